"""The `torch-aoti` backend: an AOTInductor package (`model.pt2`), compiled ahead of time.

`export` captures the same `torch.export` program as the `torch` backend (the spec's
dynamic axes become the program's symbolic sizes, min and max from `spec.axes`) and
compiles it with `torch._inductor.aoti_compile_and_package` into a PT2 archive holding
the generated C++ (or CUDA) kernels as a shared library with the weights inside
(https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html). `load` calls
`torch._inductor.aoti_load_package`: no Python model code and no compiler at run time,
no compile on the first call, but no guards either, so the runner checks shapes against
the exported ranges before every call (`shapes.check_shapes`).

A package is native code for one machine: loading it runs its library, so the artifact's
sha256 check is what stands between a modified file and the process. The C++ kernels
are compiled with `-march=native`, free to use every instruction set of the building CPU;
the manifest records them (`cpu_flags`, from /proc/cpuinfo) with the vector ISA level, and
`load` refuses a package built for a wider ISA than this CPU has (AVX512 on an AVX2
machine) or using an instruction set it lacks (AVX512-VNNI from a Zen 4 on a Skylake-SP,
both "AVX512"), naming them, rather than crash on an illegal instruction. Kernels are
built with `cpp.dynamic_threads`, so the thread count is the loader's (`threads`, or
PyTorch's intra-op setting) rather than the builder's: they read OpenMP's count of the
calling thread, which the runner sets in each thread that calls it
(`backend.threads_here`). A CUDA package holds Triton kernels compiled for the exporting GPU's compute capability, which
the manifest records (with the GPU and CUDA version); `load` refuses it on another.
On CUDA, `export` loads the new package in a child process before loading it here: on the
first CUDA run (torch 2.11, H200), AOTInductor's loader crashed the process with SIGSEGV
loading a package it had just built, which took `zoo export` down with no message; a
crash in the child refuses the export instead, with the signal (`load_in_a_child`).

Triton: its PyTorch backend loads AOTInductor packages with `platform: "torch_aoti"`
(Triton 26.03 and later, beta). As of its 26.05 README it names tensors by position
(`INPUT__0`, `OUTPUT__0`, or `ARGS[0]`/`RESULT[0]`) rather than by the spec's names, and
serves batch size 1 only. So the artifact's Triton form is Triton's Python backend
(`zoo.triton`): `1/model.py` runs the package through this runner with the spec's names
and Triton's dynamic batcher.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from zoo import Availability, Backend
from zoo.errors import ArtifactError, BackendUnavailableError, ExportError, StaleArtifactError, first_line, signal_name
from zoo.tensors import PRECISION_DTYPES

from .backend import TorchRunner, check_no_pickle, export_program, probe_torch, use_threads
from .compiled import probe_inductor

#: x86 vector ISAs as `torch.backends.cpu.get_cpu_capability()` names them, narrowest first
X86_ISAS = ("DEFAULT", "AVX2", "AVX512")

#: the x86 feature flags of /proc/cpuinfo naming instructions that code compiled with
#: `-march=native` may contain: vector and matrix extensions, and the scalar ones gcc emits
#: by itself or ATen's headers switch on by their macros (not flags a microcode update or
#: hypervisor toggles without changing what compiled code can execute, such as rtm)
_X86_ISA_FLAGS = re.compile(r"mmx|sse\w*|ssse3|pni|avx\w*|amx\w*|fma4?|f16c|xop|tbm|bmi[12]|abm|popcnt|movbe|cx16"
                            r"|lahf_lm|3dnowprefetch|adx|aes|vaes|pclmulqdq|vpclmulqdq|gfni|sha_ni")


def cpu_flags() -> list[str] | None:
    """This CPU's instruction-set features that `-march=native` lets Inductor's C++ compiler
    use (`cpp_builder._get_cpu_arch_cflags`, torch 2.13): on x86 the flags matching
    `_X86_ISA_FLAGS`, on Arm every feature Linux lists; None where /proc/cpuinfo does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return sorted(f for f in set(value.split()) if _X86_ISA_FLAGS.fullmatch(f))
                if key.strip() == "Features":
                    return sorted(set(value.split()))
    except OSError:
        pass
    return None


