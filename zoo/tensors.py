"""Small conversions between the spec's signature and torch/numpy, shared by the core
and the backends so every exporter sees the same dynamic axes and dtypes."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from .errors import SpecError, debugging, first_line
from .inputs import check_names
from .spec import ModelSpec

# A server hands runners read-only views of a request's bytes, and `torch.from_numpy`
# shares them without a copy; torch warns that writing to such a tensor is undefined.
# Inference never writes to its inputs, so the warning says nothing here.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
#: torch.export's warning about an RNN's own `_flat_weights`, which nn.LSTM and nn.GRU reassign
#: on every call ("The tensor attributes self.module.gru._flat_weights[0], ... were assigned
#: during export"): torch's internals, not the user's model (a forward that keeps state in
#: attributes of its own is refused by `zoo check`)
RNN_WEIGHTS_ASSIGNED = r"The tensor attributes .*_flat_weights\[\d+\].* were assigned during export"

#: the dtype a module is cast to for each precision (int8 is a backend's business).
PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def dynamic_shapes(spec: ModelSpec) -> tuple[dict[int, torch.export.Dim], ...]:
    """`torch.export` dynamic shapes, one entry per positional input in spec order.

    One `Dim` per axis name, shared by every input that uses it, so the exporter knows
    that "batch" is the same size everywhere. Positional: exporters capture the module
    through `zoo.signature.Signature`, which takes the inputs in spec order.
    """
    # an axis whose range is one size (min == max) is static: torch.export has no Dim for it
    dims = {name: torch.export.Dim(_identifier(name), min=r.min, max=r.max) for name, r in spec.axes.items()
            if r.min < r.max}
    return tuple({i: dims[axis] for i, axis in t.dynamic_axes.items() if axis in dims} for t in spec.inputs)


def hinted_shapes(spec: ModelSpec) -> tuple[dict[int, Any], ...]:
    """As `dynamic_shapes`, each range given as a hint (`Dim.DYNAMIC`) instead of a claim:
    torch.export then turns a guard on the axis it cannot prove from the range into a check
    the program runs, instead of refusing the capture."""
    hints = {name: torch.export.Dim.DYNAMIC(min=r.min, max=r.max) for name, r in spec.axes.items() if r.min < r.max}
    return tuple({i: hints[axis] for i, axis in t.dynamic_axes.items() if axis in hints} for t in spec.inputs)


#: torch's loggers that speak while torch.export fails ("Unable to find user code
#: corresponding to {u0}", the exportdb's case of an error)
_EXPORT_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch.export", "torch._export", "torch._dynamo")


@contextlib.contextmanager
def export_quiet() -> Iterator[None]:
    """torch.export's own account of a failed capture left out: the partial graph it
    prints to stderr (`print(e.partial_fx_graph, file=sys.stderr)`, forty lines of torch's
    IR for a branch on a tensor value, twice) and its loggers' lines, before the one-line
    error that names the cause (`export_reason`). All of it stays with ZOO_DEBUG set."""
    if debugging():
        yield
        return
    loggers = [logging.getLogger(name) for name in _EXPORT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def export_reason(exc: BaseException) -> str:
    """torch.export's error in one line: its first, and for violated constraints each
    "- ..." line under it that says which axis and why ("... specialized it to be a
    constant (6)"), which the first line only announces."""
    branch = _value_branch(exc)
    if branch is not None:
        return (f"its forward branches on tensor values in Python ({branch}), and torch.export captures one graph "
                f"for every input, so it cannot follow such a branch. Write the condition as tensor operations "
                f"(torch.where, torch.clamp) or with torch.cond")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    details = [line[2:] for line in lines[1:] if line.startswith("- ")]
    reason = " ".join([first_line(exc), *details])
    specialized = "specialized it to be a constant" in reason
    reason = reason if len(reason) <= 1500 else reason[:1500] + "..."  # the advice below is never cut
    if specialized:
        reason += (" (the model's code fixes that axis to the example's size: give it one size in the spec's axes, "
                   "AxisRange(n, n, n), or remove what fixes it)")
    elif constraint_violation(exc) is not None:
        reason = (reason.rstrip(".") + ": declare the axis static in the spec's axes with one size, AxisRange(n, n, "
                  "n), or remove the condition on its size from forward (write it with tensor operations, "
                  "torch.where, or torch.cond, or make the forward accept every size in the range)")
    return reason


#: where torch.export says the user's code asked for a data-dependent value ("The following
#: call raised this error:\n  File "m.py", line 15, in forward\n    if x.sum() > 0:")
_RAISED_AT = re.compile(r'The following call raised this error:\s*File "([^"]+)", line (\d+), in \w+\s*\n\s*(.+)')


def _value_branch(exc: BaseException) -> str | None:
    """"FILE:LINE: CODE" of a Python branch on a tensor's value that torch.export could not
    capture (its GuardOnDataDependentSymNode), or None for other failures."""
    for cause in _causes(exc):
        if type(cause).__name__ == "GuardOnDataDependentSymNode":
            found = _RAISED_AT.search(str(cause))
            return f"{Path(found[1]).name}:{found[2]}: {found[3].strip()}" if found else "a data-dependent condition"
    return None


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and what it was raised from or during, in turn (each once)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        yield exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__


def constraint_violation(exc: BaseException | None) -> BaseException | None:
    """torch.export's refusal of a dynamic axis the forward constrains (a branch on its
    size, a reshape that needs an even length), found under any wrapping of it; None for
    other failures."""
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    for cause in _causes(exc):
        kind = getattr(getattr(cause, "error_type", None), "name", None)  # torch._dynamo's UserError
        if isinstance(cause, ConstraintViolationError) or kind == "CONSTRAINT_VIOLATION":
            return cause
    return None


def _identifier(axis: str) -> str:
    # Dim names must be Python identifiers; a spec may name an axis "num-atoms".
    name = re.sub(r"\W", "_", axis)
    return name if name.isidentifier() else f"_{name}"


def example_inputs(spec: ModelSpec, device: str = "cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    """A realistic batch to trace with: the typical batch size, never 1, so that tracing
    does not specialize the batch axis to a constant."""
    r = spec.axes["batch"]
    batch = r.opt if r.opt > 1 else min(2, r.max)
    inputs = spec.sample(batch, np.random.default_rng(seed))
    if not isinstance(inputs, Mapping) or any(t.name not in inputs for t in spec.inputs):
        # the plugin's sample, as `zoo check` words it (a forward that skips a bad sample passes its check)
        raise SpecError(f"{spec.name}: sample({batch}, rng) returned {type(inputs).__name__}"
                        f"{f' with keys {sorted(inputs)}' if isinstance(inputs, Mapping) else ''}; the spec expects "
                        f"a dict of arrays by input name {[t.name for t in spec.inputs]}")
    for axis, span in spec.axes.items():  # other dynamic axes at 1 (a typical length of 1): 2, for the same reason
        sizes = {inputs[t.name].shape[d] for t in spec.inputs for d, a in t.dynamic_axes.items() if a == axis}
        if axis != "batch" and sizes == {1} and span.max > 1:
            from .bench.measure import at_length

            inputs = at_length(spec, inputs, axis, 2)
    return to_torch(inputs, spec, device)


def to_torch(inputs: Mapping[str, Any], spec: ModelSpec, device: str = "cpu") -> dict[str, torch.Tensor]:
    check_names(inputs, spec, spec.name)
    out = {}
    for t in spec.inputs:
        value = inputs[t.name]
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(_native(value))
        out[t.name] = tensor.to(device=device, dtype=TORCH_DTYPES[t.dtype])
    return out


def _native(value: Any) -> np.ndarray:
    """A row-major array in this machine's byte order, the only one `torch.from_numpy` takes
    (a big-endian array, read from a file written elsewhere, is copied)."""
    array = np.asarray(value)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))


def call_module(module: torch.nn.Module, spec: ModelSpec, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run a zoo module: inputs bound by name, outputs flattened by name (`zoo.signature`)."""
    from .signature import call, flatten

    return flatten(call(module, spec, inputs), spec)


def cpu_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A snapshot of the module's weights: detached contiguous CPU copies (what
    safetensors stores, unaffected by later training steps)."""
    return {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}


def state_dict_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """A hash of the weights' names, dtypes, shapes and bytes, independent of file layout."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
