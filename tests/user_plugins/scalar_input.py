"""A user's plugin with a 0-d input (one number, no axes): the zoo refuses it when the
plugin registers, naming the input and the shapes to use instead."""

import numpy as np
import torch

import zoo


class Shift(torch.nn.Module):
    def forward(self, x, offset):
        return x + offset


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="shift.scalar", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 3)), zoo.TensorSpec("offset", "float32", ())),
        outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
        build=Shift,
        sample=lambda batch, rng: {"x": rng.standard_normal((batch, 3)).astype(np.float32),
                                   "offset": np.float32(0.5)}))