def inductor_configs(device: str) -> dict[str, Any]:
    """Inductor settings for the package: frozen weights (constant-folded and pre-packed
    for oneDNN on CPU), kernels that follow the loader's thread count; on CUDA, the options
    of mode "max-autotune" but its CUDA graphs, which a package has no runtime for
    (`torch._inductor.list_mode_options("max-autotune-no-cudagraphs")`: autotuned GEMM
    templates and Triton kernels, coordinate-descent tuning)."""
    configs: dict[str, Any] = {"freezing": True}
    if device.startswith("cuda"):
        configs.update(torch._inductor.list_mode_options("max-autotune-no-cudagraphs"))
    else:
        configs["cpp.dynamic_threads"] = True
    return configs


def gpu_facts(device: str) -> dict[str, str]:
    """The GPU a CUDA package's kernels are compiled for: Triton builds them for this
    compute capability only (its cubins), so the package runs on GPUs that have it."""
    major, minor = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "compute_capability": f"{major}.{minor}",
            "cuda": str(torch.version.cuda)}


def check_gpu(recorded: str | None, device: str, artifact: str) -> None:
    """Refuse a CUDA package built for another compute capability than this GPU's."""
    major, minor = torch.cuda.get_device_capability(device)
    if recorded is None or recorded == f"{major}.{minor}":
        return
    raise StaleArtifactError(f"artifact {artifact} was compiled for GPUs of compute capability {recorded} and "
                             f"this {torch.cuda.get_device_name(device)} has {major}.{minor}; re-export it here "
                             f"with `zoo export --force`")


def check_isa(recorded: str | None, artifact: str, flags: list[str] | None = None) -> None:
    """Refuse a CPU package whose kernels use a wider vector ISA than this CPU's, or any
    instruction set of the CPU that built it (`flags`, its `cpu_flags()`) this one lacks:
    ISA levels are too coarse for `-march=native` code (an AVX512 Zen 4 package uses
    AVX512-VNNI and -BF16, which an AVX512 Skylake-SP lacks: SIGILL, not an error)."""
    here = cpu_flags()
    missing = sorted(set(flags) - set(here)) if flags and here is not None else []
    if missing:
        raise StaleArtifactError(f"artifact {artifact} was compiled for a CPU with instruction sets this one lacks "
                                 f"({', '.join(missing)}): its kernels are built with -march=native and may use "
                                 f"them, which would crash here on an illegal instruction; re-export it here with "
                                 f"`zoo export --force`")
    current = torch.backends.cpu.get_cpu_capability()
    if recorded is None or recorded == current:
        return
    if recorded in X86_ISAS and current in X86_ISAS and X86_ISAS.index(recorded) <= X86_ISAS.index(current):
        return
    raise StaleArtifactError(f"artifact {artifact} was compiled for {recorded} CPUs and this CPU supports "
                             f"{current}; re-export it here with `zoo export --force`")


