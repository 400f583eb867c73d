"""Faults of a model, a dataset or a command line that training must stop on with one clear
line (and the right exit status), never with an internal error, a traceback or NaN weights
saved as a result; and resume points that continue every process exactly."""

from __future__ import annotations

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
from zoo.errors import CheckpointError, SpecError, ZooError
from zoo.training import TrainOptions
from zoo.verify import evaluate

TESTS = Path(__file__).parent


def _train_plugin():
    spec = importlib.util.spec_from_file_location("train_plugin", TESTS / "train_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PLUGIN = _train_plugin()
MLP = PLUGIN.SPEC

#: variants of mlp.digits-test for runs through the command line (`zoo --plugin FILE`)
VARIANTS = f'''
import dataclasses, sys
import torch
import zoo
sys.path.insert(0, {str(TESTS)!r})
from train_plugin import MLP, SPEC


def noisy(batch, gen):  # augmentation: each process draws from its own generator
    return {{k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in batch.items()}}


class Unused(MLP):
    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))


@zoo.hookimpl
def zoo_register_models(register):
    register(dataclasses.replace(SPEC, name="mlp.digits-aug",
                                 dataset=dataclasses.replace(SPEC.dataset, augment=noisy)))
    register(dataclasses.replace(SPEC, name="mlp.digits-unused", build=Unused))
    register(dataclasses.replace(SPEC, name="mlp.digits-target",
                                 recipe=dataclasses.replace(SPEC.recipe, epochs=1, target=1.01)))
'''


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Run `zoo --plugin <the variants> ...` in a fresh directory; the completed process."""
    root = tmp_path_factory.mktemp("cli")
    (root / "variants.py").write_text(VARIANTS)

    def run(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("ZOO_DEBUG", None)
        return subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(root / "variants.py"), *args], cwd=root,
                              env=env, capture_output=True, text=True, timeout=300)

    run.root = root
    return run


# -- non-finite steps ------------------------------------------------------------------


class _SqrtOfZero(PLUGIN.MLP):
    """Finite loss, NaN gradient: d sqrt(z)/dz at z = 0 is infinite, times 0 is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.z = torch.nn.Parameter(torch.zeros(1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return super().forward(image) + 0 * torch.sqrt(self.z)


def test_a_non_finite_gradient_stops_the_run_naming_the_parameter_and_saves_nothing(tmp_path):
    spec = dataclasses.replace(MLP, build=_SqrtOfZero)
    with pytest.raises(ZooError, match=r"non-finite gradient \(NaN or infinity\) in z while the loss is finite"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)
    assert not (tmp_path / "model").exists() and not (tmp_path / "last").exists()


# -- resume ----------------------------------------------------------------------------


def test_each_rank_restores_its_own_generators():
    from zoo.training.state import capture_rng, merge_ranks, restore_rng

    gens = [torch.Generator().manual_seed(rank) for rank in (0, 1)]
    merged = merge_ranks([capture_rng(gen) for gen in gens])
    expected = [torch.randn(3, generator=gen) for gen in gens]
    for rank in (0, 1):
        gen = torch.Generator().manual_seed(99)
        restore_rng(merged, gen, rank)
        assert torch.equal(torch.randn(3, generator=gen), expected[rank])


def test_a_resumed_two_process_run_with_augmentation_reaches_the_uninterrupted_weights(cli):
    done = cli("train", "mlp.digits-aug", "--epochs", "2", "--out", "whole", "--nproc", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    # an epoch is 20 steps: cut inside the first, start over, cut inside the second, resume
    for args in (["--max-steps", "5"], ["--max-steps", "25"], ["--resume"]):
        done = cli("train", "mlp.digits-aug", "--epochs", "2", "--out", "cut", "--nproc", "2", *args)
        assert done.returncode == 0, done.stderr[-2000:]
        # starting over an unfinished run is said once, by the launcher (each rank 0 said it again)
        assert done.stderr.count("holds an unfinished run") == (args == ["--max-steps", "25"]), done.stderr
        if args == ["--max-steps", "5"]:
            (cli.root / "cut" / "metrics.json").unlink()  # as a run stopped before its end leaves it
    whole, cut = (zoo.load_checkpoint(cli.root / name / "last") for name in ("whole", "cut"))
    assert whole.sha256 == cut.sha256


def test_resume_refuses_another_optimizer_schedule_or_learning_rate(tmp_path):
    zoo.train(MLP, out=tmp_path, progress=False, options=TrainOptions(max_steps=2))
    for change in ({"optimizer": "sgd"}, {"schedule": "cosine"}, {"lr": 0.5}, {"weight_decay": 0.1}):
        spec = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, **change))
        [(key, value)] = change.items()
        with pytest.raises(CheckpointError, match=f"was trained with {key}=.*this run asks for {value}"):
            zoo.train(spec, out=tmp_path, progress=False, options=TrainOptions(resume=True))


def test_resume_refuses_another_precision(tmp_path, monkeypatch):
    """It was taken, and the record said the whole run was bf16 when most of it ran in fp32."""
    import zoo.training.options

    zoo.train(MLP, out=tmp_path, progress=False, options=TrainOptions(max_steps=2))
    monkeypatch.setattr(zoo.training.options, "_cpu_has_bf16", lambda: True)  # refused before any bf16 step
    with pytest.raises(CheckpointError, match="was trained with precision=fp32, this run asks for bf16; resume with "
                                              "the same settings"):
        zoo.train(MLP, out=tmp_path, progress=False, options=TrainOptions(resume=True, precision="bf16"))


def test_an_architecture_mismatch_names_the_keys_and_the_first_shape(tmp_path):
    state = PLUGIN.MLP(hidden=16).state_dict()
    ckpt = zoo.Checkpoint(MLP.name, {}, {**state, "extra": torch.zeros(1)}, path=tmp_path)
    with pytest.raises(CheckpointError, match=r"unexpected extra; net.1.weight has shape \[16, 64\] in the "
                                              r"checkpoint, \[32, 64\] in the model \(2 more shapes differ\)"):
        ckpt.module(MLP)
    del state["net.3.bias"]
    with pytest.raises(CheckpointError, match="missing net.3.bias"):
        dataclasses.replace(ckpt, state=state).module(MLP)


# -- datasets, recipes, checkpoints ----------------------------------------------------


def _with_split(fn):
    def load(split):
        x, y = PLUGIN.digits.load(split)
        return fn(x, y) if split == "train" else (x, y)

    return dataclasses.replace(MLP, dataset=dataclasses.replace(MLP.dataset, load=load))


@pytest.mark.parametrize("fn, message", [
    (lambda x, y: (x, y[:-7]), r"dataset 'train': input 'image' has (\d+) rows, the targets (?!\1)"),
    (lambda x, y: ({"image": x["image"][:-7]}, y), r"dataset 'train': input 'image' has \d+ rows, the targets"),
    (lambda x, y: ({"image": x["image"][:, :, :4]}, y),
     r"dataset 'train': input 'image' has shape \[\d+, 1, 4, 8\]; model mlp.digits-test takes \[-1, 1, 8, 8\] "
     r"\(dimension 2 must be 8\)"),
    (lambda x, y: ({"image": x["image"][:, 0]}, y), r"dataset 'train': input 'image' has shape \[\d+, 8, 8\]"),
    (lambda x, y: ({"image": x["image"], "mask": x["image"]}, y), r"dataset 'train': model mlp.digits-test takes "
                                                                   r"inputs \['image'\]; missing \[\], unexpected \['mask'\]"),
    (lambda x, y: (x, {"y": y}), "gives targets as dict; expected one array"),
    (lambda x, y: ([x["image"]], y), r"gives inputs as list; expected a dict of arrays by input name \(image\)"),
    (lambda x, y: ({"image": x["image"][:0]}, y[:0]), "dataset 'train': it holds no examples, and a run is trained and int8 calibrated on it"),
    (lambda x, y: (x,), r"dataset.load\('train'\) returned a tuple of 1; expected a tuple \(inputs by name, targets\)"),
    (lambda x, y: x["missing"], r"dataset.load\('train'\) raised KeyError: 'missing'"),
    (lambda x, y: ({"image": x["image"][:10]}, y[:10]), "has 10 examples and validation holds out 10"),
])
def test_a_training_split_that_cannot_train_is_named(tmp_path, fn, message):
    options = TrainOptions(val_fraction=0.95)
    with pytest.raises(ZooError, match=message):
        zoo.train(_with_split(fn), out=tmp_path, progress=False, options=options)


def test_zoo_check_names_a_split_the_spec_does_not_take():
    from zoo.check import check_model

    report, _ = check_model(_with_split(lambda x, y: ({"image": x["image"][:, 0]}, y)), random_init=True)
    assert [c.name for c in report.checks if not c.passed] == ["dataset train"]
    assert len(report.failures) == 1 and report.failures[0].startswith(
        "mlp.digits-test: dataset 'train': input 'image' has shape [1437, 8, 8]; model mlp.digits-test takes "
        "[-1, 1, 8, 8]")
    report, _ = check_model(MLP, random_init=True)
    assert [c.name for c in report.checks if c.batch is None] == ["dataset train", "dataset test"] and report.passed


def _integer_pixels(value_range, cast):
    """MLP taking the digits' raw pixel counts (0 to 16) as int64, from a split cast by `cast`."""
    def load(split):
        x, y = PLUGIN.digits.load(split)
        return {"image": cast(np.rint(x["image"] * 16))}, y

    image = zoo.TensorSpec("image", "int64", ("batch", 1, 8, 8), value_range=value_range)
    return dataclasses.replace(MLP, inputs=(image,), dataset=dataclasses.replace(MLP.dataset, load=load))


@pytest.mark.parametrize("spec, message", [
    # floats for an integer input were cast (truncated) into the batch, as no runner or server takes them
    (_integer_pixels((0, 16), lambda a: a.astype(np.float32)), "input 'image' has datatype FP32; model "
                                                              "mlp.digits-test takes INT64"),
    # an id outside its declared range failed at step 1 as torch's own IndexError, where it did
    (_integer_pixels((0, 15), lambda a: a.astype(np.int64)), r"input 'image' has value 16 at index \[\d+, 0, \d, "
                                                             r"\d\]; it takes values from 0 to 15"),
])
def test_a_split_the_spec_does_not_take_is_named_before_a_step(tmp_path, spec, message):
    with pytest.raises(SpecError, match=f"mlp.digits-test: dataset 'train': {message}"):
        zoo.train(spec, out=tmp_path, progress=False)
    assert not (tmp_path / "last").exists(), "refused before any step ran"


def test_a_test_split_the_spec_does_not_take_is_named_before_training(tmp_path):
    def load(split):
        x, y = PLUGIN.digits.load(split)
        return ({"image": x["image"][:, :, :, :7]}, y) if split == "test" else (x, y)

    spec = dataclasses.replace(MLP, dataset=dataclasses.replace(MLP.dataset, load=load))
    with pytest.raises(SpecError, match=r"mlp.digits-test: dataset 'test': input 'image' has shape \[\d+, 1, 8, 7\]"):
        zoo.train(spec, out=tmp_path, progress=False)  # before: after every epoch, when the test split was scored
    assert not (tmp_path / "last").exists(), "refused before any step ran"
    with pytest.raises(SpecError, match="dataset 'test': input 'image' has shape"):  # a verify's evaluation too
        evaluate(spec, lambda inputs: {"logits": np.zeros((len(inputs["image"]), 10), np.float32)})


@pytest.mark.parametrize("field, value", [("lr", -1.0), ("epochs", 0), ("batch_size", 0),
                                          ("weight_decay", -0.1), ("val_fraction", 1.0), ("channels_last", 1)])
def test_a_recipe_out_of_range_is_refused_naming_the_field(field, value):
    with pytest.raises(ZooError, match=f"training recipe: {field} must be .*, got {value}"):
        zoo.Recipe(**{"epochs": 1, "batch_size": 8, "lr": 1e-3, field: value})


def test_a_recipe_the_supervised_loop_cannot_follow_is_named_before_training(tmp_path):
    spec = dataclasses.replace(MLP, recipe=dataclasses.replace(MLP.recipe, optimizer="adam", lr=0.0))
    with pytest.raises(SpecError, match="mlp.digits-test: training recipe: optimizer 'adam' is not one of adamw, "
                                        "sgd; lr 0.0 trains nothing"):
        zoo.train(spec, out=tmp_path, progress=False)


@pytest.mark.parametrize("field, value", [("config", "notadict"), ("metrics", [1, 2])])
def test_a_checkpoint_json_field_of_the_wrong_type_is_named(tmp_path, field, value):
    zoo.Checkpoint(MLP.name, {}, PLUGIN.MLP().state_dict()).save(tmp_path)
    meta = json.loads((tmp_path / "checkpoint.json").read_text())
    (tmp_path / "checkpoint.json").write_text(json.dumps({**meta, field: value}))
    with pytest.raises(CheckpointError, match=f"checkpoint.json field {field} must be an object"):
        zoo.load_checkpoint(tmp_path)


def test_a_checkpoint_json_that_is_not_utf8_is_corrupted_not_an_internal_error(tmp_path):
    """It was "internal error: 'utf-8' codec can't decode byte 0xff", in `zoo export
    --checkpoint` and in `zoo train --resume` alike."""
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=2))
    for part in ("model", "last"):
        (tmp_path / part / "checkpoint.json").write_bytes(b"\xff\xfe")
    with pytest.raises(CheckpointError, match=rf"^checkpoint {tmp_path}/model is corrupted: 'utf-8' codec"):
        zoo.load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=rf"^checkpoint {tmp_path}/last is corrupted: 'utf-8' codec"):
        zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(resume=True))


