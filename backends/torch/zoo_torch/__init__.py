"""zoo backend plugin: PyTorch on CPU and CUDA, as three backends over one `torch.export` program.

- `torch`: the program run eagerly;
- `torch-compile`: a program file of the same format, compiled by `torch.compile`
  (Inductor, frozen weights) when it is loaded; on CUDA with one CUDA graph per batch
  size, and for convolutional models at fp16/bf16 an fp32 program run under autocast;
- `torch-aoti`: the program compiled ahead of time by AOTInductor into a native package.
"""

import zoo

from .aoti import TorchAotiBackend
from .backend import TorchBackend
from .compiled import TorchCompileBackend

__all__ = ["TorchAotiBackend", "TorchBackend", "TorchCompileBackend", "zoo_register_backends"]


@zoo.hookimpl
def zoo_register_backends(register):
    register(TorchBackend())
    register(TorchCompileBackend())
    register(TorchAotiBackend())
