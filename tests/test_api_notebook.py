"""The Python API as a notebook or script uses it (found by a reviewer): a model registered
with `zoo.register` is benchmarked, a script is never run again by the benchmark's worker
processes, a plugin's own failures (build, sample, probe) are one typed line, and the
client sends what the local runner takes. Real things throughout: a script run as a
subprocess, exports at random init, a real `zoo serve` for the client."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.client import Client
from zoo.errors import (BackendUnavailableError, CheckpointError, InputError, PluginError, SpecError, UsageError,
                        ZooError)

from serve_support import ServerProcess

TESTS = Path(__file__).resolve().parent
DIGITS = zoo.get_model("resnet8.digits")


def mlp_spec(name: str, build=None, sample=None) -> zoo.ModelSpec:
    return zoo.ModelSpec(
        name=name, domain="tabular", task="classification",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3)),),
        build=build or (lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))),
        sample=sample or (lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32)}))


# -- zoo.benchmark from a script -------------------------------------------------------

SCRIPT = '''
import numpy as np, torch, zoo
print("SCRIPT-TOP", flush=True)  # no __main__ guard: a worker that imports this file prints it again

def build():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

zoo.register(zoo.ModelSpec(name="mlp.script", domain="tabular", task="classification",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),), outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3)),),
    build=build, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32)}))
report = zoo.benchmark(["mlp.script", zoo.get_model("resnet8.digits").tiny()], backends=["onnxruntime"],
                       batch_sizes=[1], random_init=True, warmup=1, min_time=0.05, min_iters=5, timeout=300,
                       repository="exports")
for row in report["results"]:
    print("ROW", row["model"], row["status"], row.get("error"), row.get("in_process"))
'''


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_benchmarks_the_model_it_registered_and_is_not_run_again(tmp_path, how):
    # the registered model is measured in the script's process (its workers could not
    # rebuild it); the plugin's model in workers, which must not import the script again
    script = tmp_path / "bench_script.py"
    script.write_text(SCRIPT)
    command = [sys.executable, str(script)] if how == "file" else [sys.executable, "-"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=800,
                          stdin=script.open() if how == "stdin" else None)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("SCRIPT-TOP") == 1, done.stdout + done.stderr[-3000:]
    rows = [line.split(" ", 4)[1:] for line in done.stdout.splitlines() if line.startswith("ROW")]
    assert rows == [["mlp.script", "ok", "None", "True"], ["resnet8.digits", "ok", "None", "None"]], done.stdout
    assert "RuntimeError" not in done.stderr and "bootstrapping" not in done.stderr


def test_ray_refuses_a_model_registered_in_this_process_before_anything_runs(tmp_path):
    zoo.register(mlp_spec("mlp.ray-only"))
    try:
        with pytest.raises(UsageError, match="registered in this process only.*plugin file"):
            zoo.benchmark("mlp.ray-only", ["onnxruntime"], [1], repository=tmp_path, random_init=True, ray="local")
    finally:
        zoo.unregister("mlp.ray-only")
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


# -- zoo.export: the model's own code fails ---------------------------------------------

def not_a_module():
    return lambda x: x


@pytest.mark.parametrize("spec, says", [
    (DIGITS.tiny().configure(width=-1), "model resnet8.digits (plugin zoo-vision (vision)) failed to build: "),
    (mlp_spec("mlp.zero", build=lambda: 1 / 0), "model mlp.zero failed to build: division by zero"),
    (mlp_spec("mlp.function", build=not_a_module),
     "model mlp.function failed to build: build() returned function, not a torch.nn.Module"),
], ids=["width-negative", "raises", "returns-a-function"])
def test_a_build_that_fails_is_one_line_naming_the_model(tmp_path, spec, says):
    with pytest.raises(PluginError) as caught:
        zoo.export(spec, repository=tmp_path, random_init=True)
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


def test_a_config_value_of_another_type_is_refused_when_configured():
    """Before the build: `width="abc"` failed inside the plugin's build, "not all arguments converted"."""
    with pytest.raises(zoo.errors.UsageError, match=r"^model resnet8.digits: config width takes an int \(8 here\), "
                                                    r"got 'abc'$"):
        DIGITS.tiny().configure(width="abc")


