"""Export a zoo module to one ONNX file with the spec's names and dynamic axes.

Shared by every backend that consumes an ONNX graph (ONNX Runtime, TensorRT, OpenVINO),
so each sees one graph: inputs and outputs named as in the spec, each symbolic axis
dynamic over its `spec.axes` range. The `torch.export`-based exporter
(`dynamo=True`) is tried first; a module it cannot capture falls back to the TorchScript
exporter, and the returned info says which one wrote the file.

Imports torch and onnx (never onnxruntime, unless fp16 is asked for), so the TensorRT
and OpenVINO backends call it on machines without onnxruntime.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

import onnx
import sympy
import torch

from zoo.errors import ExportError, UnsupportedError, ZooError
from zoo.spec import ModelSpec
from zoo.signature import Signature
from zoo.tensors import RNN_WEIGHTS_ASSIGNED, constraint_violation, dynamic_shapes, export_quiet, export_reason

from . import cache

#: 18 is the opset torch's ONNX translation library is written against and is read by
#: every runtime we target (onnxruntime >= 1.14, TensorRT 8.6 and 10), so no converter runs.
DEFAULT_OPSET = 18
#: protobuf cannot hold a file over 2 GiB; above this the weights go to `<file>.data`.
_EXTERNAL_DATA_BYTES = 1 << 30


def export_onnx(module: torch.nn.Module, spec: ModelSpec, example: Mapping[str, torch.Tensor],
                path: str | Path, *, precision: str = "fp32", opset: int = DEFAULT_OPSET) -> dict[str, Any]:
    """Write `module` as an ONNX model at `path` and check it.

    `module` is captured through `zoo.signature.Signature`: inputs bound by name and
    outputs flattened by name, as the PyTorch reference calls it; `example` is a realistic batch keyed by input name,
    whose batch size is not 1 (a size-1 example would be specialized to a constant).
    `precision` "fp16" converts the graph to float16 with ONNX Runtime's own tool while
    keeping float32 inputs and outputs, so the signature does not change, and numerically
    sensitive ops in float32 (`zoo_onnx.fp16`).

    The spec's input and output names are the graph's whatever they are: an internal value
    the exporter named the same ("linear", "relu", "embedding": it names values after their
    ops) is renamed apart (`_unique_names`). A graph ONNX's checker still refuses is an
    `ExportError` with the checker's reason; its file is removed and never cached.

    The dynamo exporter's files are kept in the ONNX cache (`zoo_onnx.cache`), keyed by
    the captured program: a module exported before, by any backend or process, is copied
    from there byte for byte instead of being translated again.

    Returns ``{"exporter": "dynamo" | "torchscript", "opset": N}`` with, for the dynamo
    exporter, ``"onnx_cache": "hit" | "miss" | "off"``, plus
    ``"dynamo_error"`` (why the preferred exporter failed) after a fallback and, for
    fp16, ``"fp16"`` (the converter and the op types it kept in fp32, with counts).
    """
    if precision not in ("fp32", "fp16"):
        raise UnsupportedError(f"ONNX export supports fp32 and fp16, not {precision}")
    if any(t.dtype == "string" for t in spec.inputs + spec.outputs):
        raise UnsupportedError(f"model {spec.name} has string tensors, which ONNX export does not carry; "
                               "export the numeric model and keep pre/post-processing in Python")
    bf16 = [t.name for t in spec.inputs + spec.outputs if t.dtype == "bfloat16"]
    if bf16:  # ONNX Runtime's and OpenVINO's Python tensors are numpy arrays, and numpy has no bfloat16
        raise UnsupportedError(f"model {spec.name} has bfloat16 tensors {bf16}, which the ONNX engines' numpy "
                               "interface cannot carry; declare them float32 and cast in forward (a bf16 model "
                               "is exported with --precision bf16 where the backend offers it)")
    path = Path(path)
    wrapped = Signature(module, spec).eval()
    args = tuple(example[t.name] for t in spec.inputs)
    external = sum(p.numel() * p.element_size() for p in module.parameters()) > _EXTERNAL_DATA_BYTES
    info: dict[str, Any]
    _reuse_torchlib_ops()
    options = {"opset_version": opset, "input_names": [t.name for t in spec.inputs],
               "output_names": [t.name for t in spec.outputs],
               # keyed by the wrapper's one (variadic) parameter
               "dynamic_shapes": {"inputs": dynamic_shapes(spec)}}
    to_store = None  # the cache key of a graph this call translated, stored once it checks
    try:
        with _quiet(), export_quiet(), _dispatch_looked_up_afresh():
            program = None if external else _capture(wrapped, args, options["dynamic_shapes"])
            _refuse_narrowed_axes(spec, program, args)
            _refuse_guarded_axes(spec, program, args)
            # no key (no weights hashed) where the cache is off
            key = None if program is None or cache.cache_dir() is None else cache.program_key(program, options)
            if key is not None and cache.fetch(key, path):
                info = {"exporter": "dynamo", "onnx_cache": "hit"}
            else:
                # the captured program when there is one (the capture the exporter would
                # make itself), else the module: the exporter then tries its other ways
                onnx_program = torch.onnx.export(wrapped if program is None else program,
                                                 args if program is None else (), dynamo=True, verbose=False,
                                                 **options)
                _unique_names(onnx_program.model)
                onnx_program.save(str(path), external_data=external)
                info = {"exporter": "dynamo", "onnx_cache": "off" if key is None else "miss"}
                to_store = key
    except Exception as dynamo_exc:  # any capture failure: the TorchScript exporter may still cope
        _remove(path)
        cause = _zoo_cause(dynamo_exc)
        if cause is not None:  # the module does not fit its spec: no exporter can help
            raise cause from None
        violated = constraint_violation(dynamo_exc)
        if violated is not None:  # a traced graph would keep the example's branch for every size
            raise ExportError(f"could not export {spec.name} to ONNX: torch.export found the spec's axes "
                              f"constrained by the forward: {export_reason(violated)}") from None
        try:
            with _quiet(), _native_stdout_dropped(), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", torch.jit.TracerWarning)
                torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=opset,
                                  input_names=[t.name for t in spec.inputs],
                                  output_names=[t.name for t in spec.outputs],
                                  dynamic_axes=dynamic_axes(spec))
        except Exception as ts_exc:
            _remove(path)
            raise ExportError(f"could not export {spec.name} to ONNX: the dynamo exporter failed with "
                           f"{_summary(dynamo_exc)}; the TorchScript exporter failed with "
                           f"{_summary(ts_exc)}") from ts_exc
        _refuse_traced_branches(spec, path, seen, dynamo_exc)
        info = {"exporter": "torchscript", "dynamo_error": _summary(dynamo_exc)}
    _check(spec, path)  # before the cache keeps it: an invalid graph is never stored
    _refuse_fixed_axes(spec, path)
    if to_store is not None:
        cache.store(to_store, path)
    if precision == "fp16":
        from .fp16 import convert_fp16

        info["fp16"] = convert_fp16(path, external)
        _check(spec, path)
    info["opset"] = _opset(path)
    return info


def _unique_names(model: Any) -> None:
    """Give every internal value of the exported graph (`onnx_ir` model) a name that no
    graph input or output has.

    The dynamo exporter names values after their ops ("linear", "relu", "embedding") and
    then renames the graph's inputs and outputs to the spec's names, without looking at
    the values already so named: an output called "linear" of a model with a Linear layer
    inside would be written twice, which ONNX (single static assignment) forbids. The
    spec's names win; an internal value that holds one of them gets a fresh one (values
    are objects in the IR, so every use of it follows; an initializer's entry too)."""
    from onnxscript import ir  # onnx_ir, or ONNX Script's own IR before that was split out

    graph = model.graph
    own = {id(v) for v in (*graph.inputs, *graph.outputs)}
    reserved = {v.name for v in (*graph.inputs, *graph.outputs) if v.name}
    values = list(graph.initializers.values())
    for node in ir.traversal.RecursiveGraphIterator(graph):
        values.extend(node.outputs)
    clashing = [v for v in values if v.name in reserved and id(v) not in own]
    if not clashing:
        return
    taken = reserved | {v.name for v in values if v.name}
    for value in clashing:
        n = 1
        while f"{value.name}_{n}" in taken:
            n += 1
        value.name = fresh = f"{value.name}_{n}"
        taken.add(fresh)


