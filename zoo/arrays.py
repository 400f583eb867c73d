"""Numpy arrays from whatever a runner returns, without importing torch.

The serving path (`zoo serve`, the runners of non-PyTorch artifacts, Triton's Python
backend) uses these, so that serving an ONNX Runtime or OpenVINO artifact never imports
PyTorch: a torch tensor can only reach them from a process that has imported torch
already, so they look for its type there and nowhere else.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import numpy as np


def as_numpy(value: Any) -> np.ndarray:
    """A numpy array from a numpy array or a torch tensor (on any device, bf16 as fp32)."""
    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach()
        return (value.float() if value.is_floating_point() else value).cpu().numpy()
    return np.asarray(value)


def to_numpy(outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: as_numpy(v) for k, v in outputs.items()}
