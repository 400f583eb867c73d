"""zoo: a plugin-based model zoo with hardware backends.

    >>> import zoo
    >>> zoo.list_models("resnet*")
    ['resnet18', 'resnet50', 'resnet8.digits']
    >>> zoo.train("resnet8.digits")                           # checkpoints/resnet8.digits
    >>> art = zoo.export("resnet8.digits", backend="onnxruntime")
    >>> runner = zoo.load(art.path)                           # dict of arrays in and out
    >>> zoo.benchmark("resnet8.digits", backends=["torch", "onnxruntime"])

`import zoo` imports no deep-learning library: the names that need PyTorch (`train`,
`export`, `verify`, `benchmark`, `predict`, `Checkpoint`...) are imported on first use,
so a plugin's registration, `zoo --help`, `zoo backends` and a runner that does not use
PyTorch do not pay for it.
"""

import importlib
import sys
import types

from .version import __version__  # noqa: F401

from .arguments import check_threads  # noqa: E402
from .artifact import Artifact  # noqa: E402
from .backend import Availability, Backend, Runner  # noqa: E402
from .errors import InputError, ZooError  # noqa: E402
from .hookspecs import hookimpl  # noqa: E402
from .inline import register, register_backend, unregister  # noqa: E402
from .registry import LazyBackend, LazySpec, get_backend, get_model, list_models  # noqa: E402
from .spec import AxisRange, Dataset, Metric, ModelSpec, Recipe, TensorSpec, Tolerance  # noqa: E402

#: public name -> (submodule, its name there): imported on first use
_LAZY = {
    "benchmark": ("bench", "benchmark"), "Checkpoint": ("checkpoint", "Checkpoint"),
    "load_checkpoint": ("checkpoint", "load_checkpoint"), "export": ("export", "export"),
    "generate": ("predict", "generate"), "predict": ("predict", "predict"), "predictor": ("predict", "predictor"),
    "train": ("train", "train"), "TrainOptions": ("training.options", "TrainOptions"),
}


def load(path, threads: int | None = None, device: str | None = None) -> Runner:
    """Open and validate an artifact directory and return its runner.

    `threads`: intra-op threads, a positive int (None: the runtime's default). ONNX Runtime
    and OpenVINO give each runner its own; torch has one count per process, so for a torch
    artifact it sets that (`torch.set_num_threads`) for every torch model in the process."""
    return Artifact.open(path).load(threads=check_threads(threads), device=device)


def verify(path, threads: int | None = None) -> dict:
    """`zoo verify`: re-check an artifact's files, parity and task metric from scratch;
    the report (`zoo.verify.verify_artifact`)."""
    from .verify import verify_artifact

    return verify_artifact(path, threads)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """`zoo.export`, `zoo.train`, `zoo.verify` and `zoo.predict` are functions named
    like the submodules that define them. Importing such a submodule binds it as the
    package's attribute of that name (the import system's rule), which would hide the
    function; the package keeps its functions there instead (the submodules stay in
    `sys.modules`, where `from zoo.export import ...` finds them)."""

    def __setattr__(self, name: str, value: object) -> None:
        if (name in _LAZY or name == "verify") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Artifact", "Availability", "InputError", "AxisRange", "Backend", "Checkpoint", "Dataset", "LazyBackend",
    "LazySpec", "Metric", "ModelSpec", "Recipe", "Runner", "TensorSpec", "Tolerance", "TrainOptions", "ZooError",
    "benchmark", "export", "get_backend",
    "get_model", "hookimpl", "generate", "list_models", "load", "load_checkpoint", "predict", "predictor", "register",
    "register_backend", "train", "unregister", "verify",
]
