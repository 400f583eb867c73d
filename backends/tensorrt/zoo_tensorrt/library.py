"""The one place that imports `tensorrt`, lazily, and the one TensorRT logger.

The plugin must install, register and list itself on machines without TensorRT (its
wheels come from NVIDIA's package index, which many machines cannot reach), so nothing
imports `tensorrt` at module import time: callers ask `import_tensorrt()` when they
actually build or run an engine.

TensorRT keeps a single process-wide logger: "The logger used to create an instance of
IBuilder, IRuntime or IRefitter is used for all objects created through that interface"
(TensorRT Python API, `ILogger`), and a second, different logger only draws a warning.
So the builder and every runtime share the one `logger()` made here.
"""

from __future__ import annotations

import collections
import importlib
import logging
from types import ModuleType
from typing import Any

from zoo.errors import BackendUnavailableError

#: said by `probe` and by every refusal to build or load without the library.
NOT_INSTALLED = ("tensorrt is not installed (it installs from NVIDIA's package index: "
                 "pip install 'zoo-tensorrt[gpu]')")

log = logging.getLogger("zoo.tensorrt")
_logger: Any = None


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module, or BackendUnavailableError saying how to install it."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError as exc:
        # A wheel installed without its shared libraries also lands here (libnvinfer
        # missing): say what failed rather than "not installed".
        if getattr(exc, "name", None) == "tensorrt":
            raise BackendUnavailableError(NOT_INSTALLED) from exc
        raise BackendUnavailableError(f"tensorrt is installed but fails to import: {exc}") from exc
    except OSError as exc:
        raise BackendUnavailableError(f"tensorrt is installed but fails to import: {exc}") from exc


def version() -> str | None:
    """The installed TensorRT version (`trt.__version__`), or None when it cannot import."""
    try:
        return str(import_tensorrt().__version__)
    except BackendUnavailableError:
        return None


def logger() -> Any:
    """The process-wide TensorRT logger: forwards to `logging` and keeps recent errors."""
    global _logger
    if _logger is None:
        trt = import_tensorrt()

        class Logger(trt.ILogger):  # the documented way to implement a custom logger
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                # Build and parse failures are reported through the logger only, so the
                # last errors are kept to put into the exception the user sees.
                self.errors: collections.deque[str] = collections.deque(maxlen=20)

            def log(self, severity: Any, msg: str) -> None:
                if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                    self.errors.append(msg)
                    log.error("%s", msg)
                elif severity == trt.ILogger.Severity.WARNING:
                    log.warning("%s", msg)
                else:
                    log.debug("%s", msg)

        _logger = Logger()
    return _logger


def recent_errors() -> list[str]:
    """Errors TensorRT logged since the last `clear_errors()`."""
    return list(_logger.errors) if _logger is not None else []


def clear_errors() -> None:
    if _logger is not None:
        _logger.errors.clear()
