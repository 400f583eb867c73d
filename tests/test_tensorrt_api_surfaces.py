"""The TensorRT builder against TensorRT 10.16's and 11.4's API surfaces (issue 17).

No TensorRT installs here (its wheels come from NVIDIA's index), so the builder runs
against each release's recorded Python API surface: the members of `BuilderFlag` and
`NetworkDefinitionCreationFlag` as the 10.16 API reference lists them, and as 11.4 has
them after "Removed Python APIs and Replacements" (TensorRT 11.4 migration guide). A
member a release does not have raises AttributeError, as the real bindings do. The
parser stand-in fills the network from the real ONNX graph the backend writes
(`onnx_for_build`), one layer per node, each output typed as ONNX's type inference types
it: what a strongly typed network infers. What is checked is the builder's own calls:
the network flags, every flag set or cleared, and its refusals. That the engines build
and run is left to the `needs_tensorrt` tests on a GPU.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

from zoo.errors import BackendUnavailableError, UnsupportedError
from zoo_onnx import engines
from zoo_tensorrt import api, library
from zoo_tensorrt.backend import onnx_for_build
from zoo_tensorrt.engine import EngineBuilder

from test_backend_tensorrt import TinyConv, tiny_spec

#: BuilderFlag members in the TensorRT 10.16 Python API reference (IBuilderConfig).
BUILDER_FLAGS_10 = (
    "FP16 INT8 DEBUG GPU_FALLBACK REFIT DISABLE_TIMING_CACHE TF32 SPARSE_WEIGHTS SAFETY_SCOPE "
    "OBEY_PRECISION_CONSTRAINTS PREFER_PRECISION_CONSTRAINTS DIRECT_IO REJECT_EMPTY_ALGORITHMS "
    "VERSION_COMPATIBLE EXCLUDE_LEAN_RUNTIME FP8 ERROR_ON_TIMING_CACHE_MISS BF16 DISABLE_COMPILATION_CACHE "
    "STRIP_PLAN REFIT_IDENTICAL WEIGHT_STREAMING INT4 REFIT_INDIVIDUAL STRICT_NANS MONITOR_MEMORY FP4 "
    "EDITABLE_TIMING_CACHE DISTRIBUTIVE_INDEPENDENCE").split()
#: TensorRT 11.4: the 10.x members less those its migration guide lists as removed.
BUILDER_FLAGS_11 = [f for f in BUILDER_FLAGS_10 if f not in (
    "FP16", "INT8", "FP8", "BF16", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS",
    "DIRECT_IO")]
#: NetworkDefinitionCreationFlag: 10.16 lists EXPLICIT_BATCH ("[DEPRECATED] Ignored") and
#: STRONGLY_TYPED; 11.x drops EXPLICIT_BATCH and accepts STRONGLY_TYPED, ignoring it.
NETWORK_FLAGS = {"10.16.1.11": {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1, "PREFER_AOT_PYTHON_PLUGINS": 2,
                                "PREFER_JIT_PYTHON_PLUGINS": 3},
                 "11.4.0.106": {"STRONGLY_TYPED": 1, "PREFER_AOT_PYTHON_PLUGINS": 2, "PREFER_JIT_PYTHON_PLUGINS": 3}}
SURFACES = {"10.16.1.11": BUILDER_FLAGS_10, "11.4.0.106": BUILDER_FLAGS_11}


class _Member:
    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return self.name


def _enum(name: str, members: dict[str, int]) -> type:
    """An enum of the bindings: members by attribute, AttributeError for any other name."""
    return type(name, (), {m: _Member(m, v) for m, v in members.items()})


_ONNX_TO_TRT = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
                onnx.TensorProto.BOOL: "bool"}


def surface(version: str) -> tuple[types.ModuleType, dict[str, list[Any]]]:
    """A `tensorrt` module with `version`'s recorded members, and the log of builder calls."""
    calls: dict[str, list[Any]] = {"create_network": [], "set_flag": [], "clear_flag": [], "profiles": []}
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.BuilderFlag = _enum("BuilderFlag", {f: i for i, f in enumerate(SURFACES[version])})
    trt.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", NETWORK_FLAGS[version])
    trt.MemoryPoolType = _enum("MemoryPoolType", {"WORKSPACE": 0})
    trt.LayerType = _enum("LayerType", {"QUANTIZE": 0, "DEQUANTIZE": 1, "OTHER": 2})
    for name in set(_ONNX_TO_TRT.values()):
        setattr(trt, name, name)

    class ILogger:
        Severity = _enum("Severity", {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4})

        def __init__(self) -> None:
            pass

    class Tensor:
        def __init__(self, name: str, shape: tuple[int, ...] = (), dtype: str = "float32") -> None:
            self.name, self.shape, self.dtype = name, shape, dtype

    class Layer:
        def __init__(self, kind: Any, outputs: list[Tensor]) -> None:
            self.type, self._outputs = kind, outputs
            self.num_outputs = len(outputs)

        def get_output(self, i: int) -> Tensor:
            return self._outputs[i]

    class Network:
        def __init__(self) -> None:
            self.inputs: list[Tensor] = []
            self.layers: list[Layer] = []

        num_inputs = property(lambda self: len(self.inputs))
        num_layers = property(lambda self: len(self.layers))

        def get_input(self, i: int) -> Tensor:
            return self.inputs[i]

        def get_layer(self, i: int) -> Layer:
            return self.layers[i]

    class OnnxParser:
        """Fills the network from the graph: one layer per node, typed by ONNX inference."""

        def __init__(self, network: Network, logger: Any) -> None:
            self.network, self.num_errors = network, 0

        def supports_operator(self, op: str) -> bool:
            return True

        def parse_from_file(self, path: str) -> bool:
            model = onnx.shape_inference.infer_shapes(onnx.load(path), strict_mode=True)
            g = model.graph
            typed = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
            for v in g.input:
                dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
                self.network.inputs.append(Tensor(v.name, dims, _ONNX_TO_TRT[v.type.tensor_type.elem_type]))
            kinds = {"QuantizeLinear": trt.LayerType.QUANTIZE, "DequantizeLinear": trt.LayerType.DEQUANTIZE}
            for node in g.node:
                outputs = [Tensor(o, dtype=_ONNX_TO_TRT.get(typed.get(o, onnx.TensorProto.FLOAT), "other"))
                           for o in node.output]
                self.network.layers.append(Layer(kinds.get(node.op_type, trt.LayerType.OTHER), outputs))
            return True

    class Config:
        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            assert pool is trt.MemoryPoolType.WORKSPACE and size > 0

        def set_flag(self, flag: Any) -> None:
            calls["set_flag"].append(flag.name)

        def clear_flag(self, flag: Any) -> None:
            calls["clear_flag"].append(flag.name)

        def add_optimization_profile(self, profile: Any) -> int:
            calls["profiles"].append(profile.shapes)
            return 0

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, name: str, lo: tuple, opt: tuple, hi: tuple) -> None:
            self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

    class Builder:
        def __init__(self, logger: Any) -> None:
            assert isinstance(logger, ILogger)

        def create_network(self, flags: int = 0) -> Network:
            calls["create_network"].append(flags)
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes:
            return b"plan"

    trt.ILogger, trt.OnnxParser, trt.Builder = ILogger, OnnxParser, Builder
    return trt, calls


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The graphs the backend builds each precision from, written on the CPU."""
    torch.manual_seed(0)
    module, spec = TinyConv().eval(), tiny_spec()
    out = {}
    for precision in ("fp32", "fp16", "int8"):
        with torch.no_grad():
            out[precision], _ = onnx_for_build(module, spec, {"image": torch.randn(4, 1, 8, 8)},
                                               tmp_path_factory.mktemp(precision), precision)
    return out


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch):
    """Install a release's surface as `tensorrt` for the test; returns the call log."""
    def install(version: str) -> dict[str, list[Any]]:
        trt, calls = surface(version)
        monkeypatch.setitem(__import__("sys").modules, "tensorrt", trt)
        monkeypatch.setattr(library, "_logger", None)  # a logger of this surface's ILogger
        return calls
    return install


