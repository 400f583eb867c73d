"""A user's plugin: a bag-of-tokens classifier over sequences of any length from 2 to 64,
padded and masked, token ids bounded by the vocabulary."""

import numpy as np
import torch

import zoo

VOCAB = 100


class Bag(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, tokens, mask):
        weights = mask.unsqueeze(-1).float()
        pooled = (self.embed(tokens) * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def sample(batch, rng):
    length = 12
    lengths = rng.integers(2, length + 1, batch)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    return {"tokens": rng.integers(0, VOCAB, (batch, length)) * mask, "mask": mask}


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="bag.varlen", domain="nlp", task="text-classification",
        inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, VOCAB - 1)),
                zoo.TensorSpec("mask", "int64", ("batch", "seq"), value_range=(0, 1))),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3)),),
        build=Bag, sample=sample,
        axes={"batch": zoo.AxisRange(1, 4, 16), "seq": zoo.AxisRange(2, 12, 64)}))
