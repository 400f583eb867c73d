"""The onnxruntime backends: export -> load -> parity with torch, dynamic batch, refusals.

A tiny conv net spec is built here, so these tests need no model plugin. GPU tests are
marked `needs_cuda` and skip cleanly where torch sees no CUDA device.
"""

from __future__ import annotations

import importlib.metadata
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

import zoo
from zoo.errors import ArtifactError, BackendUnavailableError, StaleArtifactError, ZooError
from zoo.tensors import dynamic_shapes
from zoo_onnx.export import DEFAULT_OPSET, export_onnx
from zoo_onnxruntime import OnnxRuntimeBackend, OnnxRuntimeTensorRTBackend, zoo_register_backends
from zoo_onnxruntime.runner import OnnxRuntimeRunner, to_torch
from zoo_onnxruntime.tensorrt_ep import profile_shapes

ort = pytest.importorskip("onnxruntime")


def needs_cuda(test):
    test = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test)
    return pytest.mark.needs_cuda(test)


def _build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 10))


def _sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"image": rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)}


SPEC = zoo.ModelSpec(
    name="tinyconv.test", domain="vision", task="image-classification",
    inputs=(zoo.TensorSpec("image", "float32", ("batch", 1, 8, 8)),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", 10)),),
    build=_build, sample=_sample, axes={"batch": zoo.AxisRange(1, 4, 16)})


#: SPEC with int8: a quantization method and the int8 tolerance it is held to
INT8_SPEC = replace(SPEC, quantization="static", tolerances={**SPEC.tolerances, "int8": zoo.Tolerance(0.5, 0.05)})


def _reference(module: torch.nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(inputs["image"])).numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One fp32 export shared by the module's tests (the dynamo exporter takes ~1 s)."""
    module = _build().eval()
    path = tmp_path_factory.mktemp("ort") / "model.onnx"
    example = {"image": torch.from_numpy(_sample(4, np.random.default_rng(0))["image"])}
    info = OnnxRuntimeBackend().export(module, SPEC, example, path, "fp32", "cpu")
    return module, path, info


def test_registers_both_backends_without_importing_onnxruntime():
    found = []
    zoo_register_backends(register=found.append)
    assert [b.name for b in found] == ["onnxruntime", "onnxruntime-trt"]
    assert "zoo_onnxruntime" in {ep.value for ep in importlib.metadata.entry_points(group="zoo")}
    code = "import sys, zoo_onnxruntime; sys.exit('onnxruntime' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_export_writes_a_checked_dynamic_model(exported):
    _, path, info = exported
    assert info == {"exporter": "dynamo", "opset": DEFAULT_OPSET, "onnx_cache": info["onnx_cache"]}
    assert info["onnx_cache"] in ("hit", "miss")  # tests/test_onnx_cache.py: which, and when
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["image"]
    assert [o.name for o in model.graph.output] == ["logits"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert list(path.parent.iterdir()) == [path]  # small weights stay inside the one file


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_cpu_matches_torch_at_every_batch_size(exported, batch):
    module, path, _ = exported
    runner = OnnxRuntimeBackend().load(path, SPEC, "fp32", "cpu", threads=1)
    assert runner.input_names == ("image",) and runner.output_names == ("logits",)
    inputs = _sample(batch, np.random.default_rng(batch))
    out = runner(inputs)
    assert isinstance(out["logits"], np.ndarray) and out["logits"].shape == (batch, 10)
    np.testing.assert_allclose(out["logits"], _reference(module, inputs), atol=1e-4, rtol=1e-4)


def test_runner_takes_torch_tensors_and_casts_to_the_session_dtype(exported):
    module, path, _ = exported
    runner = OnnxRuntimeBackend().load(path, SPEC, "fp32", "cpu")
    inputs = _sample(2, np.random.default_rng(1))
    out = runner({"image": torch.from_numpy(inputs["image"]).double()})
    np.testing.assert_allclose(out["logits"], _reference(module, inputs), atol=1e-4, rtol=1e-4)


def test_runner_names_missing_and_unexpected_inputs(exported):
    _, path, _ = exported
    runner = OnnxRuntimeBackend().load(path, SPEC, "fp32", "cpu")
    with pytest.raises(ZooError, match=r"missing \['image'\], unexpected \['img'\]"):
        runner({"img": np.zeros((1, 1, 8, 8), np.float32)})


def test_io_binding_returns_torch_tensors(exported):
    """The CUDA code path (bind by address, outputs through DLPack), exercised on CPU."""
    module, path, _ = exported
    session = OnnxRuntimeBackend().session(path, SPEC, "fp32", "cpu")
    runner = OnnxRuntimeRunner(session, SPEC, "cpu", bind=True)
    inputs = _sample(3, np.random.default_rng(3))
    out = runner({"image": torch.from_numpy(inputs["image"])})
    assert isinstance(out["logits"], torch.Tensor) and out["logits"].shape == (3, 10)
    np.testing.assert_allclose(out["logits"].numpy(), _reference(module, inputs), atol=1e-4, rtol=1e-4)


def test_io_binding_gives_arrays_for_arrays(exported):
    """Arrays in, arrays out, as every runner does: a plugin's metric and domain check read
    the outputs with numpy (on the first CUDA run, MiniLM's domain check got device tensors
    from the bound path and its fp16 export failed)."""
    module, path, _ = exported
    session = OnnxRuntimeBackend().session(path, SPEC, "fp32", "cpu")
    runner = OnnxRuntimeRunner(session, SPEC, "cpu", bind=True)
    inputs = _sample(3, np.random.default_rng(4))
    out = runner(inputs)
    assert isinstance(out["logits"], np.ndarray) and out["logits"].shape == (3, 10)
    np.testing.assert_allclose(out["logits"], _reference(module, inputs), atol=1e-4, rtol=1e-4)


def test_to_torch_keeps_bool_outputs_bool():
    value = ort.OrtValue.ortvalue_from_numpy(np.array([True, False]))
    assert to_torch(value, torch.bool).tolist() == [True, False]


def test_shared_axes_share_one_dim_and_dict_outputs_keep_their_names(tmp_path):
    class Pair(torch.nn.Module):
        def forward(self, y, x):  # in another order than the spec's: bound by name
            return {"total": x.sum(1, keepdim=True) + y.sum(1, keepdim=True), "diff": x - y}

    spec = zoo.ModelSpec(
        name="pair.test", domain="test", task="test",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 3)), zoo.TensorSpec("y", "float32", ("batch", 3))),
        outputs=(zoo.TensorSpec("diff", "float32", ("batch", 3)), zoo.TensorSpec("total", "float32", ("batch", 1))),
        build=Pair, sample=lambda n, rng: {k: rng.standard_normal((n, 3)).astype(np.float32) for k in "xy"})
    shapes = dynamic_shapes(spec)
    assert shapes[0][0] is shapes[1][0]
    example = {k: torch.from_numpy(v) for k, v in spec.sample(4, np.random.default_rng(0)).items()}
    assert export_onnx(Pair(), spec, example, tmp_path / "model.onnx")["exporter"] == "dynamo"
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    assert {v.type.tensor_type.shape.dim[0].dim_param for v in [*graph.input, *graph.output]} == {"batch"}
    runner = OnnxRuntimeBackend().load(tmp_path / "model.onnx", spec, "fp32", "cpu")
    inputs = spec.sample(5, np.random.default_rng(1))
    out = runner(inputs)
    np.testing.assert_allclose(out["diff"], inputs["x"] - inputs["y"], atol=1e-6)
    assert out["total"].shape == (5, 1)