@pytest.mark.parametrize("version", sorted(SURFACES))
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_one_strongly_typed_build_path_on_tensorrt_10_and_11(version, precision, graphs, installed):
    calls = installed(version)
    builder = EngineBuilder()
    builder.parse(graphs[precision])
    assert builder.build(engines.profile_for(tiny_spec()), precision) == b"plan"
    assert calls["create_network"] == [1 << 1]  # STRONGLY_TYPED: required on 10.x, accepted on 11.x
    assert calls["set_flag"] == []  # no precision flag on either major: the graph's types are the engine's
    assert calls["clear_flag"] == (["TF32"] if precision == "fp32" else [])
    assert calls["profiles"] == [{"image": ((1, 1, 8, 8), (8, 1, 8, 8), (32, 1, 8, 8))}]


@pytest.mark.parametrize("version", sorted(SURFACES))
@pytest.mark.parametrize("graph, precision, says", [
    ("fp32", "fp16", "no float16 tensor"), ("fp32", "int8", "no Quantize/Dequantize"),
    ("fp16", "fp32", "holds float16 tensors"), ("int8", "fp32", "holds Q/DQ layers"),
])
def test_an_engine_is_never_named_for_a_precision_its_graph_does_not_hold(version, graph, precision, says,
                                                                          graphs, installed):
    installed(version)
    builder = EngineBuilder()
    builder.parse(graphs[graph])
    with pytest.raises(UnsupportedError, match=says):
        builder.build(engines.profile_for(tiny_spec()), precision)


def test_the_fp16_graph_keeps_float32_io_and_the_int8_graph_is_calibrated_fp32(graphs):
    fp16, int8 = onnx.load(str(graphs["fp16"])), onnx.load(str(graphs["int8"]))
    for model in (fp16, int8):
        io = [v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)]
        assert io == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT]
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)  # no mixed-type node
    assert onnx.TensorProto.FLOAT16 in {i.data_type for i in fp16.graph.initializer}
    assert onnx.TensorProto.FLOAT16 not in {i.data_type for i in int8.graph.initializer}


@pytest.mark.parametrize("version, reason", [
    ("8.6.1", "TensorRT 8.6.1 is installed; zoo-tensorrt is written for TensorRT 10.x and 11.x"),
    ("12.0.0", "TensorRT 12.0.0 is installed; zoo-tensorrt is written for TensorRT 10.x and 11.x"),
])
def test_other_majors_are_refused_by_probe_with_the_version_found(version, reason, monkeypatch):
    from zoo_tensorrt import TensorRTBackend

    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", trt)
    assert TensorRTBackend().probe("cuda").reason.startswith(reason)
    with pytest.raises(BackendUnavailableError, match="written for TensorRT 10.x and 11.x"):
        EngineBuilder()


def test_network_flags_where_a_release_drops_the_strongly_typed_member():
    trt, _ = surface("11.4.0.106")
    trt.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", {})
    assert api.strongly_typed_flags(trt) == 0  # every 11.x network is strongly typed anyway
    trt.__version__ = "10.16.1.11"
    with pytest.raises(BackendUnavailableError, match="no strongly typed networks"):
        api.strongly_typed_flags(trt)


def test_the_recorded_surfaces_differ_by_what_11_removed():
    assert set(api.REMOVED_IN_11) == set(BUILDER_FLAGS_10) - set(BUILDER_FLAGS_11)
