"""Molecular graphs from SMILES with RDKit, as padded dense tensors.

A molecule of n heavy atoms (hydrogens stay implicit, counted in each atom's features;
hydrogens a SMILES writes as atoms, deuterium too, are folded into theirs) becomes
    atom_features  (n, ATOM_DIM)      one row per atom
    bond_features  (n, n, BOND_DIM)   symmetric; all zeros where two atoms are not bonded
and a batch pads every molecule to the largest with zero rows, plus `atom_mask` (1 for a
real atom, 0 for padding). The features follow Chemprop's (Yang et al. 2019, "Analyzing
Learned Molecular Representations for Property Prediction", J. Chem. Inf. Model. 59,
3370) with two changes so that a prediction cannot depend on how a SMILES happens to
number its atoms: chirality is the CIP label (R/S), not RDKit's chiral tag (clockwise
relative to the neighbour order), and double-bond stereo is E/Z, not cis/trans relative
to arbitrary reference atoms. Mass is dropped in favour of the element one-hot.

The first BOND_TYPE_SLOTS bond features are the bond-type one-hot (with its "other"
slot), so their sum is the adjacency matrix: the model needs no separate adjacency input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from zoo.errors import InputError

if TYPE_CHECKING:  # RDKit is imported by the first molecule parsed, not by registering the models
    from rdkit import Chem

#: elements seen in drug-like molecules; anything else sets the "other element" bit.
ELEMENTS = ("H", "B", "C", "N", "O", "F", "Na", "Si", "P", "S", "Cl", "K", "Se", "Br", "Sn", "I")
DEGREES = (0, 1, 2, 3, 4, 5)
CHARGES = (-2, -1, 0, 1, 2)
#: RDKit's HybridizationType and BondType members, by name (str() of the member)
HYBRIDIZATIONS = ("S", "SP", "SP2", "SP3", "SP3D", "SP3D2")
HYDROGENS = (0, 1, 2, 3, 4)
RING_SIZES = (3, 4, 5, 6, 7, 8)
CIP = ("R", "S")
BOND_TYPES = ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC")
#: double-bond stereo by CIP label; stereo without one (unspecified, "any") is "other".
BOND_CIP = ("Z", "E")

# each one-hot group has one extra slot for "none of these"
ATOM_DIM = (len(ELEMENTS) + 1 + len(DEGREES) + 1 + len(CHARGES) + 1 + len(HYBRIDIZATIONS) + 1 + len(HYDROGENS) + 1
            + 2 + len(RING_SIZES) + len(CIP))  # 2: aromatic, in a ring
BOND_TYPE_SLOTS = len(BOND_TYPES) + 1
BOND_DIM = BOND_TYPE_SLOTS + 2 + len(BOND_CIP) + 1  # + conjugated, in ring, stereo


def one_hot(value, choices: Sequence) -> list[float]:
    """Chemprop's encoding: one slot per choice plus a last slot for anything else."""
    out = [0.0] * (len(choices) + 1)
    out[choices.index(value) if value in choices else -1] = 1.0
    return out


def atom_features(atom: Chem.Atom) -> list[float]:
    cip = atom.GetProp("_CIPCode") if atom.HasProp("_CIPCode") else None
    ring = [float(atom.IsInRingSize(k)) for k in RING_SIZES]
    return (one_hot(atom.GetSymbol(), ELEMENTS) + one_hot(atom.GetDegree(), DEGREES)
            + one_hot(atom.GetFormalCharge(), CHARGES) + one_hot(str(atom.GetHybridization()), HYBRIDIZATIONS)
            + one_hot(atom.GetTotalNumHs(), HYDROGENS) + [float(atom.GetIsAromatic()), float(atom.IsInRing())]
            + ring + [float(cip == c) for c in CIP])


def bond_features(bond: Chem.Bond) -> list[float]:
    cip = bond.GetProp("_CIPCode") if bond.HasProp("_CIPCode") else None
    return (one_hot(str(bond.GetBondType()), BOND_TYPES)  # exactly one slot set: sums to adjacency
            + [float(bond.GetIsConjugated()), float(bond.IsInRing())]
            + [float(cip == label) for label in BOND_CIP]
            + [float(cip not in BOND_CIP and str(bond.GetStereo()) != "STEREONONE")])


def featurize(mol: Chem.Mol) -> tuple[np.ndarray, np.ndarray]:
    """(atom features (n, ATOM_DIM), bond features (n, n, BOND_DIM)) of one molecule."""
    from rdkit import Chem
    from rdkit.Chem import rdCIPLabeler

    n = mol.GetNumAtoms()
    mol = Chem.Mol(mol)  # a copy: labelling sets properties on the molecule
    rdCIPLabeler.AssignCIPLabels(mol)  # R/S and E/Z by the full CIP rules, independent of atom order
    atoms = np.array([atom_features(a) for a in mol.GetAtoms()], dtype=np.float32)
    bonds = np.zeros((n, n, BOND_DIM), dtype=np.float32)
    for b in mol.GetBonds():
        i, j = b.GetBeginAtomIdx(), b.GetEndAtomIdx()
        bonds[i, j] = bonds[j, i] = bond_features(b)
    return atoms.reshape(n, ATOM_DIM), bonds