def test_a_later_export_reuses_the_exporters_op_list_and_writes_the_same_graph(exported, tmp_path, monkeypatch):
    """torch's exporter rebuilt ONNX Script's op list on every call, re-parsing the source
    of ~500 functions (about a second per export); `export_onnx` keeps it after the first.
    The module's first export (the fixture) has run, so this one parses no source."""
    from onnxscript._internal import ast_utils

    monkeypatch.setenv("ZOO_ONNX_CACHE", "0")  # the exporter itself, not the ONNX cache
    parsed = []
    real_parse = ast_utils.get_src_and_ast
    monkeypatch.setattr(ast_utils, "get_src_and_ast", lambda f: parsed.append(f) or real_parse(f))
    module, first, _ = exported
    example = {"image": torch.from_numpy(_sample(4, np.random.default_rng(0))["image"])}
    assert export_onnx(module, SPEC, example, tmp_path / "again.onnx")["exporter"] == "dynamo"
    assert parsed == []
    graph = onnx.load(str(tmp_path / "again.onnx")).graph
    assert [n.op_type for n in graph.node] == [n.op_type for n in onnx.load(str(first)).graph.node]
    inputs = _sample(3, np.random.default_rng(3))
    runner = OnnxRuntimeBackend().load(tmp_path / "again.onnx", SPEC, "fp32", "cpu")
    np.testing.assert_allclose(runner(inputs)["logits"], _reference(module, inputs), atol=1e-4, rtol=1e-4)


