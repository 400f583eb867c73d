"""The inputs a model takes: one check of a call's tensors against its spec, made by the
server on every request and by every runner `Artifact.load` returns (`CheckedRunner`),
so a notebook, `zoo verify` and a server refuse the same inputs with the same message.

Left to the backends, a bad input fails differently on each, and on some silently (found
by a tester): float ids were truncated to integers everywhere, an id outside the
embedding table read garbage on OpenVINO and row 9 for -1 on ONNX Runtime, a batch beyond
the exported range ran on ONNX Runtime and OpenVINO but not on torch. So before any
backend sees them, each input is checked for, in this order (the server's):

- its name: every input of the spec, no other;
- its type: an array (numpy or torch; a list or a number as the numpy array it makes), of
  an element type that casts to the declared one without loss (int32 ids to int64), or
  with rounding only (float64 features to float32, float32 to bfloat16). Floats for an
  integer input are refused, integers its type cannot hold, and finite numbers beyond its
  range, which the cast would make infinite (1e5 for float16);
- its shape: the rank, the fixed sizes, every dynamic axis within its exported range and
  of one size wherever it appears;
- its values: `TensorSpec.value_range` (token ids within the vocabulary).

Each refusal is an `InputError` naming the input, worded as the server answers it (400).
What passes is cast to the declared types (`as_declared`), so a backend's runner is given
those and no other, a plugin's too. The server checks a request's wire datatypes itself
(they must match exactly, as in Triton), then its arrays with `check_arrays`; its runners
are the unchecked ones.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .arrays import as_numpy
from .errors import InputError, PluginError, SpecError, VerificationError, first_line
from .serve import datatypes as dt
from .spec import ModelSpec, TensorSpec

#: (numpy kind, bytes) of an element -> its Open Inference Protocol name, as messages say it
_V2_NAMES = {(t.kind, t.itemsize): name for name, t in dt.NUMPY_TYPES.items() if t is not None and name != "BF16"}
#: the values each integer dtype of a spec holds
_INTEGER_RANGES = {"bool": (0, 1), **{d: (int(np.iinfo(d).min), int(np.iinfo(d).max))
                                     for d in ("uint8", "int8", "int32", "int64")}}
#: each float dtype of a spec: (its largest finite value, the least magnitude a cast to it
#: rounds to infinity: halfway from the largest to the next power of two, which rounding to
#: nearest even takes up). bfloat16 is float32 with 16 fewer mantissa bits: float32's range
#: but for float32's largest values, above 3.396e38.
_FLOAT_RANGES = {"float16": (65504.0, 65520.0),
                 "bfloat16": (2.0 ** 128 * (1 - 2.0 ** -8), 2.0 ** 128 * (1 - 2.0 ** -9)),
                 "float32": (float(np.finfo(np.float32).max), 2.0 ** 128 * (1 - 2.0 ** -25))}


def wire_shape(shape: Sequence[int | str]) -> list[int]:
    """A spec's shape as the protocol writes it: -1 for each dynamic axis."""
    return [d if isinstance(d, int) else -1 for d in shape]


def check_names(given: Iterable[str], spec: ModelSpec, model: str, alternative: str = "") -> None:
    """Refuse inputs other than the spec's; `alternative` adds what else the model takes."""
    want, given = [t.name for t in spec.inputs], list(given)
    missing, extra = [n for n in want if n not in given], [n for n in given if n not in want]
    if missing or extra:
        raise InputError(f"model {model} takes inputs {want}{alternative}; missing {missing}, unexpected {extra}")


def datatype_error(name: str, datatype: str, want: str, model: str) -> InputError:
    return InputError(f"input {name!r} has datatype {datatype}; model {model} takes {want}")


def check_arrays(arrays: Mapping[str, Any], spec: ModelSpec, model: str,
                 batch_max: int | None = None) -> dict[str, int]:
    """The size of every dynamic axis of `arrays` (named and typed as the spec's inputs,
    numpy or torch); `InputError` where a shape or a value is outside what `model` takes."""
    sizes = check_shapes(arrays, spec, model, batch_max)
    for t in spec.inputs:
        reason = _out_of_range(t, arrays[t.name])
        if reason is not None:
            raise InputError(f"model {model}: {reason}")
    return sizes


