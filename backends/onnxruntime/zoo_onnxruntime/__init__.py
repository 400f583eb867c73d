"""zoo backends on ONNX Runtime: `onnxruntime` (CPU and CUDA execution providers) and
`onnxruntime-trt` (TensorRT execution provider), both over one ONNX export.

Importing this package does not import onnxruntime: the backends are listed, with the
reason they cannot run, on machines without it. `export_onnx` (from `.export`, imported
on first use because it pulls in onnx) is public so the TensorRT plugin builds its
engines from the same ONNX file.
"""

from __future__ import annotations

from typing import Any, Callable

import zoo

from .backend import OnnxRuntimeBackend
from .tensorrt_ep import OnnxRuntimeTensorRTBackend

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeTensorRTBackend", "export_onnx", "zoo_register_backends"]


@zoo.hookimpl
def zoo_register_backends(register: Callable[[zoo.Backend], None]) -> None:
    register(OnnxRuntimeBackend())
    register(OnnxRuntimeTensorRTBackend())


def __getattr__(name: str) -> Any:
    if name == "export_onnx":
        from .export import export_onnx

        return export_onnx
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
