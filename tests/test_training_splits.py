"""Validation selects on the dataset's own validation split where it has one.

FreeSolv comes with MoleculeNet's 80/10/10 split (513 / 64 / 65 molecules). Training
loaded only "train" and "test" and held 10% of the train split out for validation:
`zoo train mpnn.freesolv` trained on 462 molecules, selected on 51 of the train split,
and the 64 validation molecules were never used. A dataset gives its own validation split
as `load("valid")`; one that has none (an error for the name, or the examples of another
split) is held out of the train split as before.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

import zoo
from zoo.train import module_fn
from zoo.training import TrainOptions
from zoo.training.loop import own_validation



from train_plugin import SPEC as MLP  # noqa: E402 - tests/ is on the path, as for test_training_faults


def _digits_with(valid):
    """mlp.digits-test on the digits' train and test splits, and `valid(split)` for any other name."""
    from zoo_vision import digits

    def load(split):
        return digits.load(split) if split in ("train", "test") else valid(split)

    return dataclasses.replace(MLP, dataset=zoo.Dataset("digits", load))


def test_freesolv_trains_on_its_train_split_and_selects_on_its_valid_split(tmp_path):
    pytest.importorskip("zoo_drug")
    spec = zoo.get_model("mpnn.freesolv").tiny()
    ckpt = zoo.train(spec, out=tmp_path / "run", epochs=1, progress=False)
    m = ckpt.metrics
    assert (m["train_examples"], m["val_examples"], m["val_split"]) == (513, 64, "valid")
    x, y = spec.dataset.load("valid")
    prediction = module_fn(ckpt.module(spec), spec)(x)["prediction"]
    rmse = float(np.sqrt(np.mean((prediction.astype(np.float64) - y) ** 2)))
    assert m["val_rmse_history"] == [pytest.approx(rmse, rel=1e-5)]


def test_a_validation_split_of_its_own_is_used_whatever_the_fraction(tmp_path, caplog):
    from zoo_vision import digits

    def valid(split):
        x, y = digits.load("train")
        return {"image": x["image"][:100]}, y[:100]

    spec = _digits_with(valid)
    train_rows = len(digits.load("train")[1])
    with caplog.at_level(logging.WARNING, logger="zoo.train"):
        ckpt = zoo.train(spec, out=tmp_path / "a", epochs=1, progress=False, options=TrainOptions(val_fraction=0.2))
    assert (ckpt.metrics["train_examples"], ckpt.metrics["val_examples"]) == (train_rows, 100)
    assert "mlp.digits-test: validation is the dataset's own 'valid' split (100 examples); --val-fraction 0.2 is " \
           "not used" in caplog.text
    # val_fraction 0 is no validation at all: the last epoch is the model
    ckpt = zoo.train(spec, out=tmp_path / "b", epochs=1, progress=False, options=TrainOptions(val_fraction=0))
    assert (ckpt.metrics["train_examples"], ckpt.metrics["val_examples"], ckpt.metrics["val_split"]) == (
        train_rows, 0, None)


@pytest.mark.parametrize("valid", [
    pytest.param(lambda split: (_ for _ in ()).throw(ValueError(f"no split {split!r}")), id="an error"),
    pytest.param(lambda split: __import__("zoo_vision").digits.load("test"), id="the test split"),
    pytest.param(lambda split: __import__("zoo_vision").digits.load("train"), id="the train split"),
])
def test_a_dataset_without_one_holds_validation_out_of_the_train_split(valid):
    """A load that answers "valid" with the test split (`x_test if split != "train"`, as a
    user's plugin may write it) has no validation split: selecting on it would choose the
    model on the test split."""
    assert own_validation(_digits_with(valid)) is None


def test_the_held_out_fraction_is_said_as_the_train_split(tmp_path):
    spec = _digits_with(lambda split: (_ for _ in ()).throw(ValueError(split)))
    ckpt = zoo.train(spec, out=tmp_path / "run", epochs=1, progress=False)
    rows = ckpt.metrics["train_examples"] + ckpt.metrics["val_examples"]
    assert ckpt.metrics["val_examples"] == round(0.1 * rows) and ckpt.metrics["val_split"] == "train"
