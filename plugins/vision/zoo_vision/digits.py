"""scikit-learn's digits: 1797 real 8x8 handwritten digits that ship with the package.

A fixed, stratified 80/20 split (random_state 0) so every run and every machine trains
and tests on the same images. Pixels are scaled from 0..16 to 0..1.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

NUM_CLASSES = 10
#: the class names, index i being digit i (the logits' labels)
CLASSES = tuple(str(i) for i in range(NUM_CLASSES))
SIZE = 8


@lru_cache(maxsize=None)
def _splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    # (n, 1, 8, 8) row-major: `[:, None]` would leave the channel axis a zero stride, which
    # torch reads as channels-last and convolves so
    images = (data.images / 16.0).astype(np.float32).reshape(-1, 1, SIZE, SIZE)
    labels = data.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(images, labels, test_size=0.2, stratify=labels, random_state=0)
    return {"train": (xtr, ytr), "test": (xte, yte)}


def load(split: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    if split not in ("train", "test"):
        raise ValueError(f"digits has splits train and test, not {split!r}")
    x, y = _splits()[split]
    return {"image": x}, y


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Real test images, drawn with replacement: what a deployed model would see."""
    x, _ = _splits()["test"]
    return {"image": x[rng.integers(0, len(x), size=batch)]}


def augment(batch: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random shifts of up to one pixel: the cheapest augmentation that helps on 8x8 digits."""
    import torch
    image = batch["image"]
    padded = torch.nn.functional.pad(image, (1, 1, 1, 1))
    dx, dy = torch.randint(0, 3, (2,), generator=gen).tolist()
    return {"image": padded[..., dy:dy + SIZE, dx:dx + SIZE]}