def _check(spec: ModelSpec, path: Path) -> None:
    """ONNX's checker on the written file (a path, not a loaded proto, so that external
    data is checked too): an invalid graph is an `ExportError` and is removed."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        _remove(path)
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise ExportError(f"could not export {spec.name} to ONNX: the graph written is not valid ONNX "
                          f"({lines[0].rstrip('.') if lines else type(exc).__name__}), so it is not kept") from None


def _refuse_fixed_axes(spec: ModelSpec, path: Path) -> None:
    """Refuse a graph whose input fixes an axis the spec declares dynamic: the capture made it
    a constant (a loop over it unrolled, its size used as a number), and the engine then
    refused every other size with its own words ("Got invalid dimensions for input: x"),
    found only by test vectors at another size, naming neither the axis nor the cause."""
    graph = onnx.load(str(path), load_external_data=False).graph
    found = {value.name: value.type.tensor_type.shape.dim for value in graph.input}
    for t in spec.inputs:
        for d, (axis, dim) in enumerate(zip(t.shape, found.get(t.name, ()))):
            declared = spec.axes.get(axis) if isinstance(axis, str) else None
            if declared is None or declared.min == declared.max or not dim.HasField("dim_value"):
                continue
            _remove(path)
            raise ExportError(f"could not export {spec.name} to ONNX: the graph fixes axis {axis!r} (input {t.name!r}, "
                              f"dimension {d}) to {dim.dim_value}, where the spec's range is {declared.min} to "
                              f"{declared.max}: the capture made the size a constant (a loop over it unrolled, the "
                              f"size used as a number), so the engine would refuse every other size")


#: what the tracer says it converted a tensor to ("Converting a tensor to a Python boolean ..."),
#: kept in the graph as the example's value: always a tensor's values
BAKED = ("boolean", "number", "list")
#: conversions the tracer also warns of for a size (`int(x.shape[1])`, `math.sqrt(q.size(-1))`),
#: refused only where the line reads no size: a size is checked by parity at every set's sizes
SIZE_OR_VALUE = ("integer", "float")
SIZE_WORDS = (".shape", ".size(", ".dim(", ".ndim", "len(", ".numel(")


def _baked_value(w) -> bool:
    """Whether a tracer warning is a tensor's values made a Python condition or number."""
    import linecache

    message = str(w.message)
    if any(f"to a Python {kind}" in message for kind in BAKED):
        return True
    if not any(f"to a Python {kind}" in message for kind in SIZE_OR_VALUE):
        return False
    line = linecache.getline(w.filename, w.lineno)
    return not any(word in line for word in SIZE_WORDS)


