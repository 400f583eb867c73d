"""The export contract: verified before complete, atomic, reused only on equal provenance."""

from __future__ import annotations

import dataclasses
import json

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
    assert list(repository.iterdir()) == []  # no artifact, no temporary directory


def test_interrupted_export_leaves_nothing_that_loads(faulty_backends, repository):
    with pytest.raises(KeyboardInterrupt):
        zoo.export(SPEC, "interrupted", repository=repository, random_init=True)
    assert list(repository.iterdir()) == []


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
