"""`zoo bench`: the matrix models x backends x precisions x devices x batch sizes (x the
lengths of a sequence or atom axis), every combination in its own processes.

A combination is exported (or its verified artifact reused) in one fresh process and
measured in another, so one backend's thread pools, allocator, memory or crash cannot
touch another's numbers, and the measuring process's peak memory is the engine's. Every
measurement warms up, then times single calls (synchronizing the GPU on CUDA) until both
a minimum time and a minimum count are reached. A combination that a backend or model
does not offer is "unsupported", one whose export verification refuses (parity, test
vectors, metric drop) is "refused", one that fails otherwise (an exporter's error, a
crash, a time-out) is "failed", each with its reason, and the run goes on.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import types
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UnknownModelError, UnsupportedError, UsageError, ZooError, signal_name
from ..artifact import DEFAULT_REPOSITORY
from ..registry import only_here
from ..spec import ModelSpec
from .env import environment
from .measure import artifact_facts, export_job, length_axis, measure_job, outcome_of, run_in_child
from .options import items

if TYPE_CHECKING:  # imports torch
    from ..checkpoint import Checkpoint

__all__ = ["benchmark", "combinations", "environment"]


class _Failed(Exception):
    def __init__(self, status: str, error: str):
        super().__init__(error)
        self.status, self.error = status, error


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run. `report` is the run's report of what was done before it: every
    finished combination's rows, none of the one in progress (nor its files), and
    "interrupted": true. A KeyboardInterrupt still, for code that stops on one."""

    def __init__(self, report: dict[str, Any]):
        super().__init__("interrupted")
        self.report = {**report, "interrupted": True}


def exit_cause(code: int | None) -> str:
    """A child's exit code as words: a signal by name (SIGSEGV: a native library's crash, as
    AOTInductor's loader on the first CUDA run), else the code."""
    name = signal_name(code)
    return f"killed by {name}" if name else f"exit code {code}"


def _context(start_method: str | None = None):
    """Fresh processes forked from a forkserver that has imported torch and zoo once (and
    run nothing): each combination starts clean, in a fraction of a second instead of the
    seconds a spawned interpreter spends importing torch again. Where there is no fork
    (Windows, macOS defaults), or where `start_method` says so, a spawned interpreter."""
    if start_method == "spawn" or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["zoo.bench.forkserver_quiet", "torch", "zoo", "zoo.bench.measure"])
    return ctx


@contextmanager
def _main_hidden():
    """This process's `__main__` replaced by an empty module while a worker starts.

    A spawned or forkserver child imports its parent's main module again (by its path, as
    `__mp_main__`) so that functions defined there can be unpickled: a script or notebook
    without an `if __name__ == "__main__":` guard would run again in every worker (its
    training, the benchmark itself), and `python - < script.py` fails on the path
    '<stdin>'. A worker needs nothing from it: its target is zoo's (`zoo.bench.measure`),
    its job plain data, and its models come from plugins. multiprocessing reads
    `sys.modules["__main__"]` (its `__spec__` and `__file__`) only when a process starts
    (`spawn.get_preparation_data`), so a module with neither, for that moment, tells the
    child of no main module at all."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


#: seconds a worker that Ctrl-C reached too has to finish being interrupted
INTERRUPT_GRACE_S = 5.0


def _stop(proc, interrupt: KeyboardInterrupt) -> None:
    """The worker, stopped on Ctrl-C. A terminal's Ctrl-C reaches the whole process group, so
    the worker is being interrupted too: it is given `INTERRUPT_GRACE_S` to finish, which
    removes its export's staging directory (`atomic_directory`); killed at once, it left
    `.NAME.tmp-XXXXXXXX` in the user's repository until the next write there swept it.
    SIGTERM (`Terminated`) reaches this process alone: the worker is killed at once, as it
    is past the grace. Nothing it sends after this is read: no report holds it."""
    from ..errors import Terminated

    if not isinstance(interrupt, Terminated):
        proc.join(INTERRUPT_GRACE_S)
    if proc.is_alive():
        proc.kill()


def _in_own_process(fn, job: dict[str, Any], timeout: float | None, start_method: str | None = None):
    """`fn(job)` in a freshly spawned process; its result, or `_Failed` with the reason."""
    ctx = _context(start_method)
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=run_in_child, args=(send, fn, job), daemon=True)
    with _main_hidden():
        proc.start()
    send.close()
    try:
        if not receive.poll(timeout):
            proc.kill()
            raise _Failed("failed", f"timed out after {timeout:g} s")
        try:
            status, payload = receive.recv()
        except EOFError:
            proc.join()
            raise _Failed("failed", f"the benchmark process crashed ({exit_cause(proc.exitcode)})") from None
    except KeyboardInterrupt as exc:
        _stop(proc, exc)
        raise
    finally:
        receive.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise _Failed(status, payload)
    return payload


def combination(job: dict[str, Any], timeout: float | None, start_method: str | None = None) -> tuple[str, Any]:
    """Export, then measure, each in a fresh process: ("ok", (facts, measured points)) or
    (status, reason). Ray's workers run the same function (`zoo.bench.ray_sweep`)."""
    try:
        facts = _in_own_process(export_job, job, timeout, start_method)
        return "ok", (facts, _in_own_process(measure_job, {**job, "path": facts.pop("path")}, timeout,
                                             start_method))
    except _Failed as exc:
        return exc.status, exc.error