def _refuse_traced_branches(spec: ModelSpec, path: Path, seen: list, dynamo_exc: BaseException) -> None:
    """The TorchScript tracer runs the forward once and records the operations it saw: a
    Python `if` on a tensor's values is traced as the branch the example took, and the
    graph then computes that branch for every input. Parity cannot see it when the other
    branch is rare (a clamp of outliers). So for a Python number or list made of tensor
    values (`int(t)`, `t.item()`, `t.tolist()`), which the graph keeps as the example's
    constant. The tracer warns at each such conversion; the export is refused there,
    naming the line. (Other tracer warnings, a size made a Python number, are shown as is.)"""
    branches = [w for w in seen if issubclass(w.category, torch.jit.TracerWarning) and _baked_value(w)]
    for w in seen:
        if w not in branches:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not branches:
        return
    _remove(path)
    where = ", ".join(sorted({f"{Path(w.filename).name}:{w.lineno}" for w in branches}))
    raise ExportError(f"could not export {spec.name} to ONNX: its forward branches on tensor values in Python "
                      f"or turns them into Python numbers ({where}). The dynamo exporter cannot capture that "
                      f"({_summary(dynamo_exc)}), and the TorchScript tracer would keep the branch or the number "
                      "its example gave, for every input. Write it as tensor operations (torch.where, "
                      "torch.clamp) or with torch.cond")


