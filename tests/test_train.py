"""Training reaches its stated quality, reproduces on CPU, and checkpoints safely."""

from __future__ import annotations

import pytest

import zoo
from zoo.errors import CheckpointError, ZooError


def test_digits_reaches_its_stated_accuracy(tmp_path):
    spec = zoo.get_model("resnet8.digits")
    ckpt = zoo.train(spec, out=tmp_path / "ckpt", progress=False)
    assert ckpt.metrics["test_accuracy"] >= spec.recipe.target == 0.97
    loaded = zoo.load_checkpoint(tmp_path / "ckpt", "resnet8.digits")
    assert loaded.sha256 == ckpt.sha256 and loaded.metrics["test_accuracy"] == ckpt.metrics["test_accuracy"]
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()


def test_training_is_reproducible_for_a_seed(tmp_path):
    spec = zoo.get_model("resnet8.digits").tiny()
    a = zoo.train(spec, out=tmp_path / "a", epochs=1, seed=3, progress=False)
    b = zoo.train(spec, out=tmp_path / "b", epochs=1, seed=3, progress=False)
    c = zoo.train(spec, out=tmp_path / "c", epochs=1, seed=4, progress=False)
    assert a.sha256 == b.sha256 != c.sha256


def test_checkpoint_errors_are_clear(tmp_path):
    spec = zoo.get_model("resnet8.digits").tiny()
    ckpt = zoo.train(spec, out=tmp_path / "ckpt", epochs=1, progress=False)
    with pytest.raises(CheckpointError, match="not resnet18"):
        zoo.load_checkpoint(tmp_path / "ckpt", "resnet18")
    with pytest.raises(CheckpointError, match="zoo train"):
        zoo.load_checkpoint(tmp_path / "missing", "resnet8.digits")
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        zoo.load_checkpoint(tmp_path / "ckpt")
    # a checkpoint rebuilds the module at its own recorded config, not the registry default
    other = zoo.Checkpoint(spec.name, {"width": 16}, zoo.get_model("resnet8.digits").configure(width=16).build().state_dict())
    assert other.module(zoo.get_model("resnet8.digits")).training is False
    assert ckpt.config == {"width": 8}


def test_untrainable_model_says_why():
    with pytest.raises(ZooError, match="random init"):
        zoo.train("resnet18", progress=False)
