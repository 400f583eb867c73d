"""The environment captured with every report: what a reader needs to compare numbers."""

from __future__ import annotations

import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

from ..backend import library_versions
from ..errors import PluginError
from ..version import __version__

log = logging.getLogger(__name__)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ORT_NUM_THREADS",
                    "CUDA_VISIBLE_DEVICES")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def gpu_facts() -> dict[str, Any]:
    """GPU name, count, compute capability and the driver: through torch, and the driver
    version through NVML (nvidia-ml-py), which reports it without a CUDA context."""
    import torch

    if not torch.cuda.is_available():
        return {}
    facts: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                             "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                             "cuda": torch.version.cuda}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVML missing or refusing: the rest of the facts still stand
        facts["driver"] = f"unknown ({type(exc).__name__})"
    return facts


def environment(threads: int | None = None) -> dict[str, Any]:
    """Machine, library versions, thread settings and the exact command."""
    import numpy
    import torch

    from ..registry import backends

    env: dict[str, Any] = {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version(), "numpy": numpy.__version__, "zoo": __version__,
                           "torch": torch.__version__, "threads": threads or torch.get_num_threads(),
                           "interop_threads": torch.get_num_interop_threads(),
                           "thread_env": {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ},
                           "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    libraries: set[str] = set()
    for be in backends().values():  # every backend plugin's, a third party's included
        try:
            versions = library_versions(be)
        except PluginError as exc:  # another backend's broken plugin: said, and the run's facts go on
            log.warning("%s; its libraries are left out of the report", exc)
            continue
        env.update(versions)
        libraries.update(versions)
    env["libraries"] = sorted(libraries - {"torch"})
    env.update(gpu_facts())
    return env
