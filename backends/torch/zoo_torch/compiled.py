"""The `torch-compile` backend: the `torch` backend's program, compiled by Inductor when loaded.

The artifact is the very `torch.export` program the `torch` backend writes (same file,
same no-pickle check); only loading differs. `load` wraps the program's module in
`torch.compile` (Inductor) with freezing, which inlines the weights as constants so that
Inductor folds them and, on CPU, pre-packs them for oneDNN convolutions and GEMMs (the
comment on `torch._inductor.config.freezing`). Dynamo reads that flag while tracing, so
the runner sets it around each call (`torch.compile(options=...)` reaches only Inductor
and left the weights unfrozen). `fullgraph=True`: the exported program is one graph, so
a graph break would mean part of it silently running eagerly; it fails instead. On CUDA
it uses the options of mode "max-autotune" (autotuned Triton kernels and CUDA graphs,
recorded per input shape; Inductor's layout optimization runs convolutions channels-last).

Compiling is just-in-time and costs seconds per graph, so `load` warms up at the
typical, smallest and largest batch of the spec, marking the spec's dynamic axes with
`torch._dynamo.maybe_mark_dynamic` so that a new batch size reuses a dynamic graph
instead of recompiling. PyTorch still specializes size 1, and on CPU may guard on a
range of batch sizes where its convolution backend choice changes, so a model compiles
two or three graphs; each compile, with its input shapes and seconds, is recorded in
`runner.compiles`. The compiled kernels' thread count is fixed when they are compiled
(`torch._inductor.config.cpp.threads`): `threads` is passed there, and defaults to
PyTorch's intra-op thread count at load time.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from typing import Any, Sequence

import numpy as np
import torch

from zoo import Availability, ModelSpec
from zoo.errors import ExportError, ZooError

from .backend import TorchBackend, TorchRunner, first_line, probe_torch


def probe_inductor(device: str) -> Availability:
    """Inductor compiles C++ (CPU) or Triton (CUDA) kernels: the compiler must be here."""
    base = probe_torch(device)
    if not base.ok:
        return base
    if device == "cpu":
        cxx = os.environ.get("CXX", "g++")  # Inductor's default, torch._inductor.config.cpp.cxx
        if shutil.which(cxx) is None:
            return Availability(False, f"Inductor compiles C++ kernels on CPU and the compiler {cxx!r} is not "
                                       f"on PATH (install g++ or set CXX)")
        return base
    if importlib.util.find_spec("triton") is None:
        return Availability(False, "Inductor generates Triton kernels on CUDA and the triton package is not "
                                   "installed (it comes with PyTorch's CUDA wheels)")
    return base


def compile_options(device: str, threads: int | None) -> dict[str, Any]:
    """`torch.compile(options=...)`: freezing always; mode "max-autotune"'s options on CUDA
    (a mode and options cannot both be given, so the mode is spelled out)."""
    options: dict[str, Any] = {"freezing": True}
    if device.startswith("cuda"):
        options.update(torch._inductor.list_mode_options("max-autotune"))
    elif threads:
        options["cpp.threads"] = threads
    return options


def _graphs() -> int:
    """Graphs Dynamo has compiled in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


class CompiledRunner(TorchRunner):
    """A `TorchRunner` over a `torch.compile`d module that records every compile."""

    def __init__(self, fn, spec: ModelSpec, precision: str, device: str, cudagraphs: bool) -> None:
        super().__init__(fn, spec, precision, device, compiled=True)
        self.cudagraphs = cudagraphs
        #: one entry per graph compiled: {"shapes": {input: shape}, "seconds": s}
        self.compiles: list[dict[str, Any]] = []
        self.warmup_seconds = 0.0

    def run(self, args: Sequence[torch.Tensor]) -> Any:
        if self.cudagraphs:  # a new iteration: earlier outputs may be overwritten by replay
            torch.compiler.cudagraph_mark_step_begin()
        before, start = _graphs(), time.perf_counter()
        # Dynamo reads the global `freezing` flag while tracing, to keep the weights in the
        # graph rather than lift them to inputs; `options` reach only Inductor, so without
        # this the weights were not frozen (and copied to channels-last on every call).
        inductor = torch._inductor.config
        frozen, inductor.freezing = inductor.freezing, True
        try:
            result = self.fn(*args)
        except torch._dynamo.exc.TorchDynamoException as exc:  # Inductor's errors derive from it too
            raise self._failed(args, exc) from exc
        finally:
            inductor.freezing = frozen
        if _graphs() != before:
            self.compiles.append({"shapes": self._shapes(args), "seconds": round(time.perf_counter() - start, 3)})
        return result

    def outputs(self, result: Any) -> dict[str, torch.Tensor]:
        out = super().outputs(result)
        if self.cudagraphs:  # outputs live in the graph's memory pool until the next replay
            out = {name: tensor.clone() for name, tensor in out.items()}
        return out

    def warm_up(self) -> None:
        """Compile at the typical, smallest and largest batch, dynamic axes marked."""
        start = time.perf_counter()
        rng = np.random.default_rng(0)
        r = self.spec.axes["batch"]
        with torch.inference_mode():
            for batch in dict.fromkeys((r.opt, r.min, r.max)):
                args = self.prepare(self.spec.sample(batch, rng))
                for arg, t in zip(args, self.spec.inputs):
                    for axis in t.dynamic_axes:
                        torch._dynamo.maybe_mark_dynamic(arg, axis)
                try:
                    self.run(args)
                except ZooError:
                    raise
                except Exception as exc:  # the compiled code failing on valid inputs
                    raise self._failed(args, exc) from exc
        self.warmup_seconds = round(time.perf_counter() - start, 3)

    def _failed(self, args: Sequence[torch.Tensor], exc: BaseException) -> ExportError:
        return ExportError(f"torch.compile could not compile {self.spec.name} for inputs {self._shapes(args)}: "
                           f"{first_line(exc)}; the `torch` backend runs it eagerly")

    def _shapes(self, args: Sequence[torch.Tensor]) -> dict[str, list[int]]:
        return {name: list(a.shape) for name, a in zip(self.input_names, args)}


class TorchCompileBackend(TorchBackend):
    name = "torch-compile"
    description = "torch.compile (Inductor, frozen weights) of the torch.export program, compiled when loaded"
    # the same program file as `torch`, so the same Triton runtime as `TorchBackend.triton`
    triton = TorchBackend.triton

    def probe(self, device: str) -> Availability:
        return probe_inductor(device)

    def export(self, module, spec, example, path, precision, device):
        info = super().export(module, spec, example, path, precision, device)
        return {**info, "compiler": "inductor", "compile_options": compile_options(device, None)}

    def load(self, path, spec, precision, device, threads=None, info=None):
        module = self.load_module(path, device, threads)
        options = compile_options(device, threads or torch.get_num_threads())
        compiled = torch.compile(module, backend="inductor", fullgraph=True, options=options)
        runner = CompiledRunner(compiled, spec, precision, device, bool(options.get("triton.cudagraphs")))
        runner.warm_up()
        return runner