def in_this_process(spec: ModelSpec, job: dict[str, Any]) -> tuple[str, Any]:
    """`combination` for a model or backend only this process has (`zoo.register` in a
    notebook or script): a fresh process could not rebuild it, so it is exported, then
    measured, here. No time-out bounds it and a backend's crash is this process's; its rows
    say "in_process": true and give no host memory (this process's peak is its caller's
    work too)."""
    import torch

    threads = torch.get_num_threads()  # the job's count is set for the whole process: restored after
    try:
        status, facts = outcome_of(partial(export_job, spec=spec), job)
        if status != "ok":
            return status, facts
        status, measured = outcome_of(measure_job, {**job, "path": facts.pop("path")})
    finally:
        torch.set_num_threads(threads)
    if status != "ok":
        return status, measured
    for row in measured:
        row.update(peak_host_mb=None, baseline_host_mb=None, in_process=True)
    return "ok", (facts, measured)


def _outcomes(planned, local: dict[int, ModelSpec], timeout: float | None, ray: str | None,
              nodes: dict[str, dict[str, Any]] | None = None):
    """Each planned combination's outcome, lazily (None for a hole): in fresh processes, on
    Ray (each node's environment added to `nodes`), or here for the combinations in `local`
    (by index) that only this process can run."""
    if ray is None:
        return (None if job is None else in_this_process(local[i], job) if i in local else combination(job, timeout)
                for i, (_, job) in enumerate(planned))
    if local:
        names = sorted({spec.name for spec in local.values()})
        raise UsageError(f"{', '.join(names)}: registered in this process only (zoo.register), which Ray's workers "
                         "cannot rebuild; register it in a plugin file (--plugin FILE, ZOO_PLUGINS), or benchmark "
                         "without ray")
    from .ray_sweep import run_on_ray

    return run_on_ray([job for _, job in planned], timeout, ray, nodes)


def rows_of(base: dict[str, Any], outcome: tuple) -> list[dict[str, Any]]:
    """The rows of one combination's outcome: (status, payload), or on Ray (status, payload,
    node), the node that ran it named in each row."""
    status, payload, *node = outcome
    base = {**base, "node": node[0]} if node else base
    if status != "ok":
        return [{**base, "status": status, "error": payload}]
    facts, measured = payload
    return [{**base, **m, **facts, "status": "ok"} for m in measured]


def _models(model) -> list[ModelSpec]:
    from ..registry import get_model, list_models

    if isinstance(model, ModelSpec):
        return [model]
    names = [model] if isinstance(model, str) else list(model)
    specs = []
    for name in names:
        if isinstance(name, ModelSpec):
            specs.append(name)
        elif any(c in name for c in "*?[") or name == "all":
            matched = list_models(None if name == "all" else name)
            if not matched:
                raise UnknownModelError(f"no model matches {name!r}; `zoo list` shows the models")
            specs += [get_model(n) for n in matched]
        else:
            specs.append(get_model(name))
    return specs


def check_names(precisions: Sequence[str], devices: Sequence[str], backends: Sequence[str] | None = None) -> None:
    """Refuse a precision or device no backend knows of (a typo such as `fp23` or `CPU`), and
    with `backends` a backend name nothing registered, before anything runs: otherwise every
    combination would be an "unsupported" or "failed" hole and the run would look like a
    measured one. (A registered backend that cannot run here is a row with its reason.)"""
    from ..registry import backend_names
    from ..registry import devices as known_devices
    from ..spec import PRECISIONS

    for option, names, choices in (("--precision", precisions, PRECISIONS),
                                   ("--device", devices, known_devices() if devices else [])):
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise UsageError(f"{option}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(choices)}")
    names = backend_names()  # a registered backend that cannot run here, or whose plugin is broken, is a row
    unknown = [name for name in backends or () if name not in names]
    if unknown:
        raise UsageError(f"--backends: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(names)} "
                         "(`zoo backends` says which run here)")


