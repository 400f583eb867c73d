"""A model without a batch axis: a fixed 4x4 matrix in, its 4x3 transform out (Triton's
`max_batch_size: 0`). Whatever batch size its sample is asked for, it takes one shape."""

import numpy as np
import torch

import zoo


class Transform(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, m):
        return self.lin(m)


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="matrix.fixed", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("m", "float32", (4, 4)),),
        outputs=(zoo.TensorSpec("out", "float32", (4, 3)),),
        build=Transform, sample=lambda batch, rng: {"m": rng.standard_normal((4, 4)).astype(np.float32)}))
