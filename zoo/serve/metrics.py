"""Prometheus metrics for `GET /metrics`.

Per model: requests and failures (by reason), end-to-end request latency in the server,
queue time, compute time (the runner call of the batch the request rode in), and batch
sizes; per HTTP route and gRPC method: responses by status code. On a machine with an NVIDIA GPU, the
GPU's utilization and memory are read through NVML (the `nvidia-ml-py` package) at each
scrape, as Triton's `nv_gpu_utilization` and `nv_gpu_memory_used_bytes` are.

Each application gets its own `CollectorRegistry`, so several servers in one process
(tests) do not collide.

The counters and histograms a request updates are plain numbers (`Tally`) that one
collector (`Tallies`, prometheus_client's custom-collector API) turns into metric families
at each scrape, in the text prometheus_client's own `Counter` and `Histogram` write:
their `inc` and `observe` take a lock per update and a histogram's walks its buckets in
Python, several times per request. Every update and every scrape runs on the server's
event-loop thread (HTTP and gRPC handlers, and the batcher's batch callback, which runs
after the executor's call returns), so the tallies need no lock.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from typing import Iterator, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString
from prometheus_client.registry import Collector

log = logging.getLogger("zoo.serve")
#: seconds: 50 us to 30 s, dense where CPU models answer (0.2 to 20 ms)
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 0.01, 0.015, 0.02, 0.03, 0.05,
                   0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self, gpu: bool = True) -> None:
        self.registry = CollectorRegistry()
        labels = ("model", "version")
        tallies = self.tallies = Tallies()
        self.requests = tallies.counter("zoo_inference_requests", "Inference requests received, by model.", labels)
        self.failures = tallies.counter("zoo_inference_failures", "Inference requests that failed, by model and "
                                        "reason (bad_request, queue_full, not_ready, backend, timeout, cancelled, "
                                        "disconnected, internal).", (*labels, "reason"))
        self.latency = tallies.histogram("zoo_inference_request_duration_seconds", "Time in the server per "
                                         "successful request: body read to response encoded.", labels,
                                         LATENCY_BUCKETS)
        self.queue = tallies.histogram("zoo_inference_queue_duration_seconds", "Time a request waited for its "
                                       "batch to start.", labels, LATENCY_BUCKETS)
        self.compute = tallies.histogram("zoo_inference_compute_duration_seconds", "Time in the model (the runner "
                                         "call) of the batch a request rode in.", labels, LATENCY_BUCKETS)
        self.batch_size = tallies.histogram("zoo_inference_batch_size", "Rows per batch sent to an instance.",
                                            labels, BATCH_BUCKETS)
        self.executions = tallies.counter("zoo_inference_executions", "Batches sent to an instance (a ragged "
                                          "batch whose sizes spread runs as several padding-group executions).",
                                          labels)
        self.http = tallies.counter("zoo_http_responses", "HTTP responses by route template and status code.",
                                    ("route", "code"))
        self.grpc = tallies.counter("zoo_grpc_responses", "gRPC responses by method and status code.",
                                    ("method", "code"))
        self.registry.register(tallies)
        self.queue_depth = Gauge("zoo_inference_queue_depth", "Requests waiting for an instance.", labels,
                                 registry=self.registry)
        self.ready = Gauge("zoo_model_ready", "1 when the model takes requests.", labels, registry=self.registry)
        self.gpu = GpuCollector.create() if gpu else None
        if self.gpu is not None:
            self.registry.register(self.gpu)

    @staticmethod
    def child(family: "Family", *labels: str) -> "Tally":
        """The tally of `family` for one set of label values."""
        return family.child(labels)

    def observe_batch(self, model: str, version: str, rows: int) -> None:
        self.batch_size.child((model, version)).observe(rows)
        self.executions.child((model, version)).inc()

    def observe_request(self, model: str, version: str, total: float, queue: float, compute: float) -> None:
        labels = (model, version)
        self.latency.child(labels).observe(total)
        self.queue.child(labels).observe(queue)
        self.compute.child(labels).observe(compute)

    def exposition(self, models: Sequence) -> tuple[bytes, str]:
        for m in models:
            self.queue_depth.labels(m.name, m.version).set(m.batcher.depth if m.batcher else 0)
            self.ready.labels(m.name, m.version).set(1 if m.ready else 0)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Tally:
    """One label set's count (a counter) or count per bucket and sum (a histogram)."""

    __slots__ = ("total", "counts", "bounds", "created")

    def __init__(self, bounds: tuple[float, ...] | None) -> None:
        self.total = 0.0
        self.bounds = bounds
        self.counts = [0] * len(bounds) if bounds is not None else None
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.total += amount

    def observe(self, value: float) -> None:
        """Into the first bucket whose upper bound is at least `value` (`le`), +Inf last."""
        self.total += value
        self.counts[bisect_left(self.bounds, value)] += 1


class Family:
    """A counter or histogram: its name, help, label names, buckets, and a tally per label set."""

    __slots__ = ("name", "doc", "labels", "bounds", "children")

    def __init__(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float] | None) -> None:
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.bounds = None if buckets is None else (*(float(b) for b in buckets), float("inf"))
        self.children: dict[tuple[str, ...], Tally] = {}

    def child(self, values: tuple[str, ...]) -> Tally:
        found = self.children.get(values)
        if found is None:
            if len(values) != len(self.labels):
                raise ValueError(f"{self.name} takes labels {self.labels}, not {values}")
            found = self.children[values] = Tally(self.bounds)
        return found

    def collect(self) -> Metric:
        if self.bounds is None:
            family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
            for values, tally in list(self.children.items()):
                family.add_metric(values, tally.total, created=tally.created)
            return family
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, tally in list(self.children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(self.bounds, tally.counts):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(values, buckets, tally.total)
            family.add_sample(f"{self.name}_created", dict(zip(self.labels, values)), tally.created)
        return family


class Tallies(Collector):
    """The per-request counters and histograms, written at each scrape."""

    def __init__(self) -> None:
        self.families: list[Family] = []

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> Family:
        self.families.append(Family(name, doc, labels, None))
        return self.families[-1]

    def histogram(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Family:
        self.families.append(Family(name, doc, labels, buckets))
        return self.families[-1]

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.collect()


class GpuCollector(Collector):
    """GPU utilization and memory per device, read through NVML at scrape time."""

    def __init__(self, pynvml) -> None:
        self.nvml = pynvml

    @classmethod
    def create(cls) -> "GpuCollector | None":
        """A collector when NVML starts (a driver and a GPU are present), else None."""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
        except Exception as exc:  # no package, no driver, no device: no GPU metrics, said once
            log.info("no GPU metrics: %s", exc)
            return None
        return cls(pynvml)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self.nvml
        util = GaugeMetricFamily("zoo_gpu_utilization_ratio", "GPU busy fraction over the last sample period "
                                 "(NVML).", labels=["gpu", "name"])
        used = GaugeMetricFamily("zoo_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=["gpu", "name"])
        total = GaugeMetricFamily("zoo_gpu_memory_total_bytes", "GPU memory in all (NVML).", labels=["gpu", "name"])
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else name
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                util.add_metric([str(i), name], rates.gpu / 100.0)
                used.add_metric([str(i), name], float(memory.used))
                total.add_metric([str(i), name], float(memory.total))
        except Exception as exc:  # a GPU that fell off the bus must not break /metrics
            log.warning("NVML read failed: %s", exc)
        yield from (util, used, total)
