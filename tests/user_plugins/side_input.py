"""A user's plugin: a calibrated classifier whose temperature is a side input, one value
per request applying to all its rows (no batch axis)."""

import numpy as np
import torch

import zoo


class Calibrated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 3)

    def forward(self, x, temperature):
        return torch.softmax(self.linear(x) / temperature, dim=-1)


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="calibrated.side", domain="tabular", task="classification",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 5)),
                zoo.TensorSpec("temperature", "float32", (1,), value_range=(0.05, 100.0))),
        outputs=(zoo.TensorSpec("probabilities", "float32", ("batch", 3)),),
        build=Calibrated,
        sample=lambda batch, rng: {"x": rng.standard_normal((batch, 5)).astype(np.float32),
                                   "temperature": np.array([rng.uniform(0.5, 2.0)], np.float32)},
        axes={"batch": zoo.AxisRange(1, 4, 16)}))
