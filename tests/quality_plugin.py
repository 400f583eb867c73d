"""A test-only plugin for tests/test_quality.py (`tools/quality.py --plugin`): a small MLP
on real digits under two recipes, one whose target every seed meets and one whose target
no run can meet."""

from __future__ import annotations

import numpy as np
import torch

import zoo
from zoo_vision import digits


def _accuracy(outputs, targets) -> float:
    return float(np.mean(outputs["logits"].argmax(-1) == targets))


def mlp(name: str, recipe: zoo.Recipe) -> zoo.ModelSpec:
    return zoo.ModelSpec(
        name=name, domain="vision", task="image-classification",
        inputs=(zoo.TensorSpec("image", "float32", ("batch", 1, 8, 8)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 10)),),
        build=lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                          torch.nn.Linear(32, 10)),
        sample=digits.sample, dataset=zoo.Dataset("scikit-learn digits", digits.load),
        loss=lambda outputs, target: torch.nn.functional.cross_entropy(outputs["logits"], target),
        metric=zoo.Metric("accuracy", _accuracy), recipe=recipe)


MET = mlp("mlp.quality-met", zoo.Recipe(epochs=2, batch_size=64, lr=1e-2, target=0.5, quality_seeds=2))
MISSED = mlp("mlp.quality-missed", zoo.Recipe(epochs=1, batch_size=64, lr=1e-2, target=1.01, quality_seeds=1))


@zoo.hookimpl
def zoo_register_models(register):
    register(MET)
    register(MISSED)
