"""`zoo bench`: latency and throughput of verified artifacts, backend against backend.

Each backend is measured in its own freshly spawned process, so one backend's thread
pools, allocator state or crash cannot affect another's numbers. Every measurement
warms up first, then times single calls (synchronizing the GPU when on CUDA) until
both a minimum time and a minimum count are reached, and reports percentiles.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import ZooError
from .export import DEFAULT_REPOSITORY, export
from .registry import get_model


def environment(threads: int | None = None) -> dict[str, Any]:
    """What a reader needs to compare numbers: machine, library versions, threads, command."""
    import torch

    from .registry import backends

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    env = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
           "torch": torch.__version__, "threads": threads or torch.get_num_threads(),
           "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    for be in backends().values():
        env.update(be.versions())
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return env


def time_calls(fn, inputs, sync, warmup: int, min_time: float, min_iters: int, max_iters: int) -> np.ndarray:
    """Seconds per call: `warmup` untimed calls, then timed ones until both minimums are met."""
    for _ in range(warmup):
        fn(inputs)
    sync()
    times = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn(inputs)
        sync()
        times.append(time.perf_counter() - t0)
    return np.asarray(times)


def summarize(times: np.ndarray, batch: int) -> dict[str, float]:
    ms = times * 1e3
    return {"p50_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "std_ms": float(ms.std()),
            "throughput": float(batch / np.median(times)), "iterations": int(len(times))}


def _measure_artifact(path: str, batch_sizes: Sequence[int], options: dict[str, Any],
                      plugin_files: Sequence[str]) -> list[dict[str, Any]]:
    """Runs in the worker process: load the artifact once, time every batch size."""
    import torch

    from .artifact import Artifact
    from .registry import load_plugin_file

    for file in plugin_files:
        load_plugin_file(file)
    threads = options["threads"]
    if threads:
        torch.set_num_threads(threads)
    art = Artifact.open(path)
    spec = art.spec()
    start = time.perf_counter()
    runner = art.load(threads=threads)
    load_seconds = time.perf_counter() - start
    cuda = art.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for batch in batch_sizes:
        inputs: dict[str, Any] = spec.sample(batch, np.random.default_rng(0))
        if cuda:  # device-resident inputs: time the engine, not host-to-device copies
            inputs = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
        times = time_calls(runner, inputs, sync, options["warmup"], options["min_time"],
                           options["min_iters"], options["max_iters"])
        rows.append({"batch": batch, "load_seconds": round(load_seconds, 3), **summarize(times, batch)})
    return rows


def benchmark(model: str, backends: Sequence[str] = ("torch", "onnxruntime"), batch_sizes: Sequence[int] = (1, 8, 32),
              precision: str | Sequence[str] = "fp32", device: str = "cpu", repository: str | Path = DEFAULT_REPOSITORY,
              checkpoint: str | Path | None = None, random_init: bool = False, threads: int | None = None,
              warmup: int = 10, min_time: float = 1.0, min_iters: int = 20, max_iters: int = 100_000,
              on_result=None) -> dict[str, Any]:
    """Export (or reuse) one verified artifact per backend and precision, and time it at
    each batch size.

    `precision` is one precision or several (the matrix backends x precisions; a backend
    that does not offer a precision, or a model that states no tolerance for it, is
    reported as "unsupported"). A backend that fails to export or run is reported as
    "failed" with its reason; the rest go on. `on_result(row)` is called as each row is
    ready (the CLI's progress display).
    """
    from .errors import UnsupportedError
    from .registry import get_backend, plugin_files

    precisions = [precision] if isinstance(precision, str) else list(precision)

    spec = get_model(model)
    if not backends or not batch_sizes or not precisions:
        raise ZooError("name at least one backend, precision and batch size to benchmark")
    limit = spec.axes["batch"].max
    bad = [b for b in batch_sizes if not 1 <= b <= limit]
    if bad:
        raise ZooError(f"batch sizes {bad} are outside {spec.name}'s exported range 1..{limit}")
    options = {"threads": threads, "warmup": warmup, "min_time": min_time, "min_iters": min_iters,
               "max_iters": max_iters}
    rows: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    for name, prec in [(b, p) for p in precisions for b in backends]:
        base = {"model": spec.name, "backend": name, "precision": prec, "device": device}
        try:
            get_backend(name).check_supported(prec, device)
            spec.tolerance(prec)
        except ZooError as exc:  # a hole in the matrix, or a bad precision name
            row = {**base, "status": "unsupported" if isinstance(exc, UnsupportedError) else "failed",
                   "error": str(exc)}
            rows.append(row)
            if on_result:
                on_result(row)
            continue
        try:
            art = export(spec, name, prec, device, repository, checkpoint=checkpoint, random_init=random_init)
            metric = art.manifest.get("metric") or {}
            facts = {"max_abs_error": art.manifest["parity"]["max_abs_error"],
                     "metric": metric.get("artifact"), "metric_delta": metric.get("delta"),
                     "quantization": art.manifest.get("quantization"),
                     "export_seconds": art.manifest["export_seconds"]}
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                measured = pool.submit(_measure_artifact, str(art.path), list(batch_sizes), options,
                                       list(plugin_files)).result()
            new = [{**base, **facts, **m, "status": "ok"} for m in measured]
        except ZooError as exc:
            new = [{**base, "status": "failed", "error": str(exc)}]
        except concurrent.futures.process.BrokenProcessPool:
            new = [{**base, "status": "failed", "error": "the benchmark process crashed"}]
        except Exception as exc:  # a library error inside one backend must not stop the others
            new = [{**base, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}]
        for row in new:
            rows.append(row)
            if on_result:
                on_result(row)
    return {"model": spec.name, "environment": environment(threads), "results": rows}
