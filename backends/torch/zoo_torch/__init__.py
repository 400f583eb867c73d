"""zoo backend plugin: PyTorch on CPU and CUDA, as three backends over one `torch.export` program.

- `torch`: the program run eagerly;
- `torch-compile`: a program file of the same format, compiled by `torch.compile`
  (Inductor, frozen weights) when it is loaded; on CUDA with one CUDA graph per batch
  size, and for convolutional models at fp16/bf16 an fp32 program run under autocast;
- `torch-aoti`: the program compiled ahead of time by AOTInductor into a native package.
"""

import importlib

import zoo

__all__ = ["TorchAotiBackend", "TorchBackend", "TorchCompileBackend", "zoo_register_backends"]
#: each backend's class and the module defining it: modules that import torch at their top,
#: imported when the backend is first looked up (or a name below is first read), so that a
#: process serving an ONNX Runtime or OpenVINO artifact imports no PyTorch
CLASSES = {"torch": ("backend", "TorchBackend"), "torch-compile": ("compiled", "TorchCompileBackend"),
           "torch-aoti": ("aoti", "TorchAotiBackend")}
#: what each of them declares, so that a `--device` name is checked without importing torch
DEVICES = ("cpu", "cuda")


def __getattr__(name: str):
    for module, cls in CLASSES.values():
        if cls == name:
            return getattr(importlib.import_module(f".{module}", __name__), cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make(name: str) -> zoo.Backend:
    return __getattr__(CLASSES[name][1])()


@zoo.hookimpl
def zoo_register_backends(register):
    for name in CLASSES:
        register(zoo.LazyBackend(name, lambda name=name: _make(name), devices=DEVICES))