def combinations(specs: Sequence[ModelSpec], backends: Sequence[str], precisions: Sequence[str],
                 devices: Sequence[str]) -> list[tuple[ModelSpec, str, str, str]]:
    return [(s, b, p, d) for s in specs for d in devices for p in precisions for b in backends]


def _hole(spec: ModelSpec, backend: str, precision: str, device: str, batch_sizes, lengths) -> ZooError | None:
    """Why this combination cannot run, before any process is started; None when it can."""
    from ..registry import get_backend

    try:
        get_backend(backend).check_supported(precision, device)
        spec.tolerance(precision)
    except ZooError as exc:
        return exc
    return _out_of_range(spec, batch_sizes, lengths)


def _out_of_range(spec: ModelSpec, batch_sizes, lengths) -> UsageError | None:
    """Batch sizes or lengths outside the ranges the model is exported for; None if all fit.
    A usage error where it is raised (one model: no run can use the value); in a matrix of
    several models it is that model's hole."""
    if not spec.has_batch_axis and list(batch_sizes) != [1]:  # batch 4 was the one input at 4x the samples/s
        return UsageError(f"--batch-sizes: {spec.name} has no batch axis (its inputs have one shape): benchmark it "
                          f"with --batch-sizes 1")
    limit = spec.axes["batch"]
    bad = [b for b in batch_sizes if not limit.min <= b <= limit.max]
    if bad:
        return UsageError(f"--batch-sizes: batch sizes {bad} are outside {spec.name}'s exported range "
                          f"{limit.min}..{limit.max}")
    axis = length_axis(spec)
    if lengths and axis is not None:
        r = spec.axes[axis]
        bad = [n for n in lengths if not r.min <= n <= r.max]
        if bad:
            return UsageError(f"--lengths: {axis} lengths {bad} are outside {spec.name}'s exported range "
                              f"{r.min}..{r.max}")
    return None


def int8_method(spec: ModelSpec, precision: str) -> str | None:
    """The int8 method a combination measures: the spec's own (`ModelSpec.quantization`),
    None below int8. Rows carry it, so a report says which int8 it measured."""
    return spec.quantization if precision == "int8" else None


def job_for(spec: ModelSpec, backend: str, precision: str, device: str, repository, checkpoint, random_init: bool,
            threads: int | None) -> dict[str, Any]:
    """What a combination's worker processes need to rebuild the spec and export it. Its paths
    are absolute (`_absolute`), the default checkpoint's included where this process found one."""
    from ..checkpoint import default_path
    from ..registry import plugin_files

    if checkpoint is None and not random_init and spec.trainable and default_path(spec.name).exists():
        checkpoint = default_path(spec.name)  # the one `_check_weights` found here, not under a worker's directory
    return {"model": spec.name, "config": dict(spec.config), "backend": backend, "precision": precision,
            # the worker rebuilds the spec from the registry: the method travels explicitly, so
            # a spec passed in with another method is measured (and named) as that method
            "quantization": int8_method(spec, precision), "device": device, "repository": _absolute(repository),
            "checkpoint": None if checkpoint is None else _absolute(checkpoint), "random_init": random_init,
            "plugin_files": list(plugin_files), "threads": threads}


def _absolute(path: str | Path) -> str:
    """A path as a worker takes it: absolute, so a Ray worker on another node (or in another
    directory) finds what this process meant, not the same relative path under its own
    working directory. Not resolved: a link that every node mounts stays as named."""
    return str(Path(path).absolute())


#: `zoo bench`'s batch sizes where none are given (`default_batch_sizes`)
DEFAULT_BATCH_SIZES = (1, 8, 32)


def default_batch_sizes(model, defaults: Sequence[int] = DEFAULT_BATCH_SIZES) -> list[int]:
    """The batch sizes of a run of `model` (names, patterns or specs, as `benchmark` takes
    them) given none: `defaults`, as one model's range holds them (its largest or smallest
    in place of those past its ends; 1 alone for a model without a batch axis). With
    several models, `defaults` as they are: a size past one's range is its hole in the matrix."""
    specs = _models(model)
    if len(specs) != 1:
        return list(defaults)
    if not specs[0].has_batch_axis:
        return [1]
    r = specs[0].axes["batch"]
    return sorted({min(max(b, r.min), r.max) for b in defaults})


