"""The training engine: DDP under torchrun, resume, gradient accumulation and
checkpointing, validation-based selection and early stopping, logs and traces.

Most tests train `mlp.digits-test` (tests/train_plugin.py): an MLP on real digits with no
dropout, BatchNorm or augmentation, so runs that must agree can be compared weight by
weight; the rest use registered models at their tiny size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import CheckpointError, UnsupportedError, ZooError
from zoo.training import TrainOptions
from zoo.training.loop import holdout, validate

TESTS = Path(__file__).parent
PLUGIN = TESTS / "train_plugin.py"


def _plugin():
    spec = importlib.util.spec_from_file_location("train_plugin", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MLP = _plugin().SPEC


def _close(a: zoo.Checkpoint, b: zoo.Checkpoint, atol: float) -> float:
    worst = max((a.state[k] - b.state[k]).abs().max().item() for k in a.state)
    assert worst <= atol, f"weights differ by {worst}"
    return worst


def _zoo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(PLUGIN), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_ddp_with_two_gloo_processes_agrees_with_one_process(tmp_path):
    one = zoo.train(MLP, out=tmp_path / "one", progress=False, options=TrainOptions(threads=1))
    done = _zoo("train", MLP.name, "--out", str(tmp_path / "two"), "--nproc", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    two = zoo.load_checkpoint(tmp_path / "two", MLP.name)
    assert two.metrics["world_size"] == 2 and one.metrics["world_size"] == 1
    # each process took half of every global batch; DDP averaged the gradients
    _close(one, two, atol=1e-4)
    assert abs(two.metrics["test_accuracy"] - one.metrics["test_accuracy"]) <= 0.01
    # rank 0 alone wrote: one event file, one checkpoint
    assert len(list((tmp_path / "two" / "tensorboard").iterdir())) == 1


def test_sigterm_to_zoo_train_stops_its_torchrun_processes_too(tmp_path):
    """SIGTERM (a time-out's, a scheduler's) to `zoo train --nproc 2` alone: before, it ended
    that process at once (status -15) and torchrun's processes trained on, unowned. Now the
    run stops as on Ctrl-C, torchrun and its processes with it, and says how to resume."""
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "zoo", "--plugin", str(PLUGIN), "train", MLP.name, "--out",
                                str(tmp_path / "run"), "--nproc", "2", "--epochs", "1000"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "run" / "last").is_dir():  # an epoch done: the processes are training
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no epoch finished in 240 s"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
        assert "--resume" in stderr
        time.sleep(1)
        with pytest.raises(ProcessLookupError):  # nothing of its process group is left
            os.killpg(process.pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def test_a_global_batch_is_sharded_with_weights_that_keep_its_mean():
    from zoo.training.distributed import World, check_batch_size
    from zoo.training.loop import shard

    batch = torch.arange(13)
    parts = [shard(batch, World(rank, 2, rank)) for rank in (0, 1)]
    assert sorted(torch.cat([p for p, _ in parts]).tolist()) == list(range(13))
    assert [w for _, w in parts] == [7 * 2 / 13, 6 * 2 / 13]  # mean of weighted means = the batch mean
    assert shard(torch.arange(1), World(1, 2, 1))[1] == 0.0  # no example left: a zero-weight one
    with pytest.raises(ZooError, match="without examples"):
        check_batch_size(1, World(0, 2, 0))


@pytest.mark.parametrize("model", ["mlp", "resnet8.digits"])
def test_resume_after_an_interruption_reaches_the_uninterrupted_weights(tmp_path, model):
    spec = MLP if model == "mlp" else zoo.get_model(model).tiny()  # resnet8: BatchNorm, augmentation
    straight = zoo.train(spec, out=tmp_path / "a", epochs=3, progress=False)

    def interrupt(epoch, _):
        if epoch == 2:
            raise KeyboardInterrupt  # as Ctrl-C would, after epoch 2's resume point
    with pytest.raises(KeyboardInterrupt):
        zoo.train(spec, out=tmp_path / "b", epochs=3, progress=False, on_epoch_end=interrupt)
    assert json.loads((tmp_path / "b" / "last" / "training.json").read_text())["epoch"] == 2
    resumed = zoo.train(spec, out=tmp_path / "b", epochs=3, progress=False, options=TrainOptions(resume=True))
    assert resumed.sha256 == straight.sha256
    assert resumed.metrics["loss_history"] == straight.metrics["loss_history"]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_run_cut_inside_an_epoch_by_max_steps_resumes_at_its_next_micro_batch(tmp_path, accumulate):
    options = {"batch_size": 64 // accumulate, "accumulate": accumulate}
    straight = zoo.train(MLP, out=tmp_path / "a", epochs=2, progress=False, options=TrainOptions(**options))
    cut = zoo.train(MLP, out=tmp_path / "b", epochs=2, progress=False,
                    options=TrainOptions(max_steps=5, **options))
    # the run ends with step 5's weights, in epoch 1 of 2 (21 steps each), selecting nothing
    assert (cut.metrics["steps"], cut.metrics["epochs_run"], cut.metrics["cut_in_epoch"]) == (5, 0, 1)
    assert cut.metrics["best_epoch"] is None and cut.metrics["loss_history"] == []
    assert cut.metrics["train_loss"] > straight.metrics["loss_history"][0]  # the first steps' loss is the highest
    state = json.loads((tmp_path / "b" / "last" / "training.json").read_text())
    assert (state["epoch"], state["step"], state["run"]["progress"]["partial"]["position"]) == (0, 5, 5 * accumulate)
    # resumed, it goes on from micro-batch 5 * accumulate of epoch 1: exactly the uninterrupted run
    resumed = zoo.train(MLP, out=tmp_path / "b", epochs=2, progress=False, options=TrainOptions(resume=True, **options))
    assert resumed.sha256 == straight.sha256
    assert resumed.metrics["loss_history"] == straight.metrics["loss_history"]
    assert resumed.metrics["steps"] == straight.metrics["steps"] == 42 and resumed.metrics["cut_in_epoch"] is None


def test_a_run_cut_after_its_best_epoch_keeps_the_selection_through_a_resume(tmp_path):
    """Cut in epoch 2 of 3 where epoch 1 validates best (a high constant learning rate):
    the cut run ends with epoch 1's weights, as the selection stands, and its model/ must
    not hold the cut step's weights, which a resumed run would reload as epoch 1's."""
    hot = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, lr=1.0, schedule="constant"))
    straight = zoo.train(hot, out=tmp_path / "a", epochs=3, progress=False)
    assert straight.metrics["best_epoch"] == 1, straight.metrics["val_accuracy_history"]  # the premise
    cut = zoo.train(hot, out=tmp_path / "b", epochs=3, progress=False, options=TrainOptions(max_steps=26))
    assert (cut.metrics["cut_in_epoch"], cut.metrics["best_epoch"], cut.metrics["epochs_run"]) == (2, 1, 1)
    resumed = zoo.train(hot, out=tmp_path / "b", epochs=3, progress=False, options=TrainOptions(resume=True))
    assert resumed.metrics["best_epoch"] == 1 and resumed.sha256 == straight.sha256


def test_a_resume_point_that_does_not_fit_the_optimizer_is_refused_by_name(tmp_path):
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False)
    state = tmp_path / "last" / "training.json"
    meta = json.loads(state.read_text())
    meta["optimizer"]["param_groups"][0]["params"] = [0]  # one parameter where the model has more
    state.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="does not fit this run's model, optimizer or schedule"):
        zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(resume=True))


def test_a_model_failing_in_training_is_named_not_an_internal_error(tmp_path):
    broken = zoo.get_model("resnet8.digits", width=0)
    with pytest.raises(zoo.errors.SpecError, match=r"resnet8.digits: a training step \(image\[64, 1, 8, 8\]\) "
                                                     r"raised RuntimeError"):
        zoo.train(broken, out=tmp_path, epochs=1, progress=False)


def _with_a_nan_image(split):
    from zoo_vision import digits

    x, y = digits.load(split)
    x = {"image": x["image"].copy()}
    x["image"][5, 0, 0, 0] = np.nan  # one unreadable pixel in one training example
    return x, y


def _a_nan_augment(batch, generator):
    return {"image": batch["image"].masked_fill(batch["image"] > 0.99, float("nan"))}


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_split_with_nan_is_refused_before_any_step_naming_its_rows(tmp_path, split):
    """A test split with NaN inputs was scored without a word (argmax of NaN logits: class 0)."""
    from zoo_vision import digits

    def load(which):
        return _with_a_nan_image(which) if which == split else digits.load(which)

    spec = dataclasses.replace(MLP, dataset=zoo.Dataset("digits with a NaN pixel", load))
    with pytest.raises(ZooError, match=rf"^{MLP.name}: dataset '{split}': input 'image' has non-finite values \(NaN "
                                       rf"or infinity\) in 1 row \(5\): clean the dataset$"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)
    assert not (tmp_path / "model").exists() and not (tmp_path / "metrics.json").exists()


def test_a_run_directory_whose_new_run_failed_points_to_the_run_it_set_aside(tmp_path):
    """It said "train one with `zoo train MODEL`", which trains into another directory."""
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False)
    epochs_done = []

    def nan_in_the_second_epoch(batch, generator):  # after the first epoch's resume point set the old run aside
        return _a_nan_augment(batch, generator) if epochs_done else batch

    spec = dataclasses.replace(MLP, dataset=dataclasses.replace(MLP.dataset, augment=nan_in_the_second_epoch))
    with pytest.raises(ZooError, match="training loss is nan"):
        zoo.train(spec, out=tmp_path, epochs=2, progress=False, options=TrainOptions(val_fraction=0),
                  on_epoch_end=lambda epoch, scalars: epochs_done.append(1))
    with pytest.raises(zoo.errors.CheckpointError, match=rf"^no checkpoint at {tmp_path} .*; the finished run set "
                                                         rf"aside when a new run started there is in {tmp_path}/previous: "
                                                         rf"--checkpoint {tmp_path}/previous; `zoo train "
                                                         rf"{MLP.name} --out {tmp_path} --seed 0 --epochs 2 "
                                                         rf"--batch-size 64 --val-fraction 0 --resume` continues the run "
                                                         rf"stopped there$"):
        zoo.load_checkpoint(tmp_path, expect_model=MLP.name)
    assert zoo.load_checkpoint(tmp_path / "previous", expect_model=MLP.name).model == MLP.name
    with pytest.raises(zoo.errors.CheckpointError, match=rf"train one with `zoo train {MLP.name} --out {tmp_path}/x`$"):
        zoo.load_checkpoint(tmp_path / "x", expect_model=MLP.name)


def test_a_non_finite_loss_stops_the_run_naming_the_input_and_writes_nothing(tmp_path):
    spec = dataclasses.replace(MLP, dataset=dataclasses.replace(MLP.dataset, augment=_a_nan_augment))
    with pytest.raises(ZooError, match=r"training loss is nan at this step; non-finite values in the batch's image: clean"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)
    assert not (tmp_path / "model").exists() and not (tmp_path / "metrics.json").exists()
    # a diverging run (finite data) is told how to go on
    hot = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, optimizer="sgd", lr=1e30, schedule="constant"))
    with pytest.raises(ZooError, match=r"training loss is (nan|inf) at this step; lower the learning rate"):
        zoo.train(hot, out=tmp_path / "hot", epochs=1, progress=False)


def test_a_failed_save_keeps_the_previous_resume_point(tmp_path, monkeypatch):
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=3))  # cut in epoch 1
    before = zoo.load_checkpoint(tmp_path / "last")
    import zoo.training.state as state

    def disk_full(tensors, path):
        Path(path).write_bytes(b"\0" * 100)  # a torn write, then the failure
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(state, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):  # resumed: its next save replaces that resume point
        zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(resume=True))
    after = zoo.load_checkpoint(tmp_path / "last")
    assert after.sha256 == before.sha256 and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_resume_refuses_another_model_corruption_and_changed_settings(tmp_path):
    zoo.train(MLP, out=tmp_path / "mlp", epochs=1, progress=False)
    resume = TrainOptions(resume=True)
    digits = zoo.get_model("resnet8.digits").tiny()
    with pytest.raises(CheckpointError, match="not resnet8.digits"):
        zoo.train(digits, out=tmp_path / "mlp", epochs=1, progress=False, options=resume)
    with pytest.raises(CheckpointError, match="trained with epochs=1"):
        zoo.train(MLP, out=tmp_path / "mlp", epochs=2, progress=False, options=resume)
    with pytest.raises(CheckpointError, match="no resume point"):
        zoo.train(MLP, out=tmp_path / "nothing", epochs=1, progress=False, options=resume)
    state = tmp_path / "mlp" / "last" / "training.safetensors"
    good = state.read_bytes()
    flipped = bytearray(good)
    flipped[-1] ^= 0x01  # one bit of the optimizer or generator state: it loaded, and the run went elsewhere
    state.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match=rf"^resume point {tmp_path}/mlp/last is corrupted: training.safetensors "
                                              rf"does not match the sha256 recorded in training.json$"):
        zoo.train(MLP, out=tmp_path / "mlp", epochs=1, progress=False, options=resume)
    state.write_bytes(good[:-16])
    with pytest.raises(CheckpointError, match="corrupted"):
        zoo.train(MLP, out=tmp_path / "mlp", epochs=1, progress=False, options=resume)


def test_a_resume_point_of_an_earlier_zoo_without_the_sha256_resumes_with_a_warning(tmp_path, caplog):
    """Resume points written before they recorded their tensors' sha256 (the same format 1)
    were refused as corrupted: the epochs trained were lost for an upgrade."""
    zoo.train(MLP, out=tmp_path / "mlp", epochs=2, progress=False, options=TrainOptions(max_steps=25))
    meta_path = tmp_path / "mlp" / "last" / "training.json"
    meta = json.loads(meta_path.read_text())
    del meta["tensors_sha256"]
    meta_path.write_text(json.dumps(meta))
    with caplog.at_level("WARNING", logger="zoo"):
        resumed = zoo.train(MLP, out=tmp_path / "mlp", epochs=2, progress=False, options=TrainOptions(resume=True))
    assert resumed.metrics["epochs"] == 2
    assert any("written by an earlier zoo" in r.getMessage() for r in caplog.records), caplog.text


def test_gradient_accumulation_takes_the_same_steps_as_the_large_batch(tmp_path):
    big = zoo.train(MLP, out=tmp_path / "big", epochs=2, progress=False)
    accumulated = zoo.train(MLP, out=tmp_path / "acc", epochs=2, progress=False,
                            options=TrainOptions(batch_size=32, accumulate=2))
    _close(big, accumulated, atol=1e-4)
    # an epoch whose last group is uneven (1293 examples: 26 full groups of 48, then 24 + 21):
    # each micro-batch counts by its examples, not as half of the group
    uneven_big = zoo.train(MLP, out=tmp_path / "big48", epochs=2, progress=False, options=TrainOptions(batch_size=48))
    uneven = zoo.train(MLP, out=tmp_path / "acc48", epochs=2, progress=False,
                       options=TrainOptions(batch_size=24, accumulate=2))
    _close(uneven_big, uneven, atol=1e-4)
    halves = zoo.train(MLP, out=tmp_path / "half", epochs=2, progress=False, options=TrainOptions(batch_size=32))
    assert (big.state["net.1.weight"] - halves.state["net.1.weight"]).abs().max() > 1e-3  # twice the steps


def test_gradient_clipping_bounds_the_update(tmp_path):
    sgd = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, optimizer="sgd", schedule="constant", lr=0.1))
    torch.manual_seed(sgd.recipe.seed)  # the initialization training starts from
    init = sgd.build().state_dict()
    free = zoo.train(sgd, out=tmp_path / "free", epochs=1, progress=False, options=TrainOptions(val_fraction=0))
    clipped = zoo.train(sgd, out=tmp_path / "clip", epochs=1, progress=False,
                        options=TrainOptions(val_fraction=0, clip_grad_norm=1e-3))
    moved = {name: sum((c.state[k] - init[k]).norm() ** 2 for k in init) ** 0.5 for name, c in
             (("free", free), ("clipped", clipped))}
    steps = -(-clipped.metrics["train_examples"] // 64)
    # Nesterov SGD, momentum m: a step is lr * (g + m * buffer) with |buffer| <= |g| / (1 - m)
    bound = steps * 0.1 * 1e-3 * (1 + 0.9 / (1 - 0.9))
    assert moved["clipped"] <= bound < moved["free"]


def test_gradient_checkpointing_gives_the_same_training(tmp_path):
    spec = zoo.get_model("resnet8.digits").tiny()
    plain = zoo.train(spec, out=tmp_path / "a", epochs=1, progress=False)
    recomputed = zoo.train(spec, out=tmp_path / "b", epochs=1, progress=False,
                           options=TrainOptions(grad_checkpointing=True))
    # the same parameters and BatchNorm running statistics: the recomputation in backward
    # normalizes by the batch's statistics again but does not update the running ones twice
    assert plain.state.keys() == recomputed.state.keys()
    worst = max((plain.state[k].double() - recomputed.state[k].double()).abs().max().item() for k in plain.state)
    assert worst <= 1e-5
    tracked = [k for k in plain.state if k.endswith("num_batches_tracked")]
    assert tracked and all(torch.equal(plain.state[k], recomputed.state[k]) for k in tracked)
    module = spec.build().train()
    module.set_grad_checkpointing(True)
    module(torch.randn(4, 1, 8, 8)).sum().backward()  # one step: each BatchNorm counts one batch
    assert {int(m.num_batches_tracked) for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {1}
    assert recomputed.metrics["options"]["grad_checkpointing"] is True
    with pytest.raises(ZooError, match="does not support gradient checkpointing"):
        zoo.train(MLP, out=tmp_path / "c", epochs=1, progress=False, options=TrainOptions(grad_checkpointing=True))
    with pytest.raises(ZooError, match="no Conv2d"):
        zoo.train(MLP, out=tmp_path / "c", epochs=1, progress=False, options=TrainOptions(channels_last=True))


def test_the_selected_checkpoint_is_the_best_validation_epoch(tmp_path):
    ckpt = zoo.train(MLP, out=tmp_path, epochs=4, progress=False)
    history = ckpt.metrics["val_accuracy_history"]
    best = max(range(len(history)), key=lambda i: (history[i], i))  # a tie goes to the later epoch
    assert ckpt.metrics["best_epoch"] == best + 1
    x, y = MLP.dataset.load("train")
    _, val_idx = holdout(len(y), MLP.recipe.val_fraction, MLP.recipe.seed)
    module = ckpt.module(MLP)
    again = validate(MLP, module, {"image": torch.from_numpy(x["image"])}, torch.from_numpy(y), val_idx, "cpu")
    assert again["accuracy"] == history[best]


def test_a_metric_named_as_an_error_selects_its_lowest_epoch_without_being_told(tmp_path):
    # a user's "error" metric left at the default direction selected its worst epoch
    error = zoo.Metric("val_error", lambda outputs, targets: float((outputs["logits"].argmax(1) != targets).mean()))
    assert error.higher_is_better is False
    ckpt = zoo.train(dataclasses.replace(MLP, metric=error), out=tmp_path, epochs=4, progress=False)
    history = ckpt.metrics["val_val_error_history"]
    assert len(set(history)) > 1, history  # epochs that differ, or the selection shows nothing
    best = min(range(len(history)), key=lambda i: (history[i], -i))  # a tie goes to the later epoch
    assert ckpt.metrics["best_epoch"] == best + 1


@pytest.mark.parametrize("name, higher", [
    ("rmse", False), ("val_loss", False), ("word_error_rate", False), ("MAE", False), ("top1-err", False),
    ("perplexity", False), ("neg_mean_squared_error", True), ("negative_mse", True), ("accuracy", True),
    ("map50", True), ("mean_return", True), ("f1", True),
])
def test_a_metric_without_a_direction_takes_it_from_its_name(name, higher):
    compute = lambda outputs, targets: 0.0  # noqa: E731
    assert zoo.Metric(name, compute).higher_is_better is higher
    assert zoo.Metric(name, compute, higher_is_better=not higher).higher_is_better is (not higher)  # stated wins
    with pytest.raises(ZooError, match=rf"metric '{name}': higher_is_better='no'; expected True or False"):
        zoo.Metric(name, compute, higher_is_better="no")


def test_early_stopping_stops_when_validation_stops_improving(tmp_path):
    # a learning rate too small to move any prediction (a recipe's must be positive)
    frozen = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, lr=1e-12, schedule="constant"))
    ckpt = zoo.train(frozen, out=tmp_path, epochs=10, progress=False, options=TrainOptions(patience=2))
    # patience counts epochs without a strict improvement; a tie still moves the selection on
    assert ckpt.metrics["stopped_early"] is True and ckpt.metrics["epochs_run"] == 3
    assert ckpt.metrics["val_accuracy_history"] == [ckpt.metrics["val_accuracy_history"][0]] * 3
    assert ckpt.metrics["best_epoch"] == 3


def test_tensorboard_events_profile_trace_and_metrics_json(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ckpt = zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(profile=True))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "val/accuracy", "val/loss", "train/samples_per_second"} <= set(tags)
    steps_per_epoch = -(-ckpt.metrics["train_examples"] // 64)
    assert len(events.Scalars("train/loss")) == 2 * steps_per_epoch
    assert [e.value for e in events.Scalars("val/accuracy")] == pytest.approx(ckpt.metrics["val_accuracy_history"])
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"]) == 3
    assert json.loads((tmp_path / "metrics.json").read_text())["test_accuracy"] == ckpt.metrics["test_accuracy"]


def test_compiled_training_matches_eager(tmp_path):
    eager = zoo.train(MLP, out=tmp_path / "eager", epochs=1, progress=False)
    compiled = zoo.train(MLP, out=tmp_path / "compiled", epochs=1, progress=False, options=TrainOptions(compile=True))
    _close(eager, compiled, atol=1e-4)


def test_ppo_uses_the_same_run_directory_and_resume(tmp_path):
    spec = zoo.get_model("ppo.cartpole").tiny()
    straight = zoo.train(spec, out=tmp_path / "a", epochs=10, progress=False)
    assert (tmp_path / "a" / "last" / "training.json").is_file() and (tmp_path / "a" / "metrics.json").is_file()
    assert list((tmp_path / "a" / "tensorboard").glob("events.*"))
    resumed = zoo.train(spec, out=tmp_path / "a", epochs=10, progress=False, options=TrainOptions(resume=True))
    assert resumed.sha256 == straight.sha256  # resumed at the end: nothing left to train
    # an option the trainer refuses on any CPU (bf16 is refused earlier on a CPU without it)
    with pytest.raises(UnsupportedError, match="does not take --accumulate"):
        zoo.train(spec, out=tmp_path / "b", epochs=1, progress=False, options=TrainOptions(accumulate=2))
    # options of the supervised loop that PPO has no use for: refused, not ignored
    for option, flag in (({"val_fraction": 0.1}, "--val-fraction"), ({"profile": True}, "--profile"),
                         ({"channels_last": True}, "--channels-last"), ({"threads": 2}, "--threads other than 1")):
        with pytest.raises(UnsupportedError, match=f"does not take {flag}"):
            zoo.train(spec, out=tmp_path / "b", epochs=1, progress=False, options=TrainOptions(**option))


def test_cli_options_and_errors(tmp_path):
    done = _zoo("train", MLP.name, "--out", str(tmp_path), "--epochs", "1", "--accumulate", "2",
                "--batch-size", "32", "--clip-grad-norm", "1.0", "--patience", "3", "--no-tensorboard", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["options"]["accumulate"] == 2 and metrics["batch_size"] == 32
    assert not (tmp_path / "tensorboard").exists()
    for args, message in (
        (("--warp-speed",), "No such option"),
        (("--precision", "fp16"), "fp16 training needs a CUDA device"),
        (("--accumulate", "0"), "at least 1"),
        (("--val-fraction", "1.5"), "--val-fraction must be in [0, 1)"),
    ):
        done = _zoo("train", MLP.name, "--out", str(tmp_path / "x"), *args, cwd=tmp_path)
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr[-500:])


def test_patience_without_a_validation_split_is_refused_before_training(tmp_path):
    """--patience watches the validation metric; with nothing held out it would never stop,
    silently (as `zoo train resnet8.digits --patience 5` did: its recipe holds none out)."""
    with pytest.raises(ZooError, match=r"--patience stops when the validation metric stops improving, and "
                                       r"mlp.digits-test holds no examples out .* add --val-fraction"):
        zoo.train(MLP, out=tmp_path / "p", epochs=1, progress=False,
                  options=TrainOptions(val_fraction=0.0, patience=2))
    assert not (tmp_path / "p").exists()


def _select_on_rank(rank: int, init_file: str, values: list, out_dir: str) -> None:
    """One of two gloo processes: the epochs' selection with this rank's own validation values."""
    import json
    from types import SimpleNamespace

    import torch.distributed as dist

    from zoo.training.distributed import World
    from zoo.training.loop import _select

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        run = SimpleNamespace(world=World(rank, 2, rank), options=SimpleNamespace(patience=1),
                              save_model=lambda checkpoint: None)
        progress = {"history": [], "val_history": [], "best": None, "best_epoch": None, "stale_epochs": 0,
                    "stopped_early": False}
        spec, module = SimpleNamespace(name="m", config={}), torch.nn.Linear(1, 1)
        for epoch, value in enumerate(values[rank], 1):
            _select(spec, run, module, progress, epoch, 1.0, {"accuracy": value}, "accuracy", True)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(progress))
    finally:
        dist.destroy_process_group()


def test_every_rank_takes_rank_0s_early_stopping_decision(tmp_path):
    """Ranks validate their own replica, whose BatchNorm statistics differ after the last
    step (DDP broadcasts buffers at each forward): with --patience, rank 0 stopped while
    rank 1 went on training against a closed process group, and torchrun failed. The
    selection takes rank 0's value on every rank, so both decide alike."""
    import json

    values = [[0.50, 0.40], [0.50, 0.60]]  # epoch 2: worse on rank 0, better on rank 1
    torch.multiprocessing.spawn(_select_on_rank, args=(str(tmp_path / "init"), values, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert ranks[0]["stopped_early"] is True and ranks[0]["val_history"] == [0.5, 0.4] and ranks[0]["best_epoch"] == 1


def _trainable_vision() -> list[str]:
    """The trainable convolutional models: vision's, named without building one."""
    return [name for name in zoo.list_models()
            if (spec := zoo.get_model(name)).domain == "vision" and spec.recipe is not None]


@pytest.mark.parametrize("layout", ["the recipe's", "row-major"])
@pytest.mark.parametrize("augmentation", ["its own", "channels-last"])
@pytest.mark.parametrize("model", _trainable_vision())
def test_a_run_convolves_in_the_layout_it_chose_whatever_strides_its_batches_come_with(tmp_path, model, augmentation,
                                                                                       layout):
    """Image batches whose strides read as channels-last (digits' (N, 1, 8, 8) images as
    loaded; an augmentation's output) made every convolution of an fp32 run channels-last
    whatever the recipe chose, and under DDP the 1x1 kernels' gradient strides did not
    match their buckets (a warning). A run convolves in its chosen layout, and says which."""
    spec = zoo.get_model(model).tiny()
    layouts: list[bool] = []  # per training convolution: its input in the run's layout

    def build():
        module = spec.build()
        for conv in (m for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1):
            conv.register_forward_pre_hook(lambda m, args: layouts.append(args[0].is_contiguous(
                memory_format=torch.channels_last if chosen else torch.contiguous_format)) if m.training else None)
        return module

    def channels_last(batch, gen):
        batch = spec.dataset.augment(batch, gen) if spec.dataset.augment is not None else batch
        return {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in batch.items()}

    # fp32: channels-last only where the recipe says so, or --channels-last
    chosen = bool(spec.recipe.channels_last) and layout == "the recipe's"
    dataset = spec.dataset if augmentation == "its own" else dataclasses.replace(spec.dataset, augment=channels_last)
    run = zoo.train(dataclasses.replace(spec, build=build, dataset=dataset), out=tmp_path / "run", epochs=1,
                    progress=False, options=TrainOptions(max_steps=1, channels_last=None if chosen else False))
    assert run.metrics["channels_last"] is chosen
    assert layouts and all(layouts), f"{layouts.count(False)} of {len(layouts)} convolutions not in the chosen layout"


class _NoGrad(torch.nn.Module):
    """An MLP whose forward runs without autograd, as inference code is written."""

    def __init__(self, mode) -> None:
        super().__init__()
        self.mlp, self.mode = _plugin().MLP(), mode

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        with self.mode():
            return self.mlp(image)


def test_a_loss_that_is_not_a_scalar_is_refused_naming_its_shape(tmp_path):
    """It said torch's "grad can be implicitly created only for scalar outputs"."""
    def per_example(outputs, target):
        return torch.nn.functional.cross_entropy(outputs["logits"], target, reduction="none")

    spec = dataclasses.replace(MLP, loss=per_example)
    with pytest.raises(zoo.errors.SpecError, match=rf"^{MLP.name}: its loss returned a tensor of shape \[64\]; it must "
                                                   r"be a scalar, one number per batch"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)


def test_a_loss_that_is_a_python_number_is_refused_naming_it(tmp_path):
    # a review found it: `.item()` on the loss gave "'float' object has no attribute 'backward'"
    def as_number(outputs, target):
        return torch.nn.functional.cross_entropy(outputs["logits"], target).item()

    spec = dataclasses.replace(MLP, loss=as_number)
    with pytest.raises(zoo.errors.SpecError, match=rf"^{MLP.name}: its loss returned a float, not a tensor"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_loss_without_a_gradient_is_refused_naming_the_likely_cause(tmp_path, mode):
    """It said torch's "element 0 of tensors does not require grad and does not have a grad_fn"."""
    spec = dataclasses.replace(MLP, build=lambda: _NoGrad(mode))
    with pytest.raises(zoo.errors.SpecError, match=rf"^{MLP.name}: its loss does not depend on any trainable parameter "
                                                   r"through autograd: a forward run under torch.no_grad"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)
