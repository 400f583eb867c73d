"""Input shapes checked against the exported signature, and strides made row-major,
before a program runs.

An eager `torch.export` module checks its inputs itself, but an AOTInductor package
does not (unless built with `AOTI_RUNTIME_CHECK_INPUTS=1`): a batch beyond the exported
maximum, or strides other than the example's, are undefined behaviour there. So every
torch runner checks shapes before it runs, with the core's check
(`zoo.inputs.check_shapes`): the runner `Artifact.load` returns has checked them already,
with the types and values, but one loaded with `Backend.load` (export's parity check)
has not. `row_major` gives compiled code the strides it was built for.
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo import ModelSpec, inputs


def check_shapes(tensors: Mapping[str, torch.Tensor], spec: ModelSpec) -> dict[str, int]:
    """The size of every dynamic axis in `tensors`; `InputError` when a rank or a fixed
    size differs from the spec, an axis is outside its range, or inputs that share an
    axis disagree on its size."""
    return inputs.check_shapes(tensors, spec, spec.name)


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
