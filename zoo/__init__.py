"""zoo: a plugin-based model zoo with hardware backends.

    >>> import zoo
    >>> zoo.list_models("resnet*")
    >>> ckpt = zoo.train("resnet8.digits")
    >>> art = zoo.export("resnet8.digits", backend="onnxruntime")
    >>> runner = zoo.load(art.path)
"""

from .backend import Availability, Backend, Runner
from .errors import ZooError
from .hookspecs import hookimpl
from .registry import get_backend, get_model, list_models
from .spec import AxisRange, Dataset, Metric, ModelSpec, Recipe, TensorSpec, Tolerance

__all__ = [
    "Availability", "AxisRange", "Backend", "Dataset", "Metric", "ModelSpec", "Recipe", "Runner",
    "TensorSpec", "Tolerance", "ZooError", "get_backend", "get_model", "hookimpl", "list_models",
]
