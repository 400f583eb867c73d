"""zoo-tensorrt: the `tensorrt` backend, native TensorRT engines built from the ONNX export.

Registering imports neither tensorrt nor onnx (the hookspec asks this of every backend):
on a machine without TensorRT or a GPU the backend is still listed, and its `probe`
says why it cannot run.
"""

from typing import Callable

import zoo

from .backend import TensorRTBackend

__all__ = ["TensorRTBackend"]


@zoo.hookimpl
def zoo_register_backends(register: Callable[[zoo.Backend], None]) -> None:
    register(TensorRTBackend())
