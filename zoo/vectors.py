"""Test vectors: inputs and the PyTorch fp32 reference's outputs, stored in the artifact.

The ONNX model zoo ships `test_data_set_N/input_*.pb` and `output_*.pb` beside each
model, so any runtime can check itself without the training code. Every artifact here
carries the same in safetensors (no pickle, no protobuf): `test_data/set_N.safetensors`
with tensors `input.<name>` and `output.<name>`, and the size of every dynamic axis in
the file's metadata. `zoo verify` holds the runner to them, with or without the plugin
that defined the model, and a model known only by its artifact samples inputs from them.

Sets are taken at the smallest, typical and largest batch, every other dynamic axis at
its own smallest, typical and largest size along with it (`at_length`: sampled content
cut, or grown: padded where an input masks the axis, as a tokenizer and `zoo serve` pad,
repeated where none does), from the spec's `sample` with a fixed seed; a model with two or more
dynamic input axes besides the batch gets a fourth, those axes at different ends
(`mixed_sizes`). A set stays under
SET_BYTES: one that would exceed it is recorded at a smaller batch, and the manifest's
`test_data.notes` say so.

A model with integer inputs that declare a `value_range` gets up to two more sets (`range_ends`):
the sample at the smallest batch with every such input filled with the low end of its range,
then with the high end (the inputs `zoo check` runs there, `filled`), recorded with the values
(`"values"` in the manifest's entry). An input whose end the sampled sets already hold is left
as sampled in it: that value is verified there, and an attention mask filled with 0 is no input
a tokenizer makes (every position masked, where PyTorch's SDPA and ONNX Runtime answered 4e-3
apart, both meaningless). The sample may never reach values the server accepts:
OpenVINO's CPU plugin computes an int64 `%` lossily (2**40 % 1000 answered 0, PyTorch 776) and
such an export verified on its samples; the export and `zoo verify` run these sets on every
backend, and a failure names the input, its value and the output that differs. Float inputs are
not filled so: a constant at a float range's end is seldom an input at all (an atom mask of
zeros is no molecule, an observation at the end of every dimension no state), and float error
is held by parity on the samples; bool inputs declare no range.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .arrays import as_numpy
from .artifact import not_safetensors, safe_member
from .errors import ArtifactError, SpecError, VerificationError, first_line
from .spec import AxisRange, ModelSpec, TensorSpec
from .verify import parity

TEST_DATA = "test_data"
#: the largest a set's inputs and outputs may be together: artifacts stay small to copy
SET_BYTES = 2 << 20
SEED = 0
ROLES = ("min", "opt", "max")
MIXED = "mixed"  # a fourth set, dynamic axes at different ends (`mixed_sizes`)
#: the dtypes whose declared `value_range` is run at its ends (`range_ends`), as `zoo check` runs it
INTEGER = ("int64", "int32", "int8", "uint8")

ArrayFn = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class VectorSet:
    file: str  # its path inside the artifact
    axes: dict[str, int]  # the size of every dynamic axis, "batch" included
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    values: dict[str, int] | None = None  # a set at a range's end (`range_ends`): each filled input's value


def record(spec: ModelSpec, reference: ArrayFn, root: Path) -> tuple[list[VectorSet], dict[str, Any]]:
    """Write the sets under `root`/test_data; them, and the manifest's "test_data" entry."""
    from .bench.measure import lengths_of

    strings = [t.name for t in spec.inputs + spec.outputs if t.dtype == "string"]
    if strings:
        return [], {"sets": [], "notes": [f"none recorded: tensors {strings} are strings, which safetensors "
                                          "does not store"]}
    sets: list[VectorSet] = []
    notes: list[str] = spec.batch_notes()
    seen: set[tuple] = set()
    for role in (*ROLES, MIXED):
        if role == MIXED and (axes := mixed_sizes(spec)) is None:
            continue
        # a model without a batch axis: batch 1 alone (`ModelSpec.batch_sizes`), its other axes at each size
        axes = axes if role == MIXED else {name: 1 if name == "batch" and not spec.has_batch_axis
                                           else getattr(r, role) for name, r in spec.axes.items()}
        wanted, least = axes["batch"], spec.axes["batch"].min
        # sized from the signature first, so a large model's reference never runs at a batch
        # whose outputs (a language model's logits) would not be kept anyway
        while _expected_bytes(spec, axes) > SET_BYTES and axes["batch"] > least:
            axes["batch"] = max(least, axes["batch"] * SET_BYTES // _expected_bytes(spec, axes))
        inputs, outputs = _draw(spec, reference, axes)
        while _nbytes(inputs, outputs) > SET_BYTES and axes["batch"] > least:  # outputs the signature does not size
            axes["batch"] = max(least, axes["batch"] * SET_BYTES // _nbytes(inputs, outputs))
            inputs, outputs = _draw(spec, reference, axes)
        if axes["batch"] != wanted:
            notes.append(f"the {role} set is recorded at batch {axes['batch']}, not {wanted}: it would exceed "
                         f"{SET_BYTES >> 20} MiB")
        sizes = {"batch": axes["batch"], **lengths_of(spec, inputs)}
        if tuple(sorted(sizes.items())) not in seen:
            seen.add(tuple(sorted(sizes.items())))
            sets.append(_save(spec, root, len(sets), inputs, outputs, sizes))
    for which, values in range_ends(spec):
        # an end the sampled sets already hold is verified there (an attention mask's 0 and 1), and
        # filled whole would make an input no caller sends (every position masked)
        values = {name: value for name, value in values.items()
                  if not any(np.any(vs.inputs[name] == value) for vs in sets)}
        if values and all(vs.values != values for vs in sets):  # value_range=(5, 5): one set
            inputs, outputs = _draw_filled(spec, reference, which, values)
            sizes = {"batch": spec.axes["batch"].min, **lengths_of(spec, inputs)}
            sets.append(_save(spec, root, len(sets), inputs, outputs, sizes, values))
    entry = {"sets": [{"file": s.file, "axes": s.axes, **({"values": s.values} if s.values else {})} for s in sets],
             "seed": SEED, "max_set_bytes": SET_BYTES, "notes": notes}
    return sets, entry


def _save(spec: ModelSpec, root: Path, index: int, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray],
          sizes: dict[str, int], values: dict[str, int] | None = None) -> VectorSet:
    """Set number `index`, of these axis sizes, written under `root`."""
    import torch
    from safetensors.torch import save_file

    file = f"{TEST_DATA}/set_{index}.safetensors"
    (root / TEST_DATA).mkdir(exist_ok=True)
    # cloned: a model may return an input, or one tensor as two outputs, and safetensors
    # refuses tensors that share memory
    tensors = {f"input.{k}": v.detach().clone().contiguous() for k, v in inputs.items()}
    tensors |= {f"output.{k}": torch.from_numpy(np.array(v, copy=True, order="C")) for k, v in outputs.items()}
    metadata = {"axes": json.dumps(sizes), "seed": str(SEED), **({"values": json.dumps(values)} if values else {})}
    save_file(tensors, str(root / file), metadata=metadata)
    # as stored and as `read` gives them back: float16 stays float16 (a runner is given the
    # declared types, zoo.inputs.as_declared), bfloat16 is float32
    declared = {t.name: t.dtype for t in spec.inputs}
    return VectorSet(file, sizes, {k: _as_declared(as_numpy(v), declared[k]) for k, v in inputs.items()}, dict(outputs),
                     values)


def range_ends(spec: ModelSpec) -> list[tuple[str, dict[str, int]]]:
    """("low", values) and ("high", values): every integer input with a declared `value_range`
    at that end of it (the sets `record` adds, the runs `zoo check` makes); [] for a model
    with none."""
    bounded = [t for t in spec.inputs if t.dtype in INTEGER and t.value_range is not None]
    if not bounded:
        return []
    return [("low", {t.name: math.ceil(t.value_range[0]) for t in bounded}),
            ("high", {t.name: math.floor(t.value_range[1]) for t in bounded})]


def filled(spec: ModelSpec, seed: int, values: Mapping[str, int]) -> dict[str, Any]:
    """The sample at the smallest batch with each input named in `values` filled with its value."""
    inputs = dict(spec.sample(spec.axes["batch"].min, np.random.default_rng(seed)))
    dtypes = {t.name: t.dtype for t in spec.inputs}
    for name, value in values.items():
        inputs[name] = np.full(np.shape(inputs[name]), value, dtype=dtypes[name])
    return inputs


def _draw_filled(spec: ModelSpec, reference: ArrayFn, which: str, values: Mapping[str, int]):
    """`filled`'s inputs (torch, CPU) and the reference's outputs; `zoo check`, which every
    export runs first, has refused a forward that raises there (on the CPU)."""
    from .tensors import to_torch

    typed = to_torch(filled(spec, SEED, values), spec)
    try:
        outputs = reference(typed)
    except Exception as exc:  # the plugin's forward, at the ends of the ranges it declares
        raise SpecError(f"{spec.name}: the forward fails with {_ends(spec, values, which)} ({type(exc).__name__}: "
                        f"{first_line(exc)}); declare the range the forward takes") from exc
    declared = {t.name: t.dtype for t in spec.outputs}
    return typed, {k: _as_declared(as_numpy(v), declared[k]) for k, v in outputs.items()}


def _ends(spec: ModelSpec, values: Mapping[str, int], which: str | None = None) -> str:
    """"user_id = 1099511627776, the high end of its value_range (0, 1099511627776)": which
    end each value is, read off the spec where not given."""
    ranges = {t.name: t.value_range for t in spec.inputs}
    parts = []
    for name, value in values.items():
        low, high = ranges.get(name) or (value, value)
        end = which or ("low" if value == math.ceil(low) else "high" if value == math.floor(high) else None)
        parts.append(f"{name} = {value}" + (f", the {end} end of its value_range ({_num(low)}, {_num(high)})"
                                            if end else ""))
    return "; ".join(parts)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def mixed_sizes(spec: ModelSpec) -> dict[str, int] | None:
    """The sizes of the set `record` adds for a model with two or more dynamic input axes
    besides the batch: the first (by name) at its smallest, the last at its largest, those
    between spread evenly, the batch at its typical size; None for other models. The other
    sets move every axis together (h = w at each), so a forward that relates two axes (`if
    h != w`, a transpose that needs a square) matched PyTorch on all of them, and an export
    that took h for w passed parity; this set tells them apart."""
    ranges = {t.dynamic_axes[d]: spec.axes[t.dynamic_axes[d]] for t in spec.inputs for d in t.dynamic_axes}
    names = sorted(a for a, r in ranges.items() if a != "batch" and r.min < r.max)
    if len(names) < 2:
        return None
    together = [tuple(getattr(spec.axes[a], role) for a in names) for role in ROLES]
    for order in (names, names[::-1]):  # h in [8, 16], w in [4, 8]: (8, 8) is no test; (16, 4) is
        spread = {a: spec.axes[a].min + round((spec.axes[a].max - spec.axes[a].min) * k / (len(names) - 1))
                  for k, a in enumerate(order)}
        sizes = tuple(spread[a] for a in names)
        # axes of distinct sizes, in proportions the other sets do not have (h = 2w in each, say)
        if len(set(sizes)) == len(sizes) and not any(_proportional(sizes, other) for other in together):
            return {name: 1 if name == "batch" and not spec.has_batch_axis else r.opt
                    for name, r in spec.axes.items()} | spread
    return None


def _proportional(a: Sequence[int], b: Sequence[int]) -> bool:
    return all(x * b[0] == y * a[0] for x, y in zip(a, b))


def _draw(spec: ModelSpec, reference: ArrayFn, axes: Mapping[str, int]):
    """Typed inputs (torch, CPU) from the spec's sample at these sizes, and the reference's outputs."""
    from .bench.measure import at_length, masks
    from .tensors import to_torch

    inputs = spec.sample(axes["batch"], np.random.default_rng(SEED))
    for axis, size in axes.items():
        if axis != "batch":
            inputs = at_length(spec, inputs, axis, size)
    typed = to_torch(inputs, spec)
    declared = {t.name: t.dtype for t in spec.outputs}
    try:
        outputs = reference(typed)
    except Exception as exc:  # the plugin's forward, on its sample cut or grown to these sizes (`at_length`)
        sizes = ", ".join(f"{a}={n}" for a, n in axes.items())
        resized = [a for a in axes if a != "batch"]
        grown = "padded" if any(masks(spec, a) for a in resized) else "repeated"
        raise SpecError(f"{spec.name}: the forward fails on its sample at {sizes} ({type(exc).__name__}: "
                        f"{first_line(exc)}); the sample is " + (f"cut or {grown} along {', '.join(resized)} to "
                        f"each end of the range (its content, such as lengths or indices into that axis, "
                        f"unchanged): let the forward take every size the spec declares, or narrow the range"
                        if resized else "drawn at each end of the batch range: let the forward take every "
                        "batch size the spec declares")) from exc
    # in the declared dtype where numpy has it (a float16 output stays float16, exactly:
    # the reference computed it so); bfloat16, which numpy lacks, is kept as float32
    return typed, {k: _as_declared(as_numpy(v), declared[k]) for k, v in outputs.items()}


def check_ends(spec: ModelSpec, reference: ArrayFn) -> list[str]:
    """`zoo check`'s run of what `record` runs: the forward at the smallest, typical and
    largest size of every axis but the batch (at its smallest: `check` runs the batch
    sizes), one problem line per failing set of sizes."""
    problems = []
    mixed = mixed_sizes(spec)
    for axes in [{name: r.min if name == "batch" else getattr(r, role) for name, r in spec.axes.items()}
                 for role in ROLES] + ([{**mixed, "batch": spec.axes["batch"].min}] if mixed else []):
        try:
            _draw(spec, reference, axes)
        except SpecError as exc:
            problems.append(str(exc))
    return problems


def _as_declared(array: np.ndarray, dtype: str) -> np.ndarray:
    return array.astype(dtype) if dtype != "bfloat16" and array.dtype != np.dtype(dtype) else array


def _load(path: Path) -> dict[str, np.ndarray]:
    """A set's tensors in their own dtypes (float16 stays float16), without torch; a file
    holding bfloat16, which numpy lacks, through torch, as float32."""
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        if not any(f.get_slice(k).get_dtype() == "BF16" for k in f.keys()):
            return {k: f.get_tensor(k) for k in f.keys()}
    import torch
    from safetensors.torch import load_file

    return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in load_file(str(path)).items()}


