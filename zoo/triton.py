"""NVIDIA Triton model configuration (`config.pbtxt`) for an artifact.

The text is protobuf text format for Triton's `ModelConfig` message, so the export
repository is also a valid Triton model repository; the tests parse it with the
`model_config_pb2` module that tritonclient ships.
"""

from __future__ import annotations

import json
from typing import Mapping

from .spec import ModelSpec, TensorSpec

TRITON_DTYPES = {
    "float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "int64": "TYPE_INT64",
    "int32": "TYPE_INT32", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL", "string": "TYPE_STRING",
}


def batched(spec: ModelSpec) -> bool:
    """Triton's implicit batch dimension applies when every tensor leads with "batch"."""
    return all(t.shape and t.shape[0] == "batch" for t in spec.inputs + spec.outputs)


def rows_batched(spec: ModelSpec) -> bool:
    """Requests can be merged along "batch" (zoo serve): every output and at least one input
    lead with it. Inputs without it are side inputs; Triton has no such notion, so a model
    with side inputs gets `max_batch_size: 0` there and runs one request at a time."""
    return all(t.shape[:1] == ("batch",) for t in spec.outputs) and any(t.shape[:1] == ("batch",)
                                                                         for t in spec.inputs)


def tensor_config(t: TensorSpec, drop_batch: bool) -> dict:
    """One `ModelInput`/`ModelOutput` of Triton's configuration, as JSON (`GET .../config`)."""
    dims = t.shape[1:] if drop_batch else t.shape
    entry: dict = {"name": t.name, "data_type": TRITON_DTYPES[t.dtype],
                   "dims": [d if isinstance(d, int) else -1 for d in dims] or [1]}
    if not dims:  # a per-sample scalar: Triton wants dims [1] plus an empty reshape, else it feeds [batch, 1]
        entry["reshape"] = {"shape": []}
    return entry


def _tensor(t: TensorSpec, drop_batch: bool) -> str:
    entry = tensor_config(t, drop_batch)
    reshape = "\n    reshape: { shape: [ ] }" if "reshape" in entry else ""
    return (f"  {{\n    name: {json.dumps(t.name)}\n    data_type: {entry['data_type']}\n"
            f"    dims: [ {', '.join(str(d) for d in entry['dims'])} ]{reshape}\n  }}")


def model_config(name: str, spec: ModelSpec, runtime: Mapping[str, str], filename: str, device: str) -> str:
    """The `config.pbtxt` text for artifact `name` of `spec` served by `runtime`."""
    is_batched = batched(spec)
    r = spec.axes["batch"]
    lines = [f"name: {json.dumps(name)}"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in runtime.items()]
    side = [t.name for t in spec.inputs if t.shape[:1] != ("batch",)]
    if side and rows_batched(spec):  # say why a batchable model is not batched here
        lines.append(f"# side inputs {side} have no batch axis: one value per request for all its rows. Triton's "
                     "implicit batch axis needs it on every input, so Triton runs each request alone; zoo serve "
                     "batches requests whose side inputs are equal")
    lines.append(f"max_batch_size: {r.max if is_batched else 0}")
    lines.append("input [\n" + ",\n".join(_tensor(t, is_batched) for t in spec.inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor(t, is_batched) for t in spec.outputs) + "\n]")
    if is_batched:
        preferred = ", ".join(str(b) for b in sorted({r.opt, r.max}))
        lines.append(f"dynamic_batching {{\n  preferred_batch_size: [ {preferred} ]\n"
                     f"  max_queue_delay_microseconds: 1000\n}}")
    kind = "KIND_GPU" if device.startswith("cuda") else "KIND_CPU"
    lines.append(f"instance_group [\n  {{\n    count: 1\n    kind: {kind}\n  }}\n]")
    lines.append(f"default_model_filename: {json.dumps(filename)}")
    return "\n".join(lines) + "\n"
