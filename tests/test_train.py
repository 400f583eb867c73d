"""Training reaches its stated quality, reproduces on CPU, and checkpoints safely."""

from __future__ import annotations

import json

import pytest
import torch

import zoo
from zoo.errors import CheckpointError, UnsupportedError, ZooError
from zoo.training import TrainOptions
from zoo.training.options import _cpu_has_bf16


@pytest.fixture(scope="module")
def digits_fp32(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp32")
    return out, zoo.train("resnet8.digits", out=out, progress=False)


def test_the_run_directory_holds_the_selection_the_resume_point_metrics_and_events(tmp_path):
    """(The stated accuracy at full size, over seeds, is the quality tier's: tools/quality.py.)"""
    out = tmp_path
    ckpt = zoo.train(zoo.get_model("resnet8.digits").tiny(), out=out, epochs=2, progress=False)
    # the run directory: selected checkpoint, resume point, final metrics, event files
    assert ckpt.path == out / "model" and (out / "model" / "model.safetensors").is_file()
    assert (out / "last" / "training.safetensors").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(ckpt.metrics))
    loaded = zoo.load_checkpoint(out, "resnet8.digits")  # a run directory reads as its selected checkpoint
    assert loaded.sha256 == ckpt.sha256 and loaded.metrics["test_accuracy"] == ckpt.metrics["test_accuracy"]
    assert loaded.config == {"width": 8}


@pytest.mark.slow
@pytest.mark.skipif(not _cpu_has_bf16(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")
def test_bf16_autocast_trains_within_one_point_of_fp32(digits_fp32, tmp_path):
    _, fp32 = digits_fp32
    bf16 = zoo.train("resnet8.digits", out=tmp_path, progress=False, options=TrainOptions(precision="bf16"))
    assert bf16.metrics["precision"] == "bf16" and bf16.metrics["options"]["channels_last"] is None
    assert bf16.metrics["test_accuracy"] >= fp32.metrics["test_accuracy"] - 0.01
    assert bf16.sha256 != fp32.sha256  # it really ran in another precision
    assert all(v.dtype != torch.bfloat16 for v in bf16.state.values())  # fp32 weights, autocast activations


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
    weights = tmp_path / "ckpt" / "model" / "model.safetensors"
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


def test_a_precision_the_device_cannot_do_is_refused_up_front(tmp_path):
    with pytest.raises(UnsupportedError, match="fp16 training needs a CUDA device"):
        zoo.train("resnet8.digits", out=tmp_path, progress=False, options=TrainOptions(precision="fp16"))
    with pytest.raises(ZooError, match="unknown precision 'int8'"):
        TrainOptions(precision="int8")
    assert not tmp_path.joinpath("model").exists()


def test_a_run_that_misses_its_recipes_target_says_so(tmp_path, caplog):
    """`Recipe.target` is checked after every run: recorded beside the metrics, and a miss
    is a warning (the library's log, and one line from `zoo train`)."""
    import dataclasses
    import logging

    tiny = zoo.get_model("resnet8.digits").tiny()
    unreachable = dataclasses.replace(tiny, recipe=dataclasses.replace(tiny.recipe, target=1.01))
    with caplog.at_level(logging.WARNING, logger="zoo.train"):
        ckpt = zoo.train(unreachable, out=tmp_path / "miss", epochs=1, progress=False)
    reached = ckpt.metrics["target"]
    assert reached == {"metric": "accuracy", "value": ckpt.metrics["test_accuracy"], "target": 1.01, "met": False}
    assert any(r.getMessage().endswith("short of its recipe's target 1.01 (seed 0, 1 epochs)") for r in caplog.records)
    assert json.loads((tmp_path / "miss" / "metrics.json").read_text())["target"]["met"] is False
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zoo.train"):  # a cut run is not the recipe's whole run
        zoo.train(unreachable, out=tmp_path / "cut", epochs=2, progress=False, options=TrainOptions(max_steps=1))
    assert any(r.getMessage().endswith("short of its recipe's target 1.01 (seed 0, a run cut by --max-steps after "
                                       "1 step of 2 epochs)") for r in caplog.records), caplog.text
    lower = dataclasses.replace(tiny, recipe=dataclasses.replace(tiny.recipe, target=0.0))
    assert zoo.train(lower, out=tmp_path / "met", epochs=1, progress=False).metrics["target"]["met"] is True