def _expected_bytes(spec: ModelSpec, axes: Mapping[str, int]) -> int:
    """A set's size at these axis sizes as the signature states it; an output with a size
    named by no axis counts as nothing here (`_nbytes` measures it once computed)."""
    total = 0
    for t in spec.inputs + spec.outputs:
        dims = [axes.get(d) if isinstance(d, str) else d for d in t.shape]
        if None not in dims:
            total += math.prod(dims) * (2 if t.dtype == "bfloat16" else np.dtype(t.dtype).itemsize)
    return total


def _nbytes(inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> int:
    return sum(t.numel() * t.element_size() for t in inputs.values()) + sum(a.nbytes for a in outputs.values())


def read(art) -> list[VectorSet]:
    """The artifact's stored sets (files hash-checked when it was opened); [] if it has none."""
    from safetensors import SafetensorError

    spec_inputs = [t["name"] for t in art.manifest["signature"]["inputs"]]
    spec_outputs = [t["name"] for t in art.manifest["signature"]["outputs"]]
    sets = []
    for item in (art.manifest.get("test_data") or {}).get("sets", []):
        try:
            tensors = _load(safe_member(art.path, item["file"], art.name))
        except (SafetensorError, OSError) as exc:
            raise not_safetensors(art.name, item["file"], exc) from None
        inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
        outputs = {k.removeprefix("output."): v for k, v in tensors.items() if k.startswith("output.")}
        if sorted(inputs) != sorted(spec_inputs) or sorted(outputs) != sorted(spec_outputs):
            raise ArtifactError(f"artifact {art.name}: test vectors {item['file']} hold inputs {sorted(inputs)} "
                                f"and outputs {sorted(outputs)}, not the signature's; re-export it")
        values = item.get("values")
        if values is not None and not (isinstance(values, dict) and values
                                       and all(type(v) is int and k in inputs for k, v in values.items())):
            raise ArtifactError(f"artifact {art.name}: test vectors {item['file']} name values {values!r} that are "
                                f"not integers of its inputs; re-export it")
        sets.append(VectorSet(item["file"], dict(item["axes"]), inputs, outputs, values))
    return sets


def check(spec: ModelSpec, runner: ArrayFn, sets: Sequence[VectorSet], precision: str) -> dict[str, Any]:
    """The runner on every set's inputs against its stored outputs, held as parity holds
    it (`zoo.verify.parity`, the precision's tolerance); a typed error naming the set."""
    checks, worst = [], 0.0
    for vs in sets:
        stored = replace(spec, sample=lambda batch, rng, vs=vs: dict(vs.inputs))
        try:
            report = parity(stored, lambda inputs, vs=vs: vs.outputs, runner, precision,
                            batch_sizes=(vs.axes["batch"],))
        except VerificationError as exc:
            if vs.values:  # the server takes every value in the declared range
                raise type(exc)(f"test vectors {vs.file} ({_ends(spec, vs.values)}): {exc}; the server accepts every "
                                f"value in the declared range: declare the range this backend computes exactly, "
                                f"or export to another backend") from None
            sizes = ", ".join(f"{a}={n}" for a, n in vs.axes.items() if a != "batch")
            raise type(exc)(f"test vectors {vs.file}{f' ({sizes})' if sizes else ''}: {exc}") from None
        worst = max(worst, report["max_abs_error"])
        checks += [{**c, "set": vs.file, "axes": vs.axes} for c in report["checks"]]
    return {"precision": precision, "tolerance": spec.tolerance(precision).to_json(), "max_abs_error": worst,
            "sets": len(sets), "checks": checks, "passed": True}


def sampler(sets: Callable[[], Sequence[VectorSet]], inputs: Sequence[TensorSpec],
            axes: Mapping[str, AxisRange]) -> Callable[[int, np.random.Generator], dict[str, np.ndarray]]:
    """A `sample` for a model known only by its artifact: rows of the stored set at the
    typical sizes (drawn by `rng`, repeated past its batch), or, where the artifact holds
    no sets, values synthesized within each input's dtype and value_range."""

    def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        found = [s for s in sets() if not s.values]  # not the range ends' constants
        if not found:
            return synthesize(inputs, axes, batch, rng)
        typical = [s for s in found if all(s.axes.get(a) == r.opt for a, r in axes.items() if a != "batch")]
        source = max(typical or found, key=lambda s: s.axes["batch"])
        rows = np.resize(rng.permutation(source.axes["batch"]), batch)
        return {t.name: np.take(source.inputs[t.name], rows, axis=t.shape.index("batch")) if "batch" in t.shape
                else source.inputs[t.name].copy() for t in inputs}

    return sample


def synthesize(inputs: Sequence[TensorSpec], axes: Mapping[str, AxisRange], batch: int,
               rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs of the right shapes (other axes at their typical size), dtypes and ranges."""
    out = {}
    for t in inputs:
        shape = [batch if d == "batch" else axes[d].opt if isinstance(d, str) else d for d in t.shape]
        if t.dtype == "string":
            out[t.name] = np.full(shape, b"", dtype=object)
        elif t.dtype == "bool":
            out[t.name] = rng.integers(0, 2, shape).astype(bool)
        elif t.dtype in ("float32", "float16", "bfloat16"):
            low, high = t.value_range or (-1.0, 1.0)
            out[t.name] = rng.uniform(low, high, shape).astype("float32" if t.dtype == "bfloat16" else t.dtype)
        else:
            low, high = t.value_range or (0, 1)
            out[t.name] = rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1, shape).astype(t.dtype)
    return out
