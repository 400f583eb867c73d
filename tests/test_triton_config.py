"""Every artifact's config.pbtxt is a Triton `ModelConfig` that agrees with its spec.

The text is parsed by protobuf with the `model_config_pb2` module that tritonclient
ships (tritonclient[grpc], in requirements.txt), so a field Triton does not know, or a
malformed value, fails the parse itself. Artifacts are exported tiny and at random
init by every backend that runs on the CPU here, for two specs: the vision plugin's
`resnet8.digits` and a sequence model defined below, whose int64 input and second
output have a dynamic "seq" axis.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import zoo
from zoo import registry
from zoo.triton import model_config, triton_form

#: zoo dtype -> Triton DataType, written out here rather than taken from zoo.triton
TRITON_TYPES = {
    "float32": model_config_pb2.TYPE_FP32, "float16": model_config_pb2.TYPE_FP16,
    "bfloat16": model_config_pb2.TYPE_BF16, "int64": model_config_pb2.TYPE_INT64,
    "int32": model_config_pb2.TYPE_INT32, "int8": model_config_pb2.TYPE_INT8,
    "uint8": model_config_pb2.TYPE_UINT8, "bool": model_config_pb2.TYPE_BOOL,
    "string": model_config_pb2.TYPE_STRING,
}
VOCAB, WIDTH, CLASSES = 32, 8, 3


class Pooler(torch.nn.Module):
    """Token embeddings (batch, seq, width) and mean-pooled logits (batch, classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embed(tokens)
        return self.head(hidden.mean(dim=1)), hidden


def sample_tokens(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    seq = int(rng.integers(2, 17))  # a different length per call, so parity covers the dynamic axis
    return {"tokens": rng.integers(0, VOCAB, (batch, seq), dtype=np.int64)}


POOLER = zoo.ModelSpec(
    name="pooler.test", domain="nlp", task="text-classification",
    inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq")),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", CLASSES)),
             zoo.TensorSpec("hidden", "float32", ("batch", "seq", WIDTH))),
    build=Pooler, sample=sample_tokens,
    axes={"batch": zoo.AxisRange(1, 4, 16), "seq": zoo.AxisRange(2, 8, 16)})

#: the compiling backends write the torch backend's Triton mapping (torch-compile) or are
#: covered in tests/test_backend_torch_compiled.py (torch-aoti); compiling here costs minutes
CPU_BACKENDS = sorted(name for name, backend in registry.backends().items()
                      if backend.probe("cpu").ok and name not in {"torch-compile", "torch-aoti"})
SPECS = {"resnet8.digits": lambda: zoo.get_model("resnet8.digits").tiny(), "pooler.test": lambda: POOLER}


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.fixture(scope="module", params=[(b, s) for b in CPU_BACKENDS for s in SPECS], ids="-".join)
def exported(request, tmp_path_factory) -> tuple[zoo.Artifact, zoo.ModelSpec, model_config_pb2.ModelConfig]:
    backend, spec_name = request.param
    spec = SPECS[spec_name]()
    art = zoo.export(spec, backend, repository=tmp_path_factory.mktemp("exports"), random_init=True)
    return art, spec, parse((art.path / "config.pbtxt").read_text())


def test_cpu_backends_are_found():
    assert {"onnxruntime", "torch"} <= set(CPU_BACKENDS)


def test_name_and_runtime(exported):
    art, _, config = exported
    assert config.name == art.path.name
    # the engine's own Triton backend where Triton has one that serves the artifact as verified, else
    # Triton's Python backend (zoo.triton.triton_form)
    native = triton_form(zoo.get_backend(art.backend).triton, None) == "native"
    runtime = dict(zoo.get_backend(art.backend).triton) if native else {"backend": "python"}
    assert set(runtime) <= {"platform", "backend"}
    assert {key: getattr(config, key) for key in runtime} == runtime
    assert art.manifest["triton"] == {"form": "native" if native else "python", **runtime}


def test_batching(exported):
    _, spec, config = exported
    assert config.max_batch_size == spec.axes["batch"].max
    assert config.HasField("dynamic_batching")
    # Triton's recommended start (and its defaults): no preferred sizes, no queue delay
    assert list(config.dynamic_batching.preferred_batch_size) == []
    assert config.dynamic_batching.max_queue_delay_microseconds == 0