def torchscript_only(monkeypatch) -> None:
    """torch.onnx.export with the dynamo exporter failing, as on a module it cannot capture."""
    real_export = torch.onnx.export

    def dynamo_fails(*args, dynamo=True, **kwargs):
        if dynamo:
            raise RuntimeError("cannot capture this module")
        return real_export(*args, dynamo=False, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", dynamo_fails)


def test_falls_back_to_torchscript_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_ONNX_CACHE", "0")  # else an earlier export of the module is a hit
    torchscript_only(monkeypatch)
    module = _build().eval()
    example = {"image": torch.zeros(4, 1, 8, 8)}
    info = export_onnx(module, SPEC, example, tmp_path / "model.onnx")
    assert info["exporter"] == "torchscript" and "cannot capture" in info["dynamo_error"]
    runner = OnnxRuntimeBackend().load(tmp_path / "model.onnx", SPEC, "fp32", "cpu")
    inputs = _sample(7, np.random.default_rng(7))  # dynamic batch through dynamic_axes
    np.testing.assert_allclose(runner(inputs)["logits"], _reference(module, inputs), atol=1e-4, rtol=1e-4)


class ClipsOutliers(torch.nn.Module):
    """A Python `if` on tensor values whose other branch ordinary samples never take."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        if x.abs().max() > 10:  # rare: a glitching sensor
            x = x.clamp(-10, 10)
        return self.fc(x)


class ClipsByCount(ClipsOutliers):
    """The same branch on a Python number made of tensor values: found by a user, exported
    by the tracer as the example's branch (17.3 off PyTorch on an input holding 100)."""

    def forward(self, x):
        if int((x.abs() > 10).sum()) > 0:
            x = x.clamp(-10, 10)
        return self.fc(x)


class ClipsByItem(ClipsOutliers):
    def forward(self, x):
        if x.abs().max().item() > 10:
            x = x.clamp(-10, 10)
        return self.fc(x)


class ClipsByList(ClipsOutliers):
    def forward(self, x):
        if max(x.abs().amax(1).tolist()) > 10:
            x = x.clamp(-10, 10)
        return self.fc(x)


@pytest.mark.parametrize("module", [ClipsOutliers, ClipsByCount, ClipsByItem, ClipsByList],
                         ids=["bool", "int", "item", "tolist"])
def test_a_branch_on_tensor_values_is_refused_not_traced_one_way(tmp_path, module):
    """The dynamo exporter cannot capture the branch, and the TorchScript tracer would
    keep the branch the example took for every input (parity on ordinary samples passes,
    an outlier gets a wrong answer): refused, naming the line. Whether the condition is a
    tensor (`if tensor:`) or a Python number made of one (`int()`, `.item()`, `.tolist()`)."""
    spec = zoo.ModelSpec(name="clips.outliers", domain="tabular", task="regression",
                         inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),),
                         outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),), build=module,
                         sample=lambda b, rng: {"x": rng.standard_normal((b, 4)).astype(np.float32)},
                         axes={"batch": zoo.AxisRange(1, 4, 8)})
    with pytest.raises(ZooError, match=r"(branches on|turns) tensor values (in|into) Python.* "
                                       r"\(test_backend_onnxruntime.py:\d+\)"):
        export_onnx(module().eval(), spec, {"x": torch.zeros(4, 4)}, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


class ScaledAttention(torch.nn.Module):
    """A size made a Python number (attention's usual scale), which the tracer warns of as
    it warns of a tensor's values: exported, not refused (a review found it refused)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        q = self.fc(x)
        return torch.softmax(q @ q.transpose(-2, -1) / math.sqrt(q.size(-1)), -1) @ x


def test_a_size_made_a_python_number_is_traced_not_refused(tmp_path, monkeypatch):
    torchscript_only(monkeypatch)
    spec = zoo.ModelSpec(name="attn.scaled", domain="tabular", task="regression",
                         inputs=(zoo.TensorSpec("x", "float32", ("batch", "seq", 8)),),
                         outputs=(zoo.TensorSpec("y", "float32", ("batch", "seq", 8)),), build=ScaledAttention,
                         sample=lambda b, rng: {"x": rng.standard_normal((b, 6, 8)).astype(np.float32)},
                         axes={"batch": zoo.AxisRange(1, 2, 4), "seq": zoo.AxisRange(2, 6, 12)})
    module = ScaledAttention().eval()
    info = export_onnx(module, spec, {"x": torch.zeros(2, 6, 8)}, tmp_path / "model.onnx")
    assert info["exporter"] == "torchscript"
    runner = OnnxRuntimeBackend().load(tmp_path / "model.onnx", spec, "fp32", "cpu")
    x = np.random.default_rng(1).standard_normal((3, 11, 8)).astype(np.float32)
    np.testing.assert_allclose(runner({"x": x})["y"], module(torch.from_numpy(x)).detach().numpy(), atol=1e-5)


def test_bfloat16_tensors_are_refused_before_any_export(tmp_path):
    """numpy has no bfloat16: ONNX Runtime cannot hand such an output back (and OpenVINO's
    would be its bits read as float16), so the exporter says so before any work."""
    spec = zoo.ModelSpec(name="bf16.out", domain="tabular", task="regression",
                         inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),),
                         outputs=(zoo.TensorSpec("y", "bfloat16", ("batch", 3)),), build=ClipsOutliers,
                         sample=lambda b, rng: {"x": rng.standard_normal((b, 4)).astype(np.float32)})
    with pytest.raises(ZooError, match=r"bfloat16 tensors \['y'\].*declare them float32"):
        export_onnx(ClipsOutliers().eval(), spec, {"x": torch.zeros(4, 4)}, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


def test_fp16_export_keeps_a_float32_signature(exported, tmp_path):
    module, _, _ = exported
    path = tmp_path / "model.onnx"
    info = export_onnx(module, SPEC, {"image": torch.zeros(4, 1, 8, 8)}, path, precision="fp16")
    # nothing in a conv net needs fp32 (tests/test_onnxruntime_gpu_paths.py: models that do)
    assert info["fp16"] == {"converter": "onnxruntime.transformers.float16", "keep_io_types": True, "fp32_ops": {}}
    model = onnx.load(str(path))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    assert {i.data_type for i in model.graph.initializer} & floats == {onnx.TensorProto.FLOAT16}


def test_fp16_is_offered_on_cuda_only(exported):
    module, path, _ = exported
    with pytest.raises(zoo.errors.UnsupportedError, match="fp16 on cpu"):
        OnnxRuntimeBackend().export(module, SPEC, {"image": torch.zeros(4, 1, 8, 8)}, path, "fp16", "cpu")


def test_int8_static_writes_qdq_around_a_float_signature(exported, tmp_path):
    module, _, _ = exported
    spec = INT8_SPEC
    path = tmp_path / "model.onnx"
    info = OnnxRuntimeBackend().export(module, spec, {"image": torch.zeros(4, 1, 8, 8)}, path, "int8", "cpu")
    assert info["exporter"] == "dynamo" and info["quantization"]["method"] == "static"
    assert list(tmp_path.iterdir()) == [path]  # the fp32 intermediate stays out of the artifact
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert onnx.TensorProto.INT8 in {i.data_type for i in model.graph.initializer}
    runner = OnnxRuntimeBackend().load(path, spec, "int8", "cpu")
    inputs = _sample(5, np.random.default_rng(5))
    want = _reference(module, inputs)
    got = runner(inputs)["logits"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()  # int8: a few percent of the range
    assert not np.array_equal(got, want)


class _OutlierBlock(torch.nn.Module):
    """A transformer's sublayer in small: Linear -> LayerNorm -> Linear, the LayerNorm with
    one outlier channel (gain 30) as BERT's have (all-MiniLM-L6-v2's reach 30 where 99% of
    values lie within +-2)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.norm, self.down = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)
        with torch.no_grad():
            self.norm.weight[3] = 30.0

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


