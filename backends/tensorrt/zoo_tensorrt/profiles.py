"""The optimization profile a TensorRT engine is built for, derived from a `ModelSpec`.

An engine with dynamic input dimensions needs at least one optimization profile: a
min, opt and max shape per input. TensorRT tunes its kernels for `opt` and accepts any
shape between `min` and `max`; "a runtime error will be raised if the input tensor
dimensions fall outside the valid range for this profile" (TensorRT Python API,
`IOptimizationProfile`). The spec already states every dynamic axis's range
(`spec.axes`: AxisRange min/opt/max), so one profile follows from it: symbolic axes take
their range, static dimensions stay as they are.

Pure Python on purpose: the profile is part of the engine's provenance and is checked
on every call, on machines with and without TensorRT.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

from zoo.errors import UnsupportedError
from zoo.spec import ModelSpec


class ShapeRange(NamedTuple):
    """The shapes one input is built for: smallest, tuning point, largest."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max))

    def to_json(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


#: input name -> its shape range; one engine, one profile (profile 0).
Profile = Mapping[str, ShapeRange]


def profile_for(spec: ModelSpec) -> dict[str, ShapeRange]:
    """One optimization profile covering every input of `spec`, in input order."""
    profile = {}
    for tensor in spec.inputs:
        dims = [_dim_range(spec, d) for d in tensor.shape]
        profile[tensor.name] = ShapeRange(
            tuple(d[0] for d in dims), tuple(d[1] for d in dims), tuple(d[2] for d in dims))
    return profile


def _dim_range(spec: ModelSpec, dim: int | str) -> tuple[int, int, int]:
    if isinstance(dim, str):  # a symbolic axis: its AxisRange (ModelSpec checked it has one)
        r = spec.axes[dim]
        return r.min, r.opt, r.max
    return dim, dim, dim


def profile_to_json(profile: Profile) -> dict[str, dict[str, list[int]]]:
    """The profile as it is recorded in the engine's provenance (plain JSON)."""
    return {name: r.to_json() for name, r in profile.items()}


def profile_from_json(data: Mapping[str, Mapping[str, Any]]) -> dict[str, ShapeRange]:
    return {name: ShapeRange(tuple(r["min"]), tuple(r["opt"]), tuple(r["max"])) for name, r in data.items()}


def describe(spec: ModelSpec, name: str, r: ShapeRange) -> str:
    """`(batch 1..32, 1, 8, 8)`: the range of one input, in the spec's own axis names."""
    tensor = next((t for t in spec.inputs if t.name == name), None)
    dims = []
    for i, (lo, hi) in enumerate(zip(r.min, r.max)):
        label = tensor.shape[i] if tensor is not None and i < len(tensor.shape) else None
        dims.append(f"{label} {lo}..{hi}" if isinstance(label, str) else str(lo) if lo == hi else f"{lo}..{hi}")
    return f"({', '.join(dims)})"


def check_shape(spec: ModelSpec, profile: Profile, name: str, shape: Sequence[int]) -> None:
    """Refuse an input shape outside the engine's profile with a message naming the range.

    TensorRT would refuse it too (`set_input_shape` returns False and logs an error);
    checking first gives the user the range in the spec's terms instead.
    """
    r = profile[name]
    if not r.contains(shape):
        raise UnsupportedError(
            f"input {name!r} has shape {tuple(shape)}, outside the shapes this engine was built for: "
            f"{describe(spec, name, r)}")
