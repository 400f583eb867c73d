"""zoo backend plugin: OpenVINO on CPU (fp32, bf16, and int8 by NNCF), added purely as a
plugin: nothing in the core knows it exists.

Importing this package imports neither openvino nor nncf (the hookspec asks this of
every backend): without them the backend is still listed, and `probe` says why it
cannot run.
"""

from __future__ import annotations

from typing import Callable

import zoo

from .backend import OpenVinoBackend

__all__ = ["OpenVinoBackend", "zoo_register_backends"]


@zoo.hookimpl
def zoo_register_backends(register: Callable[[zoo.Backend], None]) -> None:
    register(OpenVinoBackend())