def checkpoint_path(checkpoint):
    """A checkpoint as the worker processes take it: a directory (a `Checkpoint` object's own)."""
    from ..checkpoint import Checkpoint

    if not isinstance(checkpoint, Checkpoint):
        return checkpoint
    if checkpoint.path is None:
        raise ZooError(f"checkpoint: a Checkpoint that was never saved; save it (checkpoint.save(DIR)) and pass it, "
                       f"or DIR: the combinations run in processes of their own, which read it from disk "
                       f"({checkpoint.model})")
    return checkpoint.path


def _check_weights(specs: list[ModelSpec], checkpoint, random_init: bool, here: bool = True) -> None:
    """Weights every combination would refuse, refused once before any runs, where each row
    failed with the same line: --checkpoint with --random-init, a --checkpoint that is not
    there, and one trainable model with neither and no checkpoint at its default path (as
    `zoo export` and `zoo optimize` refuse it). Only the path is looked at (the workers read
    the weights). `here` False (a Ray sweep, whose workers may see storage this machine does
    not): what is on this machine's disk is not asked."""
    from ..export import one_source

    one_source(checkpoint, random_init)
    if not here:
        return
    if checkpoint is not None:
        if not Path(checkpoint).exists():
            from ..checkpoint import load_checkpoint

            load_checkpoint(checkpoint, specs[0].name)  # its "no checkpoint at ..." and what is there instead
    elif not random_init and len(specs) == 1 and specs[0].trainable:
        from ..checkpoint import default_path, missing

        if not default_path(specs[0].name).exists():
            raise missing(specs[0].name, "benchmark untrained weights with --random-init")


def checked_models(model, backends: Sequence[str], batch_sizes: Sequence[int], precisions: Sequence[str],
                   devices: Sequence[str], lengths: Sequence[int] | None = None, checkpoint=None,
                   random_init: bool = False, ray: str | None = None) -> list[ModelSpec]:
    """The specs of a run's models, after every check that needs no process: names, the
    lengths axis, and with one model its batch and length ranges (usage errors, before
    anything is exported; with several models a range is one model's hole in the matrix).
    The CLI calls it before its progress bar; `benchmark` and `loadgen` call it again."""
    specs = _models(model)
    if not specs:
        raise UsageError("name at least one model to benchmark")
    check_names(precisions, devices, backends)
    if checkpoint is not None and len(specs) > 1:
        raise UsageError("--checkpoint names one model's weights; benchmark one model with it, or none")
    if lengths and not any(length_axis(s) for s in specs):
        raise UsageError(f"--lengths {','.join(map(str, lengths))}: {', '.join(s.name for s in specs)} "
                         f"{'has' if len(specs) == 1 else 'have'} no sequence or atom axis to measure at; leave it out")
    for spec in specs if lengths else ():
        axes = sorted({a for t in spec.inputs for a in t.dynamic_axes.values() if a != "batch"})
        if len(axes) > 1:  # it set the first alone (h=16 with w at its typical 32), a run no one asked for
            raise UsageError(f"--lengths sets one dynamic axis besides the batch, and {spec.name} has "
                             f"{len(axes)} ({', '.join(axes)}); leave --lengths out to measure it at its typical sizes")
    if len(specs) == 1:  # one model: its range is a usage error, not a hole in a matrix
        error = _out_of_range(specs[0], batch_sizes, lengths)
        if error is not None:
            raise error
    _check_weights(specs, checkpoint, random_init, here=ray is None)
    return specs