def check_shapes(arrays: Mapping[str, Any], spec: ModelSpec, model: str,
                 batch_max: int | None = None) -> dict[str, int]:
    """The size of every dynamic axis of `arrays`; `InputError` where a rank or a fixed size
    differs from the spec, an axis is outside its range, or inputs disagree on an axis.
    `batch_max`: a smaller largest batch than the exported one (the server's)."""
    sizes: dict[str, int] = {}
    for t in spec.inputs:
        shape = list(arrays[t.name].shape)
        if len(shape) != len(t.shape):
            raise InputError(f"input {t.name!r} has shape {shape}; model {model} takes {wire_shape(t.shape)}")
        for d, (got, dim) in enumerate(zip(shape, t.shape)):
            if isinstance(dim, int):
                if got != dim:
                    raise InputError(f"input {t.name!r} has shape {shape}; model {model} takes "
                                     f"{wire_shape(t.shape)} (dimension {d} must be {dim})")
                continue
            r = spec.axes[dim]
            high = batch_max if dim == "batch" and batch_max is not None else r.max
            if not r.min <= got <= high:
                raise InputError(f"input {t.name!r}: axis {dim!r} (dimension {d}) is {got}; model {model} "
                                 f"takes {r.min} to {high}")
            if sizes.setdefault(dim, got) != got:
                raise InputError(f"inputs disagree on axis {dim!r}: {sizes[dim]} and {got} (input {t.name!r})")
    return sizes


