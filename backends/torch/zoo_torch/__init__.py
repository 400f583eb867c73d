"""zoo backend plugin: PyTorch on CPU and CUDA, as three backends over one `torch.export` program.

- `torch`: the program run eagerly;
- `torch-compile`: the same program file, compiled by `torch.compile` (Inductor, frozen
  weights) when it is loaded;
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
