"""The invariances a molecular property model must keep, checked on every export.

A known way chemistry models fail in production: the prediction for a molecule changes
with the molecules it is batched with (padding leaking into messages, pooling or a
normalization that spans the batch) or with the order in which its SMILES happens to
list the atoms. The D-MPNN here is invariant to both by construction; this check makes
every artifact (and `zoo verify`) prove it on real molecules, through the artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from zoo.errors import ToleranceError
from zoo.spec import Tolerance

from .datasets import PropertyData
from .featurize import featurize, pad, parse

if TYPE_CHECKING:
    from rdkit import Chem

Fn = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]


def permuted(mol: Chem.Mol, rng: np.random.Generator) -> Chem.Mol:
    """The same molecule with its atoms renumbered by a random permutation."""
    from rdkit import Chem

    order = [int(i) for i in rng.permutation(mol.GetNumAtoms())]
    return Chem.RenumberAtoms(mol, order)


def predictions(fn: Fn, graphs, atoms: int | None = None) -> np.ndarray:
    return np.asarray(fn(pad(graphs, atoms))["prediction"], dtype=np.float64)


def invariance_report(fn: Fn, data: PropertyData, max_atoms: int, molecules: int = 6,
                      seed: int = 0) -> dict[str, Any]:
    """Largest change of a prediction when a molecule is batched with others and padded to
    `max_atoms` instead of run alone, and when its atoms are renumbered."""
    rng = np.random.default_rng(seed)
    test = data.parts["test"]
    mols = [parse(data.smiles[i]) for i in rng.choice(test, size=min(molecules, len(test)), replace=False)]
    graphs = [featurize(m) for m in mols]
    alone = np.array([predictions(fn, [g])[0] for g in graphs])
    batched = predictions(fn, graphs, atoms=max_atoms)
    renumbered = np.array([predictions(fn, [featurize(permuted(m, rng))])[0] for m in mols])
    return {"alone": alone, "batched_vs_alone": float(np.abs(batched - alone).max()),
            "renumbered_vs_original": float(np.abs(renumbered - alone).max()),
            "graphs": graphs}


def invariance_check(data: Callable[[], PropertyData], max_atoms: int,
                     tolerance: Tolerance) -> Callable[[Fn, Fn], dict[str, Any]]:
    """A `ModelSpec.domain_check`: the runner's predictions must not depend on batch
    company, padding or atom order. The bound is the fp32 tolerance plus twice the
    runner's own disagreement with PyTorch on the unpadded molecules, so an fp16 artifact
    is held to its own precision, while a padding leak still shows."""

    def check(reference: Fn, runner: Fn, precision: str = "fp32") -> dict[str, Any]:
        got = invariance_report(runner, data(), max_atoms)
        ref_alone = np.array([predictions(reference, [g])[0] for g in got["graphs"]])
        noise = float(np.abs(got["alone"] - ref_alone).max())
        bound = tolerance.atol + tolerance.rtol * float(np.abs(ref_alone).max()) + 2 * noise
        report = {"invariance_molecules": len(got["graphs"]), "batched_vs_alone": got["batched_vs_alone"],
                  "renumbered_vs_original": got["renumbered_vs_original"], "invariance_bound": bound}
        for key, what in (("batched_vs_alone", f"batched with other molecules and padded to {max_atoms} atoms"),
                          ("renumbered_vs_original", "with its atoms renumbered")):
            if not got[key] <= bound:
                raise ToleranceError(f"a molecule's prediction changes by {got[key]:.3g} when {what}; "
                                     f"allowed {bound:.3g}: padding or atom order leaks into the model")
        return report

    return check
