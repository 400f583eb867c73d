"""zoo backend plugin: PyTorch (`torch.export` programs run eagerly) on CPU and CUDA."""

import zoo

from .backend import TorchBackend


@zoo.hookimpl
def zoo_register_backends(register):
    register(TorchBackend())
