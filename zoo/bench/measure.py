"""What runs inside a combination's own processes: the export, then the measurement.

The export (which verifies parity and the task metric, or refuses) and the measurement
run in two separate processes, so the measuring process's peak memory is the engine's
and the inference's, not the exporter's, and a crash in either is one failed row.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .stats import summarize


def _setup(job: Mapping[str, Any]) -> None:
    """The parent's plugin files and thread count. Measuring needs no model plugin: an
    artifact describes its model itself (`Artifact.spec`)."""
    import torch

    from ..registry import load_plugin_file

    for file in job["plugin_files"]:
        load_plugin_file(file)
    if job["threads"]:
        torch.set_num_threads(job["threads"])


def export_job(job: Mapping[str, Any], spec=None) -> dict[str, Any]:
    """Export (or reuse) the verified artifact; its path and the facts its manifest holds.
    `spec`: the spec itself, where the job runs in the process that registered it
    (`zoo.bench.matrix.in_this_process`); a worker rebuilds it from the registry."""
    from ..export import export
    from ..registry import get_model

    _setup(job)
    spec = get_model(job["model"], **job["config"]) if spec is None else spec
    art = export(spec, job["backend"], job["precision"], job["device"], job["repository"],
                 checkpoint=job["checkpoint"], random_init=job["random_init"], quantization=job["quantization"],
                 keep_triton=True)
    return {"path": str(art.path), **artifact_facts(art, spec)}


def artifact_facts(art, spec) -> dict[str, Any]:
    """What a report row says about the artifact itself, from its manifest: parity, the
    metric through it, its export time and size."""
    metric = art.manifest.get("metric") or {}
    files = [p for p in (art.path / "1").rglob("*") if p.is_file()]
    return {"artifact": art.name, "max_abs_error": art.manifest["parity"]["max_abs_error"],
            "metric_name": metric.get("name"), "metric": metric.get("artifact"),
            "metric_reference": metric.get("reference"), "metric_delta": metric.get("delta"),
            "higher_is_better": spec.metric.higher_is_better if spec.metric else None,
            "quantization": art.manifest.get("quantization"),
            "export_seconds": art.manifest["export_seconds"],
            "artifact_bytes": sum(p.stat().st_size for p in files)}


def length_axis(spec) -> str | None:
    """The model's dynamic axis other than batch (sequence, atoms), or None."""
    return next((a for a in spec.axes if a != "batch"), None)


def at_length(spec, inputs: dict[str, np.ndarray], axis: str, length: int) -> dict[str, np.ndarray]:
    """The inputs with every dimension named `axis` cut or grown to `length`: real sampled
    content (tokens, atoms and their bonds, masks) at the length being measured.

    An axis that an input masks (`masks`) grows by padding on the right, each input with
    its absent value (`absent`), as a tokenizer pads a batch and `zoo serve` pads a ragged
    one: the sample's own content, then positions the mask marks absent. Repeated, a masked
    sample repeats its padding between its copies (a mask with holes), and a graph's bonds
    join every copy of an atom to every copy of its neighbours: mpnn.freesolv's test vectors
    at 64 atoms held atoms of degree 12 and predictions of -266 kcal/mol, no molecule's,
    on which every int8 export was refused. An axis nothing masks has no absent position to
    add, and its content is repeated (a language model's tokens)."""
    pad = any(_binary(inputs[name]) for name in masks(spec, axis))
    out = {}
    for t in spec.inputs:
        array = inputs[t.name]
        for dim, name in t.dynamic_axes.items():
            if name != axis:
                continue
            have = array.shape[dim]
            if have >= length:
                array = np.take(array, np.arange(length), axis=dim)
            elif pad:
                widths = [(0, length - have if d == dim else 0) for d in range(array.ndim)]
                array = np.pad(array, widths, constant_values=absent(t))
            else:
                array = np.take(array, np.arange(length) % have, axis=dim)
        out[t.name] = np.ascontiguousarray(array)
    return out