def test_forms(tmp_path):
    """`triton="python"` on an engine Triton has a backend for; `"native"` refused where
    it has none, before any work; an unknown form refused."""
    spec = POOLER
    art = zoo.export(spec, "onnxruntime", repository=tmp_path, random_init=True, triton="python")
    config = parse((art.path / "config.pbtxt").read_text())
    assert (config.backend, config.platform, config.default_model_filename) == ("python", "", "")
    assert "from zoo.triton_backend import TritonPythonModel" in (art.path / "1" / "model.py").read_text()
    assert art.manifest["files"]["1/model.py"]
    native = zoo.export(spec, "onnxruntime", repository=tmp_path, random_init=True)  # rebuilt in the native form
    assert parse((native.path / "config.pbtxt").read_text()).platform == "onnxruntime_onnx"
    assert not (native.path / "1" / "model.py").exists()
    with pytest.raises(zoo.ZooError, match="Triton has no backend for this engine"):
        zoo.export(spec, "torch", repository=tmp_path, random_init=True, triton="native")
    with pytest.raises(zoo.ZooError, match="unknown Triton form 'jit'"):
        zoo.export(spec, "torch", repository=tmp_path, random_init=True, triton="jit")


def expected_tensors(tensors: tuple[zoo.TensorSpec, ...]) -> list[tuple[str, int, list[int]]]:
    """Name, Triton type and dims with the batch axis dropped and dynamic axes as -1."""
    return [(t.name, TRITON_TYPES[t.dtype], [d if isinstance(d, int) else -1 for d in t.shape[1:]])
            for t in tensors]


def test_inputs_and_outputs(exported):
    _, spec, config = exported
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == expected_tensors(spec.inputs)
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == expected_tensors(spec.outputs)


def test_outputs_with_labels_name_a_labels_file_triton_reads(exported):
    """Triton's classification extension answers "score:index:label" only where the
    output's `label_filename` names a file of one label per line, in the model directory:
    as zoo serve answers for an output whose spec has labels. The file is one of the
    artifact's hashed files."""
    art, spec, config = exported
    for t, entry in zip(spec.outputs, config.output):
        if t.labels:
            assert entry.label_filename == f"labels.{t.name}.txt"
            assert (art.path / entry.label_filename).read_text().splitlines() == list(t.labels)
            assert entry.label_filename in art.manifest["files"]
        else:
            assert entry.label_filename == ""
    assert any(t.labels for t in spec.outputs) == (spec.name == "resnet8.digits")


def test_model_file_and_instances(exported):
    art, _, config = exported
    # Triton's version directory "1": the engine's file, or the Python backend's model.py beside it
    python_form = config.backend == "python"
    assert config.default_model_filename == ("" if python_form else art.model_file.name)
    assert (art.path / "1" / (config.default_model_filename or "model.py")).is_file()
    assert art.model_file.parent == art.path / "1"
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]


def test_signature_in_the_manifest_matches(exported):
    art, _, config = exported
    manifest = json.loads((art.path / "zoo.json").read_text())
    assert [t["name"] for t in manifest["signature"]["inputs"]] == [t.name for t in config.input]
    assert [t["name"] for t in manifest["signature"]["outputs"]] == [t.name for t in config.output]


def test_onnx_graph_names_match_the_config(exported):
    art, _, config = exported
    if art.model_file.suffix != ".onnx":
        pytest.skip("only ONNX files are read here")
    import onnx

    graph = onnx.load(str(art.model_file), load_external_data=False).graph
    assert [i.name for i in graph.input] == [t.name for t in config.input]
    assert [o.name for o in graph.output] == [t.name for t in config.output]


def test_per_sample_scalars_are_reshaped():
    spec = zoo.ModelSpec(
        name="regressor.test", domain="drug", task="regression",
        inputs=(zoo.TensorSpec("features", "float32", ("batch", 4)),),
        outputs=(zoo.TensorSpec("value", "float32", ("batch",)),),
        build=lambda: torch.nn.Linear(4, 1), sample=lambda b, rng: {})
    config = parse(model_config("regressor.test.onnxruntime.fp32", spec, {"platform": "onnxruntime_onnx"},
                                "model.onnx", "cpu"))
    value = config.output[0]
    assert list(value.dims) == [1]
    assert value.HasField("reshape") and list(value.reshape.shape) == []


