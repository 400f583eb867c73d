"""`zoo optimize`: the fastest verified artifact of a model on a device, with the evidence.

Every backend that can run on the device here is tried at every precision it offers
there and the model states a tolerance for (`ModelSpec.tolerances`). Each combination
goes through `zoo.bench.benchmark`: exported (which verifies parity, the domain check and
the task metric, and refuses a bad artifact), then timed in its own process. Of those
that passed, and whose task metric stayed within `max_metric_drop` of PyTorch fp32's,
the fastest for the objective is written into the repository under one name per model,
device and objective, with its Triton `config.pbtxt` and, in its `zoo.json`, every
candidate's figures and why it was or was not chosen (as Triton's Model Analyzer keeps
the measurements behind the configuration it recommends).

Safety: candidates are exported into a hidden staging repository inside `repository`
(so the winner moves in by a same-filesystem rename), the winner is re-verified from
its files before it replaces a previous result, and the staging directory is removed
whatever happens. A failed run leaves the repository as it found it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import registry
from .artifact import MANIFEST, Artifact
from .backend import Availability
from .bench import benchmark
from .bench.matrix import check_names
from .checkpoint import Checkpoint, default_path, missing
from .bench.compare import MAX_THRESHOLD
from .errors import BackendUnavailableError, ExportError, ToleranceError, UnsupportedError, UsageError, ZooError
from .export import DEFAULT_REPOSITORY, at_checkpoint_config
from .fsutil import atomic_directory, check_destination, sha256_file
from .spec import PRECISIONS, ModelSpec
from .triton import triton_form, write_repository_files
from .verify import verify_artifact

OBJECTIVES = ("latency", "throughput")
#: what each objective ranks by, and which way is better
_RANK = {"latency": ("p50_ms", min), "throughput": ("throughput", max)}


def result_name(model: str, device: str, objective: str) -> str:
    """The artifact directory (and Triton model name) of an optimize result:
    `resnet8.digits.optimized.latency.cpu`. One per model, objective and device, so a
    new run replaces the last one and `zoo serve` / Triton serve it under a stable name."""
    return f"{model}.optimized.{objective}.{re.sub(r'[^A-Za-z0-9_-]', '-', device)}"


def optimize(model: str | ModelSpec, device: str = "cpu", objective: str = "latency",
             max_metric_drop: float | None = None, repository: str | Path = DEFAULT_REPOSITORY,
             checkpoint: str | Path | Checkpoint | None = None, random_init: bool = False,
             backends: Sequence[str] | None = None, precisions: Sequence[str] | None = None,
             batch: int | None = None, threads: int | None = None, min_time: float = 1.0,
             on_result: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Try every backend and precision available for `model` on `device`, keep those that
    verify and stay within `max_metric_drop`, and write the fastest into `repository`.

    `objective` "latency" ranks by median latency at `batch` (default 1: one request at a
    time); "throughput" by samples/s at `batch` (default the model's typical batch,
    `axes["batch"].opt`: the shape engines are tuned for and the first batch size that
    config.pbtxt asks Triton's dynamic batcher to form, so the batch a loaded server runs
    most; the largest batch is an edge of the range, rarely filled). `max_metric_drop`
    is the largest allowed worsening of the task metric against PyTorch fp32, in the
    metric's own units and direction (0.01: one accuracy point); None keeps the model's
    own per-precision bound, which every export enforces anyway, so a bound here can only
    tighten it. `backends`/`precisions` narrow the search. `on_result(row)` sees every
    candidate as it is judged by the benchmark.

    Returns the evidence (also stored under "optimize" in the artifact's manifest) with
    the written artifact's `path`. Raises a `ZooError` naming every candidate's fate when
    none qualifies; the repository is then left untouched.
    """
    if isinstance(model, str) and (model == "all" or any(c in model for c in "*?[,")):
        raise UsageError(f"zoo optimize takes one model, got {model!r}: name one (`zoo list` shows them); "
                         "`zoo bench` measures several")
    # at the checkpoint's config (`zoo train -c image_size=32`): its batch range, and the
    # config.pbtxt of the result, are that model's
    spec, _ = at_checkpoint_config(registry.get_model(model), checkpoint, random_init)
    _check_options(spec, objective, max_metric_drop, threads, min_time)
    batch = _batch(spec, objective, batch)
    runnable, rejected = _backends(device, backends)
    wanted = _precisions(spec, device, runnable, precisions)
    repository = Path(repository)
    # both before any candidate: found by each export, they were one failed row per candidate,
    # and a repository that cannot be written was found at the final rename, after all of them
    check_destination(repository, "--repository")
    _check_weights(spec, checkpoint, random_init)
    for row in rejected:
        row.update(model=spec.name)
        if on_result:
            on_result(row)

    created = not repository.exists()
    staging = repository / f".optimize-{uuid.uuid4().hex[:12]}"
    staging.mkdir(parents=True)
    try:
        report = benchmark(spec, [be.name for be in runnable], [batch], wanted, device, staging,
                           checkpoint=checkpoint, random_init=random_init, threads=threads,
                           min_time=min_time, on_result=on_result)
        rows = rejected + [dict(r) for r in report["results"]]
        chosen = _judge(spec, rows, objective, max_metric_drop)
        evidence = {"objective": objective, "device": device, "batch": batch, "max_metric_drop": max_metric_drop,
                    "metric": _metric_json(spec), "chosen": _identity(chosen),
                    "figures": {k: chosen.get(k) for k in _FIGURES}, "candidates": rows,
                    "environment": report.get("environment")}
        final = repository / result_name(spec.name, device, objective)
        staged = staging / chosen["artifact"]  # the name export chose (an int8 method can be in it)
        art, verification = _install(spec, staged, final, evidence, threads)
        return {"model": spec.name, **evidence, "artifact": art.name, "path": str(art.path),
                "verification": verification}
    finally:  # also on failure and Ctrl-C: no candidate, no staging, no empty repository left
        shutil.rmtree(staging, ignore_errors=True)
        if created and repository.is_dir() and not any(repository.iterdir()):
            repository.rmdir()


