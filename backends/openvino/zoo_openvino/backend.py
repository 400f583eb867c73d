"""The OpenVINO backend: IR compiled by OpenVINO's CPU plugin, in fp32, bf16 or int8.

The precision is stated, never left to OpenVINO's default: on a CPU with native
bfloat16 (AVX512_BF16, AMX) the CPU plugin runs float models in bf16 unless told
otherwise, which would give an "fp32" artifact bf16 numerics. So fp32 and int8 compile
with `inference_precision` f32 (int8's unquantized ops stay fp32), and bf16 is offered
as its own precision, refused on CPUs without native bf16, where OpenVINO would quietly
compute in fp32 instead. Triton's OpenVINO backend cannot be told f32 (`TRITON_CAVEAT`), so
an artifact's Triton form is by default the python one, which serves it through this runner.

openvino is imported only inside methods: the backend is listed, with the reason it
cannot run, on machines without it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from zoo.backend import Availability, Backend, device_kind, release
from zoo.errors import ArtifactError, BackendUnavailableError, StaleArtifactError, UnsupportedError, first_line
from zoo.triton import NativeOnRequest

if TYPE_CHECKING:
    import openvino
    import torch

    from zoo.spec import ModelSpec

    from .runner import OpenVinoRunner

NOT_INSTALLED = "openvino is not installed (pip install zoo-openvino)"
#: OpenVINO's element type for the arithmetic of each zoo precision.
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # names of openvino.Type members
#: why an OpenVINO artifact's Triton form is python unless asked (`zoo.triton.NativeOnRequest`):
#: Triton's OpenVINO backend passes OpenVINO only the config.pbtxt parameters it names
#: (INFERENCE_NUM_THREADS, COMPILATION_NUM_THREADS, NUM_STREAMS, PERFORMANCE_HINT, HINT_BF16) and
#: refuses HINT_BF16 other than YES, so nothing there sets INFERENCE_PRECISION_HINT to f32
TRITON_CAVEAT = ("Triton's OpenVINO backend compiles the model at the CPU plugin's default precision, bf16 on "
                 "CPUs with native bfloat16 (AVX512_BF16, AMX), and has no parameter that makes it f32 (it takes "
                 "HINT_BF16=YES only, which a bf16 artifact should be given: --triton-parameter HINT_BF16=YES); "
                 "an fp32 or int8 artifact served so is not computed as it was verified. --triton python serves "
                 "it through zoo's runner, which compiles it at its own precision")


#: the CPU features whose int8 dot products add into int32, as /proc/cpuinfo names them:
#: AVX512_VNNI, AVX-VNNI (its VEX form, on CPUs without AVX-512) and AMX; oneDNN, under
#: OpenVINO's CPU plugin, has int8 kernels for each (its avx512_core_vnni, avx2_vnni, amx ISAs)
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_tile"})


def cpu_has_vnni() -> bool:
    """VNNI (int8 dot products into int32) in AVX-512 or AVX, or AMX (VNNI_FLAGS), from the
    kernel's CPU flags where it lists them, so that registering the backend imports no
    PyTorch; elsewhere through PyTorch's CPU probe (`torch.cpu._is_vnni_supported`, AVX-512
    only, and `_is_amx_tile_supported`)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is not None:
        return bool(VNNI_FLAGS & set(flags))
    import torch

    return bool(torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported())


