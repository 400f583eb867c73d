"""The drug plugin's inputs beyond plain SMILES: explicit and isotopic hydrogens (folded
into their atom, as implicit ones are), mixtures and salts (refused on every path), the
architecture config's ranges, and a molecule CSV whose header repeats a column."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import InputError, UsageError, ZooError
from zoo.train import module_fn

pytest.importorskip("zoo_drug")
from zoo_drug import MAX_ATOMS, datasets, mpnn_spec
from zoo_drug.featurize import featurize, parse

ICOSANE = "C" * 20
#: every hydrogen of icosane (C20H42) written out as deuterium
PERDEUTERO_ICOSANE = "[2H]C([2H])([2H])" + "C([2H])([2H])" * 18 + "C([2H])([2H])[2H]"


@pytest.fixture(scope="module")
def spec():
    return zoo.get_model("mpnn.freesolv").tiny()


@pytest.fixture(scope="module")
def fn(spec):
    torch.manual_seed(0)
    return module_fn(spec.build().eval(), spec)


def _predict(spec, fn, items):
    return [r["prediction"] for r in zoo.predict(spec, fn, items)]


# --- hydrogens written as atoms ----------------------------------------------------

@pytest.mark.parametrize("written, plain", [
    ("[2H]OC", "CO"),  # deuterium
    ("[3H]OC", "CO"),  # tritium
    (PERDEUTERO_ICOSANE, ICOSANE),
    ("[2H]n1cccc1", "c1cc[nH]c1"),  # on an aromatic nitrogen
    ("[2H][N+]([2H])([2H])[2H]", "[NH4+]"),  # on a charged atom
    ("[2H][C@](C)(F)Cl", "C[C@@H](F)Cl"),  # a deuterium on a stereocentre: the protio molecule's label
    ("[2H]/C(C)=C/F", "C/C=C\\F"),  # a deuterium that defines E/Z: the heavy atoms keep it
])
def test_isotopic_hydrogens_fold_into_their_atom(spec, fn, written, plain):
    """The features count hydrogens per heavy atom; a hydrogen that became a graph atom
    of its own was a different molecule to the model ([2H]OC: -3.92, CO: -3.59)."""
    folded, want = parse(written), parse(plain)
    assert folded.GetNumAtoms() == want.GetNumAtoms()
    assert all(a.GetAtomicNum() != 1 for a in folded.GetAtoms())
    assert sorted(map(tuple, featurize(folded)[0])) == sorted(map(tuple, featurize(want)[0]))
    got, expected = _predict(spec, fn, [written, plain])
    assert abs(got - expected) <= 1e-4, (got, expected)


def test_a_deuterated_molecule_within_the_limit_is_taken_and_counted_by_heavy_atoms(spec, fn):
    # C22D46: 22 heavy atoms, refused as "68 heavy atoms"
    perdeutero_c22 = "[2H]C([2H])([2H])" + "C([2H])([2H])" * 20 + "C([2H])([2H])[2H]"
    assert parse(perdeutero_c22).GetNumAtoms() == 22
    assert len(_predict(spec, fn, [perdeutero_c22])) == 1
    too_big = "[2H]C([2H])([2H])" + "C" * MAX_ATOMS  # MAX_ATOMS + 1 heavy atoms and three deuteria
    with pytest.raises(InputError, match=f"has {MAX_ATOMS + 1} heavy atoms; this model takes molecules of at most "
                                         f"{MAX_ATOMS}"):
        zoo.predict(spec, fn, [too_big])


def test_hydrogen_only_molecules_keep_their_atoms():
    # nothing to fold into: H2 stays a graph of two hydrogen atoms, as it always was
    assert parse("[H][H]").GetNumAtoms() == 2 and parse("[2H][2H]").GetNumAtoms() == 2


def test_the_datasets_featurize_as_they_did():
    """Folding touches only SMILES with hydrogen atoms: the shipped datasets have none, so
    every trained checkpoint sees exactly the inputs it was trained on."""
    from rdkit import Chem

    for data in (datasets.freesolv("random"), datasets.solubility()):
        for smiles, (atoms, bonds) in zip(data.smiles, data.graphs):
            plain = featurize(Chem.MolFromSmiles(smiles))
            assert np.array_equal(atoms, plain[0]) and np.array_equal(bonds, plain[1]), smiles


# --- mixtures and salts ------------------------------------------------------------

@pytest.mark.parametrize("items, message", [
    ([b"CCO", b"CC.O"], "SMILES 'CC.O' (item 2) holds 2 unconnected fragments (a mixture or a salt)"),
    ([b"[Na+].[Cl-]"], "SMILES '[Na+].[Cl-]' (item 1) holds 2 unconnected fragments"),
    ([b"CC(=O)[O-].CC(=O)[O-].[Ca+2]"], "(item 1) holds 3 unconnected fragments"),
    ([b"C.[H]"], "(item 1) holds 2 unconnected fragments"),  # a lone hydrogen has no atom to fold into
])
def test_a_mixture_or_salt_is_refused_naming_the_item(spec, fn, items, message):
    """The sum readout pools every atom: two molecules in one SMILES were predicted as one."""
    with pytest.raises(InputError) as info:
        zoo.predict(spec, fn, items)
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(InputError, match="unconnected fragments"):  # the server's path: the spec's preprocess
        spec.preprocess(items)


def test_ring_closures_across_a_dot_are_one_molecule(spec, fn):
    assert _predict(spec, fn, ["C1.C1"]) == _predict(spec, fn, ["CC"])  # ethane, bonded by the ring closure


def test_cli_refuses_a_salt_in_one_line(spec, tmp_path):
    from zoo.checkpoint import Checkpoint

    torch.manual_seed(0)
    state = spec.build().state_dict()
    ckpt = Checkpoint(spec.name, dict(spec.config), state).save(tmp_path / "ckpt")
    cmd = [sys.executable, "-m", "zoo", "predict", "mpnn.freesolv", "--smiles", "CCO", "--smiles", "[Na+].[Cl-]",
           "--checkpoint", str(ckpt)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SMILES '[Na+].[Cl-]' (item 2) holds 2 unconnected fragments" in lines[0]


def test_a_csv_row_with_a_mixture_is_refused_by_its_row_number(tmp_path):
    rows = ["smiles,target", "CCO,-5.0", "CCC,2.0", "CC.O,1.0"] + [f"{'C' * k}O,{k}" for k in range(1, 10)]
    path = tmp_path / "mols.csv"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(ZooError, match="SMILES 'CC.O' \\(mols.csv row 4\\) holds 2 unconnected fragments"):
        datasets.from_csv(path)


# --- architecture config -----------------------------------------------------------

@pytest.mark.parametrize("setting, message", [
    ({"depth": 0}, "config depth must be an integer of at least 1, not 0"),
    ({"hidden": -4}, "config hidden must be an integer of at least 1, not -4"),
    ({"hidden": 0}, "config hidden must be an integer of at least 1, not 0"),  # trained a constant model
    ({"ffn_hidden": 0}, "config ffn_hidden must be an integer of at least 1, not 0"),
    ({"dropout": 1.5}, "config dropout must be a number from 0 up to (not including) 1, not 1.5"),
    ({"dropout": -0.1}, "config dropout must be a number from 0 up to (not including) 1, not -0.1"),
    ({"dropout": 1.0}, "config dropout must be a number from 0 up to (not including) 1, not 1.0"),
    ({"readout": "max"}, "config readout must be one of mean, sum, not 'max'"),
])
def test_an_architecture_out_of_range_is_a_usage_error_naming_the_setting(setting, message):
    for make in (lambda: zoo.get_model("mpnn.freesolv", **setting), lambda: zoo.get_model("mpnn.solubility", **setting),
                 lambda: mpnn_spec("mpnn.mine", lambda: None, prop="p", unit="u", **setting)):
        with pytest.raises(UsageError) as info:
            make()
        assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_refuses_an_architecture_out_of_range_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "zoo", "train", "mpnn.freesolv", "--config", "depth=0", "--epochs", "1",
           "--out", str(tmp_path / "ckpt")]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: mpnn.freesolv: config depth must be an integer of at least 1, not 0"]


# --- a molecule CSV --------------------------------------------------------------------

def test_a_repeated_column_name_is_refused(tmp_path):
    """csv.DictReader keeps the last of two columns of one name: the SMILES column read
    was the third, and the error named a row of the wrong cells."""
    path = tmp_path / "mols.csv"
    path.write_text("smiles,logS,smiles\n" + "".join(f"{'C' * k}O,{k},note\n" for k in range(1, 12)))
    with pytest.raises(ZooError) as info:
        datasets.from_csv(path, target="logS")
    assert str(info.value) == ("mols.csv names column 'smiles' twice in its header (columns 1 and 3): "
                               "give every column its own name")
