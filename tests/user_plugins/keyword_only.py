"""A user's plugin: a forward whose inputs are keyword-only parameters."""

import numpy as np
import torch

import zoo


class Gate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.value = torch.nn.Linear(4, 2)
        self.gate = torch.nn.Linear(3, 2)

    def forward(self, *, context, signal):
        return self.value(signal) * torch.sigmoid(self.gate(context))


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="gate.kwonly", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("signal", "float32", ("batch", 4)), zoo.TensorSpec("context", "float32", ("batch", 3))),
        outputs=(zoo.TensorSpec("y", "float32", ("batch", 2)),),
        build=Gate,
        sample=lambda batch, rng: {"signal": rng.standard_normal((batch, 4)).astype(np.float32),
                                   "context": rng.standard_normal((batch, 3)).astype(np.float32)},
        axes={"batch": zoo.AxisRange(1, 4, 16)}))