def check_inputs(inputs: Mapping[str, Any], spec: ModelSpec, model: str) -> dict[str, Any]:
    """What a runner is called with, checked: its arrays in spec order, in the types the
    spec declares (`as_declared`; a list as the numpy array it makes); `InputError` otherwise."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"model {model} takes a dict of its inputs {[t.name for t in spec.inputs]}, "
                         f"not a {type(inputs).__name__}")
    check_names(inputs, spec, model)
    arrays = {t.name: _array(t.name, inputs[t.name], model) for t in spec.inputs}
    for t in spec.inputs:
        check_type(t.name, t.dtype, arrays[t.name], model)
    check_arrays(arrays, spec, model)
    return as_declared(arrays, spec)


def as_declared(arrays: Mapping[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """Inputs as a runner takes them: each numpy array or torch tensor (as given, on its
    device) in the type its spec declares; a bfloat16 input as a float32 numpy array, numpy
    having no bfloat16 of its own (`zoo serve` widens BF16 so, and ml_dtypes' is widened).
    Where the types are already those, the arrays themselves (no copy).

    A backend whose runner casts only what its engine cannot take was given float32 for a
    float16 input by the export's test vectors, and int32 ids for int64 by `zoo.load`."""
    typed = {}
    for t in spec.inputs:
        value = arrays[t.name]
        if t.dtype == "string":
            typed[t.name] = value
        elif _is_tensor(value):
            want = getattr(sys.modules["torch"], t.dtype)
            typed[t.name] = value if value.dtype == want else value.to(want)
        else:
            value, want = np.asarray(value), np.dtype("float32" if t.dtype == "bfloat16" else t.dtype)
            typed[t.name] = value if value.dtype == want else value.astype(want)
    return typed


def dataset_splits(spec: ModelSpec) -> list[str]:
    """The splits of `spec.dataset` that training reads: the train split, and the test
    split where the task metric is scored on it (not by its own evaluation)."""
    scored = spec.metric is not None and spec.metric.evaluate is None
    return ["train", "test"] if scored else ["train"]


def load_split(spec: ModelSpec, split: str) -> tuple[Mapping[str, Any], Any]:
    """`spec.dataset.load(split)`, checked (`check_split`); `SpecError` naming the model and
    the split where the plugin's load fails or gives what the spec does not take."""
    try:
        loaded = spec.dataset.load(split)
    except Exception as exc:  # the plugin's code
        raise SpecError(f"{spec.name}: dataset.load({split!r}) raised {type(exc).__name__}: {first_line(exc)}") from exc
    if not isinstance(loaded, tuple) or len(loaded) != 2:
        what = f"a tuple of {len(loaded)}" if isinstance(loaded, tuple) else f"a {type(loaded).__name__}"
        raise SpecError(f"{spec.name}: dataset.load({split!r}) returned {what}; expected a tuple (inputs by name, "
                        f"targets)")
    check_split(spec, split, *loaded)
    return loaded


def check_split(spec: ModelSpec, split: str, inputs: Any, targets: Any) -> None:
    """A dataset split (`Dataset.load(split)`) checked as training and evaluation take it:
    a dict of arrays by input name, each of the spec's type, rank, fixed sizes, axis ranges
    (the batch axis aside: it holds the examples) and value ranges, one row per target.
    `SpecError` naming the split otherwise, before a step runs: left to the loop, a wrong
    shape failed at the first step as torch's own error, float ids were truncated to
    integers silently, and a bad test split failed only after the whole run."""
    where = f"{spec.name}: dataset {split!r}"
    if not isinstance(inputs, Mapping):
        raise SpecError(f"{where} gives inputs as {type(inputs).__name__}; expected a dict of arrays by input "
                        f"name ({', '.join(t.name for t in spec.inputs)})")
    if isinstance(targets, (Mapping, str)) or np.asarray(targets).dtype == object or np.ndim(targets) == 0:
        raise SpecError(f"{where} gives targets as {type(targets).__name__}; expected one array with a row per "
                        f"example")
    rows = len(targets)
    try:
        check_names(inputs, spec, spec.name)
        arrays = {t.name: _array(t.name, inputs[t.name], spec.name) for t in spec.inputs}
        for t in spec.inputs:
            if np.ndim(arrays[t.name]) == 0 or len(arrays[t.name]) != rows:
                raise InputError(f"input {t.name!r} has {_rows(arrays[t.name])}, the targets {rows}")
            check_type(t.name, t.dtype, arrays[t.name], spec.name)
        if not rows:  # `zoo check` passed it, and int8 calibration failed in the engine's words
            raise InputError("it holds no examples, and a run is " + ("trained and int8 calibrated on it"
                                                                       if split == "train" else "scored on it"))
        check_shapes(arrays, spec, spec.name, batch_max=rows)
        for t in spec.inputs:
            reason = _out_of_range(t, arrays[t.name])
            if reason is not None:
                raise InputError(reason)
        for name, array in [*arrays.items(), ("the targets", targets)]:
            _finite(name, array)
    except InputError as exc:
        raise SpecError(f"{where}: {exc}") from None


def _finite(name: str, array: Any) -> None:
    """Refuse NaN or infinity in a split: in a test split it was scored as whatever the
    metric made of the NaN outputs (argmax's class 0), without a word."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)  # a row per example: scalars are refused above
    if bad.any():
        rows = np.flatnonzero(bad)
        where = ", ".join(map(str, rows[:5])) + (" ..." if len(rows) > 5 else "")
        label = name if name == "the targets" else f"input {name!r}"
        raise InputError(f"{label} {'have' if name == 'the targets' else 'has'} non-finite values (NaN or infinity) "
                         f"in {len(rows)} row{'s' * (len(rows) != 1)} ({where}): clean the dataset")


def _rows(array: Any) -> str:
    return "no rows (a scalar)" if np.ndim(array) == 0 else f"{len(array)} rows"


class CheckedRunner:
    """A backend's runner behind `check_inputs`: what `Artifact.load` returns, for every
    backend, a plugin's too. All but the call is the backend runner's own (`session`,
    `compiles`, `input_names` ...); `unchecked` is that runner, for callers that check
    inputs themselves (the server)."""

    def __init__(self, runner: Callable[..., dict[str, Any]], spec: ModelSpec, model: str,
                 precision: str = "fp32") -> None:
        self.unchecked, self._spec, self._model = runner, spec, model
        self._typed = precision in TYPED_PRECISIONS

    def __call__(self, inputs: Mapping[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        outputs = self.unchecked(check_inputs(inputs, self._spec, self._model), *args, **kwargs)
        if not isinstance(outputs, Mapping):
            raise VerificationError(unnamed_outputs(outputs, self._model))
        if self._typed:
            check_output_types(outputs, self._spec, self._model)
        return outputs

    def __getattr__(self, name: str) -> Any:  # only for what the instance lacks: the runner's own attributes
        if name.startswith("__") or "unchecked" not in self.__dict__:  # copy and pickle, before __init__ ran
            raise AttributeError(name)
        return getattr(self.unchecked, name)


def preprocessed(spec: ModelSpec, count: int, inputs: Any) -> Mapping[str, Any]:
    """What a plugin's `preprocess` made of `count` items, if it is the model's inputs with a
    row per item: a slip there (a missing tensor, rows that are not the items) is named as
    the plugin's, where it would have been a KeyError, or results for other items."""
    if not isinstance(inputs, Mapping):
        raise PluginError(f"model {spec.name}: its preprocess returned a {type(inputs).__name__}, not a dict of "
                          f"its inputs by name")
    missing = [t.name for t in spec.inputs if t.name not in inputs]
    if missing:
        raise PluginError(f"model {spec.name}: its preprocess returned no {missing} (it gave "
                          f"{sorted(map(str, inputs))})")
    for t in spec.inputs:
        rows = np.shape(inputs[t.name])[:1]
        if t.shape[:1] == ("batch",) and rows != (count,):
            raise PluginError(f"model {spec.name}: its preprocess made {rows[0] if rows else 'no'} rows of "
                              f"{t.name!r} for {count} item{'s' * (count != 1)}; it makes one row per item")
    return inputs


def postprocessed(spec: ModelSpec, count: int, results: Any) -> list[Any]:
    """What a plugin's `postprocess` made of the outputs of `count` items, if it is one
    result per item in order: a list or tuple of `count` (a set has no order; fewer results
    would leave items unanswered, without a word), each one JSON holds."""
    plain = _one_per_item(spec, count, results)
    for k, result in enumerate(plain, 1):
        if (why := json_unfit(result)) is not None:
            raise _not_json(spec, k, why)
    return plain


def encoded_results(spec: ModelSpec, count: int, results: Any) -> list[bytes]:
    """`postprocessed`, as the JSON documents a server answers: each result encoded once,
    the encoding its check."""
    encoded = []
    for k, result in enumerate(_one_per_item(spec, count, results), 1):
        try:
            encoded.append(json.dumps(result, allow_nan=False).encode())
        except (TypeError, ValueError) as exc:
            raise _not_json(spec, k, str(exc)) from None
    return encoded


def _one_per_item(spec: ModelSpec, count: int, results: Any) -> list[Any]:
    if not isinstance(results, (list, tuple)):
        raise PluginError(f"model {spec.name}: its postprocess returned a {type(results).__name__}, not a list of "
                          f"one result per item")
    if len(results) != count:
        raise PluginError(f"model {spec.name}: its postprocess returned {len(results)} result"
                          f"{'s' * (len(results) != 1)} for {count} item{'s' * (count != 1)}; it returns one per item")
    return [plain_result(r) for r in results]


def _not_json(spec: ModelSpec, k: int, why: str) -> PluginError:
    return PluginError(f"model {spec.name}: its postprocess's result for item {k} is not JSON ({why}): a result is "
                       f"made of strings, numbers, booleans, None, lists and dicts")


def json_unfit(value: Any) -> str | None:
    """Why strict JSON (no NaN) cannot hold `value` (a plugin's answer, kept in a manifest or
    sent to a client), or None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def plain_result(value: Any) -> Any:
    """A plugin's postprocess result as plain JSON values: numpy scalars and arrays as
    numbers and lists, and a non-finite float as null, since JSON (RFC 8259) has no NaN.
    The same locally (`zoo.predict`) as from a server, which sends results as JSON."""
    if isinstance(value, dict):
        return {k: plain_result(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_result(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return plain_result(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def unnamed_outputs(outputs: Any, model: str) -> str:
    """Why a runner's answer is not outputs: it returns them by name, a dict, which a list
    (ONNX Runtime's `session.run`) or a lone array is not."""
    return (f"model {model}: its backend's runner returned a {type(outputs).__name__}, not a dict of output arrays "
            f"by name")


#: precisions whose runners answer exactly the spec's output types (at fp16/bf16 an engine
#: may answer a float32 output in its own precision)
TYPED_PRECISIONS = ("fp32", "int8")


def check_output_types(outputs: Mapping[str, Any], spec: ModelSpec, model: str) -> None:
    """Refuse an output of another element type than the spec declares (bfloat16: as
    float32 too, which numpy has). Parity compares values, not types: the torch runner once
    returned a float16 output as float32, and every export and `zoo verify` passed."""
    for t in spec.outputs:
        value = outputs.get(t.name)
        if t.dtype == "string" or not hasattr(value, "dtype"):
            continue
        kind, size, name = _element(value)
        declared = np.dtype("float32" if t.dtype == "bfloat16" else t.dtype)
        want = {(declared.kind, declared.itemsize)} | ({("f", 2)} if t.dtype == "bfloat16" else set())
        if (kind, size) not in want:
            raise VerificationError(f"model {model}: output {t.name!r} is {name}, but its spec declares "
                                    f"{dt.v2_name(t.dtype)}: the artifact's backend returns another type than its "
                                    f"signature states")


def unchecked(runner: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """The backend's own runner behind a `CheckedRunner` (any other runner as it is)."""
    return runner.unchecked if isinstance(runner, CheckedRunner) else runner


def _array(name: str, value: Any, model: str) -> Any:
    if isinstance(value, np.ndarray) or _is_tensor(value):
        return value
    if isinstance(value, (list, tuple, int, float, np.generic)):  # what numpy makes an array of, as runners did
        try:
            return np.asarray(value)
        except ValueError as exc:  # rows of different lengths
            raise InputError(f"input {name!r} is a {type(value).__name__} that makes no array ({first_line(exc)}); "
                             f"model {model} takes a numpy array or a torch tensor") from None
    what = "None" if value is None else f"a {type(value).__name__}"
    raise InputError(f"input {name!r} is {what}, not an array; model {model} takes a numpy array or a torch tensor")


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # imported wherever a tensor exists; `import zoo` does not import it
    return torch is not None and isinstance(value, torch.Tensor)


def _element(value: Any) -> tuple[str, int, str]:
    """(numpy kind, bytes, the protocol's name or else the library's) of an array's or tensor's elements."""
    if not _is_tensor(value):
        d = value.dtype
        if d.name == "bfloat16":  # ml_dtypes' (tritonclient's, onnx's), a kind numpy does not know ("V")
            return "f", 2, "BF16"
        return d.kind, d.itemsize, _V2_NAMES.get((d.kind, d.itemsize), d.name)
    torch, d = sys.modules["torch"], value.dtype
    if d is torch.bfloat16:
        return "f", 2, "BF16"
    kind = ("b" if d is torch.bool else "c" if d.is_complex else "f" if d.is_floating_point
            else "i" if d.is_signed else "u")
    return kind, d.itemsize, _V2_NAMES.get((kind, d.itemsize), str(d).removeprefix("torch."))


def check_type(name: str, dtype: str, value: Any, model: str) -> None:
    """Refuse what the cast of input `name` to `dtype` would change beyond rounding: any
    float to an integer type (the server refuses it too), an integer the type cannot hold,
    a finite number it would make infinite, a non-number. `zoo.client` casts by the same
    rule, so an array a runner takes here is taken by a server too."""
    kind, size, datatype = _element(value)
    integer = _INTEGER_RANGES.get(dtype)
    takes = "OSU" if dtype == "string" else "biu" if integer else "biuf"
    if kind not in takes:
        raise datatype_error(name, datatype, dt.v2_name(dtype), model)
    if kind in "iuf" and dtype in _FLOAT_RANGES:
        _check_float_range(name, dtype, value, kind, size, datatype, model)
    if integer is None or kind not in "iu":
        return
    source, (low, high) = np.iinfo(f"{kind}{size}"), integer
    if low <= source.min and source.max <= high or _within(value, low, high):
        return
    array = _numpy(value)
    index = [int(i) for i in np.argwhere((array < low) | (array > high))[0]]
    raise InputError(f"input {name!r} has value {array[tuple(index)].item()} at index {index}, which "
                     f"{dt.v2_name(dtype)} cannot hold; model {model} takes {dt.v2_name(dtype)}")


def _check_float_range(name: str, dtype: str, value: Any, kind: str, size: int, datatype: str, model: str) -> None:
    """Refuse a finite value (a float or an integer) the cast to float `dtype` would make
    infinite (1e5 as float16): every engine made it so, without a word, and answered NaN.
    An infinity given stays one."""
    largest, overflows = _FLOAT_RANGES[dtype]
    source_largest = (_FLOAT_RANGES["bfloat16"][0] if datatype == "BF16" else
                      float((np.finfo if kind == "f" else np.iinfo)(f"{kind}{size}").max))
    if source_largest < overflows or _largest_finite(value) < overflows:
        return
    array = _float64(value)
    index = [int(i) for i in np.argwhere(np.isfinite(array) & (np.abs(array) >= overflows))[0]]
    raise InputError(f"input {name!r} has value {array[tuple(index)].item()} at index {index}, which "
                     f"{dt.v2_name(dtype)} cannot hold (its largest is {largest:.6g}; it would be infinity); model "
                     f"{model} takes {dt.v2_name(dtype)}")


def _largest_finite(value: Any) -> float:
    """The largest magnitude among the finite elements of a numeric array or tensor (0 if none):
    of an array without a copy where none is infinite, of a tensor on its own device."""
    if _is_tensor(value):
        torch, value = sys.modules["torch"], value.detach()
        if value.numel() == 0:
            return 0.0
        return float(torch.where(torch.isfinite(value), value.abs(), 0).max())
    array = value.astype(np.float32) if value.dtype.name == "bfloat16" else value  # widened without loss
    if array.size == 0:
        return 0.0
    high, low = float(np.fmax.reduce(array, axis=None)), float(np.fmin.reduce(array, axis=None))  # NaN skipped
    if math.isfinite(high) and math.isfinite(low):
        return max(high, -low)
    finite = array[np.isfinite(array)]  # an infinity given, or only NaN: the others
    return float(np.abs(finite).max()) if finite.size else 0.0


def _float64(value: Any) -> np.ndarray:
    """A numeric array or tensor as float64 numpy (every float type of a spec exactly)."""
    if _is_tensor(value):
        return value.detach().cpu().double().numpy()
    return np.asarray(value, dtype=np.float64)


def _out_of_range(t: TensorSpec, value: Any) -> str | None:
    if t.value_range is None or _within(value, *t.value_range):
        return None
    return t.out_of_range(_numpy(value))  # the first value outside, for the message


def _within(value: Any, low: float, high: float) -> bool:
    """Whether every element lies in [low, high] (a NaN does not): its least and greatest,
    on a CUDA tensor's own device (one sync, no copy to the host)."""
    if _is_tensor(value) and value.device.type != "cpu":
        if value.numel() == 0:
            return True
        least, greatest = sys.modules["torch"].aminmax(value)
        return bool((least >= low) & (greatest <= high))
    array = _numpy(value)
    return array.size == 0 or bool(array.min() >= low and array.max() <= high)


def _numpy(value: Any) -> np.ndarray:
    if _is_tensor(value):
        return as_numpy(value)
    return value