def pad(graphs: Sequence[tuple[np.ndarray, np.ndarray]], atoms: int | None = None) -> dict[str, np.ndarray]:
    """Stack molecules into zero-padded arrays of `atoms` atoms (default: the largest)."""
    atoms = max(a.shape[0] for a, _ in graphs) if atoms is None else atoms
    batch = len(graphs)
    x = np.zeros((batch, atoms, ATOM_DIM), dtype=np.float32)
    e = np.zeros((batch, atoms, atoms, BOND_DIM), dtype=np.float32)
    mask = np.zeros((batch, atoms), dtype=np.float32)
    for i, (a, b) in enumerate(graphs):
        n = a.shape[0]
        x[i, :n], e[i, :n, :n], mask[i, :n] = a, b, 1.0
    return {"atom_features": x, "bond_features": e, "atom_mask": mask}


def quoted(smiles: str, limit: int = 40) -> str:
    """A SMILES for a message: quoted, and cut after `limit` characters (a bad item may be
    a whole file pasted in)."""
    return repr(smiles) if len(smiles) <= limit else f"{smiles[:limit]!r}... ({len(smiles):,} characters)"


def parse(smiles: str, where: str = "") -> Chem.Mol:
    """One RDKit molecule (hydrogens folded into their atoms) from SMILES, or InputError
    saying why not: not SMILES, or more than one molecule (a '.' between fragments)."""
    from rdkit import Chem, rdBase

    where = f" ({where})" if where else ""
    if not smiles.strip():
        raise InputError(f"empty SMILES{where}")
    if len(smiles.split()) > 1:  # RDKit reads the text after whitespace as the molecule's name, silently
        raise InputError(f"SMILES {quoted(smiles)}{where} contains whitespace: give one molecule, "
                         f"with no spaces, tabs or line breaks inside it")
    odd = next(((k, c) for k, c in enumerate(smiles, start=1) if not "!" <= c <= "~"), None)
    if odd is not None:  # RDKit stops reading there, silently: 'C\u00e9' was methane, 'CCO\x00' ethanol
        raise InputError(f"SMILES {quoted(smiles)}{where} holds {odd[1]!r} (U+{ord(odd[1]):04X}) at position "
                         f"{odd[0]}: SMILES is printable ASCII, and RDKit would read only the molecule before it")
    with rdBase.BlockLogs():  # RDKit prints parse errors to stderr; the message says it instead
        mol = Chem.MolFromSmiles(smiles)
        if mol is None:
            raw = Chem.MolFromSmiles(smiles, sanitize=False)
            problems = Chem.DetectChemistryProblems(raw) if raw is not None else []
            reason = problems[0].Message() if problems else "not valid SMILES syntax"
            raise InputError(f"invalid SMILES {quoted(smiles)}{where}: {reason}")
        mol = fold_hydrogens(mol)
    fragments = len(Chem.GetMolFrags(mol))
    if fragments > 1:  # the readout pools every atom: 'CC.O' or '[Na+].[Cl-]' would be predicted as one molecule
        raise InputError(f"SMILES {quoted(smiles)}{where} holds {fragments} unconnected fragments (a mixture or a "
                         f"salt): this model predicts a property of one molecule; give one (a salt as its parent "
                         f"molecule, without counter-ions)")
    return mol


def fold_hydrogens(mol: Chem.Mol) -> Chem.Mol:
    """`mol` with every hydrogen that is bonded to a heavy atom counted on that atom, as
    the features count hydrogens, instead of kept as an atom of its own. RDKit's parser
    already folds plain ones ('[H]OC'), but keeps isotopic ones ('[2H]OC': a third atom,
    and a molecule the model never saw) and those that define a double bond's E/Z. The
    features carry no mass, so deuterium and tritium fold like protium, and E/Z moves to
    the heavy atoms. What has no heavy atom to fold into (H2, a lone proton) stays.

    A molecule without hydrogen atoms is returned as it is: ordinary SMILES, and the
    shipped datasets (tests/test_drug_inputs.py), featurize exactly as before."""
    from rdkit import Chem

    if all(atom.GetAtomicNum() != 1 for atom in mol.GetAtoms()):
        return mol
    params = Chem.RemoveHsParameters()
    params.removeIsotopes = True
    params.removeDefiningBondStereo = True
    params.showWarnings = False
    return Chem.RemoveHs(mol, params)


def preprocess_smiles(items: Sequence[bytes], max_atoms: int) -> dict[str, np.ndarray]:
    """SMILES items (bytes) -> padded model inputs; every bad item is an InputError naming it
    by its 1-based position."""
    graphs = []
    for k, item in enumerate(items, start=1):
        try:
            text = bytes(item).decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"item {k} is not UTF-8 text, so not a SMILES string") from None
        mol = parse(text.strip(), f"item {k}")
        if mol.GetNumAtoms() > max_atoms:
            raise InputError(f"SMILES {quoted(text.strip())} (item {k}) has {mol.GetNumAtoms()} heavy atoms; "
                             f"this model takes molecules of at most {max_atoms}")
        graphs.append(featurize(mol))
    if not graphs:
        raise InputError("no SMILES given")
    return pad(graphs)