# -- the command line ------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp8"], "unknown precision 'fp8'"), (["--batch-size", "0"], "--batch-size must be"),
    (["--accumulate", "0"], "--accumulate must be"), (["--val-fraction", "1"], "--val-fraction must be"),
    (["--epochs", "-1"], "--epochs must be"), (["--threads", "0"], "--threads must be"),
    (["--nproc", "0"], "--nproc must be"), (["--config", "hid=3"], "unknown config ['hid']"),
    (["--patience", "2", "--val-fraction", "0"], "holds no examples out for validation"),
])
def test_usage_errors_exit_2_with_one_line(cli, monkeypatch, capsys, args, message):
    """In process, through `main`'s own exit-code mapping (refused before anything loads);
    the variants' plugin file is unloaded again, so no other test sees its models."""
    from zoo import registry
    from zoo.cli import main

    plugin = cli.root / "variants.py"
    monkeypatch.chdir(cli.root)
    monkeypatch.setattr(sys, "argv", ["zoo", "--plugin", str(plugin), "train", "mlp.digits-aug", "--out", "usage",
                                      *args])
    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        registry.unload_plugin_file(plugin)
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2, stderr
    assert len(stderr.splitlines()) == 1 and message in stderr.replace("\n", " ")


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "1"], "a global batch of 1 leaves some of the 2 processes without examples"),
    (["--resume"], "no resume point at"),
])
def test_what_every_process_would_refuse_is_refused_once_before_torchrun(cli, args, message):
    done = cli("train", "mlp.digits-aug", "--out", "refused", "--nproc", "2", *args)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and message in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_a_parameter_without_gradient_under_ddp_is_named_once_without_torchruns_traceback(cli):
    done = cli("train", "mlp.digits-unused", "--epochs", "1", "--out", "unused", "--nproc", "2")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: mlp.digits-unused: parameters unused get no gradient under DDP, which needs every trainable "
        "parameter in the loss of each step: use them, freeze them (requires_grad=False), or train with one "
        "process"], done.stderr


