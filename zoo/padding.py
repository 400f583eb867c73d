"""Whether zero-padding a model's dynamic axes changes its outputs: the condition for
batching requests of different lengths into one execution (`zoo serve`'s ragged batching).

A ragged batch pads every request with zeros to the longest one (`serve.batcher.merge`)
and cuts each output back to the request's own length. That gives a request what it gets
alone only where the model takes zeros at the end of an axis as absent: a mask input that
zero-padding sets to "absent" (`attention_mask` 1/0, a graph net's `atom_mask`), or a
causal model (no position before the padding sees it). A model without a mask (an LSTM
reading its last step) or with PyTorch's `key_padding_mask` convention (True = padding, so
a zero is a real token) is changed by it. Triton batches only identical shapes unless a
model's configuration asks for ragged batching; the zoo asks the model itself:
`padding_safe` runs it on a sample and on the same sample padded, and the server batches
requests of different lengths only for a model that passes, at the artifact's own
tolerance. A sample of values on both sides of zero hides a max or min over the axis (a
zero below every real maximum changes nothing), so the probe is repeated with the
sample's real-valued inputs shifted all below zero and all above it.

Dynamic batching itself, of requests of one shape, is right only where a model's rows do
not see each other: a model normalizing each row by the batch's mean, or taking a softmax
or a max over the batch axis, answers a request merged with others differently than alone.
`rows_independent` runs a sample's rows together and apart, and the server merges requests
only for a model that passes, at the same tolerance.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .spec import ModelSpec
from .arrays import as_numpy
from .errors import first_line
from .verify import effective_atol

#: positions added to the axis under test (fewer where the axis's range ends sooner)
PAD = 3


def ragged_axes(spec: ModelSpec) -> list[str]:
    """The dynamic non-batch axes of the inputs: those a ragged batch pads (by name: a
    time-major input has its batch axis second)."""
    return sorted({a for t in spec.inputs for a in t.dynamic_axes.values() if a != "batch"})


def padded(spec: ModelSpec, inputs: Mapping[str, Any], axis: str, extra: int) -> dict[str, np.ndarray]:
    """`inputs` with `extra` zeros appended along every dimension that is `axis`."""
    out = {}
    for t in spec.inputs:
        x = np.asarray(inputs[t.name])
        widths = [(0, extra if t.dynamic_axes.get(d) == axis else 0) for d in range(x.ndim)]
        out[t.name] = np.pad(x, widths) if any(w for _, w in widths) else x
    return out


def shifted(spec: ModelSpec, inputs: Mapping[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    """`inputs` with every real-valued input that is not a 0/1 mask moved all below zero,
    and all above it (its spread kept): where padding's zeros are the smallest or largest
    value along the axis. None where no input is such."""
    values = {t.name: np.asarray(inputs[t.name]) for t in spec.inputs}
    real = [k for k, x in values.items() if np.issubdtype(x.dtype, np.floating) and x.size
            and np.isfinite(x).all() and not np.isin(x, (0, 1)).all()]
    if not real:
        return {}
    return {"shifted below zero": {**values, **{k: (values[k] - values[k].max() - 1).astype(values[k].dtype)
                                               for k in real}},
            "shifted above zero": {**values, **{k: (values[k] - values[k].min() + 1).astype(values[k].dtype)
                                               for k in real}}}


def padding_safe(spec: ModelSpec, fn: Callable[[dict[str, Any]], Mapping[str, Any]], inputs: Mapping[str, Any],
                 precision: str = "fp32") -> tuple[bool, str]:
    """(True, "") where zero-padding each dynamic axis of `inputs` leaves `fn`'s outputs,
    cut back, within `precision`'s tolerance, also with the inputs shifted (`shifted`);
    else (False, why)."""
    axes = ragged_axes(spec)
    if not axes:
        return True, ""
    for t in spec.outputs:  # a padded request's part of such an axis cannot be cut back out of the batch's
        own = [a for d, a in t.dynamic_axes.items() if d > 0 and a not in axes]
        if own:
            return False, (f"output {t.name} has axis {own[0]!r}, which no input has, so a padded request's "
                           f"part of it cannot be cut back to what the request alone gives")
    safe, why = _unchanged(spec, fn, inputs, axes, precision, fn(dict(inputs)))
    for label, probe in shifted(spec, inputs).items():
        if not safe:
            break
        try:
            want = fn(probe)
        except Exception:  # noqa: BLE001 - values the model does not take: nothing to compare
            continue
        if all(np.isfinite(v).all() for v in map(as_numpy, want.values()) if np.issubdtype(v.dtype, np.floating)):
            safe, why = _unchanged(spec, fn, probe, axes, precision, want)  # else outside its domain (a log)
            why = why if safe else f"{why}, its sample's values {label}"
    return safe, why


def _unchanged(spec: ModelSpec, fn: Callable[[dict[str, Any]], Mapping[str, Any]], inputs: Mapping[str, Any],
               axes: list[str], precision: str, outputs: Mapping[str, Any]) -> tuple[bool, str]:
    want = {k: as_numpy(v) for k, v in outputs.items()}
    for axis in axes:
        size = next(np.shape(inputs[t.name])[d] for t in spec.inputs for d, a in t.dynamic_axes.items()
                    if d > 0 and a == axis)
        extra = min(PAD, spec.axes[axis].max - size)
        if extra < 1:
            return False, f"its sample is at the longest {axis} ({size}), so padding it could not be tried"
        try:
            got = {k: as_numpy(v) for k, v in fn(padded(spec, inputs, axis, extra)).items()}
        except Exception as exc:  # noqa: BLE001 - the model's forward, or the engine, at a longer length
            return False, (f"it fails with {axis} padded from {size} to {size + extra} "
                           f"({type(exc).__name__}: {first_line(exc)})")
        for t in spec.outputs:
            cut = tuple(slice(0, size) if d > 0 and t.dynamic_axes.get(d) == axis else slice(None)
                        for d in range(got[t.name].ndim))
            ref, out = want[t.name], got[t.name][cut]
            if out.shape != ref.shape:
                return False, f"output {t.name} has shape {list(out.shape)} padded, {list(ref.shape)} not"
            change = _change(ref, out, spec, precision)
            if change is not None:
                return False, f"zero-padding {axis} by {extra} changes output {t.name}{change}"
    return True, ""


def rows_independent(spec: ModelSpec, fn: Callable[[dict[str, Any]], Mapping[str, Any]], inputs: Mapping[str, Any],
                     precision: str = "fp32") -> tuple[bool, str]:
    """(True, "") where `fn`'s outputs for `inputs`' rows run together are, within
    `precision`'s tolerance, what its first row gets alone and what the other rows get
    without it (its first `batch.min` rows, where the model takes no fewer rows); else
    (False, why). Three runs: a row alone is where a statistic over the batch moves most, and a split into halves would miss it where a sample's rows repeat
    (rows drawn from a stored set smaller than the batch: a, b, a, b has the mean of a, b).
    Inputs without the batch axis (side inputs) go whole to each run, as the batcher
    passes them; a sample of fewer than twice `batch.min` rows, or a model with an output
    without the batch axis, is not batched and passes."""
    batched = {t.name for t in spec.inputs if t.shape[:1] == ("batch",)}
    rows = min((np.shape(inputs[name])[0] for name in batched), default=0)
    least = spec.axes["batch"].min if "batch" in spec.axes else 1  # a part below it would be refused
    if rows < 2 * least or not all(t.shape[:1] == ("batch",) for t in spec.outputs):
        return True, ""
    whole = {k: as_numpy(v) for k, v in fn(dict(inputs)).items()}
    for part in (slice(0, least), slice(least, rows)):
        alone = fn({k: v[part] if k in batched else v for k, v in inputs.items()})
        for t in spec.outputs:
            ref, out = as_numpy(alone[t.name]), whole[t.name][part]
            if out.shape != ref.shape:
                return False, (f"a row's output {t.name} has shape {list(out.shape[1:])} batched with "
                               f"others, {list(ref.shape[1:])} alone")
            change = _change(ref, out, spec, precision)
            if change is not None:
                return False, f"a row's output {t.name} changes when batched with others{change}"
    return True, ""


def _change(ref: np.ndarray, out: np.ndarray, spec: ModelSpec, precision: str) -> str | None:
    """None where `out` is `ref` (exactly, for integers; within `precision`'s tolerance for
    floats), else what a message adds: "" for integers, " by up to X (...)" for floats."""
    if not np.issubdtype(ref.dtype, np.floating):
        return None if np.array_equal(out, ref) else ""
    beyond = _beyond_tolerance(ref, out, spec, precision)
    return None if beyond is None else (f" by up to {beyond[0]:.3g} (its {precision} tolerance: "
                                        f"atol={beyond[1]:.3g})")


def _beyond_tolerance(ref: np.ndarray, out: np.ndarray, spec: ModelSpec, precision: str) -> tuple[float, float] | None:
    """How far floating-point `out` is from `ref` at most, and the atol it exceeds; None where
    it is within `precision`'s tolerance (the atol relative to `ref`'s magnitude, as `verify`
    holds outputs)."""
    tol = spec.tolerance(precision)
    ref64, err = ref.astype(np.float64), np.abs(out.astype(np.float64) - ref)
    finite = np.abs(ref64[np.isfinite(ref64)])
    magnitude = float(finite.max()) if finite.size else 0.0
    atol = tol.atol if precision == "int8" else effective_atol(tol.atol, magnitude)
    if np.all(err <= atol + tol.rtol * np.abs(ref64)):
        return None
    return float(np.nanmax(err)), atol
