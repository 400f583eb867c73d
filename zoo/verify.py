"""Parity against the PyTorch fp32 reference, and the task metric through any runner.

As Optimum's `validate_model_outputs` does, parity raises typed errors: `ShapeError`
when names or shapes differ, `ToleranceError` when values differ beyond the spec's
tolerance for the precision. The report says, per batch size and output, the largest
absolute error and the tolerance it was held to.

Three checks gate every artifact, each against the spec's `Tolerance` for its precision
(see its docstring): elementwise parity, the plugin's domain check, and the task metric's
change. At fp32/fp16/bf16 parity is the tight one; at int8 parity is loose (it catches a
broken graph) and the metric's allowed drop and the domain check's int8 threshold are
what hold quantization to account.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .errors import ShapeError, ToleranceError, VerificationError, ZooError, first_line
from .spec import ModelSpec, Tolerance
from .arrays import as_numpy
from .inputs import TYPED_PRECISIONS, as_declared, check_output_types, load_split, unnamed_outputs

ArrayFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]

#: an output whose magnitude is under this many times the `atol` is held relative to it:
#: see `effective_atol`.
RELATIVE_BELOW = 10.0
#: the loosest tolerance `zoo verify` takes from a manifest, where no plugin states the
#: model's own. rtol: at 1 an output of zeros already passes (|0 - ref| = 1 x |ref|), so a
#: larger one bounds nothing. atol: the loosest a shipped model states is 2.5 (an int8
#: policy's); 1e3 leaves room for outputs in large units (pixels, returns) and refuses the
#: absurd (1e308, which verified anything). Exports are not bounded: a plugin answers for its own.
MANIFEST_ATOL_MAX = 1e3
MANIFEST_RTOL_MAX = 1.0


def effective_atol(atol: float, magnitude: float) -> float:
    """The absolute tolerance an output of this magnitude (max |reference|) is held to.

    A stated `atol` is meant for outputs well above it; an output of a random-init model
    around 1e-10 would pass atol=1e-3 whatever a backend computed, zeros included. So no
    output may be off by more than 1/RELATIVE_BELOW of its own magnitude: the stated
    atol where the magnitude is at least RELATIVE_BELOW x atol (no change), a tenth of
    the magnitude below that (continuous at the boundary). An output that is 0 everywhere
    has no scale to be relative to and keeps the stated atol. Not applied at int8, whose
    elementwise bound is stated loose on purpose (see `Tolerance`); `closer_than_zeros`
    holds int8 outputs instead.
    """
    if magnitude <= 0 or not np.isfinite(magnitude):
        return atol
    return min(atol, magnitude / RELATIVE_BELOW)


def closer_than_zeros(out: np.ndarray, ref: np.ndarray) -> float | None:
    """|out - ref| / |ref| (Euclidean norms, over the finite reference values) where it is
    1 or more: an output no closer to the reference than zeros are, which int8's loose
    elementwise bound passes wherever the outputs are small (random-init logits of 0.1
    against atol=1.0, an artifact that outputs zeros included). None where it is closer.
    A random-init policy's int8 logits (magnitude 2e-4) came within 0.65 of it elementwise."""
    finite = np.isfinite(ref)
    norm = float(np.linalg.norm(ref[finite]))
    if norm == 0:
        return None
    ratio = float(np.linalg.norm((out - ref)[finite])) / norm
    return ratio if ratio >= 1 else None