OUTLIER_SPEC = zoo.ModelSpec(
    name="outlier.test", domain="nlp", task="feature-extraction",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", "seq", 64)),),
    outputs=(zoo.TensorSpec("y", "float32", ("batch", "seq", 8)),),
    build=_OutlierBlock, axes={"batch": zoo.AxisRange(1, 2, 4), "seq": zoo.AxisRange(1, 8, 16)},
    sample=lambda batch, rng: {"x": rng.standard_normal((batch, 8, 64)).astype(np.float32)},
    quantization="dynamic", tolerances={**SPEC.tolerances, "int8": zoo.Tolerance(0.5, 0.05)})


def test_int8_of_a_transformer_quantizes_activations_per_row_block_and_refuses_static(tmp_path):
    """One int8 scale per activation tensor spends its steps on a transformer's outlier
    channels: ONNX Runtime's per-tensor dynamic int8 kept all-MiniLM-L6-v2's embeddings at
    cosine 0.989 (0.96 for one-word texts), static at 0.17. A graph with LayerNormalization
    gets int8 weights and activations scaled per row and block of 32 (MatMulNBits, int8
    compute), and static int8 is refused, saying why and what to use."""
    module = _OutlierBlock().eval()
    example = {"x": torch.from_numpy(OUTLIER_SPEC.sample(2, np.random.default_rng(0))["x"])}
    path = tmp_path / "model.onnx"
    info = OnnxRuntimeBackend().export(module, OUTLIER_SPEC, example, path, "int8", "cpu")["quantization"]
    assert info["method"] == "dynamic" and info["quantized_ops"] == {"MatMulNBits": 2}
    assert (info["form"], info["bits"], info["block_size"], info["accuracy_level"]) == ("MatMulNBits", 8, 32, 4)
    nodes = onnx.load(str(path)).graph.node
    assert {a.name: a.i for n in nodes if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name in ("bits", "block_size", "accuracy_level")} == {"bits": 8, "block_size": 32, "accuracy_level": 4}
    inputs = {"x": np.random.default_rng(5).standard_normal((3, 11, 64)).astype(np.float32)}
    with torch.no_grad():
        want = module(torch.from_numpy(inputs["x"])).numpy()
    got = OnnxRuntimeBackend().load(path, OUTLIER_SPEC, "int8", "cpu")(inputs)["y"]
    assert 0 < np.abs(got - want).max() < 0.05 * np.abs(want).max()  # int8: a few percent of the range
    with pytest.raises(zoo.errors.UnsupportedError, match=r"^model outlier.test: static int8 fixes one scale per "
                                                          r"activation tensor .* has 1 LayerNormalization ops.*"
                                                          r"outlier channels.* Use --quantization dynamic"):
        OnnxRuntimeBackend().export(module, replace(OUTLIER_SPEC, quantization="static"), example,
                                    tmp_path / "static.onnx", "int8", "cpu")


