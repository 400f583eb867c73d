"""Python's own documentation as a language-modelling corpus: `pydoc_data.topics`.

`pydoc_data.topics.topics` ships with every CPython (it backs `help("for")`): 79 topics,
~470 kB of real English prose and code on Python 3.11, nothing to download. The split is
by topic, so no validation text was seen in training, not even a neighbouring window:
in sorted order every tenth topic, starting at the sixth, is held out (8 topics, ~8 % of
the bytes). The corpus is the running Python's, so numbers are comparable within one
Python minor version.

Training windows overlap by half (stride 64), so each byte is seen at two context
positions per epoch; validation windows do not overlap, so each byte is scored once.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .text import VOCAB

if TYPE_CHECKING:
    import torch

WINDOW = 128  # context length: windows of 128 bytes predict the 128 bytes shifted by one
TRAIN_STRIDE = WINDOW // 2
SEPARATOR = b"\n\n"  # between topics, as paragraphs are separated within one
SPLITS = ("train", "test")


@lru_cache(maxsize=1)
def topic_split() -> dict[str, tuple[str, ...]]:
    """Topic names by split, deterministic and disjoint."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    held_out = names[5::10]
    return {"train": tuple(n for n in names if n not in held_out), "test": tuple(held_out)}


def _check(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"the pydoc corpus has splits {SPLITS}, not {split!r}")


@lru_cache(maxsize=2)
def corpus(split: str) -> np.ndarray:
    """The split's topics as one byte stream (uint8, read-only)."""
    _check(split)
    from pydoc_data.topics import topics

    data = np.frombuffer(SEPARATOR.join(topics[name].encode("utf-8") for name in topic_split()[split]),
                         dtype=np.uint8)
    data.flags.writeable = False
    return data


def load(split: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(inputs, next-byte targets), both int64 (windows, 128)."""
    data = corpus(split)
    stride = TRAIN_STRIDE if split == "train" else WINDOW
    starts = np.arange(0, len(data) - WINDOW, stride)
    index = starts[:, None] + np.arange(WINDOW)
    return {"tokens": data[index].astype(np.int64)}, data[index + 1].astype(np.int64)


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Validation text: `batch` windows of one random length (8 to 128 bytes), as a
    deployed model sees prompts of any length up to its context."""
    data = corpus("test")
    length = int(rng.integers(8, WINDOW + 1))
    starts = rng.integers(0, len(data) - length, size=batch)
    return {"tokens": data[starts[:, None] + np.arange(length)].astype(np.int64)}


def next_byte_loss(outputs, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next byte over every position of every window."""
    from torch.nn.functional import cross_entropy

    return cross_entropy(outputs["logits"].reshape(-1, VOCAB), targets.reshape(-1))


def perplexity(outputs, targets: np.ndarray, chunk: int = 64) -> float:
    """exp(mean negative log-likelihood per byte); uniform guessing scores 256."""
    logits, targets = outputs["logits"], np.asarray(targets)
    total = 0.0
    for i in range(0, len(targets), chunk):
        z = logits[i:i + chunk].astype(np.float64)
        z -= z.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(z).sum(axis=-1))
        picked = np.take_along_axis(z, targets[i:i + chunk, ..., None], axis=-1)[..., 0]
        total += float((log_norm - picked).sum())
    return float(np.exp(total / targets.size))
