"""The `torch-compile` backend: a `torch.export` program, compiled by Inductor when loaded.

The artifact is a `torch.export` program file like the `torch` backend's (same format,
same no-pickle check); `load` wraps its module in `torch.compile` (Inductor) with
freezing, which inlines the weights as constants so that Inductor folds them and, on
CPU, pre-packs them for oneDNN convolutions and GEMMs (the comment on
`torch._inductor.config.freezing`). Dynamo reads that flag while tracing, so the runner
sets it around each call (`torch.compile(options=...)` reaches only Inductor and left the
weights unfrozen). `fullgraph=True`: the exported program is one graph, so a graph break
would mean part of it silently running eagerly; it fails instead.

Compiling is just-in-time and costs seconds per graph, so `load` warms up at every
combination of the typical, smallest and largest size of each dynamic axis of the spec
(`warm_up_sizes`), marking the axes with `torch._dynamo.maybe_mark_dynamic` so that a new
size reuses a dynamic graph instead of recompiling. PyTorch still specializes size 1 (a
graph for each set of axes at 1: batch 1, seq 1, both), and on CPU may guard on a range of
batch sizes where its convolution backend choice changes, so a model compiles two to five
graphs, none of them at request time for sizes in the spec's ranges; each compile, with
its input shapes, seconds and FX graph cache outcome, is recorded in `runner.compiles`.
On CPU that cache is bypassed, and each process compiles again (`inductor_cache_dir`).
The compiled kernels' thread count is fixed when they are compiled
(`torch._inductor.config.cpp.threads`): `threads` is passed there, and defaults to
PyTorch's intra-op thread count at load time; the runner sets the same count for the
torch ops around them in each thread that calls it (`backend.threads_here`).

On CUDA, Inductor runs with the options of mode "max-autotune-no-cudagraphs" (autotuned
GEMM templates and Triton kernels, `torch._inductor.list_mode_options`), and the runner
replays one CUDA graph per input shape, captured at load for the typical, smallest and
largest batch and on first use for any other (`cudagraphs.CudaGraphs`, which says why not
Inductor's own): `runner.cudagraphs` lists the shapes captured, `runner.uncaptured` those
run without a graph and why, and `runner.capture(batch_sizes)` captures more up front.

Convolutional models (a 4-D convolution in the graph) get two more, recorded in the
manifest's backend info at export (`convolutional`, `channels_last`, `autocast`):
- channels_last on CUDA: cuDNN's and Tensor Cores' convolutions are NHWC, so a
  contiguous (NCHW) model pays a transpose around every convolution
  (https://docs.pytorch.org/tutorials/intermediate/memory_format_tutorial.html).
  Inductor's layout optimization converts a frozen model by itself (conv weights
  channels-last as folded constants, activations kept channels-last between layers), but
  it turns itself off for graphs with dynamic shapes on GPUs
  (`GraphLowering.decide_layout_opt`, pytorch#102670), and the batch axis is dynamic
  here: `force_layout_optimization` turns it back on, and the 4-D inputs are given
  channels-last (converted by the copy into a CUDA graph's input buffer, so for free).
  The weights are left to Inductor: converting the module by hand
  (`module.to(memory_format=...)`) broke Inductor's frozen oneDNN convolutions on CPU
  (a stride assertion in its unary-fusion lowering, torch 2.13). On CPU,
  `decide_layout_opt` always lays convolutions out channels-last for oneDNN, so nothing
  changes there (by hand: resnet18 at batch 8 ran as fast either way).
- fp16/bf16 by autocast rather than by casting the program: the program and its weights
  stay fp32 and run under `torch.autocast`, which runs convolutions and matmuls in the
  half type and keeps ops that need fp32's range (softmax, norms, exp, sums) in fp32
  (https://docs.pytorch.org/docs/stable/amp.html, "Autocast Op Reference"). A cast
  program is what the `torch` and `torch-aoti` backends build (every op in half); with
  freezing, Inductor folds autocast's weight casts into half constants, so mixed precision
  costs a CNN only the few ops autocast keeps in fp32. By hand on CPU in bf16, trained
  resnet8.digits and mobilenetv2.digits through Inductor: autocast about halved the
  largest and mean error against fp32 and ran no slower than the cast program. Models
  without convolutions keep the cast program, as before.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import shutil
import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from zoo import Availability, ModelSpec
from zoo.errors import ExportError, ZooError, first_line
from zoo.tensors import PRECISION_DTYPES, to_torch

from .backend import TorchBackend, TorchRunner, export_program, probe_torch, save_program
from .cudagraphs import CudaGraphs
from .shapes import check_shapes, row_major


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


def compile_options(device: str, threads: int | None, channels_last: bool = False) -> dict[str, Any]:
    """`torch.compile(options=...)`: freezing always; on CUDA, mode "max-autotune"'s
    options but for its CUDA graphs, which `CudaGraphs` records instead (a mode and
    options cannot both be given, so the mode is spelled out), and Inductor's
    channels-last layout for a convolutional model (see the module docstring)."""
    # the caches that let a later load reuse an earlier one's compile and autotuning
    # (`inductor_cache_dir`); PyTorch's defaults, stated so that a changed default does
    # not silently make every benchmark compile from scratch
    options: dict[str, Any] = {"freezing": True, "fx_graph_cache": True, "autotune_local_cache": True}
    if device.startswith("cuda"):
        options.update(torch._inductor.list_mode_options("max-autotune-no-cudagraphs"))
        options["triton.cudagraphs"] = False
        if channels_last:
            options["force_layout_optimization"] = True
    elif threads:
        options["cpp.threads"] = threads
    return options


def is_convolutional(program: torch.export.ExportedProgram) -> bool:
    """Whether the program's graph has a 2-D convolution (a 4-D weight)."""
    convolutions = {torch.ops.aten.conv2d, torch.ops.aten.convolution}
    for node in program.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "overloadpacket", None) in convolutions:
            weight = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
            if weight is not None and weight.dim() == 4:
                return True
    return False


