"""`zoo check` runs the forward several times (a second run for determinism, the ends of
each `value_range`): each run gets its own copy of the inputs, a forward that writes into
its inputs is told so by name, and what a run at a range's end returns is held to the spec
as the samples' outputs are.
"""

from __future__ import annotations

import numpy as np
import torch

import zoo
from zoo.check import check


def features(batch, rng):
    return {"features": rng.standard_normal((batch, 4)).astype(np.float32)}


def spec(name: str, build, **fields) -> zoo.ModelSpec:
    fields = {"inputs": (zoo.TensorSpec("features", "float32", ("batch", 4)),),
              "outputs": (zoo.TensorSpec("logits", "float32", ("batch", 2)),), "sample": features, **fields}
    return zoo.ModelSpec(name=name, domain="tabular", task="classification", build=build, **fields)


def failures(s: zoo.ModelSpec) -> list[str]:
    torch.manual_seed(0)
    return check(s, s.build().eval()).failures


class Centred(torch.nn.Module):
    """Normalises its input in place, as preprocessing code often does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.register_buffer("mean", torch.full((4,), 5.0))

    def forward(self, features):
        features -= self.mean
        features *= 2.0
        return self.fc(features)


def test_a_forward_that_writes_into_its_input_is_told_so_not_blamed_on_dropout():
    """It failed as "differs by up to 10.2 between two runs ... (dropout called with
    training=True, random sampling)": the second run read the inputs the first had changed."""
    lines = failures(spec("inplace.input", Centred))
    assert len(lines) == 1, lines
    assert lines[0].startswith("inplace.input: at batch 8: the forward modifies its input 'features' in place"), lines
    assert "dropout" not in lines[0] and "features = features - " in lines[0]


class Average(torch.nn.Module):
    """Keeps a moving average of its inputs in a buffer, updated by every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.register_buffer("ema", torch.zeros(()))

    def forward(self, features):
        self.ema.mul_(0.9).add_(features.mean())
        return self.fc(features) + self.ema


def test_a_buffer_updated_in_forward_is_not_also_blamed_on_dropout():
    lines = failures(spec("ema.buffer", Average))
    assert lines == ["ema.buffer: forward changes buffers ema: an exported model must not keep state between calls "
                     "(compute such values without assigning them to the module, or fix them at build)"], lines


class TopK(torch.nn.Module):
    """The `k` best scores, `k` an input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, features, k):
        return torch.topk(self.fc(features), int(k[0].item())).values


def _top_k(value_range):
    def sample(batch, rng):
        return {**features(batch, rng), "k": np.array([3], np.int64)}

    return spec("top.k", TopK, sample=sample,
                inputs=(zoo.TensorSpec("features", "float32", ("batch", 4)),
                        zoo.TensorSpec("k", "int64", (1,), value_range=value_range)),
                outputs=(zoo.TensorSpec("top", "float32", ("batch", "top")),),
                axes={"batch": zoo.AxisRange(1, 2, 4), "top": zoo.AxisRange(1, 3, 5)})


def test_outputs_at_the_ends_of_a_value_range_are_held_to_the_spec():
    """k = 10 ran at the range's end without an exception and passed: its output has 10
    columns, past the 5 the spec declares (and every runner and the server were told)."""
    assert failures(_top_k((1, 10))) == [
        "top.k: at batch 1 with k = 10 (the high end of its value_range): output 'top' has top = 10, past the "
        "largest size the spec's axes give it (5): widen its range, or cap the output in forward"]
    assert failures(_top_k((1, 5))) == []
