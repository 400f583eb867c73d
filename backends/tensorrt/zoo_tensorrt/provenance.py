"""Engine provenance: everything a TensorRT engine depends on, and the check that refuses
to load one built for something else.

The record and its key (`Machine`, `engine_provenance`, `provenance_key`) and the shape
profile live in `zoo_onnx.engines`, where the reasons are cited: ONNX Runtime's TensorRT
execution provider keys its engine cache by the same record, so equal facts give equal
keys on both paths. This module adds what is the native backend's own: this machine's facts, the manifest's
record and the refusal of a stale engine with a message that says how to rebuild it,
never loading it (docs/architecture.md, "Contracts that matter").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import ArtifactError, StaleArtifactError
from zoo_onnx.engines import MACHINE_FIELDS, Machine, Profile, profile_from_json, profile_to_json, provenance_key

__all__ = ["check_provenance", "current_machine", "rebuild_command", "recorded_provenance", "weights_sha256"]

if TYPE_CHECKING:
    import torch


def current_machine(device: str) -> Machine:
    """This machine's TensorRT version and the GPU behind `device` ("cuda", "cuda:1")."""
    from .library import import_tensorrt

    return Machine.of(device, str(import_tensorrt().__version__))


def weights_sha256(module: "torch.nn.Module") -> str:
    """sha256 of the module's state dict, buffers included (batch-norm statistics change
    outputs), hashed as the core hashes weights, so it equals the manifest's weights hash."""
    from zoo.tensors import state_dict_sha256

    return state_dict_sha256(module.state_dict())


def rebuild_command(model: str, precision: str, device: str = "cuda") -> str:
    # TensorRT's int8 is always static (calibrated Q/DQ): naming it rebuilds the same
    # artifact whichever method the model declares (`...int8` or `...int8-static`)
    method = " --quantization static" if precision == "int8" else ""
    return f"zoo export {model} --backend tensorrt --precision {precision}{method} --device {device} --force"


def recorded_provenance(info: Mapping[str, Any] | None, model: str, precision: str,
                        device: str = "cuda") -> dict[str, Any]:
    """The provenance in a manifest's backend_info, checked against its recorded key.

    A missing record or one that does not hash to its key means the manifest was
    written by something else or edited by hand: the engine's origin is unknown.
    """
    provenance = (info or {}).get("provenance")
    key = (info or {}).get("provenance_key")
    if not isinstance(provenance, Mapping) or not isinstance(key, str):
        raise ArtifactError(f"the TensorRT engine for {model} has no provenance in its manifest; "
                            f"rebuild it with `{rebuild_command(model, precision, device)}`")
    missing = [f for f in ("precision", "profile", *MACHINE_FIELDS) if f not in provenance]
    if missing:
        raise ArtifactError(f"the TensorRT engine provenance for {model} lacks {', '.join(missing)}")
    if provenance_key(provenance) != key:
        raise ArtifactError(f"the TensorRT engine provenance for {model} does not match its key "
                            f"(the manifest was edited); rebuild it with "
                            f"`{rebuild_command(model, precision, device)}`")
    return dict(provenance)


def check_provenance(recorded: Mapping[str, Any], *, machine: Machine, precision: str,
                     profile: Profile, model: str, device: str = "cuda") -> None:
    """Raise StaleArtifactError unless the engine was built for exactly this use here.

    Compares what can be known at load time: the machine (TensorRT version, GPU name,
    compute capability), the precision asked for, and the input profile the spec
    declares now. The message says exactly what differs and how to rebuild.
    """
    problems = []
    built = Machine(**{f: str(recorded[f]) for f in MACHINE_FIELDS})
    if built != machine:
        differs = []
        if built.tensorrt != machine.tensorrt:
            differs.append("TensorRT version")
        if built.gpu != machine.gpu:
            differs.append("GPU")
        if built.compute_capability != machine.compute_capability:
            differs.append("compute capability")
        problems.append(f"engine built for {built.describe()}; this machine has {machine.describe()} "
                        f"({_and(differs)} differ{'s' if len(differs) == 1 else ''})")
    if recorded["precision"] != precision:
        problems.append(f"engine built for {recorded['precision']}, loaded as {precision}")
    built_profile = profile_to_json(profile_from_json(recorded["profile"]))
    if built_profile != profile_to_json(profile):
        problems.append(f"engine built for input shapes {_shapes(built_profile)}; "
                        f"the model now declares {_shapes(profile_to_json(profile))}")
    if problems:
        raise StaleArtifactError(
            f"stale TensorRT engine for {model}: {'; '.join(problems)}. A TensorRT engine runs only "
            f"with the TensorRT version, on the GPU model and for the shapes it was built for; "
            f"rebuild it on this machine with `{rebuild_command(model, precision, device)}`")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _shapes(profile_json: Mapping[str, Mapping[str, list[int]]]) -> str:
    return ", ".join(f"{name} {r['min']}..{r['max']} (opt {r['opt']})" for name, r in profile_json.items())