def precision_plan(program: torch.export.ExportedProgram, precision: str, device: str) -> dict[str, bool]:
    """How a program runs (see the module docstring), as recorded in the manifest."""
    convolutional = is_convolutional(program)
    return {"convolutional": convolutional,
            "channels_last": convolutional and device.startswith("cuda"),
            "autocast": convolutional and precision in ("fp16", "bf16")}


def channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor with exactly channels-last strides, copied only when they differ.
    Exact, as `shapes.row_major` is, since compiled code indexes by the strides it was
    compiled for (`contiguous(memory_format=...)` keeps others on size-1 axes)."""
    _, c, h, w = tensor.shape
    expected = (c * h * w, 1, w * c, c)
    if tensor.stride() == expected:
        return tensor
    return torch.empty_strided(tensor.shape, expected, dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def _graphs() -> int:
    """Graphs Dynamo has compiled in this process so far."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


#: Inductor's FX graph cache outcomes, as its counters name them
_CACHE_COUNTERS = {"hit": "fxgraph_cache_hit", "miss": "fxgraph_cache_miss", "bypass": "fxgraph_cache_bypass"}


def _cache_counts() -> dict[str, int]:
    counters = torch._dynamo.utils.counters["inductor"]
    return {outcome: counters[name] for outcome, name in _CACHE_COUNTERS.items()}


