"""NVIDIA Triton model configuration (`config.pbtxt`) for an artifact.

The text is protobuf text format for Triton's `ModelConfig` message, so the export
repository is also a valid Triton model repository; the tests parse it with the
`model_config_pb2` module that tritonclient ships and load it in a real `tritonserver`
(tests/test_triton_server.py).

Two forms (`zoo export --triton native|python`):

- **native**: the engine's own Triton backend (`platform: "onnxruntime_onnx"`,
  `"tensorrt_plan"`, `backend: "openvino"`), named by the backend plugin's `triton`.
- **python**: Triton's Python backend runs `1/model.py`, which serves the artifact
  through zoo's own runner (`zoo.triton_backend`) under Triton's dynamic batcher. It is
  the only form for engines Triton has no backend for: a `torch.export` program (Triton's
  PyTorch backend runs TorchScript), `torch.compile`, and AOTInductor packages with a batch
  axis (Triton's `torch_aoti` platform serves batch 1 only). Any artifact can take it, an
  ONNX Runtime or OpenVINO one included; `model.py` opens the artifact as `zoo.load` does,
  so every file is checked against the manifest's sha256 before anything runs.

A backend whose engine Triton has a backend for, but which cannot be configured to compute
as the artifact was verified, states its `triton` as a `NativeOnRequest`: python by default,
native only when asked, with a warning saying what Triton would compute instead. OpenVINO's
is one: its CPU plugin computes float models in bf16 on CPUs with native bf16 unless told
f32, and Triton's OpenVINO backend has no parameter that says f32 (docs/deploy.md).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Mapping

from .spec import ModelSpec, TensorSpec

TRITON_DTYPES = {
    "float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "int64": "TYPE_INT64",
    "int32": "TYPE_INT32", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL", "string": "TYPE_STRING",
}


#: the configuration Triton reads from a model's directory
CONFIG = "config.pbtxt"
#: a top-level `name:` field (nested ones, a tensor's, are indented as `model_config` writes them);
#: protobuf's text format takes either quote
_NAME = re.compile(r"""^name\s*:\s*(?:"((?:[^"\\\n]|\\.)*)"|'((?:[^'\\\n]|\\.)*)')""", re.M)

FORMS = ("native", "python")
PYTHON_RUNTIME = {"backend": "python"}
#: `1/model.py` of the python form: Triton's Python backend looks for `TritonPythonModel` in it
MODEL_PY = '''"""Triton Python-backend model written by `zoo export`: serves this artifact (the model file
beside this one, checked against zoo.json) through zoo's own runner. Triton's Python stub
must see zoo and this artifact's backend plugin (docs/deploy.md)."""
from zoo.triton_backend import TritonPythonModel  # noqa: F401
'''


class NativeOnRequest(dict):
    """A backend's `triton` (Triton's platform or backend for its engine) where that Triton
    backend cannot be configured to compute as the artifact was verified: `triton_form`
    makes the python form the default and warns with `caveat` when the native one is asked
    for. A plain mapping otherwise: what config.pbtxt and the manifest record of it."""

    def __init__(self, runtime: Mapping[str, str], caveat: str) -> None:
        super().__init__(runtime)
        self.caveat = caveat


def triton_form(runtime: Mapping[str, str], requested: str | None) -> str:
    """The form an export takes: `requested`, else native where Triton has a backend that
    serves the artifact as verified (not a `NativeOnRequest`)."""
    from .errors import UnsupportedError

    caveat = getattr(runtime, "caveat", None)
    if requested is None:
        return "native" if runtime and caveat is None else "python"
    if requested not in FORMS:
        raise UnsupportedError(f"unknown Triton form {requested!r}; choose {' or '.join(FORMS)}")
    if requested == "native" and not runtime:
        raise UnsupportedError("Triton has no backend for this engine: its artifacts are served by Triton's "
                               "Python backend through zoo's runner (--triton python)")
    if requested == "native" and caveat is not None:
        logging.getLogger("zoo").warning("the native Triton form, as asked: %s", caveat)
    return requested


#: a model configuration parameter as `zoo export --triton-parameter` takes it: a key as Triton's
#: backends name theirs ("enable_mem_arena", "memory.enable_memory_arena_shrinkage"), and a value
#: of printable ASCII that needs no escaping in config.pbtxt
PARAMETER_KEY, PARAMETER_VALUE = re.compile(r"[A-Za-z0-9_.:-]{1,128}"), re.compile(r"[ !#-\[\]-~]{0,1024}")


def check_parameters(parameters: Mapping[str, str] | None) -> dict[str, str]:
    """`parameters` for a `config.pbtxt`, or a usage error naming the first bad one."""
    from .errors import UsageError

    checked = {}
    for key, value in (parameters or {}).items():
        if not isinstance(key, str) or not PARAMETER_KEY.fullmatch(key):
            raise UsageError(f"Triton parameter key {str(key)[:80]!r}: letters, digits, '_', '.', ':' and '-' only")
        if not isinstance(value, str) or not PARAMETER_VALUE.fullmatch(value):
            raise UsageError(f"Triton parameter {key}: the value must be a string of printable ASCII without "
                             f"quotes or backslashes, not {str(value)[:80]!r}")
        checked[key] = value
    return checked