def _refuse_narrowed_axes(spec: ModelSpec, program: torch.export.ExportedProgram | None, args: tuple) -> None:
    """Refuse a capture that holds a dynamic axis to fewer sizes than the spec declares.

    Where `torch.export` alone raises a constraint violation (a branch on a size, `if
    x.shape[1] > 10`: the torch backend refuses it so), the ONNX exporter's capture turns
    the guard into a runtime assertion and narrows the axis's range; the graph written
    computes the example's branch and drops the assertion, so other sizes are wrong and
    parity found it only on test vectors, naming neither the axis nor the branch."""
    if program is None:
        return
    for symbol, held in _axis_symbols(spec, program, args).items():
        declared, bounds = spec.axes[held.axis], program.range_constraints.get(symbol)
        if declared.min == declared.max or bounds is None:
            continue
        low, high = bounds.lower, bounds.upper
        if (high.is_finite and int(high) < declared.max) or int(low) > max(declared.min, 2):
            raise ExportError(
                f"could not export {spec.name} to ONNX: its forward holds axis {held.axis!r} (input {held.input!r}, "
                f"dimension {held.dim}) to sizes {int(low)} to {high}, where the spec's range is {declared.min} to "
                f"{declared.max}: it branches on or checks that size, and the graph would compute the example's "
                f"branch for every size. Declare the range the forward takes in the spec's axes, or write the "
                f"condition with tensor operations (torch.where) or torch.cond")


def _refuse_guarded_axes(spec: ModelSpec, program: torch.export.ExportedProgram | None, args: tuple) -> None:
    """Refuse a capture that holds a dynamic axis to a condition other than a range.

    A forward that needs an even length (`if x.shape[1] % 2`, a reshape into pairs) makes
    `torch.export` guard on it; alone it raises a constraint violation (the torch backend
    refuses it so), but the ONNX exporter's capture defers such a guard to a runtime
    assertion, which the graph written drops: it keeps the example's branch for every size
    (or fails in the engine), and parity, whose samples had the example's length, passed.
    The deferred assertions are read from the capture's `ShapeEnv`; one that a size in the
    spec's range fails (the other axes at the example's sizes) is refused, naming it."""
    if program is None:
        return
    axes = _axis_symbols(spec, program, args)
    shape_env = next((a.size.node.shape_env for a in axes.values()), None)
    asserts = getattr(shape_env, "deferred_runtime_asserts", None) or {}
    for held in [a.expr for found in asserts.values() for a in found]:
        if not held.free_symbols <= axes.keys():
            continue  # on a data-dependent (unbacked) size too: not the spec's axes alone
        for symbol in sorted(held.free_symbols, key=str):
            name, d, axis = axes[symbol].input, axes[symbol].dim, axes[symbol].axis
            declared = spec.axes[axis]
            others = {s: sympy.Integer(axes[s].example) for s in held.free_symbols if s != symbol}
            # from 2: sizes 0 and 1 are the capture's own (`backed_size_oblivious`), as in `_refuse_narrowed_axes`
            failing = [n for n in range(max(declared.min, 2), min(declared.max, declared.min + 4096) + 1)
                       if held.xreplace({**others, symbol: sympy.Integer(n)}) == sympy.false]
            if not failing:
                continue
            names = {s: sympy.Symbol(axes[s].axis) for s in held.free_symbols}
            raise ExportError(
                f"could not export {spec.name} to ONNX: input {name!r} axis {d} ({axis!r}) {_rule(held, symbol)} "
                f"(torch.export found {held.xreplace(names)}), so sizes {', '.join(map(str, failing[:5]))}"
                f"{', ...' if len(failing) > 5 else ''} of the spec's range {declared.min} to {declared.max} break it, "
                f"and the graph would not check them (it keeps the example's branch, or fails in the engine). "
                f"Declare the axis static in the spec's axes (AxisRange(n, n, n)), or make the forward accept "
                f"every length in the range (pad the input to the length it needs inside forward)")


