"""`zoo bench MODEL --url URL`: requests/s and latency percentiles of a running server at
several concurrencies, as Triton's `perf_analyzer --concurrency-range` reports them.

Each of `c` concurrent clients keeps one HTTP/1.1 keep-alive connection and sends its
next request as soon as the previous answer arrives (closed loop), for a fixed time,
cycling through distinct pre-encoded requests made from the model's own `sample`. The
client is a few lines over asyncio streams rather than a general HTTP library, so that
on a small machine the load generator takes as little CPU from the server as it can.

The server's own view comes from `/metrics` scraped before and after each point: mean
time in the server, in the queue and in the model (the runner call of the request's
batch), and the mean batch size. Overhead = server time - queue time - model time: what
the server adds per request (HTTP, decoding, validation, batching, encoding).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any, Sequence
from urllib.parse import urlsplit

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ..errors import ZooError
from .protocol import encode_request

SERVER_HISTOGRAMS = {"request": "zoo_inference_request_duration_seconds",
                     "queue": "zoo_inference_queue_duration_seconds",
                     "compute": "zoo_inference_compute_duration_seconds", "batch": "zoo_inference_batch_size"}


def sweep(url: str, served: str, model: str, concurrencies: Sequence[int], batch_sizes: Sequence[int] = (1,),
          duration: float = 5.0, binary: bool = True, warmup: float = 0.5, distinct: int = 64) -> dict[str, Any]:
    """Closed-loop load at each concurrency (and rows per request); a JSON-able report."""
    from ..registry import get_model

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ZooError(f"--url must be an http://HOST:PORT URL, got {url!r}")
    try:
        meta = httpx.get(f"{parts.scheme}://{parts.netloc}/v2/models/{served}", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ZooError(f"no answer from {url}: {exc}") from None
    if "error" in meta:
        raise ZooError(f"server at {url}: {meta['error']}")
    info = meta.get("zoo") or {}
    spec = get_model(info.get("model", model), **info.get("config", {}))
    results = []
    for batch in batch_sizes:
        rng = np.random.default_rng(0)
        bodies = [encode_request(spec.sample(batch, rng), binary=binary) for _ in range(distinct)]
        for c in concurrencies:
            asyncio.run(closed_loop(parts.hostname, parts.port or 80, f"/v2/models/{meta['name']}/infer", bodies, c,
                                    warmup))
            before = _scrape(parts, meta["name"])
            latencies, errors, elapsed = asyncio.run(
                closed_loop(parts.hostname, parts.port or 80, f"/v2/models/{meta['name']}/infer", bodies, c, duration))
            server = _server_view(before, _scrape(parts, meta["name"]))
            ms = np.asarray(latencies) * 1e3
            results.append({"concurrency": c, "batch": batch, "requests": len(latencies), "errors": errors,
                            "requests_per_s": len(latencies) / elapsed,
                            "samples_per_s": len(latencies) * batch / elapsed,
                            "p50_ms": float(np.percentile(ms, 50)) if ms.size else None,
                            "p90_ms": float(np.percentile(ms, 90)) if ms.size else None,
                            "p99_ms": float(np.percentile(ms, 99)) if ms.size else None, "server": server})
    return {"url": url, "model": meta["name"], "batching": info.get("batching"), "binary": binary,
            "duration_s": duration, "results": results}


async def closed_loop(host: str, port: int, path: str, bodies: list, concurrency: int, duration: float,
                      statuses: Counter | None = None) -> tuple[list[float], int, float]:
    """`concurrency` clients in a closed loop over `bodies` for `duration` s: the latencies
    of every answer, how many were not 200, the seconds taken; `statuses` counts the
    answers by (body index, status code)."""
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    stop_at = start + duration
    await asyncio.gather(*(_client(host, port, path, bodies, k, stop_at, latencies, errors,
                                   Counter() if statuses is None else statuses) for k in range(concurrency)))
    return latencies, errors[0], time.perf_counter() - start


async def _client(host: str, port: int, path: str, bodies: list, k: int, stop_at: float,
                  latencies: list[float], errors: list[int], statuses: Counter) -> None:
    requests = []
    for body, headers in bodies:
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        requests.append(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
                        .encode() + body)
    reader, writer = await asyncio.open_connection(host, port)
    i = k * 7  # clients start at different requests
    try:
        while time.perf_counter() < stop_at:
            index = i % len(requests)
            request = requests[index]
            i += 1
            sent = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - sent)
            statuses[index, status] += 1
            if status != 200:
                errors[0] += 1
    finally:
        writer.close()


def _scrape(parts, model: str) -> dict[str, float]:
    """Sum and count of the server's histograms for `model`."""
    text = httpx.get(f"{parts.scheme}://{parts.netloc}/metrics", timeout=30).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == model and sample.name.endswith(("_sum", "_count")):
                found[sample.name] = sample.value
    return found


def _server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    def mean(metric: str) -> float | None:
        count = after.get(f"{metric}_count", 0) - before.get(f"{metric}_count", 0)
        total = after.get(f"{metric}_sum", 0) - before.get(f"{metric}_sum", 0)
        return total / count if count else None

    view = {key: mean(name) for key, name in SERVER_HISTOGRAMS.items()}
    out = {f"{k}_ms": (v * 1e3 if v is not None else None) for k, v in view.items() if k != "batch"}
    out["mean_batch"] = view["batch"]
    if None not in (view["request"], view["queue"], view["compute"]):
        out["overhead_ms"] = (view["request"] - view["queue"] - view["compute"]) * 1e3
    return out


def print_sweep(report: dict[str, Any], console) -> None:
    from rich.table import Table

    table = Table("concurrency", "rows/request", "requests/s", "p50 ms", "p90 ms", "p99 ms", "errors",
                  "server ms", "queue ms", "model ms", "overhead ms", "mean batch",
                  title=f"{report['model']} at {report['url']}")

    def f(v: float | None, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    for r in report["results"]:
        s = r["server"]
        table.add_row(str(r["concurrency"]), str(r["batch"]), f(r["requests_per_s"], 1), f(r["p50_ms"]),
                      f(r["p90_ms"]), f(r["p99_ms"]), str(r["errors"]), f(s.get("request_ms")), f(s.get("queue_ms")),
                      f(s.get("compute_ms")), f(s.get("overhead_ms")), f(s.get("mean_batch"), 1))
    console.print(table)
