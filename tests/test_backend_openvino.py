"""The OpenVINO backend plugin: every registered model through export -> load -> verify
at its tiny size, int8 by NNCF (both methods), the compile options, and the refusals.

The plugin touches nothing in the core; if these pass, a backend was added by installing
a distribution. Skips where openvino is not installed. (int8 through every model with an
int8 tolerance runs in tests/test_quantization.py, parametrized over every int8 backend.)
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import ArtifactError, BackendUnavailableError, StaleArtifactError, UnsupportedError, ZooError

ov = pytest.importorskip("openvino", reason="openvino is not installed (pip install -e backends/openvino)")

from zoo_openvino import OpenVinoBackend  # noqa: E402
from zoo_openvino.backend import cpu_has_vnni  # noqa: E402

MODELS = zoo.list_models()


def _concrete(spec, shape, inputs):
    """A spec shape with its symbolic axes read off the inputs."""
    sizes = {axis: inputs[t.name].shape[i] for t in spec.inputs for i, axis in t.dynamic_axes.items()}
    return tuple(sizes[d] if isinstance(d, str) else d for d in shape)


def _ops(xml) -> set[str]:
    return {op.get_type_name() for op in ov.Core().read_model(str(xml)).get_ordered_ops()}


def test_registers_through_its_entry_point_without_importing_openvino():
    assert "openvino" in zoo.registry.backends()
    assert "zoo_openvino" in {ep.value for ep in importlib.metadata.entry_points(group="zoo")}
    code = "import sys, zoo_openvino; sys.exit('openvino' in sys.modules or 'nncf' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("name", MODELS)
def test_fp32_export_load_verify(name, repository):
    spec = zoo.get_model(name).tiny()
    art = zoo.export(spec, "openvino", repository=repository, random_init=True)
    m = art.manifest
    assert m["parity"]["passed"] and {c["batch"] for c in m["parity"]["checks"]} == set(spec.batch_sizes())
    assert {"1/model.xml", "1/model.bin"} <= set(m["files"])  # the weights are hashed with the graph
    # Triton's OpenVINO backend cannot be told f32 (zoo_openvino.backend.TRITON_CAVEAT): zoo's runner serves it
    assert '\nbackend: "python"\n' in (art.path / "config.pbtxt").read_text()
    # Dynamic axes stay dynamic and fixed ones fixed, with the spec's names.
    model = ov.Core().read_model(str(art.path / "1" / "model.xml"))
    for t in spec.inputs:
        port = next(p for p in model.inputs if t.name in p.get_names())
        assert [d.is_dynamic for d in port.get_partial_shape()] == [isinstance(d, str) for d in t.shape], t.name

    runner = zoo.load(art.path, threads=1)
    inputs = spec.sample(spec.axes["batch"].max - 1, np.random.default_rng(1))  # a batch never checked
    out = runner(inputs)
    assert set(out) == {t.name for t in spec.outputs}
    for t in spec.outputs:
        assert out[t.name].shape == _concrete(spec, t.shape, inputs), t.name


@pytest.mark.parametrize("flags, vnni", [
    ("fpu sse4_2 avx2 avx_vnni", True),  # AVX-VNNI without AVX-512 (client CPUs): int8 products in int32
    ("fpu avx2 avx512f avx512_vnni", True), ("fpu avx2 avx512f amx_tile", True),
    ("fpu sse4_2 avx2 avx512f avx512bw", False),  # int8 kernels that add pairs in int16
])
def test_int8_is_offered_on_the_cpus_whose_int8_products_add_in_int32(monkeypatch, tmp_path, flags, vnni):
    import io

    import zoo_openvino.backend as module
    info = f"processor\t: 0\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n"
    monkeypatch.setattr(module, "open", lambda path, **kw: io.StringIO(info), raising=False)
    assert module.cpu_has_vnni() is vnni


@pytest.mark.skipif(not cpu_has_vnni(), reason="OpenVINO offers int8 only on CPUs with VNNI "
                    "(AVX512_VNNI, AVX-VNNI, AMX); this one has none")
def test_static_int8_quantizes_the_convolutions(repository):
    spec = zoo.get_model("resnet8.digits").tiny()
    art = zoo.export(spec, "openvino", precision="int8", repository=repository, random_init=True)
    q = art.manifest["backend"]["info"]["quantization"]
    assert art.manifest["quantization"] == q["method"] == "static" and q["tool"] == "nncf.quantize"
    assert q["calibration_samples"] > 0 and q["model_type"] == "default"
    assert "FakeQuantize" in _ops(art.path / "1" / "model.xml")
    assert art.manifest["metric"]["passed"]
    report = zoo.verify(art.path, threads=1)  # re-checked from the artifact directory alone
    assert report["backend"] == "openvino" and report["precision"] == "int8" and report["parity"]["passed"]


@pytest.mark.skipif(not cpu_has_vnni(), reason="OpenVINO offers int8 only on CPUs with VNNI "
                    "(AVX512_VNNI, AVX-VNNI, AMX); this one has none")
def test_dynamic_int8_stores_int8_weights_and_attention_is_recognized(repository):
    spec = zoo.get_model("minilm-l6.all-v2").tiny()
    art = zoo.export(spec, "openvino", precision="int8", repository=repository, random_init=True)
    q = art.manifest["backend"]["info"]["quantization"]
    assert art.manifest["quantization"] == q["method"] == "dynamic" and q["tool"] == "nncf.compress_weights"
    model = ov.Core().read_model(str(art.path / "1" / "model.xml"))
    weights = {op.get_element_type().get_type_name() for op in model.get_ordered_ops()
               if op.get_type_name() == "Constant" and op.get_output_size() and op.shape and len(op.shape) == 2}
    assert "u8" in weights  # int8_asym: unsigned 8-bit weights with a zero point
    assert "FakeQuantize" not in _ops(art.path / "1" / "model.xml")  # no fixed activation scales

    static = zoo.export(spec, "openvino", precision="int8", repository=repository, random_init=True,
                        quantization="static")  # the override: NNCF's transformer recipe
    assert static.manifest["backend"]["info"]["quantization"]["model_type"] == "transformer"
    assert "FakeQuantize" in _ops(static.path / "1" / "model.xml")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """One small fp32 artifact shared by the tests that only load it."""
    spec = zoo.get_model("ppo.cartpole").tiny()
    return spec, zoo.export(spec, "openvino", repository=tmp_path_factory.mktemp("ov"), random_init=True)


def test_compiled_with_the_threads_latency_hint_and_the_stated_precision(policy):
    import openvino.properties as props
    import openvino.properties.hint as hints

    _, art = policy
    backend = OpenVinoBackend()
    compiled = backend.compile(art.path / "1" / "model.xml", "fp32", threads=1)
    assert compiled.get_property(props.inference_num_threads) == 1
    assert compiled.get_property(hints.performance_mode) == "LATENCY"
    # f32 stated: on CPUs with native bfloat16 OpenVINO would otherwise compute in bf16
    assert compiled.get_property(hints.inference_precision) == ov.Type.f32


def test_bf16_is_a_compile_hint_offered_only_where_the_cpu_computes_in_bf16(policy):
    import openvino.properties.hint as hints

    spec, art = policy
    backend = OpenVinoBackend()
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        runner = backend.load(art.path / "1" / "model.xml", spec, "bf16", "cpu")
        assert runner.compiled.get_property(hints.inference_precision) == ov.Type.bf16
        assert runner(spec.sample(2, np.random.default_rng(0)))["logits"].shape == (2, 2)
    else:
        with pytest.raises(UnsupportedError, match="no native bfloat16"):
            backend.load(art.path / "1" / "model.xml", spec, "bf16", "cpu")


def test_runner_takes_torch_tensors_and_names_bad_inputs(policy, tmp_path):
    spec, art = policy
    runner = zoo.load(art.path)
    obs = spec.sample(3, np.random.default_rng(0))["observation"]
    from_numpy = runner({"observation": obs})
    from_torch = runner({"observation": torch.from_numpy(obs).double()})  # cast to the model's float32
    assert all(isinstance(v, np.ndarray) for v in from_torch.values())
    for name in from_numpy:
        np.testing.assert_array_equal(from_numpy[name], from_torch[name])
    with pytest.raises(ZooError, match=r"missing \['observation'\], unexpected \['obs'\]"):
        runner({"obs": obs})

    other = zoo.get_model("ppo.pendulum").tiny()  # same input name, other outputs
    with pytest.raises(ArtifactError, match="does not match model ppo.pendulum"):
        OpenVinoBackend().load(art.path / "1" / "model.xml", other, "fp32", "cpu")
    copy = shutil.copytree(art.path / "1", tmp_path / "copy")
    (copy / "model.bin").unlink()
    with pytest.raises(ArtifactError, match="model.bin"):
        OpenVinoBackend().load(copy / "model.xml", spec, "fp32", "cpu")


@pytest.mark.parametrize("precision, device, error, message", [
    ("fp32", "cuda", UnsupportedError, "does not run on cuda"),
    ("fp16", "cpu", UnsupportedError, "does not support fp16 on cpu"),
    ("int4", "cpu", UnsupportedError, "does not support int4"),
])
def test_bad_requests_are_refused_before_any_work(repository, precision, device, error, message):
    spec = zoo.get_model("ppo.cartpole").tiny()
    with pytest.raises(error, match=message):
        zoo.export(spec, "openvino", precision=precision, device=device, repository=repository, random_init=True)
    assert not repository.exists()


def test_probe_says_why_in_one_sentence():
    backend = OpenVinoBackend()
    int8 = ("int8",) if cpu_has_vnni() else ()  # int8 kernels that add in int32 only
    assert backend.probe("cpu").ok and backend.precisions == {"cpu": ("fp32", "bf16", *int8)}
    assert backend.probe("cuda").reason == "openvino runs on cpu, not cuda"
    assert set(backend.versions()) == {"openvino", "nncf"}


def test_accepts_ir_from_this_or_an_older_openvino_only(monkeypatch):
    backend = OpenVinoBackend()
    monkeypatch.setattr(backend, "versions", lambda: {"openvino": "2025.2.0"})
    backend.check_compatible({"openvino": "2025.2.0", "nncf": "2.17.0"}, "m.openvino.int8")
    backend.check_compatible({"openvino": "2024.6.0"}, "m.openvino.fp32")
    with pytest.raises(StaleArtifactError, match="zoo export --force"):
        backend.check_compatible({"openvino": "2026.0.0"}, "m.openvino.fp32")
    monkeypatch.setattr(backend, "versions", lambda: {})
    with pytest.raises(BackendUnavailableError, match="not installed"):
        backend.check_compatible({"openvino": "2025.2.0"}, "m.openvino.fp32")


def test_a_conversion_failure_says_what_failed_not_only_where():
    """OpenVINO's first line is a source location; what failed comes after it (an ONNX
    export with ops it cannot convert, found with an nn.EmbeddingBag model)."""
    from zoo_openvino.convert import reason

    exc = RuntimeError("Exception from src/inference/src/cpp/core.cpp:84:\n"
                       "Check 'false' failed at src/frontends/common/src/frontend.cpp:54:\n"
                       "FrontEnd API failed with OpConversionFailure:\n"
                       "Model wasn't fully converted. Failed operations detailed log:\n"
                       "-- ReduceMean-18 with a message:\nUnsupported input type dynamic\n")
    said = reason(exc)
    assert "core.cpp" not in said and "Model wasn't fully converted" in said and "ReduceMean-18" in said
    assert reason(RuntimeError("x" * 1000)).endswith("...") and len(reason(RuntimeError("x" * 1000))) == 400
