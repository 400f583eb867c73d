"""A model whose outputs may hold nothing: it keeps the positions of its input above a
threshold, with a score for each, as a detector keeps its boxes above a confidence. The
`kept` axis only outputs have starts at 0: an input with nothing above the threshold is
answered with empty outputs, not refused."""

import numpy as np
import torch

import zoo


class Peaks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = torch.nn.Linear(8, 8)
        self.register_buffer("threshold", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        keep = x > self.threshold
        return {"kept": torch.nonzero(keep), "scores": torch.sigmoid(self.score(x))[keep]}


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.random((batch, 8)).astype(np.float32)}


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="peaks.threshold", domain="signal", task="selection", build=Peaks, sample=sample,
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 8)),),
        outputs=(zoo.TensorSpec("kept", "int64", ("kept", 2)), zoo.TensorSpec("scores", "float32", ("kept",))),
        axes={"batch": zoo.AxisRange(1, 4, 16), "kept": zoo.AxisRange(0, 16, 128)}))