def test_a_sample_that_returns_none_is_a_spec_error(tmp_path):
    spec = mlp_spec("mlp.nosample", sample=lambda batch, rng: None)
    with pytest.raises(SpecError, match=r"mlp.nosample: sample\(\d+(, rng)?\) returned NoneType; the spec expects a "
                                        r"dict"):
        zoo.export(spec, repository=tmp_path, random_init=True)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


class RaisingProbe(zoo.Backend):
    name = "probe.raises"
    precisions = {"cpu": ("fp32",)}
    filename = "model.bin"

    def versions(self):
        return {}

    def probe(self, device):
        raise RuntimeError("boom in probe")

    def export(self, module, spec, example, path, precision, device):
        raise AssertionError("not reached: the probe said no")

    def load(self, path, spec, precision, device, threads=None, info=None):
        raise AssertionError("not reached")


def test_a_probe_that_raises_means_the_backend_cannot_run_here(tmp_path):
    zoo.register_backend(RaisingProbe())
    try:
        with pytest.raises(BackendUnavailableError,
                           match="^backend probe.raises cannot run on cpu here: probe failed: boom in probe$"):
            zoo.export(DIGITS.tiny(), "probe.raises", repository=tmp_path, random_init=True)
    finally:
        zoo.unregister("probe.raises")


def test_a_missing_checkpoint_names_the_python_arguments_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    with pytest.raises(CheckpointError) as caught:
        zoo.export(DIGITS.tiny(), repository=tmp_path / "exports")
    assert "checkpoint=" in str(caught.value) and "random_init=True" in str(caught.value)
    with pytest.raises(UsageError, match=r"--random-init and --checkpoint .* \(random_init=True and checkpoint= in "
                                         r"Python\)"):
        zoo.export(DIGITS.tiny(), repository=tmp_path / "exports", random_init=True, checkpoint=tmp_path)


def test_zoo_check_reports_a_sample_that_returns_none():
    from zoo.check import check

    spec = mlp_spec("mlp.nosample-check", sample=lambda batch, rng: None)
    report = check(spec, spec.build())
    problems = [p for c in report.checks if c.name == "sample" for p in c.problems]
    assert problems and all("returned NoneType" in p for p in problems)


def test_a_lazy_spec_registers_and_is_made_when_first_looked_up():
    made = []

    def make():
        made.append(1)
        return mlp_spec("mlp.lazy")

    zoo.register(zoo.LazySpec("mlp.lazy", make))
    try:
        assert not made  # registering makes nothing
        assert zoo.get_model("mlp.lazy").name == "mlp.lazy" and made == [1]
        assert "mlp.lazy" in zoo.list_models()
    finally:
        zoo.unregister("mlp.lazy")
    with pytest.raises(PluginError, match="takes a zoo.ModelSpec or a zoo.LazySpec, not 'mlp'"):
        zoo.register("mlp")


def test_predict_refuses_a_path_for_an_image_as_the_client_does(tmp_path):
    from zoo.predict import predict, predictor

    art = zoo.export(DIGITS.tiny(), "onnxruntime", repository=tmp_path, random_init=True)
    spec, fn, _ = predictor(artifact=art.path)
    with pytest.raises(InputError, match=r"takes image inputs as bytes, not str \(a path is not read\)"):
        predict(spec, fn, [str(tmp_path / "seven.png")])


# -- arguments that are not what they should be ----------------------------------------

@pytest.mark.parametrize("call", [lambda: zoo.load(None), lambda: zoo.verify(None), lambda: zoo.get_model(None),
                                  lambda: zoo.load(3), lambda: zoo.Artifact.open(None)],
                         ids=["load", "verify", "get_model", "load-int", "Artifact.open"])
def test_none_for_a_path_or_a_name_is_a_usage_error(call):
    with pytest.raises(UsageError, match="not (None|3)$"):
        call()


@pytest.mark.parametrize("shape", ["batch", ("batch", -4), ("batch", 0), ("batch", 2.0), ("batch", ""), None])
def test_a_tensor_shape_that_is_not_sizes_and_axis_names_is_refused(shape):
    with pytest.raises(ZooError, match="tensor 'x': shape must be a tuple of positive sizes and axis names"):
        zoo.TensorSpec("x", "float32", shape)


