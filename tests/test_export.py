"""The export contract: verified before complete, atomic, reused only on equal provenance."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import ToleranceError
from zoo.registry import register_plugin, unregister_plugin
from zoo_torch.backend import TorchBackend

SPEC = zoo.get_model("resnet8.digits").tiny()


class NoisyBackend(TorchBackend):
    """The torch backend with its outputs perturbed: an export that must fail parity."""

    name = "noisy"

    def load(self, *args, **kwargs):
        runner = super().load(*args, **kwargs)
        return lambda inputs: {k: v + 0.5 for k, v in runner(inputs).items()}


class FlakyBackend(TorchBackend):
    """Correct until `broken` is set, then perturbed like NoisyBackend."""

    name = "flaky"
    broken = False

    def load(self, *args, **kwargs):
        runner = super().load(*args, **kwargs)
        return lambda inputs: {k: v + 0.5 * self.broken for k, v in runner(inputs).items()}


class InterruptedBackend(TorchBackend):
    """Writes part of a model file, then is interrupted (as by Ctrl-C)."""

    name = "interrupted"

    def export(self, module, spec, example, path, precision, device):
        path.write_bytes(b"half a model")
        raise KeyboardInterrupt


class Plugin:
    @zoo.hookimpl
    def zoo_register_backends(self, register):
        register(NoisyBackend())
        register(FlakyBackend())
        register(InterruptedBackend())


@pytest.fixture
def faulty_backends():
    plugin = Plugin()
    register_plugin(plugin, name="faulty-backends")
    yield
    unregister_plugin(plugin)


def test_parity_failure_is_typed_and_leaves_nothing(faulty_backends, repository):
    with pytest.raises(ToleranceError, match="beyond the tolerance"):
        zoo.export(SPEC, "noisy", repository=repository, random_init=True)
    assert not repository.exists()  # no artifact, no temporary directory, no repository made for it
    repository.mkdir()  # a repository that was there stays, empty as it was
    with pytest.raises(ToleranceError, match="beyond the tolerance"):
        zoo.export(SPEC, "noisy", repository=repository, random_init=True)
    assert list(repository.iterdir()) == []


def test_interrupted_export_leaves_nothing_that_loads(faulty_backends, repository):
    with pytest.raises(KeyboardInterrupt):
        zoo.export(SPEC, "interrupted", repository=repository, random_init=True)
    assert not repository.exists()


def test_failed_rebuild_keeps_the_previous_artifact(faulty_backends, repository):
    good = zoo.export(SPEC, "flaky", repository=repository, random_init=True)
    before = (good.path / "zoo.json").read_text()
    FlakyBackend.broken = True
    try:
        with pytest.raises(ToleranceError):
            zoo.export(SPEC, "flaky", repository=repository, random_init=True, force=True)
    finally:
        FlakyBackend.broken = False
    assert (good.path / "zoo.json").read_text() == before
    assert [p.name for p in repository.iterdir()] == [good.path.name]
    zoo.verify(good.path)


def test_reuse_only_with_identical_provenance(repository):
    first = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    written = (first.path / "zoo.json").stat()
    again = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    # reused, not rebuilt: a rebuild writes a new directory, so a new file (inode), whatever the clock says
    now = (again.path / "zoo.json").stat()
    assert (now.st_ino, now.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert again.manifest == first.manifest

    torch.manual_seed(1)
    other = zoo.Checkpoint(SPEC.name, dict(SPEC.config), SPEC.build().state_dict())
    rebuilt = zoo.export(SPEC, "onnxruntime", repository=repository, checkpoint=other)
    assert rebuilt.manifest["weights"]["sha256"] == other.sha256 != first.manifest["weights"]["sha256"]
    assert (rebuilt.path / "zoo.json").stat().st_ino != written.st_ino


def test_a_rebuild_says_what_the_artifact_it_replaces_was_built_from(repository, caplog):
    """`--triton python` over the native form replaced it without a word: one artifact name
    holds one form, and the user lost the other unawares."""
    native = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    with caplog.at_level(logging.WARNING, logger="zoo"):
        python = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True, triton="python")
    assert python.path == native.path and python.manifest["triton"]["form"] == "python"
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("rebuilding")] == [
        f"rebuilding {native.name}, exported before with Triton's native form (this export writes the python form, "
        f"in its place)"]


def test_triton_parameters_are_the_configs_and_part_of_what_is_reused(repository, caplog):
    """`triton_parameters` (`zoo export --triton-parameter`) are written as config.pbtxt's
    `parameters`, as Triton's ModelConfig parses them, and recorded in the manifest; an
    export with other parameters rebuilds the artifact, one with the same reuses it. A value
    the backend refuses (ONNX Runtime's arena flag is 1 or 0) fails the export, and the
    artifact there stays as it was."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    root = repository / "parameters"
    plain = zoo.export(SPEC, "onnxruntime", repository=root, random_init=True)
    assert "parameters" not in (plain.path / "config.pbtxt").read_text() and "parameters" not in plain.manifest["triton"]
    wanted = {"enable_mem_arena": "0", "memory.enable_memory_arena_shrinkage": ""}
    art = zoo.export(SPEC, "onnxruntime", repository=root, random_init=True, triton_parameters=wanted)
    config = text_format.Parse((art.path / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert {k: v.string_value for k, v in config.parameters.items()} == wanted == art.manifest["triton"]["parameters"]
    written = (art.path / "zoo.json").stat().st_ino
    assert (zoo.export(SPEC, "onnxruntime", repository=root, random_init=True, triton_parameters=wanted).path
            / "zoo.json").stat().st_ino == written
    with pytest.raises(zoo.ZooError, match="enable_mem_arena must be 1 or 0"):
        zoo.export(SPEC, "onnxruntime", repository=root, random_init=True, triton_parameters={"enable_mem_arena": "2"})
    assert (art.path / "zoo.json").stat().st_ino == written and zoo.verify(art.path)
    rebuilt = zoo.export(SPEC, "onnxruntime", repository=root, random_init=True)
    assert "parameters" not in rebuilt.manifest["triton"] and (rebuilt.path / "zoo.json").stat().st_ino != written
    # a key the backend does not read when zoo serves it: written (Triton's backend may read it), and said so
    with caplog.at_level("WARNING", logger="zoo"):
        other = zoo.export(SPEC, "onnxruntime", repository=root, random_init=True,
                           triton_parameters={"intra_op_thread_count": "1"})
    assert other.manifest["triton"]["parameters"] == {"intra_op_thread_count": "1"}
    assert any("does not read the config.pbtxt parameters intra_op_thread_count" in r.getMessage()
               for r in caplog.records), caplog.text


def test_a_triton_parameter_nothing_reads_is_refused_in_the_python_form(repository):
    """In the python form zoo's runner serves the artifact in Triton too, so a key its backend
    does not read is read by no one: `--triton-parameter enable_mem_arena=0` on a torch export
    was written and ignored. Refused before any work; the native form's keys stay (Triton's)."""
    for backend, triton in (("torch", None), ("onnxruntime", "python")):
        with pytest.raises(zoo.errors.UsageError, match="parameter bogus: in the python form neither"):
            zoo.export(SPEC, backend, repository=repository, random_init=True, triton=triton,
                       triton_parameters={"bogus": "1"})
    assert not repository.exists() or not any(repository.iterdir())  # refused before any work
    art = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True, triton="python",
                     triton_parameters={"enable_mem_arena": "0"})  # one the runner reads
    assert art.manifest["triton"] == {**art.manifest["triton"], "form": "python",
                                      "parameters": {"enable_mem_arena": "0"}}
    # one Triton's Python backend reads itself: the packed environment model.py runs in
    env = {"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/zoo-env.tar.gz"}
    art = zoo.export(SPEC, "torch", repository=repository, random_init=True, triton_parameters=env)
    assert art.manifest["triton"]["parameters"] == env


class Doubled(torch.nn.Module):
    """SPEC's module with a changed forward and the same weights (no new parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = SPEC.build()

    def forward(self, image):
        return 2 * self.inner(image)

    def state_dict(self, *args, **kwargs):
        return self.inner.state_dict(*args, **kwargs)

    def load_state_dict(self, state, *args, **kwargs):
        return self.inner.load_state_dict(state, *args, **kwargs)


def test_an_artifact_of_a_changed_model_is_rebuilt_not_reused(repository, caplog):
    """The same name, weights and backend, but the model changed since: its forward (its
    outputs on the artifact's test vectors differ), or its spec (a wider batch range).
    Each export rebuilds the artifact, which then computes what the model now does."""
    def written(art) -> tuple[int, int]:  # a rebuild writes a new file
        stat = (art.path / "zoo.json").stat()
        return stat.st_ino, stat.st_mtime_ns

    first = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    x = SPEC.sample(2, np.random.default_rng(0))
    before, stamp = zoo.load(first.path)(x)["logits"], written(first)
    changed = dataclasses.replace(SPEC, build=Doubled)
    with caplog.at_level("WARNING", logger="zoo"):
        rebuilt = zoo.export(changed, "onnxruntime", repository=repository, random_init=True)
    assert "the model no longer computes what the artifact stores" in caplog.text and written(rebuilt) != stamp
    assert rebuilt.manifest["weights"]["sha256"] == first.manifest["weights"]["sha256"]
    np.testing.assert_allclose(zoo.load(rebuilt.path)(x)["logits"], 2 * before, rtol=1e-5, atol=1e-5)
    caplog.clear()
    wider = dataclasses.replace(changed, axes={**changed.axes, "batch": zoo.AxisRange(1, 4, 16)})
    with caplog.at_level("WARNING", logger="zoo"):
        again = zoo.export(wider, "onnxruntime", repository=repository, random_init=True)
    assert "the model's spec changed since it was exported" in caplog.text
    assert again.manifest["signature"]["axes"]["batch"] == [1, 4, 16]
    stamp = written(again)
    assert written(zoo.export(wider, "onnxruntime", repository=repository, random_init=True)) == stamp  # reused


def test_manifest_records_provenance(repository):
    art = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    m = json.loads((art.path / "zoo.json").read_text())
    assert m["model"]["name"] == "resnet8.digits" and m["model"]["plugin"].startswith("zoo-vision")
    assert m["backend"]["versions"]["onnxruntime"]
    assert m["precision"] == "fp32" and m["device"] == "cpu"
    vectors = {s["file"] for s in m["test_data"]["sets"]}
    # the digits' labels, for Triton's classification extension (config.pbtxt's label_filename)
    assert set(m["files"]) == {"1/model.onnx", "config.pbtxt", "weights.safetensors", "labels.logits.txt"} | vectors
    assert vectors == {f"test_data/set_{i}.safetensors" for i in range(3)}  # smallest, typical, largest batch
    assert m["signature"]["axes"]["batch"] == [1, 8, 64]
    assert m["metric"]["name"] == "accuracy" and m["metric"]["delta"] == pytest.approx(0, abs=0.01)


def test_runner_accepts_torch_tensors_and_names_bad_inputs(repository):
    art = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    runner = zoo.load(art.path)
    x = SPEC.sample(2, np.random.default_rng(0))
    np.testing.assert_allclose(runner({"image": torch.from_numpy(x["image"])})["logits"], runner(x)["logits"])
    with pytest.raises(zoo.ZooError, match="image"):
        runner({"pixels": x["image"]})


def test_the_fp32_reference_computes_without_tf32_on_cuda():
    """cuDNN defaults to TF32 on Ampere and later; the reference turns it off, then restores it."""
    from zoo.train import ieee_fp32

    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (cuda.allow_tf32, cudnn.allow_tf32)
    cuda.allow_tf32 = cudnn.allow_tf32 = True
    try:
        with ieee_fp32("cuda:0"):
            assert (cuda.allow_tf32, cudnn.allow_tf32) == (False, False)
        assert (cuda.allow_tf32, cudnn.allow_tf32) == (True, True)
        with ieee_fp32("cpu"):
            assert (cuda.allow_tf32, cudnn.allow_tf32) == (True, True)
    finally:
        cuda.allow_tf32, cudnn.allow_tf32 = before


def test_a_checkpoint_trained_at_another_config_exports_as_that_config(tmp_path):
    """`zoo train resnet8.digits -c width=4` then `zoo export --checkpoint`: the weights are
    width 4's, and so are the manifest's config and description (the artifact loads and
    verifies as width 4), not the registered default's."""
    narrow = zoo.get_model("resnet8.digits").configure(width=4)
    torch.manual_seed(0)
    path = zoo.Checkpoint(narrow.name, dict(narrow.config), narrow.build().state_dict()).save(tmp_path / "run")
    art = zoo.export("resnet8.digits", "onnxruntime", repository=tmp_path / "exports", checkpoint=path)
    assert art.manifest["model"]["config"]["width"] == 4 and "width 4" in art.manifest["model"]["description"]
    assert zoo.verify(art.path)["parity"]["passed"]


class _Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 3)

    def forward(self, ids):
        return self.table(ids).mean(dim=1)


@pytest.mark.parametrize("output", ["linear", "relu", "embedding"])
def test_an_output_may_have_the_name_of_an_op_inside_the_model(output, tmp_path, monkeypatch):
    """The dynamo exporter names internal values after their ops ("linear", "relu",
    "embedding"); a user's output of the same name made the ONNX graph invalid (a name
    assigned twice). The spec's names win: the export verifies and its graph is valid."""
    import onnx

    monkeypatch.setenv("ZOO_ONNX_CACHE_DIR", str(tmp_path / "cache"))  # a fresh translation, then a hit
    monkeypatch.delenv("ZOO_ONNX_CACHE", raising=False)
    if output == "embedding":
        inputs = (zoo.TensorSpec("ids", "int64", ("batch", 4), value_range=(0, 9)),)
        build, sample = _Embedder, lambda n, rng: {"ids": rng.integers(0, 10, (n, 4))}
    else:
        inputs = (zoo.TensorSpec("x", "float32", ("batch", 4)),)
        build = lambda: torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),  # noqa: E731
                                            torch.nn.Linear(16, 3), torch.nn.ReLU())
        sample = lambda n, rng: {"x": rng.standard_normal((n, 4)).astype(np.float32)}  # noqa: E731
    spec = zoo.ModelSpec(name=f"user-mlp.{output}", domain="tabular", task="classification", inputs=inputs,
                         outputs=(zoo.TensorSpec(output, "float32", ("batch", 3)),), build=build, sample=sample)
    zoo.register(spec)
    try:
        for again in (False, True):
            art = zoo.export(spec.name, "onnxruntime", repository=tmp_path / f"repo{again}", random_init=True)
            assert art.manifest["backend"]["info"]["onnx_cache"] == ("hit" if again else "miss")
            model_file, = art.path.rglob("*.onnx")
            onnx.checker.check_model(str(model_file))
            graph = onnx.load(str(model_file)).graph
            assert [o.name for o in graph.output] == [output]
            produced = [name for node in graph.node for name in node.output]
            assert len(produced) == len(set(produced)) and produced.count(output) == 1
            x = spec.sample(5, np.random.default_rng(1))
            assert zoo.load(art.path)(x)[output].shape == (5, 3)
    finally:
        zoo.unregister(spec.name)