#: the measured figures of the chosen candidate that the manifest keeps
_FIGURES = ("batch", "p50_ms", "p90_ms", "p99_ms", "throughput", "noise", "iterations", "max_abs_error",
            "metric", "metric_delta", "metric_drop", "quantization", "artifact_bytes", "load_seconds")


def _check_options(spec: ModelSpec, objective: str, bound: float | None, threads: int | None,
                   min_time: float) -> None:
    if objective not in OBJECTIVES:
        raise UsageError(f"unknown objective {objective!r}; choose {' or '.join(OBJECTIVES)}")
    if bound is not None:
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound) or bound < 0:
            raise UsageError(f"--max-metric-drop is the largest allowed worsening of the task metric, a finite "
                             f"number >= 0 in the metric's units (0.01: one accuracy point; leave it out for no "
                             f"bound); got {bound!r}")
        if spec.metric is None:
            raise UsageError(f"model {spec.name} has no task metric, so --max-metric-drop cannot be checked; leave "
                           f"it out: every candidate is still held to the model's per-precision tolerances")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    if not min_time > 0:
        raise UsageError(f"--min-time must be a positive number of seconds, got {min_time!r}")


def _check_weights(spec: ModelSpec, checkpoint: str | Path | Checkpoint | None, random_init: bool) -> None:
    """Refuse, once, weights every candidate's export would refuse: a trainable model with no
    checkpoint at its default path and neither --checkpoint nor --random-init (as `zoo export`)."""
    if checkpoint is None and not random_init and spec.trainable and not default_path(spec.name).exists():
        raise missing(spec.name, "optimize untrained weights with --random-init")


