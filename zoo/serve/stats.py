"""Triton's statistics extension: per-model counts and cumulative durations.

`GET /v2/models/{m}[/versions/{v}]/stats` and the gRPC `ModelStatistics` answer in
Triton's format (its `model_statistics` JSON and protobuf), so
`get_inference_statistics` in tritonclient and Triton's tooling read them:

    success, fail         requests and their time in the server (body read to response)
    queue                 time a successful request waited for its batch to start
    compute_input         time its batch spent being merged (padding, concatenation)
    compute_infer         time its batch spent in the runner
    compute_output        time its batch's outputs took to be split back per request
    inference_count       rows (batch entries) answered; execution_count: executions
    batch_stats           per executed batch size: executions and their three durations

Every duration is a count and a sum of nanoseconds. The numbers are recorded at the
same points, from the same measurements, as the Prometheus histograms of `/metrics`
(`metrics.py`), so both views agree. Cache statistics are zero: the server has no
response cache.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

STEPS = ("compute_input", "compute_infer", "compute_output")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += max(0, round(seconds * 1e9))

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """One model version's statistics; updated from the event loop and read by the routes."""

    name: str
    version: str
    last_inference: int = 0  # ms since the epoch of the last request, 0 before any
    inference_count: int = 0
    execution_count: int = 0
    durations: dict[str, Duration] = field(default_factory=lambda: {k: Duration() for k in (
        "success", "fail", "queue", *STEPS, "cache_hit", "cache_miss")})
    batches: dict[int, dict[str, Duration]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def request(self, ok: bool, total: float, rows: int = 0, queue: float = 0.0,
                steps: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        """One request ended: answered (`ok`, with its rows, queue time and its batch's
        three step durations) or failed, `total` seconds after it arrived."""
        with self.lock:
            self.last_inference = int(time.time() * 1e3)
            if not ok:
                self.durations["fail"].add(total)
                return
            self.durations["success"].add(total)
            self.durations["queue"].add(queue)
            for step, seconds in zip(STEPS, steps):
                self.durations[step].add(seconds)
            self.inference_count += rows

    def execution(self, rows: int, steps: tuple[float, float, float]) -> None:
        """One batch of `rows` rows executed, its steps taking `steps` seconds."""
        with self.lock:
            self.execution_count += 1
            per_size = self.batches.setdefault(rows, {k: Duration() for k in STEPS})
            for step, seconds in zip(STEPS, steps):
                per_size[step].add(seconds)

    def to_json(self) -> dict[str, Any]:
        """Triton's JSON for one model (an entry of `model_stats`)."""
        with self.lock:
            return {"name": self.name, "version": self.version, "last_inference": self.last_inference,
                    "inference_count": self.inference_count, "execution_count": self.execution_count,
                    "inference_stats": {k: d.to_json() for k, d in self.durations.items()},
                    "batch_stats": [{"batch_size": size, **{k: d.to_json() for k, d in steps.items()}}
                                    for size, steps in sorted(self.batches.items())],
                    "memory_usage": [],
                    "response_stats": {}}  # per-response counts of decoupled models: none here