def test_a_shape_given_before_the_dtype_is_named_with_the_order_to_write():
    with pytest.raises(ZooError, match=r"^tensor 'x': shape and dtype are the other way round: TensorSpec takes "
                                       r"\(name, dtype, shape\), as TensorSpec\('x', 'float32', \('batch', 2\)\)$"):
        zoo.TensorSpec("x", ("batch", 2), "float32")
    with pytest.raises(ZooError, match=r"^tensor 'x': unknown dtype \['batch', 2\] \(one of float32"):
        zoo.TensorSpec("x", ["batch", 2], ("batch", 2))


def test_a_tensor_shape_given_as_a_list_or_numpy_sizes_is_a_tuple_of_ints():
    assert zoo.TensorSpec("x", "float32", ["batch", np.int64(3)]).shape == ("batch", 3)


def test_reprs_of_an_artifact_and_a_checkpoint_are_short(tmp_path):
    art = zoo.export(DIGITS.tiny(), "torch", repository=tmp_path, random_init=True)
    text = repr(art)
    assert text.startswith("Artifact('resnet8.digits.torch.fp32', path=") and "backend='torch'" in text
    assert len(text) < 300 and "sha256" not in text
    module = DIGITS.tiny().build()
    ckpt = zoo.Checkpoint("resnet8.digits", dict(DIGITS.tiny().config), module.state_dict())
    text = repr(ckpt)
    assert f"tensors={len(module.state_dict())}" in text and "tensor(" not in text and len(text) < 300


# -- zoo.client.Client against a real zoo serve -----------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """resnet8.digits (tiny, random init) exported for onnxruntime, served by `zoo serve`;
    the server, and the artifact for the local runner."""
    root = tmp_path_factory.mktemp("notebook-serve")
    art = zoo.export(DIGITS.tiny(), "onnxruntime", repository=root / "exports", random_init=True)
    proc = ServerProcess(root / "exports", log=root / "server.log")
    try:
        yield proc.wait_ready(), art
    finally:
        proc.kill()


def test_the_client_casts_float64_as_the_local_runner_does(served):
    server, art = served
    image = np.random.default_rng(0).random((2, 1, 8, 8))  # float64, as np.random.rand gives
    local = zoo.load(art.path)({"image": image})["logits"]
    with Client(server.url) as client:
        remote = client.infer(art.name, {"image": image})["logits"]
        np.testing.assert_allclose(remote, local, rtol=1e-5, atol=1e-5)
        with pytest.raises(InputError) as there:
            client.infer(art.name, {"image": image.astype(np.complex64)})
    with pytest.raises(InputError) as here:
        zoo.load(art.path)({"image": image.astype(np.complex64)})
    assert str(there.value) == str(here.value)  # refused alike, before the request


def test_the_client_takes_one_output_name_as_a_str(served):
    server, art = served
    with Client(server.url) as client:
        assert list(client.infer(art.name, {"image": np.zeros((1, 1, 8, 8), np.float32)}, outputs="logits")) == \
            ["logits"]


@pytest.mark.parametrize("name", ["a?b", "a#b", "a%2Fb"])
def test_the_client_escapes_a_model_name(served, name):
    server, _ = served
    with Client(server.url) as client, pytest.raises(ZooError, match=re.escape(f"404: unknown model {name!r}")):
        client.infer(name, {"image": np.zeros((1, 1, 8, 8), np.float32)})
    assert Client(server.url).live()


@pytest.mark.parametrize("name", ["", "a/b"])
def test_the_client_refuses_an_empty_name_a_slash_and_inputs_that_are_not_a_dict(served, name):
    server, art = served
    with Client(server.url) as client:
        with pytest.raises(UsageError, match="non-empty str without '/'"):
            client.infer(name, {"image": np.zeros((1, 1, 8, 8), np.float32)})
        with pytest.raises(InputError, match="^inputs is a dict of tensors by input name, not NoneType$"):
            client.infer(art.name, None)


def test_the_client_refuses_a_path_for_an_image_and_takes_its_bytes(served, tmp_path):
    server, art = served
    from serve_support import sample_items

    (image,) = sample_items(DIGITS, 1)
    with Client(server.url) as client:
        with pytest.raises(InputError, match=r"pass the file's bytes, open\(path, 'rb'\).read\(\)"):
            client.predict(art.name, ["d.png"])
        assert len(client.predict(art.name, [image])) == 1
