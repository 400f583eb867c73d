"""The TensorRT backend: everything that runs without a GPU runs here.

Profiles, provenance, the ONNX support check, probe reasons, registration without
tensorrt, and the export/load/build orchestration driven through a stand-in `tensorrt`
module (so every line of it executes on CPU). The one test that builds and runs a real
engine is marked `needs_tensorrt` and skips, saying why, without TensorRT and CUDA.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import zoo
import zoo_tensorrt
from zoo import registry
from zoo.errors import (ArtifactError, BackendUnavailableError, StaleArtifactError, UnsupportedError,
                        ZooError)
from zoo.spec import AxisRange, ModelSpec, TensorSpec
from zoo.tensors import state_dict_sha256
from zoo_onnxruntime.export import export_onnx
from zoo_tensorrt import TensorRTBackend, library, profiles, provenance, support
from zoo_tensorrt.engine import EngineBuilder
from zoo_tensorrt.profiles import ShapeRange
from zoo_tensorrt.runner import TensorRTRunner

H100 = provenance.Machine("10.3.0", "NVIDIA H100 80GB HBM3", "9.0")


class TinyConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(image)))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def tiny_spec(**axes: AxisRange) -> ModelSpec:
    return ModelSpec(
        name="tiny.conv", domain="vision", task="image-classification",
        inputs=(TensorSpec("image", "float32", ("batch", 1, 8, 8)),),
        outputs=(TensorSpec("logits", "float32", ("batch", 10)),),
        build=TinyConv,
        sample=lambda b, rng: {"image": rng.standard_normal((b, 1, 8, 8)).astype(np.float32)},
        axes=axes or {"batch": AxisRange(1, 8, 32)},
    )


@pytest.fixture(scope="module")
def conv_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    export_onnx(TinyConv().eval(), tiny_spec(), {"image": torch.randn(2, 1, 8, 8)}, path)
    return path


# -- profiles -----------------------------------------------------------------------------


def test_profile_takes_axis_ranges_and_keeps_static_dims() -> None:
    spec = ModelSpec(
        name="lm.tiny", domain="nlp", task="text-generation",
        inputs=(TensorSpec("ids", "int64", ("batch", "seq")), TensorSpec("scale", "float32", (1,))),
        outputs=(TensorSpec("logits", "float32", ("batch", "seq", 50)),),
        build=TinyConv, sample=lambda b, rng: {},
        axes={"batch": AxisRange(1, 4, 16), "seq": AxisRange(8, 64, 256)},
    )
    assert profiles.profile_for(spec) == {
        "ids": ShapeRange((1, 8), (4, 64), (16, 256)),
        "scale": ShapeRange((1,), (1,), (1,)),
    }


def test_profile_json_round_trip_and_shape_check() -> None:
    spec = tiny_spec()
    profile = profiles.profile_for(spec)
    assert profiles.profile_to_json(profile) == {"image": {"min": [1, 1, 8, 8], "opt": [8, 1, 8, 8],
                                                           "max": [32, 1, 8, 8]}}
    assert profiles.profile_from_json(json.loads(json.dumps(profiles.profile_to_json(profile)))) == profile
    profiles.check_shape(spec, profile, "image", (32, 1, 8, 8))
    with pytest.raises(UnsupportedError, match=r"\(64, 1, 8, 8\).*\(batch 1\.\.32, 1, 8, 8\)"):
        profiles.check_shape(spec, profile, "image", (64, 1, 8, 8))
    with pytest.raises(UnsupportedError):
        profiles.check_shape(spec, profile, "image", (2, 8, 8))


# -- provenance ---------------------------------------------------------------------------


def record(machine: provenance.Machine = H100, precision: str = "fp16") -> dict:
    return provenance.engine_provenance(weights_sha256="w" * 64, onnx_sha256="o" * 64, precision=precision,
                                        profile=profiles.profile_for(tiny_spec()), machine=machine)


def test_provenance_key_is_canonical_and_covers_every_field() -> None:
    rec = record()
    assert set(rec) == {"weights_sha256", "onnx_sha256", "precision", "profile", "tensorrt", "gpu",
                        "compute_capability"}
    assert provenance.provenance_key(rec) == provenance.provenance_key(dict(reversed(list(rec.items()))))
    for field, value in [("weights_sha256", "x"), ("precision", "fp32"), ("compute_capability", "8.9")]:
        assert provenance.provenance_key({**rec, field: value}) != provenance.provenance_key(rec)


def check(machine: provenance.Machine, precision: str = "fp16", spec: ModelSpec | None = None) -> None:
    provenance.check_provenance(record(), machine=machine, precision=precision,
                                profile=profiles.profile_for(spec or tiny_spec()), model="tiny.conv")


def test_same_machine_same_use_loads() -> None:
    check(H100)


def test_other_tensorrt_version_is_refused_with_what_differs_and_how_to_rebuild() -> None:
    with pytest.raises(StaleArtifactError) as err:
        check(provenance.Machine("10.5.0", H100.gpu, "9.0"))
    msg = str(err.value)
    assert ("engine built for TensorRT 10.3.0 on NVIDIA H100 80GB HBM3 (sm_90); this machine has "
            "TensorRT 10.5.0 on NVIDIA H100 80GB HBM3 (sm_90) (TensorRT version differs)") in msg
    assert "`zoo export tiny.conv --backend tensorrt --precision fp16 --device cuda --force`" in msg


def test_other_gpu_is_refused() -> None:
    with pytest.raises(StaleArtifactError, match=r"on NVIDIA L4 \(sm_89\) \(GPU and compute capability differ\)"):
        check(provenance.Machine("10.3.0", "NVIDIA L4", "8.9"))


def test_other_precision_and_shapes_are_refused() -> None:
    with pytest.raises(StaleArtifactError, match="built for fp16, loaded as fp32"):
        check(H100, precision="fp32")
    with pytest.raises(StaleArtifactError, match=r"input shapes image \[1, 1, 8, 8\]\.\.\[32, 1, 8, 8\].*"
                                                 r"now declares image \[1, 1, 8, 8\]\.\.\[64, 1, 8, 8\]"):
        check(H100, spec=tiny_spec(batch=AxisRange(1, 8, 64)))


def test_recorded_provenance_must_exist_and_match_its_key() -> None:
    rec = record()
    info = {"provenance": rec, "provenance_key": provenance.provenance_key(rec)}
    assert provenance.recorded_provenance(info, "tiny.conv", "fp16") == rec
    with pytest.raises(ArtifactError, match="no provenance"):
        provenance.recorded_provenance({"build_seconds": 1.0}, "tiny.conv", "fp16")
    with pytest.raises(ArtifactError, match="does not match its key"):
        provenance.recorded_provenance({**info, "provenance": {**rec, "gpu": "NVIDIA L4"}}, "tiny.conv", "fp16")


def test_weights_hash_covers_parameters_and_buffers() -> None:
    torch.manual_seed(0)
    a = TinyConv()
    assert provenance.weights_sha256(a) == state_dict_sha256(a.state_dict())  # the manifest's hash
    b = TinyConv()
    b.load_state_dict(a.state_dict())
    assert provenance.weights_sha256(a) == provenance.weights_sha256(b)
    b.bn.running_mean += 1  # a buffer, not a parameter
    assert provenance.weights_sha256(a) != provenance.weights_sha256(b)
    assert provenance.weights_sha256(a.to(torch.bfloat16)) != provenance.weights_sha256(b)


# -- support check ------------------------------------------------------------------------


def graph_model(nodes, inputs, outputs, opset: int = 17, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, **kw)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vinfo(name: str, elem_type: int = TensorProto.FLOAT, shape=("n", 4)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def test_supported_graph_has_no_problems() -> None:
    model = graph_model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Sigmoid", ["h"], ["y"])],
                        [vinfo("x")], [vinfo("y")])
    assert support.check_onnx(model) == []


def test_unsupported_unknown_and_custom_operators_are_named() -> None:
    model = graph_model(
        [helper.make_node("Unique", ["x"], ["u"], name="uniq"),
         helper.make_node("FancyOp", ["x"], ["f"], name="fancy"),
         helper.make_node("Inverse", ["x"], ["i"], domain="com.microsoft", name="inv")],
        [vinfo("x")], [vinfo("u"), vinfo("f"), vinfo("i")])
    problems = support.check_onnx(model)
    assert "operator Unique (1 node: 'uniq') is not supported by TensorRT's ONNX parser" in problems
    assert "operator FancyOp (1 node: 'fancy') is not in TensorRT's ONNX operator table" in problems
    assert any(p.startswith("operator com.microsoft::Inverse") and "plugin" in p for p in problems)
    # The installed parser's own answer wins over the (older) table.
    assert not any("FancyOp" in p for p in support.check_onnx(model, lambda op: op == "FancyOp"))


def test_operators_inside_subgraphs_are_checked() -> None:
    then = helper.make_graph([helper.make_node("Det", ["x"], ["d"])], "then", [], [vinfo("d", shape=())])
    other = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)], "else", [],
                              [vinfo("s", shape=())])
    model = graph_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                        [vinfo("c", TensorProto.BOOL, ()), vinfo("x")], [vinfo("y", shape=())])
    assert [p for p in support.check_onnx(model) if "Det" in p]


def test_unsupported_tensor_types_are_listed() -> None:
    model = graph_model(
        [helper.make_node("Cast", ["x"], ["d"], to=TensorProto.DOUBLE),
         helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT)],
        [vinfo("x"), vinfo("s", TensorProto.STRING), vinfo("c", TensorProto.COMPLEX64)], [vinfo("y")])
    problems = support.check_onnx(model)
    assert any(p.startswith("double values (1 tensor: 'd')") and "float32" in p for p in problems)
    assert any(p.startswith("string values") for p in problems)
    assert any(p.startswith("complex64 values") for p in problems)


def test_uint8_is_fine_at_the_edges_only() -> None:
    at_edges = graph_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
                           [vinfo("x", TensorProto.UINT8)], [vinfo("y")])
    assert support.check_onnx(at_edges) == []
    inside = graph_model([helper.make_node("Cast", ["x"], ["u"], to=TensorProto.UINT8),
                          helper.make_node("Cast", ["u"], ["y"], to=TensorProto.FLOAT)],
                         [vinfo("x")], [vinfo("y")])
    assert any(p.startswith("uint8 values inside the graph (1 tensor: 'u')") for p in support.check_onnx(inside))


def test_old_opset_is_a_problem() -> None:
    model = graph_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x")], [vinfo("y")], opset=8)
    assert any("opset 8" in p for p in support.check_onnx(model))


def test_real_torch_export_of_a_conv_net_is_supported(conv_onnx: Path) -> None:
    assert support.check_onnx(conv_onnx) == []


# -- probe, versions, registration ----------------------------------------------------------


def fake_tensorrt(version: str = "10.3.0", network_inputs=(("image", (-1, 1, 8, 8)),), parse_ok: bool = True,
                  plan: bytes | None = b"PLAN", has_fp16: bool = True) -> types.ModuleType:
    """A stand-in for the parts of `tensorrt` EngineBuilder uses; records what is called."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = calls = []

    class ILogger:
        Severity = types.SimpleNamespace(INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3, VERBOSE=4)

        def __init__(self) -> None:
            pass

    class Network:
        num_inputs = len(network_inputs)

        def get_input(self, i: int):
            return types.SimpleNamespace(name=network_inputs[i][0], shape=network_inputs[i][1])

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def serialize(self) -> bytes:
            return self.data + b"+timings"

    class Config:
        def set_memory_pool_limit(self, pool, size): calls.append(("pool", pool, size))
        def set_flag(self, flag): calls.append(("set_flag", flag))
        def clear_flag(self, flag): calls.append(("clear_flag", flag))
        def add_optimization_profile(self, profile): calls.append(("add_profile",))
        def create_timing_cache(self, data): return TimingCache(bytes(data))

        def set_timing_cache(self, cache, ignore_mismatch):
            calls.append(("timing_cache", cache.data, ignore_mismatch))
            return not cache.data.startswith(b"OTHER-GPU")

    class Profile:
        def set_shape(self, name, lo, opt, hi): calls.append(("set_shape", name, lo, opt, hi))

    class Builder:
        def __init__(self, logger) -> None:
            self.logger = logger

        def create_network(self, flags):
            calls.append(("create_network", flags))
            return Network()

        def create_builder_config(self): return Config()
        def create_optimization_profile(self): return Profile()

        def build_serialized_network(self, network, config):
            if plan is None:
                self.logger.log(ILogger.Severity.ERROR, "no tactic fits the workspace")
            return plan

    class ParserError:
        def node_name(self): return "/conv/Conv"
        def node_operator(self): return "Conv"
        def desc(self): return "kernel weights must be an initializer"

    class OnnxParser:
        num_errors = 0 if parse_ok else 1

        def __init__(self, network, logger) -> None:
            pass

        def supports_operator(self, op): return op == "FancyOp"
        def parse_from_file(self, path):
            calls.append(("parse", Path(path).name))
            return parse_ok

        def get_error(self, i): return ParserError()

    class Context:  # runs a "doubling" engine, y = 2 * x, on host memory by address
        def __init__(self) -> None:
            self.shapes: dict = {}
            self.addresses: dict = {}

        def set_input_shape(self, name, shape):
            self.shapes[name] = tuple(shape)
            return True

        def set_tensor_address(self, name, address):
            self.addresses[name] = address
            return True

        def infer_shapes(self): return [] if "x" in self.shapes else ["x"]
        def get_tensor_shape(self, name): return self.shapes["x"]

        def execute_async_v3(self, stream_handle):
            calls.append(("execute", stream_handle))
            n = int(np.prod(self.shapes["x"]))
            x, y = (np.ctypeslib.as_array(ctypes.cast(self.addresses[k], ctypes.POINTER(ctypes.c_float)), (n,))
                    for k in ("x", "y"))
            y[:] = 2 * x
            return True

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, i): return ["y", "x"][i]  # not spec order, on purpose
        def get_tensor_mode(self, name): return "INPUT" if name == "x" else "OUTPUT"
        def get_tensor_dtype(self, name): return "float32"
        def create_execution_context(self): return Context()

    class Runtime:
        def __init__(self, logger) -> None:
            pass

        def deserialize_cuda_engine(self, plan): return Engine() if plan == b"PLAN" else None

    trt.ILogger, trt.Builder, trt.OnnxParser, trt.Runtime = ILogger, Builder, OnnxParser, Runtime
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.BuilderFlag = types.SimpleNamespace(TF32="TF32", **({"FP16": "FP16"} if has_fp16 else {}))
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    for name in ("float32", "float16", "bfloat16", "int8", "int32", "int64", "uint8", "bool"):
        setattr(trt, name, name)
    return trt


