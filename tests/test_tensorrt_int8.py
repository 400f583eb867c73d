"""TensorRT int8 by explicit quantization: the Q/DQ graph, tested on the CPU.

The TensorRT backend builds int8 engines from a Q/DQ ONNX graph calibrated on the
model's own data (`zoo_tensorrt.quantize`). Everything about that graph is checked
here without a GPU: what TensorRT takes (symmetric int8, zero point 0, no int32 bias),
where the Q/DQ sit (inputs of weighted ops only), that the scales come from the
calibration batches, and, the real test of calibration and placement, its outputs run
by ONNX Runtime's CPU provider against the fp32 graph's on held-out inputs, within each
model's int8 tolerance. Building and running the engine needs TensorRT and a GPU
(`needs_tensorrt`).
"""

from __future__ import annotations

import collections
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper

import zoo
from zoo import registry
from zoo.calibration import calibration_batches
from zoo.errors import BackendUnavailableError, ExportError, UnsupportedError
from zoo.fsutil import sha256_file
from zoo.spec import AxisRange, ModelSpec, TensorSpec, Tolerance, _default_tolerances
from zoo.tensors import example_inputs
from zoo.verify import domain_report, metric_report, parity
from zoo_onnx.export import export_onnx
from zoo_onnxruntime.runner import OnnxRuntimeRunner
from zoo_tensorrt import TensorRTBackend, support
from zoo_tensorrt.quantize import WEIGHTED_OPS, qdq_for_tensorrt

#: parity's sample seed: calibration draws with seed 0 (`calibration_batches`).
HELD_OUT = 1


def _one_per_architecture() -> list[str]:
    """Every int8 model, one per architecture (the module class it builds).

    Siblings share their graph's structure and differ in weights and heads (resnet18,
    resnet50 and resnet8.digits are one ResNet; the two MPNNs, the two policies), and
    the fp32 ONNX export each needs costs 2-10 s on a CPU: one of each keeps every kind
    of graph covered at a quarter of the time.
    """
    chosen: dict[object, str] = {}
    for name in zoo.list_models():
        spec = zoo.get_model(name)
        if "int8" in spec.tolerances:
            try:
                key: object = type(spec.tiny().build())
            except Exception:  # noqa: BLE001 - e.g. a dataset's library failing to load here:
                key = name  # that model's own test fails with it, not the whole file's collection
            chosen.setdefault(key, name)
    return sorted(chosen.values())


class Quantized(NamedTuple):
    spec: ModelSpec
    fp32: Path
    qdq: Path
    info: dict


