"""Every registered model through build -> sample -> export -> load -> verify, on every
backend that can run here, at its tiny size (as timm parametrizes over list_models)."""

from __future__ import annotations

import numpy as np
import pytest

import zoo
from zoo.registry import backends
from zoo.tensors import call_module, to_torch

MODELS = zoo.list_models()
#: backends with their own registry-wide test files, kept out of this matrix for time:
#: openvino (tests/test_backend_openvino.py: every model), and the compiling backends
#: (tests/test_backend_torch_compiled.py: one model per domain, seconds of compile each)
OWN_TESTS = {"openvino"} | {name for name, be in backends().items() if be.compiles}
CPU_BACKENDS = [name for name, be in backends().items() if be.probe("cpu").ok and name not in OWN_TESTS]


def test_registry_has_the_built_in_models_and_backends():
    assert {"resnet8.digits", "resnet18", "resnet50"} <= set(MODELS)
    assert {"torch", "onnxruntime"} <= set(CPU_BACKENDS)
    assert "tensorrt" in backends()


def _axis_sizes(spec, inputs):
    """What each symbolic axis is in these inputs (batch, seq, atoms ...)."""
    sizes = {}
    for t in spec.inputs:
        for i, axis in t.dynamic_axes.items():
            assert sizes.setdefault(axis, inputs[t.name].shape[i]) == inputs[t.name].shape[i], (t.name, axis)
    return sizes


def _concrete(shape, sizes):
    return tuple(sizes[d] if isinstance(d, str) else d for d in shape)


@pytest.mark.parametrize("name", MODELS)
def test_build_and_sample_match_the_signature(name):
    spec = zoo.get_model(name).tiny()
    module = spec.build().eval()
    for batch in (1, 3):
        inputs = spec.sample(batch, np.random.default_rng(0))
        for t in spec.inputs:
            assert inputs[t.name].dtype == np.dtype(t.dtype)
            assert inputs[t.name].shape[0] == batch
            assert _concrete(t.shape, _axis_sizes(spec, inputs)) == inputs[t.name].shape
        for axis, size in _axis_sizes(spec, inputs).items():
            assert spec.axes[axis].min <= size <= spec.axes[axis].max, (name, axis, size)
        outputs = call_module(module, spec, to_torch(inputs, spec))
        for t in spec.outputs:
            assert tuple(outputs[t.name].shape) == _concrete(t.shape, _axis_sizes(spec, inputs)), (name, t.name)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", MODELS)
def test_export_load_verify(name, backend, repository):
    spec = zoo.get_model(name).tiny()
    art = zoo.export(spec, backend, repository=repository, random_init=True)
    assert art.path == repository / f"{name}.{backend}.fp32"
    assert art.manifest["parity"]["passed"]
    # the checks cover the smallest, typical and largest batch of the dynamic range
    assert {c["batch"] for c in art.manifest["parity"]["checks"]} == set(spec.batch_sizes())

    runner = zoo.load(art.path)
    batch = spec.axes["batch"].max - 1  # a size that was never traced or checked
    inputs = spec.sample(batch, np.random.default_rng(1))
    out = runner(inputs)
    assert set(out) == {t.name for t in spec.outputs}
    for t in spec.outputs:
        assert out[t.name].shape == _concrete(t.shape, _axis_sizes(spec, inputs))

    report = zoo.verify(art.path)
    assert report["parity"]["passed"] and report["backend"] == backend


def test_full_size_specs_are_what_they_say():
    # ResNet-18/50 at 3x224x224, 1000 classes: parameter counts of the standard architectures
    for name, millions in (("resnet18", 11.69), ("resnet50", 25.56)):
        spec = zoo.get_model(name)
        assert spec.inputs[0].shape == ("batch", 3, 224, 224)
        params = sum(p.numel() for p in spec.build().parameters()) / 1e6
        assert abs(params - millions) < 0.01, (name, params)