class OpenVinoBackend(Backend):
    name = "openvino"
    description = "OpenVINO IR (from the ONNX export) on OpenVINO's CPU plugin; int8 by NNCF post-training quantization"
    #: int8 only on CPUs with VNNI (AVX512_VNNI, AVX_VNNI, AMX), whose instructions add int8
    #: products in int32. Without them the CPU plugin's int8 kernels add pairs in int16, and
    #: even with NNCF's overflow fix on every layer a random-init resnet18 moved its logits by
    #: 0.1-0.19 at batch 8 (tolerance 0.03) in some processes and 0.016 in others, by the kernel
    #: the plugin chose: an artifact must not depend on that. (ONNX Runtime's int8 holds there.)
    precisions: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "cpu": ("fp32", "bf16", "int8") if cpu_has_vnni() else ("fp32", "bf16")}
    filename = "model.xml"  # the weights are model.bin beside it
    # Triton's OpenVINO backend reads model.xml and model.bin from the version directory, and
    # compiles them at the CPU plugin's default precision: the python form unless asked.
    triton: ClassVar[Mapping[str, str]] = NativeOnRequest({"backend": "openvino"}, TRITON_CAVEAT)

    def versions(self) -> dict[str, str]:
        # From the installed metadata: importing nncf takes seconds, and `zoo backends` asks.
        found = {}
        for lib in ("openvino", "nncf"):
            try:
                found[lib] = importlib.metadata.version(lib)
            except importlib.metadata.PackageNotFoundError:
                pass
        return found

    def probe(self, device: str) -> Availability:
        try:
            reason = self.unavailable(device)
        except Exception as exc:  # a broken install must not crash `zoo backends`
            reason = f"openvino failed to load: {exc}"
        return Availability(reason is None, reason or "")

    def unavailable(self, device: str) -> str | None:
        """Why this backend cannot run on `device` here, or None when it can."""
        if device_kind(device) not in self.precisions:
            return f"{self.name} runs on {', '.join(self.devices)}, not {device}"
        if not _installed("openvino"):
            return NOT_INSTALLED
        if "CPU" not in _core().available_devices:
            return "OpenVINO's CPU plugin does not load on this machine"
        return None

    def check_supported(self, precision: str, device: str) -> None:
        super().check_supported(precision, device_kind(device))

    def export(self, module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
               path: Path, precision: str, device: str) -> dict[str, Any]:
        from .convert import export_ir

        self._check_runs_here(precision, device)
        if precision == "int8" and not _installed("nncf"):  # only quantizing needs it, not loading
            raise BackendUnavailableError("int8 export with openvino needs nncf (pip install nncf)")
        return export_ir(module, spec, example, Path(path), precision)

    def load(self, path: Path, spec: "ModelSpec", precision: str, device: str,
             threads: int | None = None, info: Mapping[str, Any] | None = None) -> "OpenVinoRunner":
        from .runner import OpenVinoRunner

        self._check_runs_here(precision, device)
        return OpenVinoRunner(self.compile(Path(path), precision, threads), spec)

    def compile(self, path: Path, precision: str, threads: int | None = None) -> "openvino.CompiledModel":
        """The IR at `path` compiled for one caller at a time, at the lowest latency.

        The LATENCY hint makes the CPU plugin run one stream over all its threads
        (THROUGHPUT would split the cores into parallel streams for concurrent
        requests); `threads` caps those threads (INFERENCE_NUM_THREADS).
        See "High-level Performance Hints" in the OpenVINO docs.
        """
        import openvino as ov
        import openvino.properties as props
        import openvino.properties.hint as hints

        config: dict[str, Any] = {
            hints.performance_mode: hints.PerformanceMode.LATENCY,
            hints.inference_precision: getattr(ov.Type, INFERENCE_PRECISION[precision]),
        }
        if threads:
            config[props.inference_num_threads] = threads
        xml, weights = Path(path), Path(path).with_suffix(".bin")
        if not weights.is_file():
            raise ArtifactError(f"{xml.name} needs its weights file {weights.name} beside it; re-export the model")
        try:
            return _core().compile_model(str(xml), "CPU", config)
        except RuntimeError as exc:  # OpenVINO's own exception types are not public API
            raise ArtifactError(f"OpenVINO cannot load {xml}: {first_line(exc)}") from exc

    def check_compatible(self, recorded: Mapping[str, str], artifact: str) -> None:
        """Accept IR from this or an older OpenVINO; refuse IR from a newer one.

        OpenVINO reads IR written by older releases (IR v11 since 2022.1); a newer
        converter may emit operation versions an older runtime does not know. nncf is
        recorded for provenance only: loading a quantized IR does not need it.
        """
        current = self.versions()
        version = recorded.get("openvino")
        if version is None:
            return
        now = current.get("openvino")
        if now is None:
            raise BackendUnavailableError(f"artifact {artifact} needs {NOT_INSTALLED}")
        if release(now) < release(version):
            raise StaleArtifactError(
                f"artifact {artifact} was built with openvino {version}, newer than this machine's openvino {now}; "
                "upgrade openvino or re-export it here with `zoo export --force`")

    def _check_runs_here(self, precision: str, device: str) -> None:
        self.check_supported(precision, device)
        reason = self.unavailable(device)
        if reason:
            raise BackendUnavailableError(f"backend {self.name} cannot run on {device} here: {reason}")
        if precision == "bf16" and "BF16" not in _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            raise UnsupportedError("this CPU has no native bfloat16 (AVX512_BF16 or AMX), where OpenVINO would "
                                   "quietly compute in fp32; use --precision fp32 or int8")


_CORE: "openvino.Core | None" = None


def _core() -> "openvino.Core":
    """One OpenVINO Core per process: it loads the device plugins, which is not free."""
    global _CORE
    if _CORE is None:
        import openvino as ov

        _CORE = ov.Core()
    return _CORE


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