def test_a_python_caller_asking_for_progress_gets_it_on_stderr_terminal_or_not(tmp_path, capfd):
    """`zoo train` draws its bar on a terminal only; a Python caller's `progress=True` (a
    notebook, whose output is no terminal either) was overridden by that test too."""
    zoo.train(MLP, out=tmp_path / "shown", progress=True, options=TrainOptions(max_steps=2))
    out, err = capfd.readouterr()
    assert f"train {MLP.name}" in err and f"train {MLP.name}" not in out, (out, err)
    zoo.train(MLP, out=tmp_path / "quiet", progress=False, options=TrainOptions(max_steps=2))
    assert f"train {MLP.name}" not in "".join(capfd.readouterr())


def test_a_missed_target_is_warned_once(cli):
    done = cli("train", "mlp.digits-target", "--out", "target", "--max-steps", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("short of its recipe's target") == 1 and "warning: mlp.digits-target reached test accuracy" in done.stderr
    # stdout is the result, one line however long (it was hard-wrapped at 200 columns); the progress bar is drawn
    # on a terminal's stderr only (it was on stdout, among the results a script reads)
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("checkpoint target/model: train_loss "), done.stdout
    assert "samples/s" not in done.stdout and "train mlp.digits-target" not in done.stderr, done.stderr


# -- the plugin's metric ---------------------------------------------------------------


def _with_metric(compute):
    return dataclasses.replace(MLP, metric=zoo.Metric("accuracy", compute))


@pytest.mark.parametrize("compute, message", [
    (lambda outputs, targets: outputs["probs"].mean(), r"its metric 'accuracy' failed on the validation split: "
                                                       r"KeyError: 'probs'"),
    (lambda outputs, targets: outputs["logits"].argmax(axis=1) == targets, r"its metric 'accuracy' returned "
                                                                             r"ndarray of shape \(\d+,\) on the "
                                                                             r"validation split, not one number"),
    (lambda outputs, targets: float("nan"), "its metric 'accuracy' returned NaN on the validation split"),
])
def test_a_failing_metric_is_named_not_an_internal_error(tmp_path, compute, message):
    with pytest.raises(ZooError, match=f"model mlp.digits-test: {message}"):
        zoo.train(_with_metric(compute), out=tmp_path, epochs=1, progress=False,
                  options=TrainOptions(val_fraction=0.1))


def test_a_failing_metric_on_the_test_split_is_named(tmp_path):
    def compute(outputs, targets):  # no validation split: the test split's metric is its first call
        raise ValueError("shapes differ")

    with pytest.raises(ZooError, match="its metric 'accuracy' failed on the test split: ValueError: shapes differ"):
        zoo.train(_with_metric(compute), out=tmp_path, epochs=1, progress=False, options=TrainOptions(val_fraction=0))


def test_a_validation_fraction_that_holds_out_no_example_is_refused(tmp_path):
    n = len(PLUGIN.digits.load("train")[1])
    with pytest.raises(ZooError, match=rf"val_fraction 0.0001 of the {n} training examples holds out none; "
                                       rf"give at least 0.000[0-9]+ \(--val-fraction\), or 0 for no validation"):
        zoo.train(MLP, out=tmp_path, progress=False, options=TrainOptions(val_fraction=0.0001, patience=2))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_config_without_a_variant_trains_and_loads_and_cannot_change(tmp_path):
    # a plugin's `config` as metadata (no `variant`): the checkpoint records it, loading gives
    # it back unchanged, which is no change; another value is refused naming it
    spec = dataclasses.replace(MLP, config={"hidden": 32}, variant=None)
    assert spec.configure(hidden=32) is spec
    ckpt = zoo.train(spec, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=2))
    assert ckpt.config == {"hidden": 32} and isinstance(ckpt.module(spec), torch.nn.Module)
    with pytest.raises(ZooError, match=r"mlp.digits-test has a fixed configuration .* config \['hidden'\] cannot "
                                       r"change: hidden=64 \(is 32\)"):
        spec.configure(hidden=64)


