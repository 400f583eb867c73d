"""What a run's records say about it across resumes: early stopping only where the run
stopped early, throughput over all of its processes, TensorBoard without the steps a
stopped process logged past its resume point, and the thread count the trainer ran on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import zoo
from zoo.training import TrainOptions



from train_plugin import SPEC as MLP  # noqa: E402 - tests/ is on the path, as for test_training_faults
#: a learning rate too small to move any prediction: validation ties every epoch
FROZEN = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, lr=1e-12, schedule="constant"))


def test_a_run_that_ran_all_its_epochs_did_not_stop_early(tmp_path):
    """Patience ran out on the last epoch: "stopped early after 3 of 3 epochs" was said."""
    ckpt = zoo.train(FROZEN, out=tmp_path / "all", epochs=3, progress=False, options=TrainOptions(patience=2))
    assert ckpt.metrics["epochs_run"] == 3 and ckpt.metrics["stopped_early"] is False
    stopped = zoo.train(FROZEN, out=tmp_path / "early", epochs=4, progress=False, options=TrainOptions(patience=2))
    assert stopped.metrics["epochs_run"] == 3 and stopped.metrics["stopped_early"] is True


def test_throughput_and_time_count_every_process_of_a_resumed_run(tmp_path):
    """A resumed run reported its last process's figures; resuming a finished run reported
    samples_per_second None and train_seconds 0."""

    def stop(epoch, _):
        if epoch == 1:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        zoo.train(MLP, out=tmp_path, epochs=2, progress=False, on_epoch_end=stop)
    first = json.loads((tmp_path / "last" / "training.json").read_text())["run"]["progress"]["throughput"]
    resumed = zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(resume=True)).metrics
    both = json.loads((tmp_path / "last" / "training.json").read_text())["run"]["progress"]["throughput"]
    assert first["samples"] == resumed["train_examples"] and both["samples"] == 2 * resumed["train_examples"]
    assert resumed["train_seconds"] == round(both["seconds"], 2) and both["seconds"] > first["seconds"]
    assert resumed["samples_per_second"] == round(both["samples"] / both["seconds"], 1)
    again = zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(resume=True)).metrics
    assert (again["train_seconds"], again["samples_per_second"]) == (resumed["train_seconds"],
                                                                     resumed["samples_per_second"])
    assert json.loads((tmp_path / "metrics.json").read_text())["train_seconds"] == resumed["train_seconds"]


def _scalars(directory: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` as TensorBoard reads the event files in order: a session that
    starts at step s (`SummaryWriter(purge_step=s)`) discards what earlier files hold at s
    and after."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    points: list[tuple[int, float]] = []
    for path in sorted(directory.glob("events.*")):
        for event in EventFileLoader(str(path)).Load():
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                points = [(s, v) for s, v in points if s < event.step]
            for value in event.summary.value:
                if value.tag == tag:
                    points.append((event.step, value.tensor.float_val[0] if value.HasField("tensor")
                                   else value.simple_value))
    return points


def test_a_resumed_run_leaves_no_duplicate_tensorboard_steps(tmp_path):
    """The steps a stopped run logged after its last resume point were logged again by the
    resumed run: two values at one step."""
    calls = [0]

    def loss(outputs, target):
        calls[0] += 1
        if calls[0] == 30:  # a few steps into epoch 2, after epoch 1's resume point
            raise KeyboardInterrupt
        return MLP.loss(outputs, target)

    stopping = dataclasses.replace(MLP, loss=loss)
    with pytest.raises(KeyboardInterrupt):
        zoo.train(stopping, out=tmp_path, epochs=2, progress=False, options=TrainOptions(val_fraction=0.0))
    zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(val_fraction=0.0, resume=True))
    steps = [s for s, _ in _scalars(tmp_path / "tensorboard", "train/loss")]
    assert steps == list(range(1, len(steps) + 1)), steps
    assert len(steps) == 2 * -(-len(MLP.dataset.load("train")[1]) // 64)


def test_ppo_records_the_one_thread_it_ran_on(tmp_path):
    """PPO runs on one thread whatever the process's count; metrics.json said the process's."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a machine's default count (the test suite runs on one)
    try:
        ckpt = zoo.train(zoo.get_model("ppo.cartpole").tiny(), out=tmp_path, epochs=1, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert ckpt.metrics["threads_per_process"] == 1


def test_a_resumed_ppo_run_leaves_no_duplicate_tensorboard_iterations(tmp_path):
    """PPO logs by environment step through the same `Run.log`: the iterations a stopped run
    logged after its resume point (written every 10) were there twice, with other values."""
    spec = zoo.get_model("ppo.cartpole").tiny()

    def stop(iteration, _):
        if iteration == 12:  # two iterations past the resume point at 10
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        zoo.train(spec, out=tmp_path, epochs=14, progress=False, on_epoch_end=stop)
    zoo.train(spec, out=tmp_path, epochs=14, progress=False, options=TrainOptions(resume=True))
    steps = [s for s, _ in _scalars(tmp_path / "tensorboard", "train/lr")]
    assert len(steps) == 14 and steps == sorted(set(steps)), steps