def masks(spec, axis: str) -> list[str]:
    """The inputs that mark each position along `axis` present (1) or absent (0): of shape
    (batch, axis) with value_range (0, 1), as an attention mask or an atom mask. A bool
    input declares no range (PyTorch's `key_padding_mask`, True for padding, is not one)."""
    return [t.name for t in spec.inputs if len(t.shape) == 2 and set(t.shape) == {"batch", axis}
            and t.dtype != "bool" and t.value_range is not None and tuple(t.value_range) == (0, 1)]


def _binary(values) -> bool:
    """Whether a mask-shaped input's values are all 0 or 1, as a mask's are: a (batch, axis)
    input ranged 0 to 1 may be a normalized signal (or token type ids, 0 and 1 too: harmless,
    a text model's attention mask pads the axis alike), and a signal is repeated, not padded."""
    values = np.asarray(values)
    return bool(np.isin(values, (0, 1)).all())


def absent(t) -> float:
    """The value input `t` is padded with: zero, as the server pads a ragged batch (a mask's
    "absent", a padding token, no feature and no bond), or the end of its `value_range`
    nearest zero where the range leaves it out, so a padded input is one the server takes."""
    if t.value_range is None:
        return 0
    low, high = t.value_range
    if t.dtype in ("float32", "float16", "bfloat16"):
        return min(max(0.0, low), high)
    return min(max(0, math.ceil(low)), math.floor(high))


def lengths_of(spec, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The length of each dynamic axis other than batch, as sampled."""
    found = {}
    for t in spec.inputs:
        for dim, name in t.dynamic_axes.items():
            if name != "batch":
                found.setdefault(name, int(inputs[t.name].shape[dim]))
    return found


def time_calls(fn: Callable, inputs, sync: Callable[[], Any], warmup: int, min_time: float, min_iters: int,
               max_iters: int) -> np.ndarray:
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


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _own_pids(status: str | None = None) -> set[int]:
    """This process's PID in every PID namespace /proc shows (`NSpid:` in /proc/self/status),
    and os.getpid(). NVML reports PIDs as the driver's (the host's) namespace sees them, which
    inside a container differ from os.getpid(): where the container's /proc lists the outer
    PID too, it matches; where it does not, no PID does and the caller falls back."""
    import os

    pids = {os.getpid()}
    try:
        text = status if status is not None else Path("/proc/self/status").read_text()
    except OSError:
        return pids
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            pids.update(int(p) for p in line.split()[1:] if p.isdigit())
    return pids


def _nvml_process_mb(processes: Any, pids: set[int]) -> float | None:
    """The GPU memory NVML lists for one of `pids`, in MiB (None: not listed or hidden)."""
    used = [p.usedGpuMemory for p in processes if p.pid in pids and p.usedGpuMemory]
    return used[0] / 2**20 if used else None


def _cuda_used_mb(index: int) -> float:
    """Memory in use on the whole device, as the driver reports it (cudaMemGetInfo)."""
    import torch

    free, total = torch.cuda.mem_get_info(index)
    return (total - free) / 2**20


def _cuda_process_mb(index: int, used_before: float | None) -> tuple[float | None, str | None]:
    """GPU memory this process uses on device `index`, and how it was found: engines that
    bypass torch's allocator (TensorRT, ONNX Runtime) show here and not in
    torch.cuda.max_memory_allocated.

    NVML's per-process figure where NVML lists this process ("nvml"), found by the device's
    UUID (torch's index is relative to CUDA_VISIBLE_DEVICES, NVML's is not) and by PID in
    any namespace; otherwise the growth of the device's used memory since before the
    artifact was loaded ("device-delta": exact on a GPU nothing else is using, as a
    benchmark's measuring process has it)."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
            handle = (pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}") if uuid is not None
                      else pynvml.nvmlDeviceGetHandleByIndex(index))
            mb = _nvml_process_mb(pynvml.nvmlDeviceGetComputeRunningProcesses(handle), _own_pids())
            if mb is not None:
                return mb, "nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML missing or refusing: the driver's device figure below
        pass
    if used_before is None:
        return None, None
    return max(_cuda_used_mb(index) - used_before, 0.0), "device-delta"