def inductor_cache_dir() -> str:
    """Where Inductor keeps compiled graphs and autotuning results: $TORCHINDUCTOR_CACHE_DIR
    when set, else ~/.cache/zoo/inductor (or under $XDG_CACHE_HOME).

    Max-autotune benchmarks GEMM templates and Triton configs for every graph, a minute
    and more for ResNet-50, and a `torch-compile` artifact compiles when loaded: once in
    the export's verification and again in each benchmark's measuring process. Inductor's
    FX graph cache and its autotuning cache (both on by default, set on explicitly in
    `compile_options`) let a load after the first reuse what they hold, across processes,
    when they share a directory. Not on CPU: there freezing pre-packs the weights for oneDNN
    (`torch._inductor.config.cpp.weight_prepack`), the packed weights are mkldnn tensors
    the FX graph cache cannot pickle, and it bypasses every such graph (`runner.compiles`
    records "bypass"), so each process compiles its graphs again (torch 2.13, 2 cores:
    9.8 s resnet8.digits, 15 s MiniLM). Prepacking off made the graphs cacheable but saved
    little (a hit still traces and freezes: resnet8.digits loaded in 17.0 s against 17.8 s)
    and ran MiniLM slower (4.7 ms at batch 1 against 6.1 ms, fastest of 75 calls), so it
    stays on. PyTorch's default is under the temporary directory, which
    containers and CI runners often empty between runs; the zoo keeps it with its other
    caches (the TensorRT timing cache). The directory holds code Inductor generated on
    this machine, never files from an artifact."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zoo", "inductor")


def warm_up_sizes(spec: ModelSpec) -> list[dict[str, int]]:
    """The sizes of the inputs' dynamic axes `CompiledRunner.warm_up` compiles at: each
    axis's typical, smallest and largest, in every combination, all typical first (the
    graph dynamic in every axis; the rest add only the graphs a call at those sizes would
    compile, none where that one takes them). Dynamo specializes a size of 1, so a graph
    for each set of axes at 1 where their ranges start at 1 (gru.pydoc: batch 1, seq 1,
    both), and on CPU may guard on a range of sizes where its convolution backend changes:
    warmed up at the typical batch and lengths alone, a first call at seq 1 compiled for
    seconds inside the request."""
    axes = {axis: spec.axes[axis] for t in spec.inputs for axis in t.dynamic_axes.values()}
    typical = {axis: r.opt for axis, r in axes.items()}
    combos = itertools.product(*(dict.fromkeys((r.opt, r.min, r.max)) for r in axes.values()))
    return [typical] + [sizes for sizes in (dict(zip(axes, c)) for c in combos) if sizes != typical]


class CompiledRunner(TorchRunner):
    """A `TorchRunner` over a `torch.compile`d module that records every compile and,
    on CUDA, replays a CUDA graph per input shape."""

    def __init__(self, fn, spec: ModelSpec, precision: str, device: str, plan: Mapping[str, bool],
                 threads: int | None = None) -> None:
        super().__init__(fn, spec, precision, device, compiled=True, threads=threads)
        self.channels_last = bool(plan.get("channels_last"))
        #: the half type autocast runs convolutions and matmuls in, or None (a cast program)
        self.autocast = PRECISION_DTYPES[precision] if plan.get("autocast") else None
        if self.autocast is not None:  # inputs stay as declared: autocast casts them where an op runs in half
            self.dtype = None
        #: one entry per graph compiled: {"shapes": {input: shape}, "seconds": s, "cache": how
        #: Inductor's FX graph cache answered: "hit" (reused an earlier compile), "miss", "bypass"}
        self.compiles: list[dict[str, Any]] = []
        self.graphs = CudaGraphs(self.call, self.cast, device) if device.startswith("cuda") else None
        self.warmup_seconds = 0.0

    @property
    def cudagraphs(self) -> list[dict[str, Any]]:
        """The CUDA graphs captured: {"shapes": [input shapes], "seconds": s} each."""
        return self.graphs.captured if self.graphs is not None else []

    @property
    def uncaptured(self) -> list[dict[str, Any]]:
        """Input shapes run without a CUDA graph, with the reason."""
        return self.graphs.uncaptured if self.graphs is not None else []

    def cast(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.dtype is not None and tensor.is_floating_point() and tensor.dtype != self.dtype:
            tensor = tensor.to(self.dtype)
        # one channel: NCHW and NHWC are the same bytes, and only the stride of the size-1
        # axis would differ, which made Inductor's frozen oneDNN convolutions fail a stride
        # assertion with dynamic shapes (torch 2.13, CPU): keep such images row-major
        if self.channels_last and tensor.dim() == 4 and tensor.shape[1] > 1 and tensor.is_floating_point():
            return channels_last(tensor)
        return row_major(tensor)

    def prepare(self, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
        if self.graphs is None:
            return super().prepare(inputs)
        tensors = to_torch(inputs, self.spec, self.device)
        check_shapes(tensors, self.spec)
        return list(tensors.values())  # cast on the copy into the graph's static inputs

    def run(self, args: Sequence[torch.Tensor]) -> Any:
        return self.graphs(*args) if self.graphs is not None else self.call(*args)

    def call(self, *args: torch.Tensor) -> Any:
        """The compiled module on inputs already cast; records a compile if one happens."""
        before, cache, start = _graphs(), _cache_counts(), time.perf_counter()
        # Dynamo reads the global `freezing` flag while tracing, to keep the weights in the
        # graph rather than lift them to inputs; `options` reach only Inductor, so without
        # this the weights were not frozen (and copied to channels-last on every call).
        inductor = torch._inductor.config
        frozen, inductor.freezing = inductor.freezing, True
        # Autocast around the compiled call, not inside a wrapper module: Dynamo traces the
        # casts into the graph and guards on the autocast state either way, but a wrapper's
        # `forward` is one code object for every model loaded in the process, and its
        # compiles add up to `torch._dynamo.config.recompile_limit` (a hard failure with
        # fullgraph=True by the fifth load); each exported module has its own code.
        autocast = (torch.autocast(torch.device(self.device).type, dtype=self.autocast)
                    if self.autocast is not None else contextlib.nullcontext())
        try:
            with autocast:
                result = self.fn(*args)
        except torch._dynamo.exc.TorchDynamoException as exc:  # Inductor's errors derive from it too
            raise self._failed(args, exc) from exc
        finally:
            inductor.freezing = frozen
        if _graphs() != before:
            seconds = round(time.perf_counter() - start, 3)
            after = _cache_counts()
            outcome = next((o for o in ("miss", "bypass", "hit") if after[o] > cache[o]), None)
            self.compiles.append({"shapes": self._shapes(args), "seconds": seconds, "cache": outcome})
        return result

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Compile at every combination of each dynamic axis's typical, smallest and largest
        size (`warm_up_sizes`), dynamic axes marked; then, on CUDA, capture a graph for the
        typical, smallest and largest batch at the sample's lengths."""
        start = time.perf_counter()
        for tensors in self._at_sizes(warm_up_sizes(self.spec)):
            args = [self.cast(t) for t in tensors]
            for arg, t in zip(args, self.spec.inputs):
                for axis in t.dynamic_axes:
                    torch._dynamo.maybe_mark_dynamic(arg, axis)
            try:
                self.call(*args)
            except ZooError:
                raise
            except Exception as exc:  # the compiled code failing on valid inputs
                raise self._failed(args, exc) from exc
        if self.graphs is not None:
            r = self.spec.axes["batch"]
            self.graphs.capture(self._examples(dict.fromkeys((r.opt, r.min, r.max))))
        self.warmup_seconds = round(time.perf_counter() - start, 3)

    @torch.inference_mode()
    def capture(self, batch_sizes: Sequence[int]) -> list[dict[str, Any]]:
        """Capture CUDA graphs now for these batch sizes, at the lengths `spec.sample`
        gives, so that the first call at each replays (e.g. before a benchmark times it);
        returns `cudagraphs`. On CPU there are none."""
        if self.graphs is not None:
            self.graphs.capture(self._examples(batch_sizes))
        return self.cudagraphs

    def _examples(self, batch_sizes) -> list[list[torch.Tensor]]:
        rng = np.random.default_rng(0)
        return [list(to_torch(self.spec.sample(b, rng), self.spec, self.device).values()) for b in batch_sizes]

    def _at_sizes(self, sizes: Sequence[Mapping[str, int]]) -> list[list[torch.Tensor]]:
        """The spec's sample at each of these sizes: drawn at the batch, cut or repeated along
        every other axis (as `zoo.bench.measure.at_length`: sampled content at that length)."""
        examples = []
        for each in sizes:
            tensors = list(to_torch(self.spec.sample(each.get("batch", 1), np.random.default_rng(0)), self.spec,
                                    self.device).values())
            for i, t in enumerate(self.spec.inputs):
                for dim, axis in t.dynamic_axes.items():
                    if axis != "batch":
                        index = torch.arange(each[axis], device=self.device) % tensors[i].shape[dim]
                        tensors[i] = tensors[i].index_select(dim, index)
            examples.append(tensors)
        return examples

    def _failed(self, args: Sequence[torch.Tensor], exc: BaseException) -> ExportError:
        return ExportError(f"torch.compile could not compile {self.spec.name} for inputs {self._shapes(args)}: "
                           f"{first_line(exc)}; the `torch` backend runs it eagerly")

    def _shapes(self, args: Sequence[torch.Tensor]) -> dict[str, list[int]]:
        return {name: list(a.shape) for name, a in zip(self.input_names, args)}