def _batch(spec: ModelSpec, objective: str, batch: int | None) -> int:
    if not spec.has_batch_axis:  # its one shape: at "batch 8" it was that one input, counted 8 times
        if batch not in (None, 1):
            raise UsageError(f"batch {batch!r}: {spec.name} has no batch axis (its inputs have one shape); "
                             f"leave --batch out")
        return 1
    r = spec.axes["batch"]
    if batch is None:
        return 1 if objective == "latency" else r.opt
    if not isinstance(batch, int) or not 1 <= batch <= r.max:
        raise UsageError(f"batch {batch!r} is outside {spec.name}'s exported range 1..{r.max}")
    return batch


def _backends(device: str, names: Sequence[str] | None) -> tuple[list, list[dict[str, Any]]]:
    """The backends that can run on `device` here, and a row for each that cannot."""
    # an empty list (`--backends ,`) names none: it used to mean every backend, silently
    chosen = ([registry.known_backend(n, "--backends") for n in names] if names is not None
              else list(registry.backends().values()))
    if not chosen:
        raise UsageError("name at least one backend to try (leave --backends out to try every one)")
    check_names([], [device])  # a typo (`tpu`, `CPU`): no backend could ever run it
    if not any(device in be.precisions for be in chosen):
        known = sorted({d for be in chosen for d in be.devices})
        raise UnsupportedError(f"no backend {'named' if names else 'registered'} here runs on {device!r} "
                               f"(devices: {', '.join(known)}); `zoo backends` lists them")
    runnable, rejected = [], []
    for be in chosen:
        if device not in be.precisions:
            availability = Availability(False, f"does not run on {device} (devices: {', '.join(be.devices)})")
        else:
            availability = registry.probe(be, device)  # one that raises must not take the search down
        if availability.ok:
            runnable.append(be)
        else:
            rejected.append({"backend": be.name, "precision": None, "device": device, "status": "unsupported",
                             "error": f"backend {be.name} cannot run on {device} here: {availability.reason}",
                             "decision": "unavailable"})
    if not runnable:
        raise BackendUnavailableError(f"no backend can run on {device} here: "
                                      + "; ".join(r["error"] for r in rejected))
    return runnable, rejected


def _precisions(spec: ModelSpec, device: str, runnable: list, names: Sequence[str] | None) -> list[str]:
    """Every precision some runnable backend offers on `device` that the model states a
    tolerance for, in `PRECISIONS` order; the backends that lack one show up as holes."""
    if names is not None and not names:
        raise UsageError("name at least one precision to try (leave --precisions out to try every one)")
    unknown = sorted(set(names or ()) - set(PRECISIONS))
    if unknown:
        raise UsageError(f"--precisions: unknown {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}")
    offered = {p for be in runnable for p in be.precisions[device]}
    wanted = [p for p in PRECISIONS if p in offered and p in spec.tolerances and (not names or p in names)]
    if not wanted:
        raise UnsupportedError(
            f"no precision is both offered on {device} by {', '.join(be.name for be in runnable)} "
            f"({', '.join(sorted(offered))}) and stated by {spec.name} ({', '.join(spec.tolerances)})"
            + (f" among {', '.join(names)}" if names else ""))
    return wanted


def _drop(spec: ModelSpec, row: Mapping[str, Any]) -> float | None:
    """How much worse the task metric is through the artifact than through PyTorch fp32
    (> 0: worse), from `metric_delta` (artifact - reference, as `metric_report` has it)."""
    delta = row.get("metric_delta")
    if delta is None or spec.metric is None:
        return None
    higher = row.get("higher_is_better")
    higher = spec.metric.higher_is_better if higher is None else higher
    return (-delta if higher else delta) + 0.0  # + 0.0: no drop is 0.0, not -0.0 (in zoo.json too)


