"""The types of an artifact manifest's fields (`zoo.json`), checked when it is opened and
before any is read: a manifest edited by hand, or written by another tool, is refused
naming its bad field in one line, not met by a TypeError deep in a reader later."""

from __future__ import annotations

import math
from typing import Any

from .errors import ArtifactError

#: (field, its type) that every reader of a manifest relies on, checked before any is read
_FIELD_TYPES = (("model", dict), ("backend", dict), ("precision", str), ("device", str), ("model_file", str),
                ("files", dict), ("weights", dict))


def check_fields(manifest: dict[str, Any], label: str) -> None:
    """A manifest edited by hand is refused naming its bad field, not met by a TypeError later."""
    def bad(field: str, want: str) -> ArtifactError:
        return ArtifactError(f"artifact {label}: manifest field {field} must be {want}; re-export it")

    for field, kind in _FIELD_TYPES:
        if not isinstance(manifest[field], kind):
            raise bad(field, "an object" if kind is dict else "a string")
    if not isinstance(manifest.get("name", ""), str):
        raise bad("name", "a string")
    model, backend = manifest["model"], manifest["backend"]
    if not isinstance(model.get("name"), str) or not model["name"]:
        raise bad("model.name", "a non-empty string")
    if not isinstance(model.get("config", {}), dict):
        raise bad("model.config", "an object")
    if not isinstance(backend.get("name"), str) or not backend["name"]:
        raise bad("backend.name", "a non-empty string")
    for key in ("versions", "info"):
        if not isinstance(backend.get(key, {}), dict):
            raise bad(f"backend.{key}", "an object")
    _check_tolerances(model.get("tolerances") or {}, bad)
    signature = manifest.get("signature", {})
    if not isinstance(signature, dict):
        raise bad("signature", "an object")
    for key in ("inputs", "outputs"):
        if key in signature and not (isinstance(signature[key], list)
                                     and all(isinstance(t, dict) for t in signature[key])):
            raise bad(f"signature.{key}", "a list of tensors")
        for i, tensor in enumerate(signature.get(key, [])):
            _check_tensor(tensor, f"signature.{key}[{i}]", bad)
    axes = signature.get("axes", {})
    if not isinstance(axes, dict) or not all(
            isinstance(r, list) and len(r) == 3 and all(type(v) is int for v in r) for r in axes.values()):
        raise bad("signature.axes", "an object of [min, opt, max] integers")
    test_data = manifest.get("test_data") or {}
    if not isinstance(test_data, dict) or not isinstance(test_data.get("sets", []), list):
        raise bad("test_data.sets", "a list")
    for i, entry in enumerate(test_data.get("sets", [])):
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise bad(f"test_data.sets[{i}].file", "a path (a string)")


def _number(value: Any, finite: bool = True) -> bool:
    """A JSON number, finite unless not asked (not a boolean, which Python counts as one; not NaN)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
            and (math.isfinite(value) or not finite))


def _check_tensor(tensor: dict[str, Any], field: str, bad) -> None:
    """A signature tensor: its name, dtype, shape (sizes and axis names: a string would be read
    as one axis per letter) and value range (what inputs are drawn from without the plugin)."""
    for key in ("name", "dtype"):
        if not isinstance(tensor.get(key), str) or not tensor[key]:
            raise bad(f"{field}.{key}", "a non-empty string")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
            (type(d) is int and d >= 0) or (isinstance(d, str) and d) for d in shape):
        raise bad(f"{field}.shape", "a list of sizes and axis names")
    value_range = tensor.get("value_range")
    if value_range is not None and not (isinstance(value_range, list) and len(value_range) == 2
                                        and all(_number(v, finite=False) for v in value_range)
                                        and value_range[0] <= value_range[1]):  # a spec may leave a side open
        raise bad(f"{field}.value_range", "null or [low, high], numbers with low <= high")


def _check_tolerances(tolerances: Any, bad) -> None:
    """model.tolerances, which `zoo verify` holds the artifact to where the model's plugin is
    not loaded (`zoo.standalone`): bounds, so finite and not negative."""
    if not isinstance(tolerances, dict):
        raise bad("model.tolerances", "an object of tolerances by precision")
    for precision, tol in tolerances.items():
        field = f"model.tolerances.{precision}"
        if not isinstance(tol, dict):
            raise bad(field, "an object (atol, rtol, metric_drop, compare)")
        for key, default in (("atol", None), ("rtol", 0.0), ("metric_drop", None)):
            value = tol.get(key, default)
            if key == "metric_drop" and value is None:  # the metric's change is reported, not gated
                continue
            if not (_number(value) and value >= 0):
                raise bad(f"{field}.{key}", "a finite number, 0 or more")
        compare = tol.get("compare")
        if compare is not None and not (isinstance(compare, list) and all(isinstance(c, str) for c in compare)):
            raise bad(f"{field}.compare", "null or a list of output names")