def test_artifact_files_get_the_mode_the_umask_gives(tmp_path):
    """safetensors' `save_file` makes its files 0600 (weights.safetensors, test_data/*): a
    Triton or `zoo serve` running as another user could not read the artifact. The staged
    directory is committed with every file at 0o666 and every directory at 0o777 less the
    umask, as `open` and `mkdir` make them (0o027 here: group-readable, not world)."""
    import os
    import stat

    from zoo.fsutil import atomic_directory

    old = os.umask(0o027)
    try:
        art = zoo.export(POOLER, "torch", repository=tmp_path / "exports", random_init=True)
        with atomic_directory(tmp_path / "staged") as staged:  # an executable file keeps its execute bits
            (staged / "run.sh").write_text("#!/bin/sh\n")
            os.chmod(staged / "run.sh", 0o700)
            (staged / "private").write_text("")
            os.chmod(staged / "private", 0o600)
    finally:
        os.umask(old)
    modes = {p.relative_to(art.path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in art.path.rglob("*")}
    assert {"weights.safetensors", "test_data", "1/model.pt2", "zoo.json"} <= set(modes)
    assert any(name.startswith("test_data/") and name.endswith(".safetensors") for name in modes)
    assert {name: oct(mode) for name, mode in modes.items()
            if mode != (0o750 if (art.path / name).is_dir() else 0o640)} == {}
    assert stat.S_IMODE(art.path.stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "staged" / "run.sh").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "staged" / "private").stat().st_mode) == 0o640


def test_config_departures_name_what_triton_would_serve_wrongly():
    """What `zoo.triton_backend` refuses to initialize with (tests/test_triton_server.py loads such
    configurations in a real Triton): the exported configuration agrees; a changed data type,
    dims, reshape, a missing or extra tensor, or a larger `max_batch_size` are each named."""
    import copy

    from zoo.triton import batched, tensor_config
    from zoo.triton_backend import config_departures

    spec = zoo.ModelSpec(
        name="scorer.test", domain="nlp", task="text-classification",
        inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, VOCAB - 1)),),
        outputs=(zoo.TensorSpec("hidden", "float32", ("batch", "seq", WIDTH)),
                 zoo.TensorSpec("score", "float32", ("batch",))),
        build=Pooler, sample=sample_tokens, axes={"batch": zoo.AxisRange(1, 4, 16), "seq": zoo.AxisRange(2, 8, 16)})
    assert batched(spec)
    exported = {"max_batch_size": 16, "input": [tensor_config(t, True) for t in spec.inputs],
                "output": [tensor_config(t, True) for t in spec.outputs]}
    assert config_departures(exported, spec) == []
    smaller = {**exported, "max_batch_size": 4}
    assert config_departures(smaller, spec) == []  # smaller batches: Triton never sends more
    # as Triton's JSON gives it: int64 fields as strings in some versions
    assert config_departures({**exported, "input": [{**exported["input"][0], "dims": ["-1"]}]}, spec) == []

    def changed(edit) -> list[str]:
        config = copy.deepcopy(exported)
        edit(config)
        return config_departures(config, spec)

    assert changed(lambda c: c["output"][0].update(data_type="TYPE_INT32")) == [
        "output 'hidden' has data_type TYPE_INT32; the artifact's is TYPE_FP32 (float32)"]
    assert changed(lambda c: c.update(max_batch_size=64)) == [
        "max_batch_size is 64; the artifact takes batches of 1 to 16"]
    assert changed(lambda c: c["input"][0].update(dims=[-1, 4])) == [
        "input 'tokens' has dims [-1, 4]; the artifact's are [-1] (shape ['batch', 'seq'], after the batch axis)"]
    assert changed(lambda c: c["output"][1].pop("reshape")) == ["output 'score' has reshape none; the artifact's is []"]
    assert changed(lambda c: c["output"].pop()) == [
        "outputs are ['hidden']; the artifact's are ['hidden', 'score'] (missing ['score'], unexpected [])"]
    # unbatched, the batch axis in the dims: Triton runs each request whole, as the runner takes it
    whole = {"max_batch_size": 0, "input": [tensor_config(t, False) for t in spec.inputs],
             "output": [tensor_config(t, False) for t in spec.outputs]}
    assert config_departures(whole, spec) == []
    assert changed(lambda c: c.update(max_batch_size=0)) == [
        "input 'tokens' has dims [-1]; the artifact's are [-1, -1] (shape ['batch', 'seq'])",
        "output 'hidden' has dims [-1, 8]; the artifact's are [-1, -1, 8] (shape ['batch', 'seq', 8])",
        "output 'score' has dims [1]; the artifact's are [-1] (shape ['batch'])",
        "output 'score' has reshape []; the artifact's is none"]
