"""What `--resume` takes from the run it continues: the settings it refuses to change, the
thread count it warns about, where it stops under --max-steps, the selected checkpoint it
checks before training, and the command that continues a stopped run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo.errors import CheckpointError
from zoo.training import TrainOptions

TESTS = Path(__file__).parent
PLUGIN = TESTS / "train_plugin.py"


from train_plugin import SPEC as MLP  # noqa: E402 - tests/ is on the path, as for test_training_faults


def _stop_after(epoch_to_stop: int):
    def stop(epoch, _):
        if epoch == epoch_to_stop:
            raise KeyboardInterrupt  # as Ctrl-C would, after that epoch's resume point
    return stop


@pytest.mark.parametrize("changed, says", [
    ({"clip_grad_norm": 2.0}, "clip_grad_norm=1.0, this run asks for 2.0"),
    ({"clip_grad_norm": None}, "clip_grad_norm=1.0, this run asks for None"),
    ({"patience": 1}, "patience=3, this run asks for 1"),
], ids=["clip-other", "clip-dropped", "patience"])
def test_resume_refuses_another_clip_grad_norm_or_patience(tmp_path, changed, says):
    """They were taken silently and recorded in metrics.json as the whole run's."""
    asked = {"clip_grad_norm": 1.0, "patience": 3, "max_steps": 3}
    zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(**asked))
    with pytest.raises(CheckpointError, match=re.escape(f"was trained with {says}")):
        zoo.train(MLP, out=tmp_path, epochs=2, progress=False,
                  options=TrainOptions(resume=True, **{**asked, **changed}))
    resumed = zoo.train(MLP, out=tmp_path, epochs=2, progress=False,
                        options=TrainOptions(resume=True, **{**asked, "max_steps": None}))
    assert resumed.metrics["options"]["clip_grad_norm"] == 1.0 and resumed.metrics["epochs_run"] == 2


def test_resume_with_another_thread_count_warns_that_it_is_not_bit_exact(tmp_path, caplog):
    """Another machine's core count is a legitimate resume: warned, not refused, and recorded."""
    with pytest.raises(KeyboardInterrupt):
        zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(threads=1),
                  on_epoch_end=_stop_after(1))
    with caplog.at_level("WARNING", logger="zoo.train"):
        resumed = zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(threads=2, resume=True))
    warned = [r.getMessage() for r in caplog.records if "thread" in r.getMessage()]
    assert len(warned) == 1 and "1 thread per process" in warned[0] and "not bit for bit" in warned[0], warned
    assert resumed.metrics["threads_per_process"] == 2 and resumed.metrics["threads_before_resume"] == [1]


def test_resume_at_max_steps_takes_no_step_more(tmp_path):
    """A run cut at step 5 resumed with --max-steps 5 took step 6."""
    zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(max_steps=5))
    state = (tmp_path / "last" / "training.json").read_bytes()
    again = zoo.train(MLP, out=tmp_path, epochs=2, progress=False, options=TrainOptions(max_steps=5, resume=True))
    assert again.metrics["steps"] == 5 and again.metrics["cut_in_epoch"] == 1
    assert (tmp_path / "last" / "training.json").read_bytes() == state


def test_a_corrupted_selected_checkpoint_is_refused_before_any_training(tmp_path):
    """model/ was read only at the end: the resumed run trained to completion, then failed,
    and every --resume after that failed the same way without saying what to do."""
    with pytest.raises(KeyboardInterrupt):
        zoo.train(MLP, out=tmp_path, epochs=3, progress=False, on_epoch_end=_stop_after(1))
    weights = tmp_path / "model" / "model.safetensors"
    flipped = bytearray(weights.read_bytes())
    flipped[-1] ^= 0x01
    weights.write_bytes(bytes(flipped))
    state = (tmp_path / "last" / "training.json").read_bytes()
    epochs: list[int] = []
    with pytest.raises(CheckpointError, match=r"model is corrupted.*without --resume") as caught:
        zoo.train(MLP, out=tmp_path, epochs=3, progress=False, options=TrainOptions(resume=True),
                  on_epoch_end=lambda epoch, _: epochs.append(epoch))
    assert epochs == [] and (tmp_path / "last" / "training.json").read_bytes() == state
    assert "\n" not in str(caught.value)
    # what it says to do works
    assert zoo.train(MLP, out=tmp_path, epochs=1, progress=False).metrics["epochs_run"] == 1


def test_the_command_that_continues_a_stopped_run_carries_its_settings(tmp_path):
    """`zoo export` on a stopped run said `zoo train MODEL --out DIR --resume`, which the
    resume check then refused (another epoch count, batch size ...) or, without --threads 1,
    continued other than bit for bit."""
    out = tmp_path / "run"
    options = TrainOptions(threads=1, batch_size=32, val_fraction=0.0, clip_grad_norm=1.0)
    with pytest.raises(KeyboardInterrupt):
        zoo.train(MLP, out=out, epochs=2, seed=7, progress=False, options=options, on_epoch_end=_stop_after(1))
    with pytest.raises(CheckpointError) as caught:  # no validation: model/ is written at the end
        zoo.load_checkpoint(out, MLP.name)
    command = re.search(r"`(zoo train [^`]*)`", str(caught.value)).group(1)
    for flag in ("--seed 7", "--epochs 2", "--batch-size 32", "--val-fraction 0", "--clip-grad-norm 1",
                 "--threads 1", "--resume"):
        assert flag in command, command
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(PLUGIN), *shlex.split(command)[1:]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "metrics.json").read_text())["epochs_run"] == 2