def _judge(spec: ModelSpec, rows: list[dict[str, Any]], objective: str, bound: float | None) -> dict[str, Any]:
    """Mark every row with a `decision` and a `reason`; return the chosen one."""
    key, best_of = _RANK[objective]
    qualified = []
    for row in rows:
        row.setdefault("model", spec.name)
        if "decision" in row:  # judged before the benchmark (backend unavailable)
            row.setdefault("reason", row.get("error"))
            continue
        drop = row["metric_drop"] = _drop(spec, row)
        if row.get("status") != "ok":
            row["decision"] = row["status"] if row.get("status") in ("unsupported", "refused") else "failed"
            row["reason"] = row.get("error") or "failed"
        elif row.get(key) is None:
            row["decision"], row["reason"] = "failed", f"no {key} was measured"
        elif bound is not None and drop is None:
            row["decision"], row["reason"] = "over-bound", f"no {spec.metric.name} was measured to hold to the bound"
        elif bound is not None and not drop <= bound:
            row["decision"] = "over-bound"
            row["reason"] = f"{spec.metric.name} worsened by {drop:.4g}, more than the allowed {bound:g}"
        else:
            qualified.append(row)
    if not qualified:
        raise _nothing_qualifies(spec, rows, objective, bound)
    # an exact tie goes to the first in the benchmark's order (min/max keep the first)
    chosen = best_of(qualified, key=lambda r: r[key])
    for row in qualified:
        if row is chosen:
            continue
        row["decision"] = "slower"
        row["reason"] = _compare(row, chosen, key)
    runner_up = best_of([r for r in qualified if r is not chosen], key=lambda r: r[key], default=None)
    chosen["decision"] = "chosen"
    chosen["reason"] = (f"the {'lowest median latency' if key == 'p50_ms' else 'highest throughput'} of "
                        f"{len(qualified)} qualifying candidate{'s' * (len(qualified) != 1)}"
                        + (f"; {_compare(runner_up, chosen, key)} (runner-up)" if runner_up else ""))
    return chosen


def _compare(row: Mapping[str, Any], chosen: Mapping[str, Any], key: str) -> str:
    """`row` against the chosen one, flagged when the gap is within twice the measured noise
    (the larger of the two relative spreads of block medians, `zoo.bench.stats.noise`): too
    close to call. Twice a noise is held to `zoo.bench.compare.MAX_THRESHOLD` (100 %), as
    the regression gate holds its threshold: past it a 2x gap, or an 8x one, would pass as
    noise, so such a gap is called inconclusive, not within noise."""
    a, b = row[key], chosen[key]
    if key == "p50_ms":
        text = f"{a:.4g} ms median vs {b:.4g} ms ({a / b - 1:+.1%})" if b else f"{a:.4g} ms median"
    else:
        text = f"{a:.4g} samples/s vs {b:.4g} ({a / b - 1:+.1%})" if b else f"{a:.4g} samples/s"
    noise = max(row.get("noise") or 0.0, chosen.get("noise") or 0.0)
    if not b or abs(a / b - 1) > 2 * noise:  # beyond the noise: a real gap
        return text
    if 2 * noise > MAX_THRESHOLD:
        return (text + f", inconclusive: the measured noise ({noise:.1%}) is too large to judge it (twice it is over "
                f"{MAX_THRESHOLD:.0%}): re-run on an idle machine")
    return text + f", within twice the measured noise (2 x {noise:.1%}): re-run on an idle machine to separate them"