class TorchCompileBackend(TorchBackend):
    name = "torch-compile"
    compiles = True
    description = ("torch.compile (Inductor, frozen weights; max-autotune and CUDA graphs per shape on CUDA) "
                   "of a torch.export program, compiled when loaded")
    # the same program format as `torch`: Triton's Python backend (`TorchBackend.triton`)
    triton = TorchBackend.triton

    def probe(self, device: str) -> Availability:
        return probe_inductor(device)

    def export(self, module, spec, example, path, precision, device):
        program = export_program(module, spec, example, "fp32")
        plan = precision_plan(program, precision, device)
        if precision != "fp32" and not plan["autocast"]:
            program = export_program(module, spec, example, precision)
        save_program(program, path)
        dtype = torch.float32 if plan["autocast"] else PRECISION_DTYPES[precision]
        return {"exporter": "torch.export", "dtype": str(dtype), "compiler": "inductor",
                "compile_options": compile_options(device, None, plan["channels_last"]),
                "cudagraphs": "one per input shape" if device.startswith("cuda") else None, **plan}

    def load(self, path, spec, precision, device, threads=None, info=None):
        plan = {key: bool((info or {}).get(key)) for key in ("channels_last", "autocast")}
        module = self.load_module(path, device, threads)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache_dir())  # read by Inductor when it compiles
        threads = threads or torch.get_num_threads()  # the kernels' count, fixed as they compile
        options = compile_options(device, threads, plan["channels_last"])
        compiled = torch.compile(module, backend="inductor", fullgraph=True, options=options)
        runner = CompiledRunner(compiled, spec, precision, device, plan, threads)
        runner.warm_up()
        return runner
