"""A plugin with a domain-native input kind of its own ("waveform": a binary recording of
16 little-endian float32 samples), written as a user writes one: the core knows no such
kind. Loaded with `--plugin` (or `registry.load_plugin_file`) by tests/test_raw_kinds.py."""

import numpy as np
import torch

import zoo
from zoo.errors import InputError

SAMPLES = 16


class Loudness(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Linear(1, 1)

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        return self.scale(waveform.pow(2).mean(dim=1, keepdim=True))


def decode(items):
    rows = []
    for k, item in enumerate(items, 1):
        if len(item) != 4 * SAMPLES:
            raise InputError(f"waveform item {k} has {len(item)} bytes, not {4 * SAMPLES} ({SAMPLES} float32 samples)")
        rows.append(np.frombuffer(item, dtype="<f4"))
    return {"waveform": np.stack(rows).astype(np.float32)}


def results(outputs):
    return [{"loudness": round(float(v), 6)} for v in outputs["loudness"][:, 0]]


SPEC = zoo.ModelSpec(
    name="loudness.test", domain="audio", task="regression",
    inputs=(zoo.TensorSpec("waveform", "float32", ("batch", SAMPLES)),),
    outputs=(zoo.TensorSpec("loudness", "float32", ("batch", 1)),),
    build=Loudness,
    sample=lambda batch, rng: {"waveform": rng.standard_normal((batch, SAMPLES)).astype(np.float32)},
    axes={"batch": zoo.AxisRange(1, 4, 8)},
    raw_kind="waveform", raw_binary=True, preprocess=decode, postprocess=results)


@zoo.hookimpl
def zoo_register_models(register):
    register(SPEC)

