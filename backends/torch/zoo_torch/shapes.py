"""Input shapes checked against the exported signature, and strides made row-major,
before a program runs.

An eager `torch.export` module checks its inputs itself, but an AOTInductor package
does not (unless built with `AOTI_RUNTIME_CHECK_INPUTS=1`): a batch beyond the exported
maximum, or strides other than the example's, are undefined behaviour there. One check
in Python, for every torch runner, turns each shape mistake into an `InputError` that
names the input and the range; `row_major` gives compiled code the strides it was built for.
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo import ModelSpec
from zoo.errors import InputError


def _signature(shape: tuple[int | str, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_shapes(tensors: Mapping[str, torch.Tensor], spec: ModelSpec) -> dict[str, int]:
    """The size of every dynamic axis in `tensors`; raise `InputError` when a rank or a
    fixed size differs from the spec, an axis is outside its range, or inputs that share
    an axis disagree on its size."""
    seen: dict[str, tuple[int, str]] = {}  # axis -> (size, the input it was first seen in)
    for t in spec.inputs:
        shape = tuple(tensors[t.name].shape)
        if len(shape) != len(t.shape):
            raise InputError(f"input {t.name} of {spec.name} has shape {list(shape)}, expected {_signature(t.shape)}")
        for got, want in zip(shape, t.shape):
            if isinstance(want, int):
                if got != want:
                    raise InputError(f"input {t.name} of {spec.name} has shape {list(shape)}, "
                                     f"expected {_signature(t.shape)}")
                continue
            r = spec.axes[want]
            if not r.min <= got <= r.max:
                raise InputError(f"input {t.name} of {spec.name}: axis {want} is {got}, outside the exported "
                                 f"range {r.min}..{r.max}")
            size, where = seen.setdefault(want, (got, t.name))
            if size != got:
                raise InputError(f"input {t.name} of {spec.name}: axis {want} is {got}, but {size} in {where}")
    return {axis: size for axis, (size, _) in seen.items()}


def row_major(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` with row-major strides, copied only when its strides differ.

    Compiled code indexes an input by the strides of the example it was compiled for.
    `contiguous()` is not enough: it keeps any stride on an axis of size 1, and a
    (batch, 1, 8, 8) slice of a numpy array has stride 1 there, which made a bf16
    AOTInductor package of resnet8.digits return wrong logits (torch 2.13, CPU) while
    parity on freshly made samples passed.
    """
    expected, step = [], 1
    for size in reversed(tensor.shape):
        expected.append(step)
        step *= size
    if tensor.stride() == tuple(reversed(expected)):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)