# -- the run directory -----------------------------------------------------------------


def test_a_new_run_sets_a_finished_run_aside_and_a_failed_one_leaves_no_mix(tmp_path, caplog):
    first = zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=3))
    finished = json.loads((tmp_path / "metrics.json").read_text())
    calls = []

    def broken_at_the_second_validation(outputs, targets):
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("a bug")
        return 0.5

    with caplog.at_level("WARNING", logger="zoo"), pytest.raises(ZooError, match="its metric 'accuracy' failed"):
        zoo.train(_with_metric(broken_at_the_second_validation), out=tmp_path, epochs=2, progress=False,
                  options=TrainOptions(val_fraction=0.1))
    assert "held a finished run of mlp.digits-test: moved to" in caplog.text
    # the failed run's own parts (it wrote a checkpoint), no metrics claiming them; the finished run whole, beside
    assert (tmp_path / "model").is_dir() and not (tmp_path / "metrics.json").exists()
    assert json.loads((tmp_path / "previous" / "metrics.json").read_text()) == finished
    kept = zoo.checkpoint.load_checkpoint(tmp_path / "previous")
    assert all(torch.equal(kept.state[k], first.state[k]) for k in first.state)
    # a run that finishes replaces nothing of the previous one but the copy set aside before it
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=3))
    assert (tmp_path / "metrics.json").is_file()
    assert json.loads((tmp_path / "previous" / "metrics.json").read_text()) == finished  # the failed run had none