@pytest.fixture
def install_fake_tensorrt(monkeypatch: pytest.MonkeyPatch):
    def install(**kw) -> types.ModuleType:
        trt = fake_tensorrt(**kw)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setattr(library, "_logger", None)  # the logger subclasses the module's ILogger
        return trt
    return install


@pytest.fixture
def no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError


def test_probe_reasons(no_tensorrt, install_fake_tensorrt, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = TensorRTBackend()
    assert backend.probe("cpu").reason == "TensorRT runs on CUDA devices only"
    assert backend.probe("cuda").reason == (
        "tensorrt is not installed (it installs from NVIDIA's package index: pip install 'zoo-tensorrt[gpu]')")
    assert backend.versions() == {}
    install_fake_tensorrt()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend.probe("cuda") == zoo.Availability(False, "no CUDA device")
    assert backend.versions() == {"tensorrt": "10.3.0"}


def test_probe_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str):
        raise OSError("libnvinfer.so.10: cannot open shared object file")
    monkeypatch.setattr(library.importlib, "import_module", broken)
    availability = TensorRTBackend().probe("cuda")
    assert not availability.ok and "fails to import: libnvinfer.so.10" in availability.reason


def test_check_compatible_requires_the_exact_tensorrt(install_fake_tensorrt) -> None:
    install_fake_tensorrt(version="10.5.0")
    backend = TensorRTBackend()
    backend.check_compatible({"tensorrt": "10.5.0"}, "exports/tiny.conv.tensorrt.fp16")
    with pytest.raises(StaleArtifactError) as err:  # same major.minor is not enough for an engine
        backend.check_compatible({"tensorrt": "10.5.1"}, "exports/tiny.conv.tensorrt.fp16")
    assert "TensorRT 10.5.1 engine but this machine has TensorRT 10.5.0" in str(err.value)
    assert "`zoo export tiny.conv --backend tensorrt --precision fp16 --device cuda --force`" in str(err.value)