def test_int8_needs_a_quantization_method_and_the_cpu(exported, tmp_path):
    module, _, _ = exported
    example = {"image": torch.zeros(4, 1, 8, 8)}
    with pytest.raises(zoo.errors.UnsupportedError, match="names no int8 method.*--quantization static or dynamic"):
        OnnxRuntimeBackend().export(module, SPEC, example, tmp_path / "model.onnx", "int8", "cpu")
    with pytest.raises(zoo.errors.UnsupportedError, match="int8 on cuda"):
        OnnxRuntimeBackend().export(module, INT8_SPEC, example,
                                    tmp_path / "model.onnx", "int8", "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("backend", [OnnxRuntimeBackend(), OnnxRuntimeTensorRTBackend()], ids=lambda b: b.name)
def test_without_a_gpu_cuda_is_refused_with_a_reason(exported, backend):
    _, path, _ = exported
    available = backend.probe("cuda")
    assert not available.ok and available.reason
    with pytest.raises(BackendUnavailableError, match=available.reason[:20]):
        backend.load(path, SPEC, "fp16", "cuda")  # a precision both offer on cuda


def test_probe_names_the_devices_and_never_raises():
    assert OnnxRuntimeBackend().probe("cpu").ok
    assert "not tpu" in OnnxRuntimeBackend().probe("tpu").reason
    assert "not cpu" in OnnxRuntimeTensorRTBackend().probe("cpu").reason


def test_accepts_artifacts_from_this_or_older_onnxruntime_only(monkeypatch):
    backend = OnnxRuntimeBackend()
    monkeypatch.setattr(backend, "versions", lambda: {"onnxruntime": "1.20.1"})
    backend.check_compatible({"onnxruntime": "1.20.0"}, "m.onnxruntime.fp32")
    backend.check_compatible({"onnxruntime": "1.18.1+cu118"}, "m.onnxruntime.fp32")
    with pytest.raises(StaleArtifactError, match="zoo export --force"):
        backend.check_compatible({"onnxruntime": "1.21.0"}, "m.onnxruntime.fp32")
    monkeypatch.setattr(backend, "versions", lambda: {})
    with pytest.raises(BackendUnavailableError, match="not installed"):
        backend.check_compatible({"onnxruntime": "1.20.0"}, "m.onnxruntime.fp32")


def test_tensorrt_profile_comes_from_the_spec_axes():
    assert profile_shapes(SPEC) == {
        "trt_profile_min_shapes": "image:1x1x8x8",
        "trt_profile_opt_shapes": "image:4x1x8x8",
        "trt_profile_max_shapes": "image:16x1x8x8",
    }


@needs_cuda
@pytest.mark.parametrize("backend", [OnnxRuntimeBackend(),
                                     # the provider loads TensorRT's libraries, which the tensorrt package ships
                                     pytest.param(OnnxRuntimeTensorRTBackend(), marks=pytest.mark.needs_tensorrt)],
                         ids=lambda b: b.name)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_keeps_tensors_on_the_device(tmp_path, monkeypatch, backend, precision):
    available = backend.probe("cuda")
    if not available.ok:
        pytest.skip(available.reason)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # TensorRT engines land here
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # an fp32 reference (torch's default: TF32)
    module = _build().eval().cuda()
    path = tmp_path / "model.onnx"
    backend.export(module, SPEC, {"image": torch.randn(4, 1, 8, 8, device="cuda")}, path, precision, "cuda")
    runner = backend.load(path, SPEC, precision, "cuda")
    tol = SPEC.tolerance(precision)
    for batch in SPEC.batch_sizes():
        image = torch.randn(batch, 1, 8, 8, device="cuda")
        out = runner({"image": image})["logits"]
        assert out.device.type == "cuda" and out.shape == (batch, 10)
        with torch.no_grad():
            torch.testing.assert_close(out.float(), module(image), atol=tol.atol, rtol=tol.rtol)


def _spinning_stops(runner) -> bool:
    """Whether the runner's session stops its threads' spinning when a run returns."""
    options = runner.session.get_session_options()
    try:
        return options.get_session_config_entry("session.force_spinning_stop") == "1"
    except RuntimeError:  # "SessionOptions does not have configuration with key": not set
        return False


def test_a_served_session_stops_spinning_between_runs_and_an_in_process_one_does_not(tmp_path):
    """`zoo serve` (and Triton's Python backend model) load a runner whose threads stop
    spinning when a run returns, leaving the cores to the front end; `zoo.load` (bench,
    verify, predict) keeps ONNX Runtime's default, threads that spin for the next run."""
    from zoo.serve.repository import ServeOptions, open_model

    art = zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=tmp_path, random_init=True)
    model, runners = open_model(art.path, ServeOptions())
    assert runners and all(_spinning_stops(r) for r in runners)
    assert not _spinning_stops(zoo.load(art.path))
    out = runners[0]({"image": np.zeros((2, 1, 8, 8), np.float32)})
    assert out["logits"].shape == (2, 10)