def test_a_run_that_ends_before_its_first_checkpoint_puts_the_finished_run_back(tmp_path, caplog):
    """A run refused or failing in its first epoch wrote nothing of its own: the finished run
    it had set aside goes back in place, and the `previous` one before it stays."""
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=3))
    older = json.loads((tmp_path / "metrics.json").read_text())
    second = zoo.train(MLP, out=tmp_path, epochs=1, seed=1, progress=False, options=TrainOptions(max_steps=3))
    finished = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
                and "tensorboard" not in p.parts}

    def broken(outputs, targets):
        raise ValueError("a bug")

    with caplog.at_level("WARNING", logger="zoo"), pytest.raises(ZooError, match="its metric 'accuracy' failed"):
        zoo.train(_with_metric(broken), out=tmp_path, epochs=1, progress=False, options=TrainOptions(val_fraction=0.1))
    assert "the finished run it had set aside is back in place" in caplog.text
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
            and "tensorboard" not in p.parts} == finished
    assert json.loads((tmp_path / "previous" / "metrics.json").read_text()) == older
    kept = zoo.checkpoint.load_checkpoint(tmp_path)
    assert all(torch.equal(kept.state[k], second.state[k]) for k in second.state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last", "metrics.json", "model", "previous", "tensorboard"]


@pytest.mark.parametrize("args, code, message", [
    (["--nproc", "0"], 2, "error: --nproc must be at least 1, got 0"),
    (["--nproc", "2", "--seed", "-1"], 2, "error: seed must be an integer from 0 to 2**64 - 1, got -1"),
])
def test_a_refused_run_leaves_the_finished_run_where_it_was(cli, args, code, message):
    out = cli.root / "refused"
    made = cli("train", "mlp.digits-aug", "--out", str(out), "--max-steps", "2", "--epochs", "1")
    assert made.returncode == 0, made.stderr
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    refused = cli("train", "mlp.digits-aug", "--out", str(out), *args)
    assert refused.returncode == code and refused.stderr.strip().splitlines() == [message], refused.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_run_directory_of_another_model_is_refused_untouched(tmp_path):
    zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=3))
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    other = dataclasses.replace(MLP, name="mlp.other-test")
    with pytest.raises(CheckpointError, match=f"{tmp_path} holds a run of mlp.digits-test: train mlp.other-test "
                                              f"into another --out, or delete that directory first"):
        zoo.train(other, out=tmp_path, epochs=1, progress=False)
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


