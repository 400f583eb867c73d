"""Engines built from an ONNX graph: the shape profile each is built for and its provenance.

A TensorRT engine (the native backend's `model.plan`, or the one ONNX Runtime's TensorRT
execution provider caches) is not a portable model file. "By default, TensorRT engines
are compatible only with the version of TensorRT used to build them", and "without
[hardware compatibility] mode, engines are not portable across different GPU
architectures" (TensorRT documentation: Version Compatibility; Support Matrix, Engine
Portability); within one architecture its kernels are also timed and chosen for the GPU
model that built it. So an engine is keyed by its full provenance: the weights and the
ONNX graph it came from, the precision, the shape profile, the TensorRT version, the GPU
name and its compute capability. The key is the sha256 of that record in canonical
JSON; both TensorRT paths use this one record and key, so equal facts give equal keys.

An engine with dynamic input dimensions also needs an optimization profile: a min, opt
and max shape per input. TensorRT tunes its kernels for `opt` and accepts any shape
between `min` and `max`; "a runtime error will be raised if the input tensor dimensions
fall outside the valid range for this profile" (TensorRT Python API,
`IOptimizationProfile`). The spec already states every dynamic axis's range
(`spec.axes`), so one profile follows from it: symbolic axes take their range, static
dimensions stay as they are.

Pure Python, importing no GPU library: the profile and the key are computed and
checked on machines with and without a GPU. Both TensorRT paths import it from here
(`zoo_tensorrt`, and `zoo_onnxruntime.tensorrt_ep`), so neither backend imports the other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from zoo.errors import UnsupportedError
from zoo.fsutil import sha256_file
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


#: the facts of the machine an engine is built on, as recorded in the provenance.
MACHINE_FIELDS = ("tensorrt", "gpu", "compute_capability")


@dataclass(frozen=True)
class Machine:
    """What an engine is tied to on the machine that builds or loads it."""

    tensorrt: str  # trt.__version__, e.g. "10.3.0"
    gpu: str  # torch.cuda.get_device_name, e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str  # "major.minor", e.g. "9.0"

    @property
    def sm(self) -> str:
        """`sm_90`: the architecture name users know from nvcc and NVIDIA's tables."""
        return "sm_" + self.compute_capability.replace(".", "")

    def describe(self) -> str:
        return f"TensorRT {self.tensorrt} on {self.gpu} ({self.sm})"

    def to_json(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in MACHINE_FIELDS}

    @classmethod
    def of(cls, device: str, tensorrt: str) -> "Machine":
        """This machine's GPU behind `device` ("cuda", "cuda:1"), with TensorRT `tensorrt`."""
        import torch

        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        major, minor = torch.cuda.get_device_capability(index)
        return cls(tensorrt, torch.cuda.get_device_name(index), f"{major}.{minor}")


def engine_provenance(*, weights_sha256: str | None, onnx_sha256: str, precision: str,
                      profile: Profile, machine: Machine) -> dict[str, Any]:
    """The provenance record of one engine (the native backend writes it to the manifest)."""
    return {
        "weights_sha256": weights_sha256,
        "onnx_sha256": onnx_sha256,
        "precision": precision,
        "profile": profile_to_json(profile),
        **machine.to_json(),
    }


def provenance_key(provenance: Mapping[str, Any]) -> str:
    """sha256 of the record in canonical JSON: equal keys, interchangeable engines."""
    canonical = json.dumps(provenance, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def onnx_sha256(path: Path) -> str:
    """sha256 of an ONNX file, and of its external weights (`<file>.data`) when it has them.

    For a model under 2 GiB (one file) this is the file's own sha256.
    """
    path = Path(path)
    data = path.with_name(f"{path.name}.data")
    if not data.exists():
        return sha256_file(path)
    return hashlib.sha256((sha256_file(path) + sha256_file(data)).encode()).hexdigest()