def benchmark(model: str | ModelSpec | Sequence[str | ModelSpec],
              backends: str | Sequence[str] = ("torch", "onnxruntime"),
              batch_sizes: int | str | Sequence[int] | None = None, precision: str | Sequence[str] = "fp32",
              device: str | Sequence[str] = "cpu", repository: str | Path = DEFAULT_REPOSITORY,
              checkpoint: str | Path | Checkpoint | None = None, random_init: bool = False,
              threads: int | None = None, warmup: int = 10, min_time: float = 1.0, min_iters: int = 20, max_iters: int = 100_000,
              lengths: int | str | Sequence[int] | None = None, timeout: float | None = 1800.0,
              on_result: Callable[[dict[str, Any]], Any] | None = None,
              on_combination: Callable[[int, int, str], Any] | None = None,
              ray: str | None = None) -> dict[str, Any]:
    """Measure every combination; a JSON-able report (see docs/benchmarks.md).

    `model` is a name, a glob ("resnet*"), "all", a spec, or a list of them; a spec is
    rebuilt in the worker processes from its registered name and config. A model or backend
    that only this process has (`zoo.register` in a notebook or script, or a spec no plugin
    registers) is exported and measured in this process instead (`in_this_process`). `lengths` are
    lengths of the model's non-batch dynamic axis (sequence, atoms) to measure at; models
    without one ignore them. `timeout` bounds each process of a combination.
    `on_result(row)` is called as each row is ready, `on_combination(done, total, label)`
    after each combination (the CLI's progress bar). `ray` runs the combinations as Ray
    tasks (`zoo.bench.ray_sweep`): "local" starts a Ray instance on this machine, "auto"
    or an address joins a running cluster; the rows are the same as a local run's.

    `batch_sizes` None: `default_batch_sizes(model)`, as `zoo bench` without --batch-sizes
    (1, 8 and 32 where the model's range holds them; 1 alone for a model without a batch axis).
    `backends`, `precision`, `device`, `batch_sizes` and `lengths` take a list, a
    comma-separated string as `zoo bench` does ("torch,onnxruntime"), or one name or number;
    an unknown name, an empty list or item, or an item given twice is the `UsageError`
    `zoo bench` gives for it (`zoo.bench.options.items`).
    """
    backends = items("--backends", backends, "backend")
    batch_sizes = (default_batch_sizes(model) if batch_sizes is None
                   else items("--batch-sizes", batch_sizes, "batch size", int))
    precisions = items("--precision", precision, "precision")
    devices = items("--device", device, "device")
    lengths = None if lengths in (None, [], ()) else items("--lengths", lengths, "length", int)
    checkpoint = checkpoint_path(checkpoint)
    specs = checked_models(model, backends, batch_sizes, precisions, devices, lengths, checkpoint, random_init, ray)
    options = {"threads": threads, "warmup": warmup, "min_time": min_time, "min_iters": min_iters,
               "max_iters": max_iters}
    planned = []  # (base row, job) per combination; job None with the row where the combination is a hole
    local = {}  # index in planned -> spec, for the combinations only this process has the model or backend of
    for spec, name, prec, dev in combinations(specs, backends, precisions, devices):
        base = {"model": spec.name, "backend": name, "precision": prec, "quantization": int8_method(spec, prec),
                "device": dev}
        hole = _hole(spec, name, prec, dev, batch_sizes, lengths)
        if hole is not None:
            planned.append(({**base, "status": "unsupported" if isinstance(hole, UnsupportedError) else "failed",
                             "error": str(hole)}, None))
        else:
            if only_here(spec.name) or only_here(name, backend=True):
                local[len(planned)] = spec
            planned.append((base, {**job_for(spec, name, prec, dev, repository, checkpoint, random_init, threads),
                                   "batch_sizes": list(batch_sizes),
                                   "lengths": list(lengths) if lengths and length_axis(spec) else None, **options}))
    nodes: dict[str, dict[str, Any]] = {}  # on Ray: the environment of each node that ran a combination
    outcomes = _outcomes(planned, local, timeout, ray, nodes)
    rows: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        return {"models": [s.name for s in specs], "environment": _environment(threads, ray, nodes),
                "options": {"backends": list(backends), "precisions": precisions, "devices": devices,
                            "batch_sizes": list(batch_sizes), "lengths": list(lengths or []),
                            "random_init": random_init, **options, **({"ray": ray} if ray is not None else {})},
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": rows,
                **({"model": specs[0].name} if len(specs) == 1 else {})}

    try:
        for done, ((base, job), outcome) in enumerate(zip(planned, outcomes), 1):
            new = [base] if job is None else rows_of(base, outcome)
            for row in new:
                rows.append(row)
                if on_result:
                    on_result(row)
            if on_combination:
                on_combination(done, len(planned), f"{base['model']} {base['backend']} {base['precision']} "
                                                   f"{base['device']}")
    except KeyboardInterrupt:
        raise Interrupted(report()) from None
    return report()