def _files(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_metrics_json_or_previous_folder_of_the_users_is_refused_never_deleted(tmp_path):
    """A metrics.json was taken for "a finished run of MODEL", and a new run deleted the
    user's own `previous/` to set it aside there."""
    user = tmp_path / "userexp"
    (user / "previous").mkdir(parents=True)
    (user / "metrics.json").write_text('{"acc": 1}')
    (user / "previous" / "notes.txt").write_text("important")
    before = _files(user)
    with pytest.raises(CheckpointError, match=rf"^{user} holds metrics.json but no zoo run"):
        zoo.train(MLP, out=user, epochs=1, progress=False, options=TrainOptions(max_steps=2))
    assert _files(user) == before and sorted(p.name for p in user.iterdir()) == ["metrics.json", "previous"]
    # a finished run of the model, beside a `previous/` of the user's: refused before it is set aside
    run = tmp_path / "run"
    zoo.train(MLP, out=run, epochs=1, progress=False, options=TrainOptions(max_steps=2))
    (run / "previous").mkdir()
    (run / "previous" / "notes.txt").write_text("important")
    before = _files(run)
    with pytest.raises(CheckpointError, match=rf"^{run}/previous is not a run of {MLP.name}.*nothing was moved"):
        zoo.train(MLP, out=run, epochs=1, progress=False, options=TrainOptions(max_steps=2))
    assert _files(run) == before and not (run / ".previous.pending").exists()
    # and if one appears while a run trains, setting the finished run aside refuses rather than delete it
    from zoo.training.run import commit_set_aside

    (run / ".previous.pending").mkdir()
    with pytest.raises(CheckpointError, match=rf"^{run}/previous is not a zoo run"):
        commit_set_aside(run)
    assert (run / "previous" / "notes.txt").read_text() == "important"


def test_a_run_killed_in_its_first_epoch_leaves_the_finished_run_findable(tmp_path):
    """SIGKILL while a new run's first epoch trains leaves the finished run in
    `.previous.pending/` (what `prepare_run_directory` made, which the killed process could
    not put back): it was hidden, `zoo export --checkpoint` pointed to the older run in
    `previous/`, and `--resume` found no resume point."""
    from zoo.training.run import prepare_run_directory

    zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=2))  # older, in previous/
    latest = zoo.train(MLP, out=tmp_path, epochs=1, seed=1, progress=False, options=TrainOptions(max_steps=3))
    prepare_run_directory(MLP.name, tmp_path, resume=False)  # the new run's start; then kill -9
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out.tfevents.killed").write_bytes(b"x")
    assert (tmp_path / ".previous.pending" / "model").is_dir() and not (tmp_path / "model").exists()
    found = zoo.load_checkpoint(tmp_path, expect_model=MLP.name)
    assert found.sha256 == latest.sha256 and found.metrics == latest.metrics
    # --resume puts the finished run back and continues its resume point (cut at step 3 of epoch 1)
    resumed = zoo.train(MLP, out=tmp_path, epochs=1, seed=1, progress=False, options=TrainOptions(resume=True))
    assert resumed.metrics["steps"] == latest.metrics["steps"] + 18 and not (tmp_path / ".previous.pending").exists()
    assert json.loads((tmp_path / "previous" / "metrics.json").read_text())["seed"] == 0


def test_an_empty_out_or_the_filesystem_root_is_refused(tmp_path, monkeypatch):
    """`out=""` trained into the current directory, `--out /` into the filesystem root."""
    from zoo.training.run import prepare_run_directory

    monkeypatch.chdir(tmp_path)
    with pytest.raises(zoo.errors.UsageError, match=r"^out must name a directory, got ''$"):
        zoo.train(MLP, out="", epochs=1, progress=False, options=TrainOptions(max_steps=1))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(zoo.errors.UsageError, match=r"^--out /: the filesystem root cannot be a run directory"):
        prepare_run_directory(MLP.name, Path("/"), resume=False)  # what `zoo train` and `--nproc` call first


def test_a_folder_of_the_users_is_not_turned_into_a_run_directory(tmp_path, cli):
    (tmp_path / "data").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=rf"^{tmp_path} holds data, notes.txt and no zoo run: train into a "
                                              rf"new or empty directory"):
        zoo.train(MLP, out=tmp_path, epochs=1, progress=False, options=TrainOptions(max_steps=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "notes.txt"]
    # `--out ""` is the current directory (click reads it as "."): the fixture's, with its variants.py
    before = sorted(p.name for p in cli.root.iterdir())
    refused = cli("train", "mlp.digits-aug", "--out", "", "--epochs", "1", "--max-steps", "1")
    assert refused.returncode == 1 and "holds" in refused.stderr and "no zoo run" in refused.stderr, refused.stderr
    assert sorted(p.name for p in cli.root.iterdir()) == before
    # what a run leaves in a run directory, and a failed one's event files, are no user's folder
    zoo.train(MLP, out=tmp_path / "run", epochs=1, progress=False, options=TrainOptions(max_steps=1))
    (tmp_path / "run" / "notes.txt").write_text("mine, beside the run")
    zoo.train(MLP, out=tmp_path / "run", epochs=1, progress=False, options=TrainOptions(max_steps=1))
    (tmp_path / "failed" / "tensorboard").mkdir(parents=True)
    zoo.train(MLP, out=tmp_path / "failed", epochs=1, progress=False, options=TrainOptions(max_steps=1))


# ---------------------------------------------------------------- a user's own data and recipe
# ---------------------------------------------------------------- a user's own data and recipe


def _first(rows: int):
    """The digits' train split cut to its first `rows` examples, the test split whole."""
    from zoo_vision import digits

    def load(split):
        x, y = digits.load(split)
        return ({"image": x["image"][:rows]}, y[:rows]) if split == "train" else (x, y)
    return load


class _Normalized(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16),
                                       torch.nn.ReLU(), torch.nn.Linear(16, 10))

    def forward(self, image):
        return self.net(image)