def write_repository_files(directory, name: str, spec: ModelSpec, runtime: Mapping[str, str], filename: str,
                           device: str, form: str, parameters: Mapping[str, str] | None = None,
                           rows_dependent: str | None = None) -> None:
    """`config.pbtxt` (and for the python form `1/model.py`) inside artifact `directory`;
    `rows_dependent`: why the model's rows are not independent (no dynamic batching)."""
    from pathlib import Path

    directory = Path(directory)
    for t in spec.outputs:
        if label_file(t):
            (directory / label_file(t)).write_text("".join(f"{label}\n" for label in t.labels))
    if form == "python":
        (directory / "1" / "model.py").write_text(MODEL_PY)
        text = model_config(name, spec, PYTHON_RUNTIME, None, device, parameters, rows_dependent)
    else:
        text = model_config(name, spec, runtime, filename, device, parameters, rows_dependent)
    (directory / CONFIG).write_text(text)


def config_names(text: str) -> list[str]:
    """The model names a `config.pbtxt`'s top-level `name:` fields give (`model_config`
    writes one); [] where it gives none, and Triton names the model by its directory."""
    return [single or _unescaped(double) for double, single in _NAME.findall(text)]


def _unescaped(quoted: str) -> str:
    """A double-quoted name's text: `model_config` writes it as JSON does."""
    try:
        return json.loads(f'"{quoted}"')
    except json.JSONDecodeError:
        return quoted


def batched(spec: ModelSpec) -> bool:
    """Triton's implicit batch dimension applies when every tensor leads with "batch"."""
    return all(t.shape and t.shape[0] == "batch" for t in spec.inputs + spec.outputs)


def rows_batched(spec: ModelSpec) -> bool:
    """Requests can be merged along "batch" (zoo serve): every output and at least one input
    lead with it. Inputs without it are side inputs; Triton has no such notion, so a model
    with side inputs gets `max_batch_size: 0` there and runs one request at a time."""
    return all(t.shape[:1] == ("batch",) for t in spec.outputs) and any(t.shape[:1] == ("batch",)
                                                                         for t in spec.inputs)


def label_file(t: TensorSpec) -> str | None:
    """The file of an output's class labels, one per line, that its `label_filename` names,
    so that Triton's classification extension answers "score:index:label" as zoo serve
    does; None without labels (or with one a line cannot hold)."""
    if not t.labels or any("\n" in label or "\r" in label for label in t.labels):
        return None
    return f"labels.{re.sub(r'[^A-Za-z0-9_.-]', '_', t.name)}.txt"


def tensor_config(t: TensorSpec, drop_batch: bool) -> dict:
    """One `ModelInput`/`ModelOutput` of Triton's configuration, as JSON (`GET .../config`)."""
    dims = t.shape[1:] if drop_batch else t.shape
    entry: dict = {"name": t.name, "data_type": TRITON_DTYPES[t.dtype],
                   "dims": [d if isinstance(d, int) else -1 for d in dims] or [1]}
    if not dims:  # a per-sample scalar: Triton wants dims [1] plus an empty reshape, else it feeds [batch, 1]
        entry["reshape"] = {"shape": []}
    if label_file(t):
        entry["label_filename"] = label_file(t)
    return entry


def _tensor(t: TensorSpec, drop_batch: bool) -> str:
    entry = tensor_config(t, drop_batch)
    reshape = "\n    reshape: { shape: [ ] }" if "reshape" in entry else ""
    labels = f"\n    label_filename: {json.dumps(entry['label_filename'])}" if "label_filename" in entry else ""
    return (f"  {{\n    name: {json.dumps(t.name)}\n    data_type: {entry['data_type']}\n"
            f"    dims: [ {', '.join(str(d) for d in entry['dims'])} ]{reshape}{labels}\n  }}")


def model_config(name: str, spec: ModelSpec, runtime: Mapping[str, str], filename: str | None,
                 device: str, parameters: Mapping[str, str] | None = None, rows_dependent: str | None = None) -> str:
    """The `config.pbtxt` text for artifact `name` of `spec` served by `runtime`
    (`filename`: the model file Triton loads; None for the Python backend's `model.py`).
    `rows_dependent`: why a row's outputs change batched with others (`zoo.check`): then
    max_batch_size 0 (the batch axis in each tensor's dims) and no dynamic batching, and
    Triton runs each request as its client sent it."""
    # rows that are not independent: no batch axis for Triton (max_batch_size 0, the batch in dims), so it runs
    # each request as sent; without a scheduler, auto-complete can still give a batching model a dynamic batcher
    is_batched = batched(spec) and rows_dependent is None
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
    if batched(spec) and rows_dependent is not None:
        lines.append(f"# rows are not independent ({' '.join(rows_dependent.split())}): max_batch_size 0 and no "
                     "dynamic batching, as merged requests would change each other's answers")
    elif is_batched:  # Triton's recommended start: batches as large as the queue holds when an instance frees, no
        # delay and no preferred sizes (a preferred size sends that many at once and leaves the rest waiting)
        lines.append("dynamic_batching {\n  max_queue_delay_microseconds: 0\n}")
    kind = "KIND_GPU" if device.startswith("cuda") else "KIND_CPU"
    lines.append(f"instance_group [\n  {{\n    count: 1\n    kind: {kind}\n  }}\n]")
    if filename is not None:
        lines.append(f"default_model_filename: {json.dumps(filename)}")
    lines += [f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}'
              for key, value in (parameters or {}).items()]
    return "\n".join(lines) + "\n"
