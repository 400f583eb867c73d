"""zoo backends on ONNX Runtime: `onnxruntime` (CPU and CUDA execution providers) and
`onnxruntime-trt` (TensorRT execution provider), both over one ONNX export
(`zoo_onnx.export`, shared with the other backends that consume an ONNX graph).

Importing this package does not import onnxruntime: the backends are listed, with the
reason they cannot run, on machines without it.
"""

from __future__ import annotations

from typing import Callable

import zoo

from .backend import OnnxRuntimeBackend
from .tensorrt_ep import OnnxRuntimeTensorRTBackend

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeTensorRTBackend", "zoo_register_backends"]


@zoo.hookimpl
def zoo_register_backends(register: Callable[[zoo.Backend], None]) -> None:
    register(OnnxRuntimeBackend())
    register(OnnxRuntimeTensorRTBackend())