def read_only(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Read-only copies of the arrays of `inputs`, as a server hands a runner the views of
    a request's bytes: parity runs every runner on such arrays, so one that needs to write
    to its inputs (or hands them to an engine that does) fails its export, not its first
    binary request."""
    out = {}
    for name, value in inputs.items():
        if isinstance(value, np.ndarray):
            value = value.copy()
            value.flags.writeable = False
        out[name] = value
    return out


def parity(spec: ModelSpec, reference: ArrayFn, runner: ArrayFn, precision: str,
           batch_sizes: tuple[int, ...] | None = None, seed: int = 0) -> dict[str, Any]:
    """Compare `runner` with `reference` on realistic samples; raise if out of tolerance.

    Outputs the precision's tolerance does not `compare` are reported (with `"gated":
    False`) but cannot fail; `max_abs_error` is over the gated outputs. A model without a
    batch axis is run once, its rows naming no batch (`"batch": None`)."""
    tol = spec.tolerance(precision)
    rng = np.random.default_rng(seed)
    checks = []
    worst = 0.0
    for batch in batch_sizes or spec.batch_sizes():
        at, row = (f" at batch {batch}", batch) if spec.has_batch_axis else ("", None)
        inputs = spec.sample(batch, rng)
        want = {k: as_numpy(v) for k, v in reference(inputs).items()}
        try:
            produced = runner(read_only(inputs))
        except ZooError:
            raise
        except Exception as exc:  # the engine's own error: the artifact cannot run these shapes
            shapes = {k: list(np.shape(v)) for k, v in inputs.items()}
            hint = (f"; the forward makes a constant {precision} cannot hold (torch.finfo(torch.float32).min in a "
                    f"masked_fill, say): take it from the tensor's own dtype, torch.finfo(x.dtype).min, or keep fp32"
                    if precision in ("bf16", "fp16") and "without overflow" in str(exc) else "")
            raise VerificationError(f"{spec.name}: the artifact failed to run inputs of shapes {shapes}: "
                                    f"{first_line(exc)}{hint}") from exc
        if not isinstance(produced, Mapping):
            raise VerificationError(unnamed_outputs(produced, spec.name))
        if set(produced) != set(want):
            raise ShapeError(f"{spec.name}: outputs {sorted(produced)} differ from the reference's {sorted(want)}")
        if precision in TYPED_PRECISIONS:  # values are compared below, types here: an artifact answers its spec's
            check_output_types(produced, spec, spec.name)
        got = {k: as_numpy(v) for k, v in produced.items()}
        for name, ref in want.items():
            out = got[name]
            if out.shape != ref.shape:
                raise ShapeError(f"{spec.name}: output {name}{at} has shape {out.shape}, "
                                 f"the reference {ref.shape}")
            scaled = {}  # the output's magnitude, where it is too small for the stated atol
            if np.issubdtype(ref.dtype, np.floating):
                ref64 = ref.astype(np.float64)
                err = np.abs(out.astype(np.float64) - ref64)
                finite = np.abs(ref64[np.isfinite(ref64)])
                magnitude = float(finite.max()) if finite.size else 0.0
                # at int8 the elementwise bound is loose by design (it catches a broken graph)
                # and the metric and domain checks are the gate: it is not made relative, but
                # the output must be closer to the reference than zeros are
                atol = tol.atol if precision == "int8" else effective_atol(tol.atol, magnitude)
                if atol < tol.atol:
                    scaled = {"relative": True, "magnitude": magnitude, "atol": atol}
                bound = atol + tol.rtol * np.abs(ref64)
                max_err = float(err.max()) if err.size else 0.0
                ok = bool(np.all(err <= bound)) and bool(np.all(np.isfinite(out)))
                zeros = closer_than_zeros(out.astype(np.float64), ref64) if precision == "int8" else None
                if ok and zeros is not None and tol.compares(name):
                    raise ToleranceError(f"{spec.name} [{precision}]: output {name}{at} is no closer to PyTorch "
                                         f"fp32 than zeros are (|error| / |reference| = {zeros:.3g}, Euclidean)")
            else:
                max_err = float(np.mean(out != ref)) if out.size else 0.0  # fraction that differs
                ok = max_err == 0.0
            if not tol.compares(name):  # reported only: the task metric holds it at this precision
                checks.append({"batch": row, "output": name, "max_abs_error": max_err, "passed": ok,
                               "gated": False, **scaled})
                continue
            worst = max(worst, max_err)
            checks.append({"batch": row, "output": name, "max_abs_error": max_err, "passed": ok, **scaled})
            if not ok and not np.issubdtype(np.asarray(ref).dtype, np.floating):  # not a distance: a count
                raise _inexact(spec, precision, name, at, out, ref)
            if not ok:
                held = (f"atol={scaled['atol']:.3g} ({1 / RELATIVE_BELOW:g} x the output's magnitude "
                        f"{scaled['magnitude']:.3g}, under {RELATIVE_BELOW:g}x the stated atol={tol.atol:g})"
                        if scaled else f"atol={tol.atol:g}")
                raise ToleranceError(
                    f"{spec.name} [{precision}]: output {name}{at} differs from PyTorch fp32 by "
                    f"up to {max_err:.3g}, beyond the tolerance {held} rtol={tol.rtol:g}")
    report = {"precision": precision, "tolerance": tol.to_json(), "max_abs_error": worst, "checks": checks,
              "passed": True}
    if not spec.has_batch_axis:
        report["notes"] = spec.batch_notes()
    return report


def _inexact(spec: ModelSpec, precision: str, name: str, at: str, out: np.ndarray,
             ref: np.ndarray) -> ToleranceError:
    """An integer, boolean or string output that differs: how many values, and how to leave
    it to the task metric (its "error" was the fraction that differs, read against atol)."""
    kind = {"b": "a boolean", "i": "an integer", "u": "an integer"}.get(np.asarray(ref).dtype.kind, "a string")
    others = [o for o in (t.name for t in spec.outputs) if o != name]
    return ToleranceError(
        f"{spec.name} [{precision}]: output {name}{at}: {int(np.sum(out != ref))} of {out.size} values "
        f"differ from PyTorch fp32's; {kind} output must match exactly at any precision"
        + (f" (to leave it to the task metric at {precision}, compare only the others: "
           f"Tolerance(..., compare={tuple(others)!r}))" if others else ""))


def evaluate(spec: ModelSpec, fn: ArrayFn, split: str = "test", batch_size: int | None = None) -> float | None:
    """The task metric of `fn`: by the metric's own evaluation (e.g. episodes in an
    environment), or over a dataset split in batches the signature admits."""
    if spec.metric is None:
        return None
    if spec.metric.evaluate is not None:
        return spec.metric.value(spec.name, "its evaluation", fn)
    if spec.dataset is None:
        return None
    x, y = load_split(spec, split)
    x = as_declared(x, spec)  # a split's float64 features for a float32 input: the runner takes float32
    n = len(y)
    step = min(batch_size or spec.axes["batch"].max, spec.axes["batch"].max)
    parts: dict[str, list[np.ndarray]] = {}
    for i in range(0, n, step):
        out = fn({k: v[i:i + step] for k, v in x.items()})
        for k, v in out.items():
            parts.setdefault(k, []).append(as_numpy(v))
    outputs = {k: np.concatenate(v) for k, v in parts.items()}
    return spec.metric.value(spec.name, f"the {split} split", outputs, np.asarray(y))


def metric_report(spec: ModelSpec, reference: ArrayFn, runner: ArrayFn,
                  precision: str = "fp32") -> dict[str, Any] | None:
    """The task metric through the reference and through the runner, and the change;
    raises `ToleranceError` when it worsened by more than the precision's `metric_drop`."""
    ref = evaluate(spec, reference)
    if ref is None:
        return None
    got = evaluate(spec, runner)
    allowed = spec.tolerance(precision).metric_drop
    drop = ref - got if spec.metric.higher_is_better else got - ref  # > 0: worse than PyTorch fp32
    report = {"name": spec.metric.name, "reference": ref, "artifact": got, "delta": got - ref}
    if allowed is None:
        return report
    if not drop <= allowed:  # a NaN metric fails too
        direction = "lower" if spec.metric.higher_is_better else "higher"
        raise ToleranceError(
            f"{spec.name} [{precision}]: {spec.metric.name} through the artifact is {got:.4g}, {abs(drop):.4g} "
            f"{direction} than PyTorch fp32's {ref:.4g}; the model allows at most {allowed:g} at {precision}"
            + ("; try the other --quantization method, or keep fp32" if precision == "int8" else ""))
    return {**report, "allowed_drop": allowed, "passed": True}


def domain_report(spec: ModelSpec, reference: ArrayFn, runner: ArrayFn, precision: str) -> dict[str, Any] | None:
    """The plugin's domain check at this precision's threshold, or None when it has none."""
    if spec.domain_check is None:
        return None
    return spec.domain_check(reference, runner, precision=precision)


def check_manifest_tolerance(artifact: str, tol: Tolerance, precision: str) -> None:
    """Refuse a tolerance read from a manifest that bounds nothing (see MANIFEST_ATOL_MAX):
    without the plugin, the manifest is all that says how close the artifact must stay."""
    from .errors import ArtifactError

    for key, value, most in (("atol", tol.atol, MANIFEST_ATOL_MAX), ("rtol", tol.rtol, MANIFEST_RTOL_MAX)):
        if not 0 <= value <= most:  # NaN fails too
            raise ArtifactError(f"artifact {artifact}: its manifest's {precision} tolerance {key}={value:g} is not "
                                f"between 0 and {most:g}, so it would bound nothing; re-export it, or verify it "
                                f"where the model's plugin is loaded")


def verify_artifact(path, threads: int | None = None) -> dict[str, Any]:
    """`zoo verify`: re-check an artifact's files, parity and task metric from scratch.

    With the model's plugin loaded, parity is against the PyTorch fp32 reference rebuilt
    from the artifact's weights, and the stored test vectors must reproduce as well
    ("test_vectors"). Without it, the test vectors are the reference (`"reference": "test
    vectors"`), and the checks that run the plugin's code (task metric, domain check) are
    reported as skipped, with what to install, never as passed."""
    from .arguments import check_threads
    from .artifact import Artifact
    from .errors import PluginNotLoadedError, StaleArtifactError
    from .standalone import described_spec, needs_plugin, registered_spec
    from .vectors import check

    threads = check_threads(threads)
    art = Artifact.open(path)
    spec = registered_spec(art)
    sets = art.test_vectors()
    if spec is None:
        model = art.manifest["model"]
        if not sets:
            raise PluginNotLoadedError(needs_plugin(model, "verify this artifact, which predates test vectors"))
        spec = described_spec(art)
        check_manifest_tolerance(art.name, spec.tolerance(art.precision), art.precision)
        report = {"artifact": art.name, "model": spec.name, "backend": art.backend, "precision": art.precision,
                  "device": art.device, "reference": "test vectors",
                  "parity": {**check(spec, art.load(threads=threads), sets, art.precision),
                             "tolerance_from": "manifest"}}
        skipped = {"skipped": needs_plugin(model, "run this check")}
        return {**report, **{key: skipped for key in ("domain", "metric") if art.manifest.get(key) is not None}}
    from .train import module_fn  # imports torch: only here, for the PyTorch reference

    runner = art.load(threads=threads)
    module = spec.build()
    try:
        module.load_state_dict(art.weights(), strict=True)
    except RuntimeError as exc:  # the same name and signature, another architecture: its plugin changed it
        lines = str(exc).strip().splitlines()  # torch's header line, then one line per tensor that does not fit
        detail = (lines[1].strip() if len(lines) > 1 else first_line(exc)).rstrip(".")
        raise StaleArtifactError(f"artifact {art.name}: the artifact's weights do not fit {spec.name} as registered "
                                 f"now ({detail}): re-export it (`zoo export {spec.name} --force`)") from None
    module = module.eval().to(art.device)
    reference = module_fn(module, spec, art.device)
    report: dict[str, Any] = {"artifact": art.name, "model": spec.name, "backend": art.backend,
                              "precision": art.precision, "device": art.device,
                              "reference": "PyTorch fp32 (the artifact's weights)",
                              "parity": _parity_or_stale(art, spec, reference, runner, sets),
                              "test_vectors": check(spec, runner, sets, art.precision) if sets else
                              {"skipped": "the artifact predates test vectors; re-export it to add them"}}
    if spec.domain_check is not None:
        report["domain"] = domain_report(spec, reference, runner, art.precision)
    metric = metric_report(spec, reference, runner, art.precision)
    if metric is not None:
        report["metric"] = metric
    return report


def _parity_or_stale(art, spec: ModelSpec, reference: ArrayFn, runner: ArrayFn, sets) -> dict[str, Any]:
    """Parity of the runner with the reference rebuilt from the artifact's weights. Where it
    fails and the runner still reproduces the test vectors (what the reference computed at
    export), the artifact is as exported and the registered module is not: its forward
    changed since (the same weights and signature, other code), which parity alone blamed on
    the artifact ("differs from PyTorch fp32 by up to ...")."""
    from .errors import StaleArtifactError
    from .vectors import check

    try:
        return parity(spec, reference, runner, art.precision)
    except ToleranceError as exc:
        if not sets:
            raise
        try:
            check(spec, runner, sets, art.precision)
        except VerificationError:
            raise exc from None
        raise StaleArtifactError(
            f"artifact {art.name}: {spec.name} as plugin {spec.plugin or '(unnamed)'} registers it now computes "
            f"something else than when it was exported ({first_line(exc)}), while the artifact still reproduces "
            f"its test vectors: the model's forward changed since the export. Re-export it (`zoo export "
            f"{spec.name} --force`), or verify it where that plugin is not loaded (against its test vectors)") from None
