"""An example third-party zoo plugin: one model, `mlp.example`.

A two-layer MLP over 4 features giving 3 logits. It has no dataset and no training
recipe, so `zoo export mlp.example` exports it at its seeded random initialization.
The distribution's pyproject.toml publishes this module in the entry-point group `zoo`;
installing it is all it takes for `zoo list` to show the model.
"""

from __future__ import annotations

import numpy as np
import torch

import zoo
from zoo import ModelSpec, TensorSpec

FEATURES = 4
HIDDEN = 16
CLASSES = 3


def build() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Standard-normal features from the caller's seeded generator."""
    return {"features": rng.standard_normal((batch, FEATURES)).astype(np.float32)}


@zoo.hookimpl
def zoo_register_models(register):
    register(ModelSpec(
        name="mlp.example",
        domain="tabular",
        task="classification",
        description=f"Two-layer MLP ({FEATURES} -> {HIDDEN} -> {CLASSES}), random init; an example plugin",
        inputs=(TensorSpec("features", "float32", ("batch", FEATURES)),),
        outputs=(TensorSpec("logits", "float32", ("batch", CLASSES)),),
        build=build,
        sample=sample,
    ))