@pytest.fixture(scope="module", params=_one_per_architecture())
def quantized(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Quantized:
    """The model's tiny fp32 ONNX export and its Q/DQ graph for TensorRT."""
    spec = zoo.get_model(request.param).tiny()
    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp(spec.name)
    fp32, qdq = tmp / "model.onnx", tmp / "model.qdq.onnx"
    export_onnx(spec.build().eval(), spec, example_inputs(spec), fp32)
    if not any(n.op_type in WEIGHTED_OPS for n in onnx.load(str(fp32)).graph.node):
        pytest.skip(f"{spec.name} has no weighted op, which TensorRT int8 refuses "
                    f"(test_a_graph_without_weighted_ops_is_refused)")
    return Quantized(spec, fp32, qdq, qdq_for_tensorrt(fp32, qdq, spec))


def _session(path: Path, spec: ModelSpec) -> OnnxRuntimeRunner:
    """The graph as TensorRT computes it: each Q/DQ pair rounds to int8, and the op between
    runs unfused in float, as TensorRT's int32 accumulation does without overflow. ONNX
    Runtime's fused int8 CPU kernels would add u8/s8 products in int16 on CPUs without VNNI,
    which saturates: a fault of that CPU, not of the graph TensorRT receives."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    return OnnxRuntimeRunner(session, spec)


class Graph:
    """Who makes and who reads each tensor of an ONNX graph."""

    def __init__(self, path: Path) -> None:
        self.graph = onnx.load(str(path)).graph
        self.initializers = {i.name: i for i in self.graph.initializer}
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.readers: dict[str, list[tuple[onnx.NodeProto, int]]] = collections.defaultdict(list)
        for node in self.graph.node:
            for index, name in enumerate(node.input):
                self.readers[name].append((node, index))

    def nodes(self, *op_types: str) -> list[onnx.NodeProto]:
        return [n for n in self.graph.node if n.op_type in op_types]

    def made_by(self, name: str, op_type: str) -> bool:
        return name in self.producer and self.producer[name].op_type == op_type

    def weight_dq(self, name: str) -> bool:
        """`name` is a DequantizeLinear of an int8 initializer: a pre-quantized weight."""
        return self.made_by(name, "DequantizeLinear") and self.producer[name].input[0] in self.initializers


# -- the Q/DQ graph of every kind of int8 model -----------------------------------------------


def test_qdq_is_symmetric_int8_with_float_biases(quantized: Quantized) -> None:
    """What TensorRT takes: zero point 0, int8 only (no int32 bias), weights pre-quantized."""
    g = Graph(quantized.qdq)
    qdq = g.nodes("QuantizeLinear", "DequantizeLinear")
    assert qdq, "nothing was quantized"
    for node in qdq:  # a zero point that is stated, int8 and all zeros
        zero_point = g.initializers[node.input[2]]
        assert zero_point.data_type == TensorProto.INT8 and not numpy_helper.to_array(zero_point).any(), node.name
    for dq in g.nodes("DequantizeLinear"):  # of an int8 weight, or of a Q of an activation
        source = dq.input[0]
        assert (g.initializers[source].data_type == TensorProto.INT8 if source in g.initializers
                else g.made_by(source, "QuantizeLinear")), f"{dq.name} dequantizes {source}"
    for q in g.nodes("QuantizeLinear"):  # activations only, each read by DequantizeLinear only
        assert q.input[0] not in g.initializers, f"{q.name} quantizes a constant at run time"
        assert all(r.op_type == "DequantizeLinear" for r, _ in g.readers[q.output[0]]), q.name
    assert support.check_onnx(quantized.qdq) == []
    assert quantized.info["quantized_ops"] == dict(sorted(collections.Counter(n.op_type for n in qdq).items()))
    assert quantized.info["symmetric"] and not quantized.info["quantize_bias"]


def test_qdq_sits_only_on_the_inputs_of_weighted_ops(quantized: Quantized) -> None:
    """Each DQ exists for a weighted op with a constant weight: as that weight, or as its data
    input (other readers of the same tensor, a residual Add, share it). Every constant
    weight is quantized; MatMuls of two activations (attention) stay float."""
    g = Graph(quantized.qdq)
    for dq in g.nodes("DequantizeLinear"):
        readers = g.readers[dq.output[0]]
        if dq.input[0] in g.initializers:
            assert all(r.op_type in WEIGHTED_OPS and i == 1 for r, i in readers), f"{dq.name} is not a weight"
        else:
            weighted = [(r, i) for r, i in readers if r.op_type in WEIGHTED_OPS]
            assert weighted and all(i == 0 and g.weight_dq(r.input[1]) for r, i in weighted), dq.name
    for op in g.nodes(*WEIGHTED_OPS):
        weight = op.input[1] if len(op.input) > 1 else ""
        assert weight not in g.initializers, f"{op.name} kept a float weight"
        if not g.weight_dq(weight):
            assert not g.made_by(op.input[0], "DequantizeLinear"), f"{op.name} multiplies two activations in int8"
    assert quantized.info["weighted_ops"] == dict(sorted(collections.Counter(
        op.op_type for op in g.nodes(*WEIGHTED_OPS) if g.weight_dq(op.input[1] if len(op.input) > 1 else "")).items()))


def test_qdq_graph_runs_within_the_int8_tolerance(quantized: Quantized) -> None:
    """ONNX Runtime runs the Q/DQ graph as TensorRT will (int8 between each Q and DQ)."""
    spec = quantized.spec
    reference, int8 = _session(quantized.fp32, spec), _session(quantized.qdq, spec)
    report = parity(spec, reference, int8, "int8", seed=HELD_OUT)  # raises beyond the tolerance
    # Beyond float rounding (~1e-6 here): the graph did compute in int8.
    assert report["passed"] and report["max_abs_error"] > 1e-5
    metric_report(spec, reference, int8, "int8")  # raises when the metric drops beyond metric_drop
    if spec.quantization == "static":  # what TensorRT builds for it by default: its export's gate too
        domain_report(spec, reference, int8, "int8")


def test_input_scales_come_from_the_calibration_batches(quantized: Quantized) -> None:
    """Symmetric int8 MinMax: scale = max |x| / 127 over `zoo.calibration`'s batches."""
    spec, g = quantized.spec, Graph(quantized.qdq)
    inputs = {t.name for t in spec.inputs}
    direct = [q for q in g.nodes("QuantizeLinear") if q.input[0] in inputs]
    if not direct:
        pytest.skip(f"{spec.name} quantizes no graph input directly (token ids, or float ops before its "
                    f"first weighted op)")
    batches = calibration_batches(spec)
    for q in direct:
        absmax = max(float(np.abs(b[q.input[0]]).max()) for b in batches)
        scale = float(numpy_helper.to_array(g.initializers[q.input[1]]))
        assert scale == pytest.approx(absmax / 127, rel=1e-6), q.input[0]


# -- a small conv net: refusals, provenance, and a real engine -------------------------------


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn = torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv2, self.fc = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Linear(8, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.bn(self.conv1(image)))))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def conv_spec(scale: float = 1.0, **changes) -> ModelSpec:
    """Calibrated on `spec.sample` (no dataset): inputs ~ N(0, scale)."""
    spec = ModelSpec(
        name="conv.int8", domain="vision", task="image-classification",
        inputs=(TensorSpec("image", "float32", ("batch", 1, 8, 8)),),
        outputs=(TensorSpec("logits", "float32", ("batch", 10)),),
        build=ConvNet, axes={"batch": AxisRange(1, 8, 32)},
        sample=lambda b, rng: {"image": scale * rng.standard_normal((b, 1, 8, 8)).astype(np.float32)},
        # int8 moved its logits (|x| < 0.4) by < 0.002 through ONNX Runtime; 10x that catches a broken graph.
        tolerances={**_default_tolerances(), "int8": Tolerance(0.02, 0.05)}, quantization="static")
    return replace(spec, **changes)


