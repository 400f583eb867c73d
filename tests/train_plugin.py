"""A test-only zoo plugin for the training-engine tests (`zoo --plugin tests/train_plugin.py`).

`mlp.digits-test`: a two-layer MLP on scikit-learn's digits with no dropout, BatchNorm or
augmentation, so the only differences between one process and N DDP processes are float
summation order: the weights after DDP training must match one process's closely.
"""

from __future__ import annotations

import numpy as np
import torch

import zoo
from zoo_vision import digits


class MLP(torch.nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 10))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.net(image)


def _accuracy(outputs, targets) -> float:
    return float(np.mean(outputs["logits"].argmax(-1) == targets))


SPEC = zoo.ModelSpec(
    name="mlp.digits-test", domain="vision", task="image-classification",
    inputs=(zoo.TensorSpec("image", "float32", ("batch", 1, 8, 8)),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", 10)),),
    build=MLP, sample=digits.sample,
    dataset=zoo.Dataset("scikit-learn digits", digits.load),
    loss=lambda outputs, target: torch.nn.functional.cross_entropy(outputs["logits"], target),
    metric=zoo.Metric("accuracy", _accuracy),
    recipe=zoo.Recipe(epochs=3, batch_size=64, lr=1e-2, schedule="onecycle"),
)


@zoo.hookimpl
def zoo_register_models(register):
    register(SPEC)
