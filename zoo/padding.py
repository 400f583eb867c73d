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
tolerance.
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


def padding_safe(spec: ModelSpec, fn: Callable[[dict[str, Any]], Mapping[str, Any]], inputs: Mapping[str, Any],
                 precision: str = "fp32") -> tuple[bool, str]:
    """(True, "") where zero-padding each dynamic axis of `inputs` leaves `fn`'s outputs,
    cut back, within `precision`'s tolerance; else (False, why)."""
    axes = ragged_axes(spec)
    if not axes:
        return True, ""
    for t in spec.outputs:  # a padded request's part of such an axis cannot be cut back out of the batch's
        own = [a for d, a in t.dynamic_axes.items() if d > 0 and a not in axes]
        if own:
            return False, (f"output {t.name} has axis {own[0]!r}, which no input has, so a padded request's "
                           f"part of it cannot be cut back to what the request alone gives")
    tol = spec.tolerance(precision)
    want = {k: as_numpy(v) for k, v in fn(dict(inputs)).items()}
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
            if not np.issubdtype(ref.dtype, np.floating):
                if not np.array_equal(out, ref):
                    return False, f"zero-padding {axis} by {extra} changes output {t.name}"
                continue
            ref64, err = ref.astype(np.float64), np.abs(out.astype(np.float64) - ref)
            finite = np.abs(ref64[np.isfinite(ref64)])
            magnitude = float(finite.max()) if finite.size else 0.0
            atol = tol.atol if precision == "int8" else effective_atol(tol.atol, magnitude)
            if not np.all(err <= atol + tol.rtol * np.abs(ref64)):
                return False, (f"zero-padding {axis} by {extra} changes output {t.name} by up to "
                               f"{float(np.nanmax(err)):.3g} (its {precision} tolerance: atol={atol:.3g})")
    return True, ""
