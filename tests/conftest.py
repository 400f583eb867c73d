"""Markers that say what a test needs, skipping cleanly where it is absent
(as torchvision's conftest does for `needs_cuda`)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import tempfile

import pytest
import torch

import zoo
from zoo.errors import ZooError

HAS_CUDA = torch.cuda.is_available()
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
#: on a GPU machine, what may be missing and its GPU tests still skip: `ZOO_GPU_MISSING=tensorrt`
#: where TensorRT cannot be installed (its libraries come only from NVIDIA's own index)
GPU_MISSING = {m.strip() for m in os.environ.get("ZOO_GPU_MISSING", "").split(",") if m.strip()}


def skip_is_failure(keywords, has_cuda: bool, has_tensorrt: bool, missing: set[str]) -> bool:
    """Whether a skipped test fails instead: a GPU test (`needs_cuda`, `needs_tensorrt`) on a
    machine with CUDA, so a GPU run where a GPU library failed to install or load is not
    reported as passed (issue 17, finding 5). A `needs_tensorrt` test without TensorRT
    still skips where `ZOO_GPU_MISSING` names tensorrt."""
    if not has_cuda or not ({"needs_cuda", "needs_tensorrt"} & set(keywords)):
        return False
    return not ("needs_tensorrt" in keywords and not has_tensorrt and "tensorrt" in missing)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and \
            skip_is_failure(item.keywords, HAS_CUDA, HAS_TENSORRT, GPU_MISSING):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"a GPU test skipped on a machine with CUDA: {reason}"


#: the test files that take longest, slowest first (seconds from the first test's start to
#: the last's end, one full run on the 2-core machine: 235, 231, 207, 165, 164, 134, 103,
#: 97, 83, 73, 68, 63), run first: with `--dist loadfile --no-loadscope-reorder` (Makefile)
#: pytest-xdist hands out files in collection order, and one of these last would leave the
#: other workers idle for minutes at the end of the suite (its own reordering, by number of
#: tests, put test_bench_ray.py's two tests and 97 s last)
SLOWEST_FIRST = ("test_backend_torch_compiled.py", "test_quantization.py", "test_models.py", "test_backend_openvino.py",
                 "test_user_plugins.py", "test_triton_server.py", "test_bench.py", "test_bench_ray.py", "test_cli.py",
                 "test_onnxruntime_gpu_paths.py", "test_optimize.py", "test_tensorrt_int8.py")


def pytest_configure(config):
    """Under pytest-xdist, one torch thread per worker. One ONNX cache (`zoo_onnx.cache`)
    for the run: shared by the xdist workers, which inherit the controller's environment,
    and by the zoo processes tests start; used by no other run, so no result depends on
    what an earlier run left. Many files export the same tiny models to ONNX (every ONNX
    backend, every precision); each is translated once."""
    if hasattr(config, "workerinput"):
        return
    if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        # one worker per core (Makefile): each worker's torch computes on one thread, as do
        # the processes its tests start, instead of every worker's OpenMP threads spinning
        # while another's hold the core (test_models.py and test_quantization.py on 2 workers,
        # 2 cores: 157 s against 187 and 196 s)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "ZOO_ONNX_CACHE_DIR" in os.environ:
        return
    config.zoo_onnx_cache = tempfile.mkdtemp(prefix="zoo-onnx-cache-")
    os.environ["ZOO_ONNX_CACHE_DIR"] = config.zoo_onnx_cache


def pytest_unconfigure(config):
    made = getattr(config, "zoo_onnx_cache", None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop("ZOO_ONNX_CACHE_DIR", None)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
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