class _Axis(NamedTuple):
    """A dynamic axis in the capture: its symbolic size, the first input and dimension that
    hold it, the axis's name in the spec and its size in the example."""

    size: torch.SymInt
    input: str
    dim: int
    axis: str
    example: int


def _axis_symbols(spec: ModelSpec, program: torch.export.ExportedProgram, args: tuple) -> dict[Any, _Axis]:
    """Each dynamic axis of the spec's inputs, by its symbol in the capture."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    found: dict[Any, _Axis] = {}
    for t, name, arg in zip(spec.inputs, program.graph_signature.user_inputs, args):  # the spec's order (`Signature`)
        value = nodes[name].meta.get("val")
        for d, axis in t.dynamic_axes.items():
            size = value.shape[d] if value is not None and d < value.dim() else None
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                found.setdefault(size.node.expr, _Axis(size, t.name, d, axis, int(arg.shape[d])))
    return found


def _rule(held: Any, symbol: Any) -> str:
    """What `held` asks of `symbol`, in words where it is a multiple ("must be even")."""
    if isinstance(held, sympy.Eq) and sympy.Integer(0) in held.args:
        mod = next(a for a in held.args if a != 0)
        if type(mod).__name__ in ("Mod", "PythonMod") and mod.args[0] == symbol and mod.args[1].is_Integer:
            k = int(mod.args[1])
            return "must be even" if k == 2 else f"must be a multiple of {k}"
    return "must meet a condition"


def _capture(module: torch.nn.Module, args: tuple, dynamic: Mapping[str, Any]) -> torch.export.ExportedProgram | None:
    """`module` captured as `torch.onnx.export(dynamo=True)` captures it first (its
    non-strict `torch.export` strategy, with that strategy's patches), or None where that
    fails or torch's exporter is not this shape: `torch.onnx.export` is then given the
    module and tries its other ways itself. Capturing here makes the program the ONNX
    cache's key (`zoo_onnx.cache`); the graph written from it is the one the exporter
    writes from the module."""
    try:
        from torch.onnx._internal.exporter import _capture_strategies
        strategy = _capture_strategies.TorchExportNonStrictStrategy(verbose=False)
    except (ImportError, AttributeError, TypeError):
        return None
    return strategy(module, args, None, dynamic).exported_program


@contextlib.contextmanager
def _dispatch_looked_up_afresh() -> Iterator[None]:
    """Capture and translate with torch's Python kernels looked up as a fresh process would,
    and leave none of the capture's behind.

    For a dynamic-shape export, torch's ONNX capture swaps the Python kernel of `aten.gru`
    and `aten.lstm` for a `while_loop` that keeps the sequence axis dynamic
    (`torch.export._patches`), by assigning into the op's `py_kernels` without clearing the
    op's memo of which kernel serves each dispatch key, as `py_impl` does. So the memo
    decides: after any earlier trace of a GRU outside the swap (the exporter's own type
    promotion pass, the torch backend's torch.export), a later capture ran the unrolled GRU
    and fixed the time axis to the example's length, and the graph refused every other one;
    after a capture whose translation the ONNX cache served, the while_loop stayed in place
    for the torch backend's export. The memo of every op used so far is emptied before and
    after (torch empties it itself when it restores kernels, in `run_decompositions`);
    where torch keeps no such memo, nothing is done."""
    def forget() -> None:
        for op in getattr(torch._ops, "get_cached_ops", lambda: ())():
            cached = getattr(op, "_dispatch_cache", None)
            if isinstance(cached, dict):
                cached.clear()

    forget()
    try:
        yield
    finally:
        forget()


def _reuse_torchlib_ops() -> None:
    """Build the list of ONNX Script's torch functions once per process, not on every export.

    `torch.onnx.export(dynamo=True)` makes a new op registry on every call from ONNX Script's
    `get_torchlib_ops()`, which reads each of its ~500 functions' `function_ir` only for
    its domain, and that property re-parses the function's source each time: about a
    second of every export (torch 2.13, onnxscript 0.7), more than capturing a small
    model. The list depends only on the functions ONNX Script registered at import, so it
    is kept after the first call and each export still builds its own registry from a copy
    (`custom_translation_table` entries go into that registry, never into the list).

    Where torch's lazy import of ONNX Script is not this shape (another torch release), the
    exporter is left as it is: slower, never wrong.
    """
    module = torchlib_api()
    original = getattr(module, "get_torchlib_ops", None)
    if original is None or hasattr(original, "zoo_reused"):
        return
    once = functools.cache(original)

    @functools.wraps(original)
    def get_torchlib_ops() -> list:
        return list(once())

    get_torchlib_ops.zoo_reused = True  # type: ignore[attr-defined]
    module.get_torchlib_ops = get_torchlib_ops


def torchlib_api() -> types.ModuleType | None:
    """The ONNX Script module whose `get_torchlib_ops` torch's exporter calls, or None where
    torch's lazy import of it is not this shape."""
    try:
        from torch.onnx._internal._lazy_import import onnxscript_apis
        return (onnxscript_apis if isinstance(onnxscript_apis, types.ModuleType)
                else importlib.import_module(onnxscript_apis._name))  # its `_LazyModule`
    except (ImportError, AttributeError):
        return None


def dynamic_axes(spec: ModelSpec) -> dict[str, dict[int, str]]:
    """The TorchScript exporter's form: symbolic axes by tensor name, outputs included."""
    return {t.name: t.dynamic_axes for t in spec.inputs + spec.outputs if t.dynamic_axes}


def _zoo_cause(exc: BaseException) -> ZooError | None:
    """The zoo error under an exporter's own wrapping of it, if any (the dynamo exporter
    re-raises what the traced module raised as its TorchExportError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ZooError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' noise, not their errors.

    The dynamo exporter logs a warning per missing optional op library ("torchvision is
    not installed. Skipping torchvision::nms") and torch emits Deprecation/Future
    warnings from its own internals; none of it is about the user's model. Other
    warnings (a TracerWarning about a data-dependent branch, say) still show.
    """
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            # Said once per input after the first that shares an axis: the sharing we asked for.
            warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
            warnings.filterwarnings("ignore", message=RNN_WEIGHTS_ASSIGNED)
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _native_stdout_dropped() -> Iterator[None]:
    """The TorchScript exporter turns torch's C++ ONNX log on whatever its caller asks (its
    `setup_onnx_logging` tests the function `_jit_is_onnx_log_enabled`, not its value, and
    so never turns it off again) and, when a pass fails, prints the whole TorchScript graph
    to the process's standard output: some forty lines of torch's IR before our one-line
    error, and in the middle of a `--json` answer. That stream is file descriptor 1, so
    while the exporter runs, descriptor 1 writes to a file that is then dropped; the log is
    turned off again after."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            try:
                yield
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                torch._C._jit_set_onnx_log_enabled(False)
    finally:
        os.close(saved)


def _opset(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _remove(path: Path) -> None:
    for p in (path, path.with_name(f"{path.name}.data")):
        p.unlink(missing_ok=True)


def _summary(exc: BaseException) -> str:
    """The root cause's first line: the dynamo exporter wraps it in pages of advice."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # the exporter colours its messages
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]