def _environment(threads: int | None, ray: str | None, nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A run's report environment: this machine's, or on Ray the nodes' that measured
    (`zoo.bench.ray_sweep.cluster_environment`), not the driver's, which measured nothing."""
    if ray is None:
        return environment(threads)
    from .ray_sweep import cluster_environment

    return cluster_environment(environment(threads), nodes)


def _refuse_alike(arts) -> None:
    """Two artifacts a report's rows could not tell apart (model, backend, precision, device)."""
    seen: dict[tuple, Any] = {}
    for art in arts:
        key = (art.model, art.backend, art.precision, art.device)
        if key in seen:
            raise UsageError(f"--artifact {seen[key].path} and {art.path} are both {' '.join(map(str, key))}: "
                             "--compare pairs rows by model, backend, precision and device, so their rows could not "
                             "be told apart; compare one of them at a time")
        seen[key] = art


def benchmark_artifacts(paths: Sequence[str | Path], batch_sizes: Sequence[int] | None = None,
                        lengths: Sequence[int] | None = None, threads: int | None = None, warmup: int = 10,
                        min_time: float = 1.0, min_iters: int = 20, max_iters: int = 100_000,
                        timeout: float | None = 1800.0,
                        on_result: Callable[[dict[str, Any]], Any] | None = None,
                        distinct: bool = False) -> dict[str, Any]:
    """Measure artifacts as they are (`zoo bench --artifact`): no export, and no plugin,
    since an artifact describes its model itself. Each is opened here first (a missing or
    modified one is an error before anything runs), then measured in its own process, as
    a combination of the matrix is; the report has the same rows, each with the
    `artifact_path` it measured. `batch_sizes` None: `default_batch_sizes` of their models.
    `distinct` (for `--compare`, which pairs rows by model, backend, precision and device)
    refuses two artifacts alike in all four before any is measured, since their rows could
    not be told apart."""
    from ..artifact import Artifact

    if not paths or batch_sizes is not None and not batch_sizes:
        raise ZooError("name at least one artifact and one batch size to benchmark")
    unique: dict[Path, Path] = {}  # one artifact named twice (by name and by path) is measured once
    for p in map(Path, paths):
        unique.setdefault(p.resolve(), p)
    arts = [Artifact.open(p) for p in unique.values()]
    batch_sizes = default_batch_sizes([a.spec() for a in arts]) if batch_sizes is None else batch_sizes
    if lengths and not any(length_axis(a.spec()) for a in arts):
        raise UsageError(f"--lengths {','.join(map(str, lengths))}: no artifact here has a sequence or atom axis "
                         "to measure at; leave it out")
    options = {"threads": threads, "warmup": warmup, "min_time": min_time, "min_iters": min_iters,
               "max_iters": max_iters}
    rows: list[dict[str, Any]] = []
    for art in arts:  # every artifact's ranges before the first is measured
        error = _out_of_range(art.spec(), batch_sizes, lengths)
        if error is not None:
            raise UsageError(f"artifact {art.name}: {error}")
    if distinct:
        _refuse_alike(arts)

    def report() -> dict[str, Any]:
        return {"models": list(dict.fromkeys(a.model for a in arts)), "environment": environment(threads),
                "options": {"artifacts": [a.name for a in arts], "batch_sizes": list(batch_sizes),
                            "lengths": list(lengths or []), **options},
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": rows}

    try:
        _measure_each(arts, batch_sizes, lengths, options, timeout, rows, on_result)
    except KeyboardInterrupt:
        raise Interrupted(report()) from None
    return report()


def _measure_each(arts, batch_sizes, lengths, options: dict[str, Any], timeout: float | None,
                  rows: list[dict[str, Any]], on_result) -> None:
    """Each artifact measured in its own process, its rows appended to `rows` as it ends."""
    from ..registry import plugin_files

    for art in arts:
        spec = art.spec()
        base = {"model": art.model, "backend": art.backend, "precision": art.precision,
                "quantization": art.manifest.get("quantization"), "device": art.device, "artifact_path": str(art.path)}
        job = {"path": str(art.path), "plugin_files": list(plugin_files), "batch_sizes": list(batch_sizes),
               "lengths": list(lengths) if lengths and length_axis(spec) else None, **options}
        try:
            outcome: tuple[str, Any] = ("ok", (artifact_facts(art, spec),
                                               _in_own_process(measure_job, job, timeout)))
        except _Failed as exc:
            outcome = (exc.status, exc.error)
        for row in rows_of(base, outcome):
            rows.append(row)
            if on_result:
                on_result(row)
