"""The `torch` backend: a `torch.export` program (`model.pt2`) run by PyTorch eagerly.

The artifact is the exported program (graph + weights), not the plugin's Python class,
so it loads without the model's source. `torch.export.load` falls back to unpickling for
tensor subclasses and custom objects; `check_no_pickle` refuses any archive that would
take that path, so loading reads only JSON and raw tensor bytes.

`export_program` and `TorchRunner` are shared with the compiled variants
(`torch-compile`, `torch-aoti`), which start from the same program.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from zoo import Availability, Backend, ModelSpec
from zoo.errors import ArtifactError, ExportError, ZooError, first_line
from zoo.signature import Signature
from zoo.tensors import (PRECISION_DTYPES, RNN_WEIGHTS_ASSIGNED, TORCH_DTYPES, constraint_violation,
                         dynamic_shapes, export_quiet, export_reason, hinted_shapes, to_torch)

from .shapes import check_shapes, row_major


#: the records of a `torch.export.save` archive (below its root folder) that
#: `torch.export.load` reads without unpickling: bookkeeping, the program's JSON, raw tensor
#: bytes and their JSON configs, and `extra/` strings
_PT2_RECORDS = re.compile(r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
                          r"|models/[^/]+\.json|data/weights/weight_\d+|data/constants/tensor_\d+"
                          r"|data/(weights|constants)/[^/]+_config\.json|extra/[^/]+)")
#: per config, the raw-tensor file names its entries may point at
_PT2_PAYLOADS = {"weights": re.compile(r"weight_\d+"), "constants": re.compile(r"tensor_\d+")}


def check_no_pickle(path: Path, compiled_code: bool = False) -> None:
    """Refuse a .pt2 archive that would make `torch.export.load` unpickle anything.

    An allowlist, not a list of what is known to unpickle: `torch.export.load` unpickles
    weights or constants flagged `use_pickle`, and also, whatever the flag says, constants
    named `opaque_obj_*` (`pickle.loads`) and `custom_obj_*` (TorchScript's unpickler),
    legacy `data/weights/<model>.pt` and `data/constants/<model>.pt` records (`torch.load`,
    falling back to `weights_only=False`) and non-empty sample inputs (`torch.save`d;
    `save_program` writes none). So only the records `torch.export.save` writes for a plain
    program are accepted, with every weight and constant a raw tensor; anything else is
    refused by name. `compiled_code`: an AOTInductor package, whose `data/aotinductor/`
    holds the compiled library it exists to run (loading it runs native code by design:
    its hash and signature are what vouch for it) and no TorchScript objects."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                _check_record(path, archive, info, compiled_code)
    except zipfile.BadZipFile:
        raise ArtifactError(f"{path.name} is not a valid .pt2 archive") from None


def _check_record(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, compiled_code: bool) -> None:
    name = info.filename
    record = name.split("/", 1)[1] if "/" in name else ""
    if record.startswith("data/sample_inputs/") and record.count("/") == 2:
        if info.file_size:
            raise ArtifactError(f"{path.name} contains pickled sample inputs ({name}); refusing to load it")
        return
    if compiled_code and record.startswith("data/aotinductor/"):
        if "custom_obj" in record.rsplit("/", 1)[-1]:
            raise ArtifactError(f"{path.name} contains a pickled TorchScript object ({name}); refusing to load it")
        return
    if not _PT2_RECORDS.fullmatch(record):
        raise ArtifactError(f"{path.name} contains {name}, which is not a record of a plain torch.export program "
                            f"(loading it could unpickle it); refusing to load it")
    folder = record.split("/")[1] if record.startswith("data/") else None
    if folder is None or not record.endswith("_config.json"):
        return
    try:
        config = json.loads(archive.read(info))
    except ValueError:
        raise ArtifactError(f"{path.name}: {name} is not JSON") from None
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ArtifactError(f"{path.name}: {name} has no config mapping")
    for key, entry in entries.items():
        target = entry.get("path_name") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("use_pickle") is not False or not isinstance(target, str) \
                or not _PT2_PAYLOADS[folder].fullmatch(target):
            raise ArtifactError(f"{path.name} stores {folder[:-1]} {key!r} as something other than raw tensor bytes "
                                f"({name}: {str(entry)[:200]}); refusing to load it")


def export_program(module: torch.nn.Module, spec: ModelSpec, example: Mapping[str, torch.Tensor],
                   precision: str) -> torch.export.ExportedProgram:
    """`module` in `precision` captured by `torch.export` with the spec's dynamic axes.

    fp32 is the reference as it is: its weights and the spec's input dtypes unchanged (a
    float16 model stays float16, as `zoo check` ran it); fp16 and bf16 cast every float."""
    dtype = cast_dtype(precision)
    # a copy: the program keeps references to the module's parameters, and the
    # caller's reference must stay as it is
    module = Signature(copy.deepcopy(module) if dtype is None else copy.deepcopy(module).to(dtype), spec)
    args = tuple(v.to(dtype) if dtype is not None and v.is_floating_point() else v
                 for v in (example[t.name] for t in spec.inputs))
    try:
        # keyed by the signature's one (variadic) parameter; the program takes the inputs
        # in spec order and returns a plain tuple, so loading it needs no plugin's classes
        with warnings.catch_warnings(), export_quiet():
            warnings.filterwarnings("ignore", message=RNN_WEIGHTS_ASSIGNED)
            program = torch.export.export(module, args, dynamic_shapes={"inputs": dynamic_shapes(spec)})
    except ZooError:
        raise
    except Exception as exc:  # torch.export's own errors (data-dependent control flow, guards ...)
        refused = ExportError(f"torch.export could not capture {spec.name}: {export_reason(exc)}"
                              f"{_unrolled(module, exc)}")
        if constraint_violation(exc) is None:
            raise refused from exc
        program = _without_proof(module, spec, args, precision, refused)
    if dtype is not None:
        _refuse_mixed_dtypes(program, spec, args, precision)
    return program


def _unrolled(module: torch.nn.Module, exc: BaseException) -> str:
    """Where an axis was fixed to the example's size and the module has an nn.GRU, nn.LSTM or
    nn.RNN: torch.export decomposes it into a Python loop over time and unrolls it, whatever
    the user's code; say so, and what keeps the axis dynamic."""
    if "specialized it to be a constant" not in str(exc):
        return ""
    rnn = next((name for name, m in module.named_modules() if isinstance(m, torch.nn.RNNBase)), None)
    if rnn is None:
        return ""
    kind = type(module.get_submodule(rnn)).__name__
    return (f". Here it is {rnn.removeprefix('module.')!r}, an nn.{kind}: torch.export unrolls it over its time "
            f"steps, fixing the sequence axis to the example's length. The onnxruntime and openvino backends export "
            f"it with the axis dynamic; here, give the axis one size, or run the recurrence as a loop the graph "
            f"keeps (torch's scan, as zoo-nlp's gru.pydoc does)")


def _without_proof(module: torch.nn.Module, spec: ModelSpec, args: tuple, precision: str,
                   refused: ExportError) -> torch.export.ExportedProgram:
    """torch.export refuses a range whose guards it cannot prove from the range alone, true
    or not: a forward padding its input to the next multiple of 4 by `4 - h % 4` takes
    every height, yet torch cannot prove `4 * ((h + 4 - h % 4) // 4) == h + 4 - h % 4`.
    Captured again with the ranges as hints (`zoo.tensors.hinted_shapes`), those guards
    become checks the program runs; it is kept only where it runs, and answers as the
    module does, at each end of every dynamic axis and at one and three past the example's
    size of each other one (the sizes where a path chosen for the example's sizes fails).
    Else `refused` stands, with the size the program fails at."""
    try:
        with warnings.catch_warnings(), export_quiet():
            warnings.filterwarnings("ignore", message=RNN_WEIGHTS_ASSIGNED)
            program = torch.export.export(module, args, dynamic_shapes={"inputs": hinted_shapes(spec)})
    except Exception:  # noqa: BLE001 - the first refusal says why
        raise refused from None
    tolerance = spec.tolerances.get(precision) or spec.tolerances.get("fp32")
    run = program.module()
    for axis, example, size, inputs in _probe_sizes(spec, args):
        try:
            with torch.inference_mode():
                want = module(*inputs)
        except Exception:  # noqa: BLE001 - the forward itself fails there: `zoo check` names that
            continue
        try:
            with torch.inference_mode():
                got = run(*inputs)
            torch.testing.assert_close(got, want, atol=tolerance.atol if tolerance else None,
                                       rtol=tolerance.rtol if tolerance else None)
        except Exception as exc:  # noqa: BLE001 - a failed runtime check, or another answer
            r = spec.axes[axis]
            if _SIZE_ONE.search(str(exc)):
                raise ExportError(_size_one(spec.name, axis, size, first_line(exc)[:300])) from None
            raise ExportError(f"torch.export could not capture {spec.name} for every {axis} in the spec's range "
                              f"{r.min} to {r.max}: captured from the example ({axis} = {example}), the program "
                              f"fails at {axis} = {size} ({type(exc).__name__}: {first_line(exc)[:300]}). "
                              f"torch.export keeps the path the forward takes at the example's sizes: a condition on "
                              f"the size, or an op that does nothing at some sizes (a pad of -{axis} % 4 is 0 "
                              f"at multiples of 4), holds there only. Let the forward take one path at every size "
                              f"(a pad never 0, cut back after), or declare the axis static, AxisRange(n, n, n)"
                              ) from None
    return program


#: a runtime check of torch.export's that a size it kept dynamic is not 1 ("Guard failed:
#: -1 + inputs_0.size()[1] != 1"): a size of 1 would broadcast, so it assumes none is
_SIZE_ONE = re.compile(r"Guard failed: .+ != 1\b")


def _size_one(name: str, axis: str, size: int, failed: str) -> str:
    """The refusal of a range where a size derived from `axis` is 1 at `size` (`seq - 1` at seq = 2)."""
    return (f"torch.export could not capture {name} for {axis} = {size}: it takes every size it keeps dynamic "
            f"to be other than 1 (a size of 1 would broadcast), and at {axis} = {size} one the forward derives "
            f"from it is 1 ({failed}; a slice such as x[:, 1:] of length {axis} - 1, say). If the model need not "
            f"take {axis} = {size}, start the range above it, AxisRange({size + 1}, ...); else export it with the "
            f"onnxruntime or openvino backend, whose graphs take it")


def _probe_sizes(spec: ModelSpec, args: tuple) -> list[tuple[str, int, int, tuple]]:
    """(axis, the example's size, size, the example cut or repeated to it along that axis)
    for each end of every dynamic axis, and one and three past the example's size of each
    but the batch, inside the spec's range."""
    sizes: dict[str, int] = {}
    for t, tensor in zip(spec.inputs, args):
        for dim, axis in t.dynamic_axes.items():
            sizes.setdefault(axis, tensor.shape[dim])
    probes = []
    for axis, have in sizes.items():
        r = spec.axes[axis]
        # past the example first: the sizes where a path taken for the example's fails
        wanted = ([] if axis == "batch" else [have + 1, have + 3]) + [r.min, r.max]
        for n in dict.fromkeys(n for n in wanted if r.min <= n <= r.max and n != have):
            inputs = []
            for t, tensor in zip(spec.inputs, args):
                for dim, name in t.dynamic_axes.items():
                    if name == axis:
                        index = torch.arange(n, device=tensor.device) % tensor.shape[dim]
                        tensor = tensor.index_select(dim, index)
                inputs.append(tensor.contiguous())
            probes.append((axis, have, n, tuple(inputs)))
    return probes


#: PyTorch's words for an op given tensors of two dtypes ("mat1 and mat2 must have the same
#: dtype", "expected scalar type BFloat16 but found Float", "Input type (float) and bias type
#: (c10::BFloat16) should be the same")
_MIXED_DTYPES = re.compile(r"same dtype|scalar type|type \(.*\) and .* should be the same", re.IGNORECASE)


def _refuse_mixed_dtypes(program: torch.export.ExportedProgram, spec: ModelSpec, args: tuple,
                         precision: str) -> None:
    """Run the program cast to `precision` once on the example, where a forward that makes
    float32 tensors (`.float()`, a float32 tensor created in forward) fails: the capture's
    fake tensors do not check an op's dtypes, so it passed, and parity later answered
    PyTorch's bare "mat1 and mat2 must have the same dtype". Other failures are parity's."""
    try:
        with torch.no_grad():
            program.module()(*args)
    except Exception as exc:  # noqa: BLE001 - the user's forward: any other failure is parity's to report
        if not _MIXED_DTYPES.search(str(exc)):
            return
        raise ExportError(
            f"{spec.name}: its forward mixes dtypes at {precision} ({first_line(exc)}): the module is cast to "
            f"{str(PRECISION_DTYPES[precision]).removeprefix('torch.')}, but the forward makes float32 tensors "
            f"(.float(), or a tensor created as float32). Cast it back to its input's dtype (.to(x.dtype)), create "
            f"it with the input's dtype, run that part under torch.autocast, or export at fp32") from exc


def cast_dtype(precision: str) -> torch.dtype | None:
    """The dtype a program casts its module and float inputs to; None at fp32 (the spec's own)."""
    return None if precision == "fp32" else PRECISION_DTYPES[precision]


def save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    """Write `program` as a .pt2 archive that `check_no_pickle` accepts."""
    program.example_inputs = None  # else saved with torch.save, i.e. as a pickle
    torch.export.save(program, str(path))


def ieee_fp32_process() -> None:
    """fp32 is IEEE fp32 on every backend (ONNX Runtime: `use_tf32` off; TensorRT: TF32
    cleared), but torch runs cuDNN convolutions in TF32 by default: on the first CUDA run
    (H200), ResNet-50's fp32 `torch` artifact was 2e-5 off the IEEE reference where ONNX
    Runtime's was 1e-7, and its speed was TF32's. Set for the process, not per call: the
    flags are global, and saving and restoring them around each call races between threads."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


class TorchRunner:
    """Runs a torch callable in spec order; casts float inputs to the artifact's precision
    (fp16, bf16; at fp32 they stay as the spec declares them), float outputs back to the
    spec's dtypes (bfloat16 as float32, which numpy has), and checks shapes against the
    exported ranges first (a compiled package does not check them itself). Each call runs
    on `threads` intra-op threads (None: torch's process-wide count), in whichever thread
    calls it (`threads_here`)."""

    def __init__(self, fn: Callable[..., Any], spec: ModelSpec, precision: str, device: str,
                 compiled: bool = False, threads: int | None = None) -> None:
        self.fn, self.spec, self.device, self.threads = fn, spec, device, threads
        self.compiled = compiled  # compiled code: give it row-major inputs (see `shapes.row_major`)
        self.dtype = cast_dtype(precision)
        self.input_names = tuple(t.name for t in spec.inputs)
        self.output_names = tuple(t.name for t in spec.outputs)
        self.output_dtypes = tuple(torch.float32 if t.dtype == "bfloat16" else TORCH_DTYPES.get(t.dtype)
                                   for t in spec.outputs)
        if precision == "fp32" and device.startswith("cuda"):
            ieee_fp32_process()

    @torch.inference_mode()
    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        threads_here(self.threads)
        on_device = any(isinstance(v, torch.Tensor) and v.is_cuda for v in inputs.values())
        out = self.outputs(self.run(self.prepare(inputs)))
        if self.device.startswith("cuda") and on_device:
            return out  # keep device tensors on the device
        return {k: v.cpu().numpy() for k, v in out.items()}

    def prepare(self, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
        tensors = to_torch(inputs, self.spec, self.device)
        check_shapes(tensors, self.spec)
        return [self.cast(t) for t in tensors.values()]

    def cast(self, tensor: torch.Tensor) -> torch.Tensor:
        """One input in the dtype and memory layout the program runs in."""
        tensor = tensor.to(self.dtype) if self.dtype is not None and tensor.is_floating_point() else tensor
        return row_major(tensor) if self.compiled else tensor

    def run(self, args: Sequence[torch.Tensor]) -> Any:
        return self.fn(*args)

    def outputs(self, result: Any) -> dict[str, torch.Tensor]:
        if isinstance(result, Mapping):
            result = tuple(result[name] for name in self.output_names)
        result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        return {name: r.to(dtype) if r.is_floating_point() and dtype is not None else r
                for name, r, dtype in zip(self.output_names, result, self.output_dtypes)}


def probe_torch(device: str) -> Availability:
    """Whether PyTorch itself can run on `device` here."""
    if device == "cpu":
        return Availability(True)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return Availability(False, f"no CUDA device (torch {torch.__version__} sees none)")
        return Availability(True)
    return Availability(False, f"unknown device {device!r}")


def use_threads(threads: int | None) -> None:
    """torch has one intra-op thread count per process, not one per module: `threads` sets
    it for the whole process, every torch model in it included, until something sets it
    again (left alone where it is None); each runner sets its own again when called
    (`threads_here`)."""
    if threads:
        threads_here(threads)


#: the intra-op thread count `threads_here` last set in each thread
_THREAD = threading.local()


def threads_here(threads: int | None) -> None:
    """Run this thread's torch and OpenMP work on `threads` threads (None: torch's count).

    torch's count is per process, but OpenMP's (`omp_get_max_threads`, what a parallel
    region starts with) is per thread: `torch.set_num_threads` sets it in the calling thread
    only, and a new thread starts at OpenMP's default (every core, or $OMP_NUM_THREADS).
    torch's own ops set it from torch's count on a thread's first parallel op, but an
    AOTInductor package's kernels (`cpp.dynamic_threads`: bare `#pragma omp parallel`) do
    not: called from a `zoo serve` worker thread, one loaded with `threads=1` ran on every
    core. So each call sets it where this thread's last setting or torch's count differs
    (once per thread, in the steady state: a thread-local and an int compare per call)."""
    want = threads or torch.get_num_threads()
    if getattr(_THREAD, "threads", None) != want or torch.get_num_threads() != want:
        torch.set_num_threads(want)
        _THREAD.threads = want


class TorchBackend(Backend):
    name = "torch"
    description = "PyTorch eager: a torch.export program (.pt2) run by PyTorch"
    precisions = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "fp16", "bf16")}
    filename = "model.pt2"
    # no native Triton form: Triton's PyTorch backend runs TorchScript, not torch.export
    # programs, so Triton serves this artifact through its Python backend (`zoo.triton`)
    triton = {}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    def probe(self, device: str) -> Availability:
        return probe_torch(device)

    def export(self, module, spec, example, path, precision, device):
        save_program(export_program(module, spec, example, precision), path)
        return {"exporter": "torch.export", "dtype": str(PRECISION_DTYPES[precision])}

    def load(self, path, spec, precision, device, threads=None, info=None):
        return TorchRunner(self.load_module(path, device, threads), spec, precision, device, threads=threads)

    def load_module(self, path: Path, device: str, threads: int | None) -> torch.nn.Module:
        """The exported program as a module on `device`, after the no-pickle check."""
        check_no_pickle(path)
        use_threads(threads)
        return torch.export.load(str(path)).module().to(device)