def test_an_empty_test_split_is_refused_before_the_first_step(tmp_path):
    """It trained every epoch, then blamed the user's metric (KeyError: 'logits')."""
    from zoo_vision import digits

    def no_test(split):
        x, y = digits.load(split)
        return ({"image": x["image"][:0]}, y[:0]) if split == "test" else (x, y)

    spec = dataclasses.replace(MLP, dataset=zoo.Dataset("digits without a test split", no_test))
    with pytest.raises(SpecError, match=r"^mlp.digits-test: dataset 'test': it holds no examples, and a run is "
                                        r"scored on it$"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)
    assert not (tmp_path / "model").exists()


def test_a_seed_torch_cannot_take_is_a_usage_error():
    """It was "internal error: Overflow when unpacking long long", from torch.manual_seed."""
    for seed in (2 ** 64, -1):
        with pytest.raises(zoo.errors.UsageError, match=rf"^seed must be an integer from 0 to 2\*\*64 - 1, got {seed}$"):
            zoo.train(MLP, seed=seed, progress=False)
        with pytest.raises(ZooError, match=rf"seed must be an integer from 0 to 2\*\*64 - 1, got {seed}$"):
            zoo.Recipe(epochs=1, batch_size=8, lr=0.1, seed=seed)


@pytest.mark.parametrize("call, message", [
    (lambda: zoo.train(MLP, epochs=2.5), r"^epochs must be a whole number, got 2.5$"),
    (lambda: zoo.train(MLP, epochs="3"), r"^epochs must be a whole number, got '3'$"),
    (lambda: zoo.train(MLP, epochs=True), r"^epochs must be a whole number, got True$"),
    (lambda: TrainOptions(batch_size=2.5), r"^--batch-size must be a whole number, got 2.5$"),
    (lambda: TrainOptions(max_steps=1.5), r"^--max-steps must be a whole number, got 1.5$"),
    (lambda: TrainOptions(accumulate=True), r"^--accumulate must be a whole number, got True$"),
    (lambda: TrainOptions(patience="2"), r"^--patience must be a whole number, got '2'$"),
    (lambda: TrainOptions(threads=1.0), r"^--threads must be a whole number, got 1.0$"),
    (lambda: TrainOptions(val_fraction="0.1"), r"^--val-fraction must be a number, got '0.1'$"),
    (lambda: TrainOptions(clip_grad_norm=True), r"^--clip-grad-norm must be a number, got True$"),
    (lambda: TrainOptions(resume="no"), r"^resume must be True or False, got 'no'$"),
])
def test_a_count_that_is_not_a_whole_number_is_refused_clearly(call, message, tmp_path, monkeypatch):
    """They failed inside torch (OneCycleLR's ValueError, a TypeError slicing the batch) or
    were taken (--max-steps 1.5)."""
    monkeypatch.chdir(tmp_path)  # where a run taking one would write checkpoints/
    with pytest.raises(zoo.errors.UsageError, match=message):
        call()
    assert TrainOptions(batch_size=np.int64(32)).batch_size == 32
    assert type(TrainOptions(threads=np.int32(1)).threads) is int  # made an int: metrics.json records it


