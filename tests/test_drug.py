"""The drug plugin: featurization, splits, invariances (PyTorch and an ONNX Runtime
artifact), SMILES errors through the API and the CLI, and a short training run."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

import zoo
from zoo.checkpoint import Checkpoint
from zoo.errors import InputError, ZooError
from zoo.registry import backends
from zoo.train import module_fn

pytest.importorskip("zoo_drug")
from zoo_drug import MAX_ATOMS, datasets
from zoo_drug.checks import invariance_report, permuted
from zoo_drug.featurize import ATOM_DIM, BOND_DIM, BOND_TYPE_SLOTS, featurize, parse

FP32 = 1e-4  # a molecule's prediction may move only by float32 rounding


@pytest.fixture(scope="module")
def spec():
    return zoo.get_model("mpnn.freesolv").tiny()


@pytest.fixture(scope="module")
def module(spec):
    torch.manual_seed(0)
    return spec.build().eval()


def test_featurization_of_known_molecules():
    atoms, bonds = featurize(parse("CCO"))
    assert atoms.shape == (3, ATOM_DIM) and bonds.shape == (3, 3, BOND_DIM)
    adjacency = bonds[..., :BOND_TYPE_SLOTS].sum(-1)
    assert adjacency.tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 0]]

    atoms, bonds = featurize(parse("c1ccccc1O"))  # phenol: 7 heavy atoms, hydrogens implicit
    assert atoms.shape[0] == 7 and np.array_equal(bonds, bonds.transpose(1, 0, 2))
    assert bonds[..., :BOND_TYPE_SLOTS].sum() == 2 * 7  # six aromatic ring bonds and C-O, both directions
    assert featurize(parse("C"))[1].sum() == 0  # methane: one atom, no bonds

    # stereo is read from the SMILES and does not depend on atom numbering
    e, z = featurize(parse("C/C=C/C"))[1], featurize(parse("C/C=C\\C"))[1]
    assert not np.array_equal(e, z)
    r, s = featurize(parse("C[C@@H](N)C(=O)O"))[0], featurize(parse("C[C@H](N)C(=O)O"))[0]
    assert not np.array_equal(r, s)


def test_splits_are_deterministic_and_disjoint():
    data = datasets.freesolv("random")
    assert {k: len(v) for k, v in data.parts.items()} == {"train": 513, "valid": 64, "test": 65}
    again = datasets.random_split(len(data.smiles))
    assert all(np.array_equal(again[k], data.parts[k]) for k in data.parts)
    together = np.concatenate(list(data.parts.values()))
    assert sorted(together.tolist()) == list(range(len(data.smiles)))
    # the solubility set keeps the split it ships with
    solubility = datasets.solubility()
    assert {k: len(v) for k, v in solubility.parts.items()} == {"train": 1025, "test": 257}
    assert solubility.max_atoms <= MAX_ATOMS


def test_scaffold_split_keeps_each_scaffold_in_one_part():
    smiles = datasets.freesolv("random").smiles
    parts = datasets.scaffold_split(smiles)
    assert all(np.array_equal(parts[k], datasets.scaffold_split(smiles)[k]) for k in parts)
    scaffolds = {k: {datasets.scaffold(smiles[i]) for i in v} for k, v in parts.items()}
    assert not scaffolds["train"] & scaffolds["valid"] and not scaffolds["train"] & scaffolds["test"]
    assert not scaffolds["valid"] & scaffolds["test"]
    assert sum(map(len, parts.values())) == len(smiles) and len(parts["test"]) >= 0.09 * len(smiles)


def _check_invariances(fn):
    report = invariance_report(fn, datasets.freesolv("random"), MAX_ATOMS, molecules=8)
    assert report["batched_vs_alone"] < FP32, report["batched_vs_alone"]
    assert report["renumbered_vs_original"] < FP32, report["renumbered_vs_original"]
    assert np.ptp(report["alone"]) > 1e-3  # the molecules do get different predictions


def test_prediction_ignores_batch_padding_and_atom_order_in_pytorch(module, spec):
    _check_invariances(module_fn(module, spec))


@pytest.fixture(scope="module")
def onnx_artifact(spec, tmp_path_factory):
    if not backends()["onnxruntime"].probe("cpu").ok:
        pytest.skip("onnxruntime cannot run here")
    return zoo.export(spec, "onnxruntime", repository=tmp_path_factory.mktemp("exports"), random_init=True)


def test_prediction_ignores_batch_padding_and_atom_order_in_onnxruntime(onnx_artifact):
    _check_invariances(zoo.load(onnx_artifact.path))
    # and the export checked it too, through the artifact
    domain = onnx_artifact.manifest["domain"]
    assert domain["batched_vs_alone"] < FP32 and domain["renumbered_vs_original"] < FP32


def test_renumbering_really_changes_the_inputs():
    mol = parse("CC(=O)Nc1ccc(O)cc1")
    renumbered = permuted(mol, np.random.default_rng(3))
    assert not np.array_equal(featurize(mol)[0], featurize(renumbered)[0])


@pytest.mark.parametrize("items, message", [
    ([b"CCO", b"C1CC"], "invalid SMILES 'C1CC' (item 2): not valid SMILES syntax"),
    ([b"C(C)(C)(C)(C)C"], "invalid SMILES 'C(C)(C)(C)(C)C' (item 1): Explicit valence"),
    ([b"c1cccc1"], "Can't kekulize"),
    ([b"CCO", b""], "empty SMILES (item 2)"),
    ([b"\xff\xfe"], "item 1 is not UTF-8 text"),
    ([b"C" * (MAX_ATOMS + 1)], f"has {MAX_ATOMS + 1} heavy atoms; this model takes molecules of at most {MAX_ATOMS}"),
])
def test_bad_smiles_are_input_errors_naming_the_item(spec, module, items, message):
    with pytest.raises(InputError) as info:
        zoo.predict(spec, module_fn(module, spec), items)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_bad_smiles_past_the_first_batch_is_named_by_its_input_number(spec, module):
    """`zoo predict` runs items in batches of the spec's largest batch; the plugin numbers
    items within its batch, and the message says which input that is."""
    step = spec.axes["batch"].max
    items = [b"C"] * (step + 1) + [b"C1CC("]  # the bad one is input step + 2
    with pytest.raises(InputError) as info:
        zoo.predict(spec, module_fn(module, spec), items)
    assert str(info.value) == (f"invalid SMILES 'C1CC(' (item 2): not valid SMILES syntax (among inputs {step + 1} "
                               f"to {step + 2} of {step + 2}: item 1 is input {step + 1})")


def test_split_is_a_config_value():
    assert zoo.get_model("mpnn.freesolv", split="scaffold").config["split"] == "scaffold"
    with pytest.raises(ZooError, match="split must be one of random, scaffold"):
        zoo.get_model("mpnn.freesolv", split="time")


@pytest.fixture(scope="module")
def checkpoint(spec, module, tmp_path_factory):
    state = {k: v.clone() for k, v in module.state_dict().items()}
    return Checkpoint(spec.name, dict(spec.config), state).save(tmp_path_factory.mktemp("ckpt") / spec.name)


def test_predict_from_smiles(checkpoint):
    spec, fn, _ = zoo.predictor("mpnn.freesolv", checkpoint=checkpoint)
    results = zoo.predict(spec, fn, ["CCO", "c1ccccc1O"])
    assert [set(r) for r in results] == [{"prediction", "unit", "property"}] * 2
    assert results[0]["unit"] == "kcal/mol" and results[0]["prediction"] != results[1]["prediction"]


def test_cli_prints_one_line_for_an_invalid_smiles(checkpoint):
    cmd = [sys.executable, "-m", "zoo", "predict", "mpnn.freesolv", "--smiles", "CCO", "--smiles", "C1CC",
           "--checkpoint", str(checkpoint)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: invalid SMILES 'C1CC' (item 2): not valid SMILES syntax"]


def test_short_training_beats_predicting_the_mean(spec, tmp_path):
    # the tiny model learns fastest at a higher rate than the full recipe's
    quick = replace(spec, recipe=replace(spec.recipe, lr=1e-2))
    ckpt = zoo.train(quick, out=tmp_path / "ckpt", epochs=20, progress=False)
    _, y_train = spec.dataset.load("train")
    _, y_test = spec.dataset.load("test")
    mean_rmse = float(np.sqrt(np.mean((y_test - y_train.mean()) ** 2)))
    assert ckpt.metrics["test_rmse"] < 0.6 * mean_rmse, (ckpt.metrics["test_rmse"], mean_rmse)