def _nothing_qualifies(spec: ModelSpec, rows: list[dict[str, Any]], objective: str, bound: float | None) -> ZooError:
    """One error naming every candidate's fate (and metric change): a bound nobody meets is
    a `ToleranceError`, candidates that all failed an `ExportError`."""
    lines = []
    for r in rows:
        label = f"{r['backend']} {r['precision']}" if r.get("precision") else r["backend"]
        if r.get("decision") == "over-bound" and r.get("metric_drop") is not None:
            lines.append(f"{label}: {spec.metric.name} {r.get('metric')} (change {r['metric_delta']:+.4g})")
        else:
            lines.append(f"{label}: {r['decision']} ({r.get('reason')})")
    detail = "; ".join(lines)
    if any(r["decision"] == "over-bound" for r in rows):
        return ToleranceError(f"no candidate for {spec.name} keeps its {spec.metric.name} within "
                              f"{bound:g} of PyTorch fp32's: {detail}. Allow a larger --max-metric-drop, "
                              f"or train the model further so quantization costs it less")
    return ExportError(f"no candidate for {spec.name} exported, verified and ran for {objective}: {detail}")


def _install(spec: ModelSpec, staged: Path, final: Path, evidence: Mapping[str, Any],
             threads: int | None) -> tuple[Artifact, dict[str, Any]]:
    """Move the staged winner to `final` under its new name, with its evidence, and
    re-verify the files there before the rename, so a result that does not verify never
    replaces a previous one (`atomic_directory` keeps `final` old-or-new at every instant)."""
    staged_art = Artifact.open(staged)
    be = registry.get_backend(staged_art.backend)
    with atomic_directory(final) as tmp:
        for entry in staged.iterdir():
            os.rename(entry, tmp / entry.name)
        # Triton requires `name:` to match the model's directory
        record = staged_art.manifest.get("triton") or {}
        form = triton_form(be.triton, record.get("form"))
        write_repository_files(tmp, final.name, spec, be.triton, be.filename, staged_art.device, form,
                               rows_dependent=record.get("rows_dependent"))
        manifest = dict(staged_art.manifest)
        manifest["files"] = {**manifest["files"], "config.pbtxt": sha256_file(tmp / "config.pbtxt")}
        manifest.update(name=final.name, optimize={**evidence, "source": staged.name})
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
        report = verify_artifact(tmp, threads=threads)
    verification = {"max_abs_error": report["parity"]["max_abs_error"], "metric": report.get("metric"),
                    "domain": report.get("domain"), "passed": report["parity"]["passed"]}
    return Artifact.open(final), verification


def _identity(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ("backend", "precision", "device", "batch", "quantization")}


def _metric_json(spec: ModelSpec) -> dict[str, Any] | None:
    return {"name": spec.metric.name, "higher_is_better": spec.metric.higher_is_better} if spec.metric else None


def print_optimize(result: Mapping[str, Any], console) -> None:
    """Every candidate with its figures and decision, then the artifact written
    (the style of `zoo bench`'s table)."""
    from rich.markup import escape
    from rich.table import Table

    from .bench.report import precision_label, signed

    key = _RANK[result["objective"]][0]
    table = Table("backend", "precision", "batch", "p50 ms", "samples/s", "max |err|", "metric change",
                  "decision", "reason",
                  title=f"{result['model']} on {result['device']}: {result['objective']} at batch {result['batch']}")
    for r in result["candidates"]:
        delta = r.get("metric_delta")
        cells = [r["backend"], precision_label(r) or "-", r.get("batch"), _num(r.get("p50_ms"), ".3f"),
                 _num(r.get("throughput"), ".1f"), _num(r.get("max_abs_error"), ".2g"), signed(delta),
                 r.get("decision"), r.get("reason")]
        style = "bold green" if r.get("decision") == "chosen" else None
        table.add_row(*("" if v is None else escape(str(v)) for v in cells), style=style)
    console.print(table)
    chosen, figures = result["chosen"], result["figures"]
    bound = result["max_metric_drop"]
    console.print(f"wrote {escape(result['path'])}: {chosen['backend']} {precision_label(chosen)}, "
                  f"{key.replace('_', ' ')} {_num(figures.get(key), '.4g')}"
                  + (f", metric bound {bound:g}" if bound is not None else "")
                  + "; re-verified against PyTorch fp32", highlight=False)


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)