def test_a_served_session_takes_tritons_memory_parameters_and_an_in_process_one_ignores_them(tmp_path):
    """The `parameters` of an artifact's config.pbtxt that Triton's ONNX Runtime backend
    documents (`zoo export --triton-parameter`) set the session `zoo serve` loads: the
    arena off, memory patterns off, the CPU arena shrunk after every run; `zoo.load`
    (bench, verify) keeps ONNX Runtime's defaults. The served runner answers the same."""
    from zoo.serve.repository import ServeOptions, config_parameters, open_model

    parameters = {"enable_mem_arena": "0", "enable_mem_pattern": "false"}
    art = zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=tmp_path, random_init=True,
                     triton_parameters=parameters)
    assert config_parameters((art.path / "config.pbtxt").read_text()) == parameters
    model, (served,) = open_model(art.path, ServeOptions())
    # the model configuration the server answers (GET .../config, gRPC ModelConfig) has them, as Triton's does
    assert model.config()["parameters"] == {k: {"string_value": v} for k, v in parameters.items()}
    in_process = zoo.load(art.path)
    x = {"image": np.random.default_rng(0).random((3, 1, 8, 8), np.float32)}
    np.testing.assert_array_equal(served(x)["logits"], in_process(x)["logits"])
    runner = _ort_runner(served)
    options = runner.session.get_session_options()
    assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern and runner.run_options is None
    default = _ort_runner(in_process).session.get_session_options()
    assert default.enable_cpu_mem_arena and default.enable_mem_pattern

    shrinking = zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=tmp_path / "s",
                           random_init=True, triton_parameters={"memory.enable_memory_arena_shrinkage": "cpu:0"})
    _, (served,) = open_model(shrinking.path, ServeOptions())
    run_options = _ort_runner(served).run_options
    assert run_options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    assert _ort_runner(zoo.load(shrinking.path)).run_options is None


def _ort_runner(runner) -> OnnxRuntimeRunner:
    """The OnnxRuntimeRunner behind the checking runner that `Artifact.load` returns."""
    assert isinstance(runner.unchecked, OnnxRuntimeRunner)
    return runner.unchecked


@pytest.mark.parametrize("parameters, words", [
    ({"enable_mem_arena": "maybe"}, "enable_mem_arena must be 1 or 0"),
    ({"enable_mem_pattern": ""}, "enable_mem_pattern must be 1 or 0"),
    ({"memory.enable_memory_arena_shrinkage": "cpu"}, "must list devices as cpu:0;gpu:0"),
    ({"memory.enable_memory_arena_shrinkage": "cpu:0", "enable_mem_arena": "0"}, "which enable_mem_arena 0 turns off"),
])
def test_memory_parameters_onnx_runtime_would_misread_are_refused_naming_the_key(parameters, words):
    import onnxruntime as ort

    from zoo_onnxruntime.backend import serving_options

    with pytest.raises(ArtifactError, match=words):
        serving_options(ort.SessionOptions(), parameters)