def measure_job(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Load the artifact once, then time every (batch, length) point."""
    import torch

    from ..artifact import Artifact

    _setup(job)
    baseline = _rss_mb()
    art = Artifact.open(job["path"])
    spec = art.spec()
    cuda = art.device.startswith("cuda")
    index, used_before = None, None
    if cuda:
        index = torch.device(art.device).index
        index = torch.cuda.current_device() if index is None else index
        torch.cuda.reset_peak_memory_stats(index)
        used_before = _cuda_used_mb(index)
    start = time.perf_counter()
    runner = art.load(threads=job["threads"])
    load_seconds = time.perf_counter() - start
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    axis = length_axis(spec)
    rows = []
    for batch in job["batch_sizes"]:
        for length in job["lengths"] or [None]:
            inputs: dict[str, Any] = spec.sample(batch, np.random.default_rng(0))
            if length is not None and axis is not None:
                inputs = at_length(spec, inputs, axis, length)
            lengths = lengths_of(spec, inputs)
            if cuda:  # device-resident inputs: time the engine, not host-to-device copies
                inputs = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
            times = time_calls(runner, inputs, sync, job["warmup"], job["min_time"], job["min_iters"],
                               job["max_iters"])
            rows.append({"batch": batch, "lengths": lengths, "load_seconds": round(load_seconds, 4),
                         **summarize(times, batch)})
    peak_cuda, source = None, None
    if cuda:
        process_mb, source = _cuda_process_mb(index, used_before)
        peak_cuda = max(torch.cuda.max_memory_allocated(index) / 2**20, process_mb or 0.0)
    for row in rows:
        row.update({"peak_host_mb": round(_peak_rss_mb(), 1),
                    "baseline_host_mb": None if baseline is None else round(baseline, 1),
                    "peak_cuda_mb": None if peak_cuda is None else round(peak_cuda, 1),
                    **({"cuda_mb_source": source} if cuda else {})})
    return rows


def run_in_child(conn, fn: Callable[[Mapping[str, Any]], Any], job: Mapping[str, Any]) -> None:
    """A child process's entry: run `fn(job)` and send back ("ok", result) or the error.

    Ctrl-C reaches the whole process group: the parent reports it (exit 130), so the child
    exits quietly, as it does when the parent has already closed the pipe. The SIGINT
    handler the forkserver started with first: it ignores SIGINT from its first import
    (`zoo.bench.forkserver_quiet`), and so would the child."""
    import os
    import signal
    import sys

    quiet = sys.modules.get("zoo.bench.forkserver_quiet")  # forked from the forkserver (not spawned)
    if quiet is not None and quiet.INHERITED is not None:
        signal.signal(signal.SIGINT, quiet.INHERITED)

    # the parent's stdout carries the report (`--json`): libraries' progress bars and
    # prints in a worker (NNCF's calibration, compilers) go to stderr instead
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # a broken plugin was reported once by the parent; a worker rebuilding the registry need not repeat it
    logging.getLogger("zoo.plugins").setLevel(logging.ERROR)
    try:
        conn.send(outcome_of(fn, job))
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(130)
    finally:
        conn.close()


def outcome_of(fn: Callable[[Mapping[str, Any]], Any], job: Mapping[str, Any]) -> tuple[str, Any]:
    """("ok", `fn(job)`), or the row's status and reason for what it raised."""
    from ..errors import UnsupportedError, VerificationError, ZooError

    try:
        return "ok", fn(job)
    except UnsupportedError as exc:
        return "unsupported", str(exc)
    except VerificationError as exc:  # the export ran and verification refused it: an outcome, not a crash
        return "refused", str(exc)
    except ZooError as exc:
        return "failed", str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a library error inside one backend is this row's failure
        return "failed", f"{type(exc).__name__}: {exc}"