def test_registers_without_importing_tensorrt_or_onnx() -> None:
    code = textwrap.dedent("""
        import sys
        class Block:  # any import of tensorrt fails loudly
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "tensorrt":
                    raise AssertionError("tensorrt was imported")
        blocker = Block()
        sys.meta_path.insert(0, blocker)
        import zoo_tensorrt
        assert "onnx" not in sys.modules, "importing the plugin imported onnx"
        from zoo import registry
        backend = registry.get_backend("tensorrt")
        assert type(backend).__name__ == "TensorRTBackend", backend
        sys.meta_path.remove(blocker)  # probing is where the library is looked for
        print(backend.probe("cuda").reason)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tensorrt is not installed" in out.stdout or "fails to import" in out.stdout


def test_registered_in_this_process() -> None:
    assert isinstance(registry.get_backend("tensorrt"), TensorRTBackend)
    assert registry.pm.is_registered(zoo_tensorrt)


# -- export, build and load orchestration on CPU (stand-in tensorrt) ------------------------


def test_export_refuses_cpu_and_missing_tensorrt_before_any_work(no_tensorrt, tmp_path: Path) -> None:
    backend, spec = TensorRTBackend(timing_cache=tmp_path / "timing.cache"), tiny_spec()
    args = (TinyConv().eval(), spec, {"image": torch.randn(2, 1, 8, 8)}, tmp_path / "model.plan")
    with pytest.raises(UnsupportedError, match="does not run on cpu"):
        backend.export(*args, "fp32", "cpu")
    with pytest.raises(BackendUnavailableError, match="pip install 'zoo-tensorrt\\[gpu\\]'"):
        backend.export(*args, "fp32", "cuda")
    assert list(tmp_path.iterdir()) == []


def test_builder_sets_workspace_precision_profile_and_timing_cache(install_fake_tensorrt, tmp_path: Path) -> None:
    trt = install_fake_tensorrt()
    cache = tmp_path / "cache" / "timing.cache"
    builder = EngineBuilder()
    builder.parse(tmp_path / "model.onnx")
    assert builder.build(profiles.profile_for(tiny_spec()), "fp16", workspace=123, timing_cache=cache) == b"PLAN"
    assert ("create_network", 0) in trt.calls and ("pool", "WORKSPACE", 123) in trt.calls
    assert ("set_flag", "FP16") in trt.calls
    assert ("set_shape", "image", (1, 1, 8, 8), (8, 1, 8, 8), (32, 1, 8, 8)) in trt.calls
    assert cache.read_bytes() == b"+timings"  # saved after the build
    trt.calls.clear()
    EngineBuilder().build(profiles.profile_for(tiny_spec()), "fp32", timing_cache=cache)
    assert ("timing_cache", b"+timings", False) in trt.calls  # loaded before the next one
    assert ("clear_flag", "TF32") in trt.calls and ("set_flag", "FP16") not in trt.calls
    assert cache.read_bytes() == b"+timings+timings"


def test_timing_cache_from_another_gpu_is_replaced(install_fake_tensorrt, tmp_path: Path) -> None:
    trt = install_fake_tensorrt()
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"OTHER-GPU")
    EngineBuilder().build(profiles.profile_for(tiny_spec()), "fp32", timing_cache=cache)
    assert ("timing_cache", b"", False) in trt.calls
    assert cache.read_bytes() == b"+timings"


def test_builder_reports_parser_and_build_errors(install_fake_tensorrt, tmp_path: Path) -> None:
    install_fake_tensorrt(parse_ok=False)
    with pytest.raises(UnsupportedError, match=r"node '/conv/Conv' \(Conv\): kernel weights must be an initializer"):
        EngineBuilder().parse(tmp_path / "model.onnx")
    install_fake_tensorrt(plan=None)
    with pytest.raises(UnsupportedError, match="could not build the engine:\n  no tactic fits the workspace"):
        EngineBuilder().build(profiles.profile_for(tiny_spec()), "fp32")
    install_fake_tensorrt(has_fp16=False, version="11.0.0")
    with pytest.raises(UnsupportedError, match="TensorRT 11.0.0 has no FP16 builder flag"):
        EngineBuilder().build(profiles.profile_for(tiny_spec()), "fp16")


def test_builder_checks_graph_inputs_against_the_spec(install_fake_tensorrt) -> None:
    profile = profiles.profile_for(tiny_spec())
    install_fake_tensorrt(network_inputs=[("pixels", (-1, 1, 8, 8))])
    with pytest.raises(ZooError, match="input 'pixels' the model spec does not declare"):
        EngineBuilder().build(profile, "fp32")
    install_fake_tensorrt(network_inputs=[("image", (2, 1, 8, 8))])
    with pytest.raises(ZooError, match="axis 0 is fixed at 2 in the ONNX graph but the spec declares 1..32"):
        EngineBuilder().build(profile, "fp32")


@pytest.fixture
def cpu_export_env(install_fake_tensorrt, monkeypatch: pytest.MonkeyPatch, conv_onnx: Path):
    """The export/load paths with the GPU parts stood in: fake tensorrt, a made-up H100."""
    trt = install_fake_tensorrt()
    monkeypatch.setattr(TensorRTBackend, "_require", lambda self, device: None)
    monkeypatch.setattr(provenance, "current_machine", lambda device: H100)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    exporter = types.ModuleType("zoo_onnxruntime.export")
    def fake_export_onnx(module, spec, example, path):
        Path(path).write_bytes(conv_onnx.read_bytes())
        return {"exporter": "dynamo", "opset": 18}
    exporter.export_onnx = fake_export_onnx
    monkeypatch.setitem(sys.modules, "zoo_onnxruntime.export", exporter)
    return trt


def test_export_writes_the_plan_and_returns_provenance(cpu_export_env, conv_onnx: Path, tmp_path: Path) -> None:
    module, spec = TinyConv().eval(), tiny_spec()
    plan = tmp_path / "1" / "model.plan"
    plan.parent.mkdir()
    info = TensorRTBackend(timing_cache=tmp_path / "timing.cache").export(
        module, spec, {"image": torch.randn(2, 1, 8, 8)}, plan, "fp16", "cuda")
    assert plan.read_bytes() == b"PLAN" and list(plan.parent.iterdir()) == [plan]  # the ONNX is gone
    rec = info["provenance"]
    assert rec["onnx_sha256"] == provenance.file_sha256(conv_onnx)  # what export_onnx wrote
    assert rec["weights_sha256"] == provenance.weights_sha256(module)
    assert (rec["precision"], rec["tensorrt"], rec["gpu"], rec["compute_capability"]) == \
        ("fp16", "10.3.0", H100.gpu, "9.0")
    assert info["provenance_key"] == provenance.provenance_key(rec) and info["build_seconds"] >= 0
    assert info["onnx"] == {"exporter": "dynamo", "opset": 18}
    json.dumps(info)  # goes into the manifest as is


def test_export_refuses_an_unsupported_graph_before_building(cpu_export_env, tmp_path: Path, monkeypatch) -> None:
    model = graph_model([helper.make_node("Unique", ["image"], ["logits"])], [vinfo("image")], [vinfo("logits")])
    exporter = sys.modules["zoo_onnxruntime.export"]
    monkeypatch.setattr(exporter, "export_onnx", lambda m, s, e, path: onnx.save(model, str(path)))
    with pytest.raises(UnsupportedError, match="TensorRT cannot build tiny.conv:\n  - operator Unique"):
        TensorRTBackend(timing_cache=tmp_path / "t.cache").export(
            TinyConv().eval(), tiny_spec(), {"image": torch.randn(2, 1, 8, 8)}, tmp_path / "model.plan",
            "fp32", "cuda")
    assert not any(call[0] == "parse" for call in cpu_export_env.calls)
    assert list(tmp_path.iterdir()) == []


def test_load_checks_provenance_before_deserializing(cpu_export_env, tmp_path: Path, monkeypatch) -> None:
    loaded = []
    monkeypatch.setattr("zoo_tensorrt.runner.TensorRTRunner", lambda *args: loaded.append(args) or "runner")
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"PLAN")
    rec = record()
    info = {"provenance": rec, "provenance_key": provenance.provenance_key(rec)}
    backend = TensorRTBackend()
    assert backend.load(plan, tiny_spec(), "fp16", "cuda", info=info) == "runner"
    assert loaded[0][0] == b"PLAN"
    monkeypatch.setattr(provenance, "current_machine", lambda device: provenance.Machine("10.3.0", "NVIDIA L4", "8.9"))
    with pytest.raises(StaleArtifactError, match="this machine has TensorRT 10.3.0 on NVIDIA L4"):
        backend.load(plan, tiny_spec(), "fp16", "cuda", info=info)
    with pytest.raises(ArtifactError, match="no provenance"):
        backend.load(plan, tiny_spec(), "fp16", "cuda", info=None)
    assert len(loaded) == 1


def test_runner_binds_shapes_and_addresses_in_spec_order(install_fake_tensorrt, monkeypatch) -> None:
    trt = install_fake_tensorrt()
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=7))
    spec = ModelSpec(name="double.x", domain="test", task="doubling",
                     inputs=(TensorSpec("x", "float32", ("batch", 3)),),
                     outputs=(TensorSpec("y", "float32", ("batch", 3)),),
                     build=TinyConv, sample=lambda b, rng: {}, axes={"batch": AxisRange(1, 2, 4)})
    profile = profiles.profile_for(spec)
    with pytest.raises(ArtifactError, match="could not deserialize"):
        TensorRTRunner(b"JUNK", spec, profile, "cuda:0")
    runner = TensorRTRunner(b"PLAN", spec, profile, "cuda:0")
    assert (runner.input_names, runner.output_names) == (("x",), ("y",))
    runner.device = torch.device("cpu")  # the stand-in engine reads and writes host memory
    x = np.arange(6, dtype=np.float64).reshape(2, 3)  # float64 in: cast to the engine's float32
    out = runner({"x": x})
    assert list(out) == ["y"] and out["y"].dtype == torch.float32 and out["y"].tolist() == (2 * x).tolist()
    assert ("execute", 7) in trt.calls  # on torch's current stream
    with pytest.raises(UnsupportedError, match=r"\(5, 3\), outside .* \(batch 1\.\.4, 3\)"):
        runner({"x": np.zeros((5, 3), np.float32)})
    with pytest.raises(ZooError, match="missing inputs"):
        runner({"z": x})


# -- a real engine ---------------------------------------------------------------------------


@pytest.mark.needs_tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_engine_builds_runs_and_matches_torch(precision: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt", reason="tensorrt is not installed (NVIDIA's package index)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    module, spec = TinyConv().eval().cuda(), tiny_spec()
    export_onnx(module, spec, {"image": torch.randn(2, 1, 8, 8, device="cuda")}, tmp_path / "m.onnx")
    builder = EngineBuilder()
    assert support.check_onnx(tmp_path / "m.onnx", builder.supports_operator) == []
    builder.parse(tmp_path / "m.onnx")
    profile = profiles.profile_for(spec)
    plan = builder.build(profile, precision, timing_cache=tmp_path / "timing.cache")
    assert (tmp_path / "timing.cache").stat().st_size > 0
    runner = TensorRTRunner(plan, spec, profile, "cuda")
    assert runner.input_names == ("image",) and runner.output_names == ("logits",)
    tol = spec.tolerance(precision)
    for batch in spec.batch_sizes():
        image = np.random.default_rng(batch).standard_normal((batch, 1, 8, 8)).astype(np.float32)
        out = runner({"image": image})["logits"]  # numpy in: moved to the GPU once
        assert out.is_cuda and out.shape == (batch, 10)
        with torch.no_grad():
            ref = module(torch.from_numpy(image).cuda())
        torch.testing.assert_close(out, ref, atol=tol.atol, rtol=tol.rtol)
        again = runner({"image": torch.from_numpy(image).cuda()})["logits"]  # CUDA in: bound in place
        torch.testing.assert_close(again, out)
    with pytest.raises(UnsupportedError, match="outside the shapes"):
        runner({"image": np.zeros((64, 1, 8, 8), np.float32)})


@pytest.mark.needs_tensorrt
def test_real_backend_export_then_load(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt", reason="tensorrt is not installed (NVIDIA's package index)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    module, spec = TinyConv().eval().cuda(), tiny_spec()
    backend = TensorRTBackend(timing_cache=tmp_path / "timing.cache")
    assert backend.probe("cuda").ok
    plan = tmp_path / "model.plan"
    info = backend.export(module, spec, {"image": torch.randn(8, 1, 8, 8, device="cuda")}, plan, "fp32", "cuda")
    info = json.loads(json.dumps(info))  # as read back from the manifest
    runner = backend.load(plan, spec, "fp32", "cuda", info=info)
    image = torch.randn(5, 1, 8, 8, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(runner({"image": image})["logits"], module(image), atol=1e-4, rtol=1e-4)
    backend.check_compatible(backend.versions(), "exports/tiny.conv.tensorrt.fp32")