class TorchAotiBackend(Backend):
    name = "torch-aoti"
    compiles = True
    description = "AOTInductor: the torch.export program compiled ahead of time into a native package (.pt2)"
    precisions = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "fp16", "bf16")}
    filename = "model.pt2"
    # no native Triton form: served by Triton's Python backend (see the module docstring)
    triton = {}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    def probe(self, device: str) -> Availability:
        # running a package needs only libtorch; building one needs Inductor's compiler (see export)
        return probe_torch(device)

    def export(self, module, spec, example, path, precision, device):
        available = probe_inductor(device)
        if not available.ok:
            raise BackendUnavailableError(f"backend {self.name} cannot build a package here: {available.reason}")
        program = export_program(module, spec, example, precision)
        configs = inductor_configs(device)
        start = time.perf_counter()
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
        except Exception as exc:  # Inductor lowering or the C++ compiler failing
            raise ExportError(f"AOTInductor could not compile {spec.name}: {first_line(exc)}"
                              f"{_known_cause(program)}; the `torch` and `torch-compile` backends run it") from exc
        if device.startswith("cuda"):
            load_in_a_child(path, device, spec.name)
        info: dict[str, Any] = {"exporter": "torch.export", "compiler": "aotinductor",
                                "dtype": str(PRECISION_DTYPES[precision]), "inductor_configs": configs,
                                "build_seconds": round(time.perf_counter() - start, 3)}
        if device == "cpu":
            info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
            info["cpu_flags"] = cpu_flags()
            info["cxx"] = _compiler_version()
        else:
            info.update(gpu_facts(device))
        return info

    def load(self, path, spec, precision, device, threads=None, info=None):
        available = self.probe(device)
        if not available.ok:
            raise BackendUnavailableError(f"backend {self.name} cannot run on {device} here: {available.reason}")
        if device == "cpu":
            check_isa((info or {}).get("cpu_capability"), path.parent.parent.name, (info or {}).get("cpu_flags"))
        else:
            check_gpu((info or {}).get("compute_capability"), device, path.parent.parent.name)
        check_no_pickle(path, compiled_code=True)
        use_threads(threads)
        index = torch.device(device).index  # "cuda:1" -> 1; None: the current device
        try:
            package = torch._inductor.aoti_load_package(str(path), device_index=-1 if index is None else index)
        except Exception as exc:  # a file that hashed fine but that this libtorch cannot load
            raise ArtifactError(f"{path.name} is not a loadable AOTInductor package: {first_line(exc)}") from exc
        return TorchRunner(package, spec, precision, device, compiled=True, threads=threads)


#: loads a package, in a child process (`load_in_a_child`)
_CHILD = "import sys, torch; torch._inductor.aoti_load_package(sys.argv[1], device_index=int(sys.argv[2]))"


def load_in_a_child(path: Path, device: str, name: str, timeout: float = 600) -> None:
    """Load the package once in a child process: a loader that crashes there (seen on the
    first CUDA run: SIGSEGV in `AOTIModelPackageLoader`, torch 2.11, H200) refuses the
    export with the signal instead of taking this process down. A load that merely raises
    is left to the load that follows, which says why."""
    index = torch.device(device).index
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(-1 if index is None else index)],
                             capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ExportError(f"AOTInductor's loader did not load the package it built for {name} within "
                          f"{timeout:g} s; the `torch` and `torch-compile` backends run it") from exc
    cause = signal_name(out.returncode)
    if cause:
        where = f" on this {torch.cuda.get_device_name(device)}" if device.startswith("cuda") else ""
        raise ExportError(f"AOTInductor's loader crashed ({cause}) loading the package it built for {name}{where} "
                          f"(torch {torch.__version__}); the `torch` and `torch-compile` backends run it")


def _known_cause(program: torch.export.ExportedProgram) -> str:
    """What is known to make AOTInductor fail on a graph, to say alongside its error."""
    if any(node.target is torch.ops.higher_order.scan for node in program.graph.nodes):
        # torch 2.13: Inductor's decompose_scan_to_while_loop pass cannot resolve the loop's
        # symbolic output sizes in AOT mode (a KeyError on a size symbol); torch.compile copes
        return (" (its graph has a `scan` loop, e.g. a recurrent layer, which AOTInductor "
                f"in torch {torch.__version__} fails to lower with dynamic shapes)")
    return ""


def _compiler_version() -> str:
    """The first line of `$CXX --version` (Inductor's compiler), for the manifest."""
    cxx = os.environ.get("CXX", "g++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx
    return out.splitlines()[0] if out else cxx
