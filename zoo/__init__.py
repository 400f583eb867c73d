"""zoo: a plugin-based model zoo with hardware backends.

    >>> import zoo
    >>> zoo.list_models("resnet*")
    ['resnet18', 'resnet50', 'resnet8.digits']
    >>> zoo.train("resnet8.digits")                           # checkpoints/resnet8.digits
    >>> art = zoo.export("resnet8.digits", backend="onnxruntime")
    >>> runner = zoo.load(art.path)                           # dict of arrays in and out
    >>> zoo.benchmark("resnet8.digits", backends=["torch", "onnxruntime"])
"""

from .version import __version__  # noqa: F401

from .artifact import Artifact  # noqa: E402
from .backend import Availability, Backend, Runner  # noqa: E402
from .bench import benchmark  # noqa: E402
from .checkpoint import Checkpoint, load_checkpoint  # noqa: E402
from .errors import InputError, ZooError  # noqa: E402
from .export import export  # noqa: E402
from .predict import generate, predict, predictor  # noqa: E402
from .hookspecs import hookimpl  # noqa: E402
from .inline import register, register_backend, unregister  # noqa: E402
from .registry import LazySpec, get_backend, get_model, list_models  # noqa: E402
from .spec import AxisRange, Dataset, Metric, ModelSpec, Recipe, TensorSpec, Tolerance  # noqa: E402
from .train import train  # noqa: E402
from .verify import verify_artifact as verify  # noqa: E402


def load(path, threads: int | None = None, device: str | None = None) -> Runner:
    """Open and validate an artifact directory and return its runner."""
    return Artifact.open(path).load(threads=threads, device=device)


__all__ = [
    "Artifact", "Availability", "InputError", "AxisRange", "Backend", "Checkpoint", "Dataset", "LazySpec", "Metric",
    "ModelSpec", "Recipe", "Runner", "TensorSpec", "Tolerance", "ZooError", "benchmark", "export", "get_backend",
    "get_model", "hookimpl", "generate", "list_models", "load", "load_checkpoint", "predict", "predictor", "register",
    "register_backend", "train", "unregister", "verify",
]
