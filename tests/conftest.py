"""Markers that say what a test needs, skipping cleanly where it is absent
(as torchvision's conftest does for `needs_cuda`)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging

import pytest
import torch

import zoo
from zoo.errors import ZooError

HAS_CUDA = torch.cuda.is_available()
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs an NVIDIA GPU; torch.cuda.is_available() is False here")
    no_trt = pytest.mark.skip(reason="needs TensorRT (the tensorrt package and a GPU); not installed here")
    for item in items:
        if "needs_cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(no_cuda)
        if "needs_tensorrt" in item.keywords and not (HAS_TENSORRT and HAS_CUDA):
            item.add_marker(no_trt)


@pytest.fixture
def repository(tmp_path):
    """An empty model repository per test."""
    return tmp_path / "exports"


@pytest.fixture
def plugin_warnings():
    """The messages the registry logs about broken plugins during the test, read from the
    `zoo.plugins` logger itself, so that what other code did to logging (levels,
    propagation, disabled loggers) earlier in the session cannot hide them."""
    log = logging.getLogger("zoo.plugins")
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    saved = log.disabled, log.level, logging.root.manager.disable
    log.disabled, log.level = False, logging.WARNING
    logging.disable(logging.NOTSET)
    log.addHandler(handler)
    try:
        yield messages
    finally:
        log.removeHandler(handler)
        log.disabled, log.level = saved[0], saved[1]
        logging.disable(saved[2])


@pytest.fixture
def inline():
    """`zoo.register`, as a notebook uses it, with everything registered taken back out
    after the test."""
    names: list[str] = []

    def register(item) -> None:
        (zoo.register if isinstance(item, zoo.ModelSpec) else zoo.register_backend)(item)
        names.append(item.name)

    yield register
    for name in names:
        with contextlib.suppress(ZooError):  # the test took it out itself
            zoo.unregister(name)