@pytest.fixture(scope="module")
def conv_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("conv") / "model.onnx"
    export_onnx(ConvNet().eval(), conv_spec(), example_inputs(conv_spec()), path)
    return path


def test_the_conv_net_meets_its_int8_tolerance_on_the_cpu(conv_onnx: Path, tmp_path: Path) -> None:
    """The tolerance the GPU test below holds TensorRT to is met by the same graph here."""
    spec = conv_spec()
    info = qdq_for_tensorrt(conv_onnx, tmp_path / "q.onnx", spec)
    assert info["weighted_ops"] == {"Conv": 2, "Gemm": 1}  # BatchNorm folded into conv1 first
    assert parity(spec, _session(conv_onnx, spec), _session(tmp_path / "q.onnx", spec), "int8", seed=HELD_OUT)["passed"]


def test_calibration_is_part_of_the_engine_key(conv_onnx: Path, tmp_path: Path) -> None:
    """The engine's provenance hashes the Q/DQ graph: the same graph and data give the same
    file (an engine is reused), other calibration data another (it is rebuilt)."""
    paths = [tmp_path / f"{i}.onnx" for i in range(3)]
    for path, spec in zip(paths, [conv_spec(), conv_spec(), conv_spec(scale=3.0)]):
        qdq_for_tensorrt(conv_onnx, path, spec)
    assert sha256_file(paths[0]) == sha256_file(paths[1]) != sha256_file(paths[2])


def test_a_graph_without_weighted_ops_is_refused(tmp_path: Path) -> None:
    spec = conv_spec(outputs=(TensorSpec("logits", "float32", ("batch", 64)),))
    module = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Flatten()).eval()  # no weights at all
    export_onnx(module, spec, example_inputs(spec), tmp_path / "m.onnx")
    with pytest.raises(ExportError, match="without a single Q/DQ node.*build it in fp16 or fp32"):
        qdq_for_tensorrt(tmp_path / "m.onnx", tmp_path / "q.onnx", spec)


def test_the_backend_offers_int8_on_cuda_only() -> None:
    backend = registry.get_backend("tensorrt")
    assert backend.precisions == {"cuda": ("fp32", "fp16", "int8")}
    backend.check_supported("int8", "cuda")
    with pytest.raises(UnsupportedError, match="does not run on cpu"):
        backend.check_supported("int8", "cpu")


class Untouchable(torch.nn.Module):
    """A module that fails the test if an export gets as far as running it."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the export did work before refusing")


@pytest.mark.parametrize("device, change, missing, error, message", [
    ("cpu", {}, None, UnsupportedError, "does not run on cpu"),
    ("cuda", {"quantization": "dynamic"}, None, UnsupportedError, "names dynamic int8.*--quantization static"),
    ("cuda", {"tolerances": _default_tolerances(), "quantization": None}, None, UnsupportedError,
     "no tolerance for precision int8"),
    ("cuda", {}, "onnxruntime", BackendUnavailableError, "onnxruntime's quantization tool.*pip install onnxruntime"),
    ("cuda", {}, "tensorrt", BackendUnavailableError, r"pip install 'zoo-tensorrt\[gpu\]'"),
], ids=["cpu", "dynamic-method", "no-int8-tolerance", "no-onnxruntime", "no-tensorrt"])
def test_int8_export_is_refused_before_any_work(device, change, missing, error, message, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for module in [missing, f"{missing}.quantization"] if missing else []:
        monkeypatch.setitem(sys.modules, module, None)  # `import` of it raises ImportError
    backend = TensorRTBackend(timing_cache=tmp_path / "timing.cache")
    with pytest.raises(error, match=message):
        backend.export(Untouchable(), conv_spec(**change), {"image": torch.randn(2, 1, 8, 8)},
                       tmp_path / "model.plan", "int8", device)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.needs_tensorrt
def test_real_int8_engine_builds_runs_and_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt", reason="tensorrt is not installed (NVIDIA's package index)")
    from zoo.train import module_fn

    torch.manual_seed(0)
    spec, module = conv_spec(), ConvNet().eval().cuda()
    backend = TensorRTBackend(timing_cache=tmp_path / "timing.cache")
    plan = tmp_path / "model.plan"
    info = backend.export(module, spec, example_inputs(spec, "cuda"), plan, "int8", "cuda")
    info = json.loads(json.dumps(info))  # as read back from the manifest
    assert info["provenance"]["precision"] == "int8" and info["quantization"]["weighted_ops"] == {"Conv": 2, "Gemm": 1}
    runner = backend.load(plan, spec, "int8", "cuda", info=info)
    parity(spec, module_fn(module, spec, "cuda"), runner, "int8", seed=HELD_OUT)  # raises beyond the tolerance
    with pytest.raises(UnsupportedError, match="outside the shapes"):
        runner({"image": np.zeros((64, 1, 8, 8), np.float32)})
