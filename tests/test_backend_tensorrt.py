"""The TensorRT backend: everything that runs without a GPU runs here.

Profiles, provenance, the ONNX support check, probe reasons and registration without
tensorrt. The tests that build and run a real engine are marked `needs_tensorrt` and
skip, saying why, without TensorRT and CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import zoo_tensorrt
from zoo import registry
from zoo.errors import (ArtifactError, BackendUnavailableError, StaleArtifactError, UnsupportedError)
from zoo.spec import AxisRange, ModelSpec, TensorSpec
from zoo.tensors import state_dict_sha256
from zoo.train import ieee_fp32
from zoo_onnx import engines
from zoo_onnx.engines import ShapeRange
from zoo_onnx.export import export_onnx
from zoo_tensorrt import TensorRTBackend, library, provenance, support
from zoo_tensorrt.backend import onnx_for_build
from zoo_tensorrt.engine import EngineBuilder
from zoo_tensorrt.runner import TensorRTRunner

H100 = engines.Machine("10.3.0", "NVIDIA H100 80GB HBM3", "9.0")


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
    assert engines.profile_for(spec) == {
        "ids": ShapeRange((1, 8), (4, 64), (16, 256)),
        "scale": ShapeRange((1,), (1,), (1,)),
    }


def test_profile_json_round_trip_and_shape_check() -> None:
    spec = tiny_spec()
    profile = engines.profile_for(spec)
    assert engines.profile_to_json(profile) == {"image": {"min": [1, 1, 8, 8], "opt": [8, 1, 8, 8],
                                                           "max": [32, 1, 8, 8]}}
    assert engines.profile_from_json(json.loads(json.dumps(engines.profile_to_json(profile)))) == profile
    engines.check_shape(spec, profile, "image", (32, 1, 8, 8))
    with pytest.raises(UnsupportedError, match=r"\(64, 1, 8, 8\).*\(batch 1\.\.32, 1, 8, 8\)"):
        engines.check_shape(spec, profile, "image", (64, 1, 8, 8))
    with pytest.raises(UnsupportedError):
        engines.check_shape(spec, profile, "image", (2, 8, 8))


# -- provenance ---------------------------------------------------------------------------


def record(machine: engines.Machine = H100, precision: str = "fp16") -> dict:
    return engines.engine_provenance(weights_sha256="w" * 64, onnx_sha256="o" * 64, precision=precision,
                                     profile=engines.profile_for(tiny_spec()), machine=machine)


def test_provenance_key_is_canonical_and_covers_every_field() -> None:
    rec = record()
    assert set(rec) == {"weights_sha256", "onnx_sha256", "precision", "profile", "tensorrt", "gpu",
                        "compute_capability"}
    assert engines.provenance_key(rec) == engines.provenance_key(dict(reversed(list(rec.items()))))
    for field, value in [("weights_sha256", "x"), ("precision", "fp32"), ("compute_capability", "8.9")]:
        assert engines.provenance_key({**rec, field: value}) != engines.provenance_key(rec)


def check(machine: engines.Machine, precision: str = "fp16", spec: ModelSpec | None = None) -> None:
    provenance.check_provenance(record(), machine=machine, precision=precision,
                                profile=engines.profile_for(spec or tiny_spec()), model="tiny.conv")


def test_same_machine_same_use_loads() -> None:
    check(H100)


def test_other_tensorrt_version_is_refused_with_what_differs_and_how_to_rebuild() -> None:
    with pytest.raises(StaleArtifactError) as err:
        check(engines.Machine("10.5.0", H100.gpu, "9.0"))
    msg = str(err.value)
    assert ("engine built for TensorRT 10.3.0 on NVIDIA H100 80GB HBM3 (sm_90); this machine has "
            "TensorRT 10.5.0 on NVIDIA H100 80GB HBM3 (sm_90) (TensorRT version differs)") in msg
    assert "`zoo export tiny.conv --backend tensorrt --precision fp16 --device cuda --force`" in msg


def test_an_int8_artifact_of_either_name_is_rebuilt_as_tensorrts_static_int8() -> None:
    """TensorRT int8 is static: a model that declares dynamic int8 has it as `...int8-static`."""
    for name in ("exports/resnet8.digits.tensorrt.int8", "exports/minilm-l6.all-v2.tensorrt.int8-static"):
        with pytest.raises(StaleArtifactError) as err:
            TensorRTBackend().check_compatible({"tensorrt": "0.0.0"}, name)
        model = Path(name).name.split(".tensorrt.")[0]
        assert (f"`zoo export {model} --backend tensorrt --precision int8 --quantization static --device cuda "
                f"--force`") in str(err.value)


def test_other_gpu_is_refused() -> None:
    with pytest.raises(StaleArtifactError, match=r"on NVIDIA L4 \(sm_89\) \(GPU and compute capability differ\)"):
        check(engines.Machine("10.3.0", "NVIDIA L4", "8.9"))


def test_other_precision_and_shapes_are_refused() -> None:
    with pytest.raises(StaleArtifactError, match="built for fp16, loaded as fp32"):
        check(H100, precision="fp32")
    with pytest.raises(StaleArtifactError, match=r"input shapes image \[1, 1, 8, 8\]\.\.\[32, 1, 8, 8\].*"
                                                 r"now declares image \[1, 1, 8, 8\]\.\.\[64, 1, 8, 8\]"):
        check(H100, spec=tiny_spec(batch=AxisRange(1, 8, 64)))


def test_recorded_provenance_must_exist_and_match_its_key() -> None:
    rec = record()
    info = {"provenance": rec, "provenance_key": engines.provenance_key(rec)}
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


@pytest.fixture
def no_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError


def test_probe_reasons(no_tensorrt) -> None:
    backend = TensorRTBackend()
    assert backend.probe("cpu").reason == "TensorRT runs on CUDA devices only"
    assert backend.probe("cuda").reason == (
        "tensorrt is not installed (it installs from NVIDIA's package index: pip install 'zoo-tensorrt[gpu]')")
    assert backend.versions() == {}


def test_probe_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str):
        raise OSError("libnvinfer.so.10: cannot open shared object file")
    monkeypatch.setattr(library.importlib, "import_module", broken)
    availability = TensorRTBackend().probe("cuda")
    assert not availability.ok and "fails to import: libnvinfer.so.10" in availability.reason


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


def test_export_refuses_cpu_and_missing_tensorrt_before_any_work(no_tensorrt, tmp_path: Path) -> None:
    backend, spec = TensorRTBackend(timing_cache=tmp_path / "timing.cache"), tiny_spec()
    args = (TinyConv().eval(), spec, {"image": torch.randn(2, 1, 8, 8)}, tmp_path / "model.plan")
    with pytest.raises(UnsupportedError, match="does not run on cpu"):
        backend.export(*args, "fp32", "cpu")
    with pytest.raises(BackendUnavailableError, match="pip install 'zoo-tensorrt\\[gpu\\]'"):
        backend.export(*args, "fp32", "cuda")
    assert list(tmp_path.iterdir()) == []


def test_an_unaligned_view_is_copied_before_tensorrt_binds_it():
    """Issue 17, finding 4: `setTensorAddress` takes 256-byte aligned addresses only; a
    contiguous view at an offset is copied, an aligned tensor bound as it is."""
    from zoo_tensorrt.runner import ALIGNMENT, aligned

    base = torch.arange(1024, dtype=torch.float32)
    start = (-base.data_ptr() % ALIGNMENT) // base.element_size()  # the first aligned element
    at = base[start:start + 512]
    assert at.data_ptr() % ALIGNMENT == 0 and aligned(at) is at
    off = base[start + 1:start + 513]  # contiguous, 4 bytes past an aligned address
    copied = aligned(off)
    assert off.is_contiguous() and copied.data_ptr() != off.data_ptr() and torch.equal(copied, off)


# -- a real engine ---------------------------------------------------------------------------


@pytest.mark.needs_tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_engine_builds_runs_and_matches_torch(precision: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt", reason="tensorrt is not installed (NVIDIA's package index)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    module, spec = TinyConv().eval().cuda(), tiny_spec()
    # the graph of the precision: fp16 engines are built from the fp16 graph (strongly typed)
    graph, _ = onnx_for_build(module, spec, {"image": torch.randn(2, 1, 8, 8, device="cuda")}, tmp_path, precision)
    builder = EngineBuilder()
    assert support.check_onnx(graph, builder.supports_operator) == []
    builder.parse(graph)
    profile = engines.profile_for(spec)
    plan = builder.build(profile, precision, timing_cache=tmp_path / "timing.cache")
    assert (tmp_path / "timing.cache").stat().st_size > 0
    runner = TensorRTRunner(plan, spec, profile, "cuda")
    assert runner.input_names == ("image",) and runner.output_names == ("logits",)
    tol = spec.tolerance(precision)
    for batch in spec.batch_sizes():
        image = np.random.default_rng(batch).standard_normal((batch, 1, 8, 8)).astype(np.float32)
        out = runner({"image": image})["logits"]  # numpy in: moved to the GPU once
        assert out.is_cuda and out.shape == (batch, 10)
        with torch.no_grad(), ieee_fp32("cuda"):  # issue 17: the reference in IEEE fp32, not cuDNN's TF32 default
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
    with torch.no_grad(), ieee_fp32("cuda"):  # issue 17: the reference in IEEE fp32, not cuDNN's TF32 default
        reference = module(image)
    torch.testing.assert_close(runner({"image": image})["logits"], reference, atol=1e-4, rtol=1e-4)
    backend.check_compatible(backend.versions(), "exports/tiny.conv.tensorrt.fp32")
