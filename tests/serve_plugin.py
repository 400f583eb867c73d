"""A test-only zoo plugin for the server tests, loaded with `zoo --plugin tests/serve_plugin.py`.

- `ragged.test`: a tiny text model with a ragged "seq" axis and a mask, as real
  sequence models have: masked mean pooling, so zero padding changes nothing; it has
  a per-token output ("hidden", batch x seq x width) that the server must cut back to
  each request's own length, and domain-native text input (one token per UTF-8 byte).
  Its token ids are deliberately left without a `value_range`, so a request with an id
  past the vocabulary reaches ONNX Runtime, whose Gather refuses it: a real engine error
  caused by one request's values.
- `scaled.test`: a side input without the batch axis: y = x * scale, x (batch, 4) and
  scale (1,), one scale per request.
- `faulty`: the ONNX Runtime backend with faults injected into its runner: an input
  whose first element is FAIL breaks the runner for good, as a lost device would (every
  later call raises); SLOW makes it take SLOW_SECONDS. After a fault, loading the
  artifact again takes RELOAD_SECONDS (a device reset), so the test can watch readiness
  while the server recovers.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from zoo_onnxruntime import OnnxRuntimeBackend

import zoo
from zoo.errors import InputError

VOCAB, WIDTH, CLASSES = 256, 4, 3
FAIL, SLOW = -1234.0, 4321.0
SLOW_SECONDS, RELOAD_SECONDS = 1.5, 1.0
_faulted = False


class MaskedPooler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embed(tokens) * mask.unsqueeze(-1).float()
        pooled = hidden.sum(dim=1) / mask.float().sum(dim=1, keepdim=True).clamp(min=1.0)
        return self.head(pooled), hidden


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    seq = int(rng.integers(3, 13))
    lengths = rng.integers(2, seq + 1, batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return {"tokens": rng.integers(1, VOCAB, (batch, seq)).astype(np.int64) * mask, "mask": mask}


def preprocess(items: Sequence[bytes]) -> dict[str, np.ndarray]:
    """One token per UTF-8 byte, zero-padded to the longest item, with a mask."""
    for k, item in enumerate(items, 1):
        try:
            bytes(item).decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"text item {k} is not valid UTF-8") from None
        if not 2 <= len(item) <= 16:
            raise InputError(f"text item {k} has {len(item)} bytes; this model takes 2 to 16")
    seq = max(len(x) for x in items)
    tokens = np.zeros((len(items), seq), np.int64)
    for k, item in enumerate(items):
        tokens[k, :len(item)] = np.frombuffer(bytes(item), np.uint8)
    return {"tokens": tokens, "mask": (tokens > 0).astype(np.int64)}


def postprocess(outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    return [{"label": int(row.argmax()), "logits": row.tolist()} for row in np.asarray(outputs["logits"])]


RAGGED = zoo.ModelSpec(
    name="ragged.test", domain="nlp", task="text-classification",
    inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq")), zoo.TensorSpec("mask", "int64", ("batch", "seq"))),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", CLASSES)),
             zoo.TensorSpec("hidden", "float32", ("batch", "seq", WIDTH))),
    build=MaskedPooler, sample=sample, axes={"batch": zoo.AxisRange(1, 4, 16), "seq": zoo.AxisRange(2, 8, 16)},
    raw_kind="text", preprocess=preprocess, postprocess=postprocess)


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale


SCALED = zoo.ModelSpec(
    name="scaled.test", domain="tabular", task="regression",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)), zoo.TensorSpec("scale", "float32", (1,))),
    outputs=(zoo.TensorSpec("y", "float32", ("batch", 4)),),
    build=Scale, axes={"batch": zoo.AxisRange(1, 4, 16)},
    sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32),
                               "scale": rng.uniform(0.5, 2.0, (1,)).astype(np.float32)})


class FaultyRunner:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        global _faulted
        first = float(np.asarray(next(iter(inputs.values()))).reshape(-1)[0])
        if first == FAIL:
            _faulted = self.broken = True
        if getattr(self, "broken", False):
            raise RuntimeError("simulated device fault in /opt/driver/libfake.so")
        if first == SLOW:
            time.sleep(SLOW_SECONDS)
        return self.inner(inputs)


class FaultyBackend(OnnxRuntimeBackend):
    name = "faulty"
    description = "ONNX Runtime with injected faults (server tests only)"
    precisions = {"cpu": ("fp32",)}

    def load(self, path, spec, precision, device, threads=None, info=None):
        if _faulted:
            time.sleep(RELOAD_SECONDS)
        return FaultyRunner(super().load(path, spec, precision, device, threads, info))


@zoo.hookimpl
def zoo_register_models(register):
    register(RAGGED)
    register(SCALED)


@zoo.hookimpl
def zoo_register_backends(register):
    register(FaultyBackend())
