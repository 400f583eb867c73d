"""A user's plugin: one model with outputs of four dtypes (float32, float16, int64, bool),
returned as a dict in another order than the spec lists them."""

import numpy as np
import torch

import zoo


class Scorer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)

    def forward(self, features):
        scores = self.linear(features)
        return {"above": scores > 0, "best": scores.argmax(dim=1), "half": scores.half(), "scores": scores}


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="scorer.mixed", domain="tabular", task="scoring",
        inputs=(zoo.TensorSpec("features", "float32", ("batch", 6)),),
        outputs=(zoo.TensorSpec("scores", "float32", ("batch", 4)), zoo.TensorSpec("half", "float16", ("batch", 4)),
                 zoo.TensorSpec("best", "int64", ("batch",)), zoo.TensorSpec("above", "bool", ("batch", 4))),
        build=Scorer, sample=lambda batch, rng: {"features": rng.standard_normal((batch, 6)).astype(np.float32)},
        axes={"batch": zoo.AxisRange(1, 4, 16)},
        # float16 rounds the scores to 11 bits: 1e-3 relative is the bound its output holds
        tolerances={"fp32": zoo.Tolerance(1e-4, 1e-3)}))