def test_the_api_refuses_a_non_default_config_without_out_as_the_command_line_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(zoo.errors.UsageError, match=r"^resnet8.digits with config \{'width': 8\} is not its "
                                                    r"default: pass out=DIR, so checkpoints/resnet8.digits keeps "
                                                    r"the default model$"):
        zoo.train(zoo.get_model("resnet8.digits", width=8), epochs=1, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert zoo.TrainOptions is TrainOptions and "TrainOptions" in zoo.__all__


def test_a_last_batch_of_one_that_batchnorm_cannot_train_on_is_explained(tmp_path):
    spec = dataclasses.replace(MLP, build=_Normalized, dataset=zoo.Dataset("9 digits", _first(9)),
                               recipe=dataclasses.replace(MLP.recipe, batch_size=4, val_fraction=0.0))
    with pytest.raises(SpecError, match=r"a training step \(image\[1, 1, 8, 8\]\) raised ValueError: Expected more "
                                        r"than 1 value per channel .*; that batch holds one example, the remainder of "
                                        r"the training examples after the full batches, and batch statistics "
                                        r"\(BatchNorm\) need two: choose a --batch-size that leaves another remainder$"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)


def test_a_batch_larger_than_the_training_examples_is_said(tmp_path, caplog):
    import logging

    spec = dataclasses.replace(MLP, dataset=zoo.Dataset("9 digits", _first(9)),
                               recipe=dataclasses.replace(MLP.recipe, batch_size=64, val_fraction=0.0))
    with caplog.at_level(logging.WARNING, logger="zoo.train"):
        zoo.train(spec, out=tmp_path, epochs=1, progress=False)
    assert "mlp.digits-test: batch size 64 is more than its 9 training examples: each epoch is one step over all of " \
           "them" in caplog.text


def test_an_interrupted_run_says_what_it_kept_and_how_to_continue(tmp_path):
    from zoo.training.state import interrupted

    zoo.train(MLP, out=tmp_path / "run", epochs=2, progress=False, options=TrainOptions(max_steps=30))
    argv = ["--plugin", "p.py", "train", "mlp.digits-test", "--out", str(tmp_path / "run")]
    assert interrupted(tmp_path / "run", argv) == (  # a finished run here: the one stopped had set it aside
        f"interrupted before the run's first resume point (written after each epoch): nothing of it was kept, and "
        f"the finished run in {tmp_path}/run is as it was")
    (tmp_path / "run" / "metrics.json").unlink()  # as a run stopped after its first epoch leaves it
    assert interrupted(tmp_path / "run", argv) == (
        f"interrupted: the resume point {tmp_path}/run/last holds the run after epoch 1 (the one in progress is "
        f"lost); `zoo --plugin p.py train mlp.digits-test --out {tmp_path}/run --resume` continues it from there")
    assert interrupted(tmp_path / "none", argv) == (
        f"interrupted before the run's first resume point (written after each epoch): nothing in {tmp_path}/none "
        f"to resume")


def test_an_interrupted_resumed_run_says_what_its_resume_point_holds(tmp_path):
    """A run cut by --max-steps writes metrics.json; resumed and then stopped, it was told
    "nothing of it was kept" while `last/` held its resume point after epoch 2."""
    from zoo.training.state import interrupted

    zoo.train(MLP, out=tmp_path, epochs=3, progress=False, options=TrainOptions(max_steps=5))

    def stop(epoch, _):
        if epoch == 2:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        zoo.train(MLP, out=tmp_path, epochs=3, progress=False, options=TrainOptions(resume=True), on_epoch_end=stop)
    assert (tmp_path / "metrics.json").is_file()  # the cut run's
    argv = ["train", MLP.name, "--out", str(tmp_path), "--resume"]
    assert interrupted(tmp_path, argv) == (
        f"interrupted: the resume point {tmp_path}/last holds the run after epoch 2 (the one in progress is "
        f"lost); `zoo train {MLP.name} --out {tmp_path} --resume` continues it from there")


@pytest.mark.parametrize("to", ["group", "torchrun", "zoo"])
def test_ctrl_c_under_torchrun_says_where_the_run_can_continue_and_exits_130(cli, to):
    """Ctrl-C at a terminal signals the whole process group (zoo, torchrun, every training
    process); a launcher's parent that ignores SIGINT (a shell's background job) leaves
    torchrun alone to get it, and torchrun then ends the processes and exits 1 itself. A
    SIGINT to zoo alone left torchrun and its processes training on, unowned, after zoo had
    said the run was interrupted; now it passes it on and waits for them."""
    import signal
    import time

    out = cli.root / f"stopped-{to}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ZOO_DEBUG", None)
    args = ["--plugin", str(cli.root / "variants.py"), "train", "mlp.digits-aug", "--epochs", "500", "--out",
            str(out), "--nproc", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "zoo", *args], cwd=cli.root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while not (out / "last" / "training.json").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1, children  # torchrun
    if to == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(int(children[0]) if to == "torchrun" else proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    with pytest.raises(ProcessLookupError):  # torchrun ended before zoo did
        os.kill(int(children[0]), 0)
    line = " ".join(stderr.split())
    assert line.startswith(f"interrupted: the resume point {out}/last holds the run after epoch "), stderr
    assert line.count("interrupted:") == 1 and "Traceback" not in stderr and "torchrun exited" not in stderr, stderr


def test_ctrl_c_says_where_the_run_can_continue_and_exits_130(cli):
    """A real SIGINT to `zoo train` after its first resume point: it printed nothing (the
    progress bar stopped where it was)."""
    import signal
    import time

    out = cli.root / "stopped"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ZOO_DEBUG", None)
    args = ["--plugin", str(cli.root / "variants.py"), "train", "mlp.digits-aug", "--epochs", "500", "--out",
            str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "zoo", *args], cwd=cli.root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "last" / "training.json").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    line = " ".join(stderr.split())
    assert line.startswith(f"interrupted: the resume point {out}/last holds the run after epoch "), stderr
    assert line.endswith(f"(the one in progress is lost); `zoo {' '.join(args)} --resume` continues it from there")
