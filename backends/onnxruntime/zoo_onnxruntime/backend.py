"""The ONNX Runtime backend: an ONNX file run by the CPU or CUDA execution provider.

ONNX Runtime quietly runs a session on the CPU when the execution provider it was asked
for cannot start (missing CUDA libraries, a CPU-only wheel). The zoo contract forbids
silent fallbacks, so `load` checks which provider the session actually got and refuses
otherwise. onnxruntime is imported only inside methods: registering this backend must
work, and say what is missing, on a machine without it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from zoo.backend import Availability, Backend, device_kind, release, serving, serving_parameters
from zoo.errors import ArtifactError, BackendUnavailableError, StaleArtifactError, first_line

if TYPE_CHECKING:
    import onnxruntime
    import torch

    from zoo.spec import ModelSpec

    from .runner import OnnxRuntimeRunner

NOT_INSTALLED = "onnxruntime is not installed (pip install 'zoo-onnxruntime[cpu]' or '[gpu]')"


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    description = "ONNX (torch.onnx dynamo exporter) run by ONNX Runtime's CPU or CUDA execution provider"
    # fp16 only on CUDA: ONNX Runtime's CPU kernels compute most fp16 ops by casting to fp32.
    # int8 only on CPU: its int8 kernels (VNNI/AVX2) are CPU kernels; on CUDA int8 is
    # TensorRT's business.
    precisions: ClassVar[Mapping[str, tuple[str, ...]]] = {"cpu": ("fp32", "int8"), "cuda": ("fp32", "fp16")}
    filename = "model.onnx"
    triton: ClassVar[Mapping[str, str]] = {"platform": "onnxruntime_onnx"}
    #: the execution provider that must run the graph, per device type.
    provider_names: ClassVar[Mapping[str, str]] = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
    parameters: ClassVar[tuple[str, ...]] = ("enable_mem_arena", "enable_mem_pattern",
                                             "memory.enable_memory_arena_shrinkage")  # `serving_options`

    def versions(self) -> dict[str, str]:
        ort = _onnxruntime()
        return {"onnxruntime": ort.__version__} if ort is not None else {}

    def probe(self, device: str) -> Availability:
        try:
            reason = self.unavailable(device)
        except Exception as exc:  # a broken install must not crash `zoo backends`
            reason = f"onnxruntime failed to load: {exc}"
        return Availability(reason is None, reason or "")

    def unavailable(self, device: str) -> str | None:
        """Why this backend cannot run on `device` here, or None when it can."""
        kind = device_kind(device)
        if kind not in self.precisions:
            return f"{self.name} runs on {', '.join(self.devices)}, not {device}"
        ort = _onnxruntime()
        if ort is None:
            return NOT_INSTALLED
        provider = self.provider_names[kind]
        if provider not in ort.get_available_providers():
            return f"the installed onnxruntime has no {provider} (install onnxruntime-gpu instead of onnxruntime)"
        if kind == "cuda":
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device (torch.cuda.is_available() is False)"
            index = _index(device)
            if index >= torch.cuda.device_count():
                return f"no CUDA device {index} (this machine has {torch.cuda.device_count()})"
            return cuda_major_mismatch(ort_cuda_version(), torch.version.cuda, torch.__version__)
        return None

    def export(self, module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
               path: Path, precision: str, device: str) -> dict[str, Any]:
        from zoo.errors import signals_held

        with signals_held():  # a SIGTERM inside onnx's native initialization crashed the process
            from zoo_onnx.export import export_onnx

        self.check_supported(precision, device_kind(device))
        if precision != "int8":
            return export_onnx(module, spec, example, path, precision=precision)
        from .quantize import quantize_onnx

        # The fp32 graph is an intermediate: only the quantized file enters the artifact.
        with tempfile.TemporaryDirectory(prefix="zoo-onnx-fp32-") as tmp:
            fp32 = Path(tmp) / path.name
            info = export_onnx(module, spec, example, fp32, precision="fp32")
            info["quantization"] = quantize_onnx(fp32, path, spec, spec.quantization)
        return info

    def load(self, path: Path, spec: "ModelSpec", precision: str, device: str,
             threads: int | None = None, info: Mapping[str, Any] | None = None) -> "OnnxRuntimeRunner":
        from .runner import OnnxRuntimeRunner

        self.check_supported(precision, device_kind(device))
        reason = self.unavailable(device)
        if reason:
            raise BackendUnavailableError(f"backend {self.name} cannot run on {device} here: {reason}")
        stream = None
        if device_kind(device) == "cuda":
            import torch

            # The runner's own torch stream, handed to ONNX Runtime as its compute stream
            # (see OnnxRuntimeRunner). Not torch's default stream: its handle is 0, which
            # ONNX Runtime reads as "no stream given" (onnxruntime PR #19229 and its ROCm
            # follow-up).
            stream = torch.cuda.Stream(device=_index(device))  # the device the provider is given
        session = self.session(Path(path), spec, precision, device, threads, info=info,
                               stream=stream.cuda_stream if stream is not None else None)
        run_options = serving_options(None, serving_parameters()) if serving() else None
        return OnnxRuntimeRunner(session, spec, device, stream=stream, run_options=run_options)

    def session(self, path: Path, spec: "ModelSpec", precision: str, device: str,
                threads: int | None = None, *, info: Mapping[str, Any] | None = None,
                stream: int | None = None) -> "onnxruntime.InferenceSession":
        """An InferenceSession whose first provider is the one asked for, or an error.

        `stream` is the CUDA stream handle the providers compute on (None: their own).
        """
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        if serving():  # its threads spin within a run but stop when it returns, leaving the cores to the front end
            options.add_session_config_entry("session.force_spinning_stop", "1")
            serving_options(options, serving_parameters())
        providers = self.providers(path, spec, precision, device, info=info, stream=stream)
        wanted = providers[0][0]
        if wanted not in ort.get_available_providers():
            raise BackendUnavailableError(f"the installed onnxruntime has no {wanted}")
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers,
                                           disabled_optimizers=_disabled_optimizers(precision))
        except Exception as exc:  # onnxruntime's own exception types are not public API
            raise ArtifactError(f"onnxruntime cannot load {path}: {first_line(exc)}") from exc
        got = session.get_providers()[0]
        if got != wanted:
            raise BackendUnavailableError(
                f"onnxruntime could not start {wanted} and would have run on {got} instead; "
                "check that the CUDA libraries it needs (and TensorRT, for onnxruntime-trt) are installed "
                "and visible (onnxruntime logs the missing library above)")
        return session

    def providers(self, path: Path, spec: "ModelSpec", precision: str, device: str, *,
                  info: Mapping[str, Any] | None = None,
                  stream: int | None = None) -> list[tuple[str, dict[str, Any]]]:
        """The execution providers for a session, most preferred first, with their options.

        Only the one provider: nodes it has no kernel for still run on ONNX Runtime's
        implicit CPU provider, but the session as a whole never lands on the wrong one.
        `stream` becomes the CUDA provider's `user_compute_stream`: "Defines the compute
        stream for the inference to run on" (CUDA Execution Provider docs).
        """
        kind = device_kind(device)
        options = cuda_options(_index(device), stream) if kind == "cuda" else {}
        return [(self.provider_names[kind], options)]

    def check_compatible(self, recorded: Mapping[str, str], artifact: str) -> None:
        """Accept an artifact from this or an older onnxruntime; refuse one from a newer.

        ONNX Runtime reads every ONNX opset it was released with and all older ones, so a
        newer runtime loads an older export; an older runtime may not know the opset or
        the ops a newer exporter/converter emitted.
        """
        current = self.versions()
        for lib, version in recorded.items():
            now = current.get(lib)
            if now is None:
                raise BackendUnavailableError(f"artifact {artifact} needs {lib}: {NOT_INSTALLED}")
            if release(now) < release(version):
                raise StaleArtifactError(
                    f"artifact {artifact} was built with {lib} {version}, newer than this machine's {lib} {now}; "
                    f"upgrade {lib} or re-export it here with `zoo export --force`")


#: the model configuration parameters of Triton's ONNX Runtime backend that set how a
#: session holds memory (onnxruntime_backend's README, "Model Config Options"), honoured by
#: `zoo serve` and zoo's Triton Python-backend model alike: the arena keeps the largest
#: working set a request ever needed (docs/serving.md, "Memory")
ARENA, PATTERN, SHRINKAGE = OnnxRuntimeBackend.parameters
_BOOLEANS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}  # Triton's ParseBoolValue


def serving_options(options: "onnxruntime.SessionOptions | None",
                    parameters: Mapping[str, str]) -> "onnxruntime.RunOptions | None":
    """Apply the served model's `parameters` to its session `options` (when given), and
    return the run options they ask for (None: ONNX Runtime's defaults). A value ONNX
    Runtime would misread is an error naming the key."""
    import onnxruntime as ort

    flags = {}
    for key in (ARENA, PATTERN):
        if key in parameters:
            flags[key] = _BOOLEANS.get(parameters[key].strip().lower())
            if flags[key] is None:
                raise ArtifactError(f"config.pbtxt parameter {key} must be 1 or 0 (or true/false), "
                                    f"not {parameters[key][:40]!r}")
    shrinkage = parameters.get(SHRINKAGE, "")
    if shrinkage and not re.fullmatch(r"(cpu|gpu):\d+(;(cpu|gpu):\d+)*", shrinkage):
        raise ArtifactError(f"config.pbtxt parameter {SHRINKAGE} must list devices as cpu:0;gpu:0, "
                            f"not {shrinkage[:40]!r}")
    if "cpu" in shrinkage and flags.get(ARENA) is False:
        raise ArtifactError(f"config.pbtxt parameter {SHRINKAGE} shrinks the CPU arena, which {ARENA} 0 turns off")
    if options is not None:
        if ARENA in flags:
            options.enable_cpu_mem_arena = flags[ARENA]
        if PATTERN in flags:
            options.enable_mem_pattern = flags[PATTERN]
    if not shrinkage:
        return None
    run = ort.RunOptions()
    run.add_run_config_entry(SHRINKAGE, shrinkage)
    return run


def _onnxruntime() -> "onnxruntime | None":
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def cuda_options(index: int, stream: int | None = None) -> dict[str, Any]:
    """The CUDA provider's options: its device, no TF32, and the compute stream if given.

    The provider runs float32 GEMMs and convolutions in TF32 unless told not to
    (`use_tf32` "By default, enable TF32", CUDAExecutionProviderInfo): 10-bit mantissas,
    off PyTorch fp32 by more than an fp32 tolerance. An fp32 artifact computes in fp32,
    as the native TensorRT backend's engines do (BuilderFlag.TF32 cleared); an fp16
    graph has no float32 GEMM for it to speed up.
    """
    options: dict[str, Any] = {"device_id": index, "use_tf32": False}
    if stream:
        options["user_compute_stream"] = str(stream)
    return options


def _disabled_optimizers(precision: str) -> list[str] | None:
    """Graph optimizers to skip for `precision`.

    onnxruntime 1.31's NchwcTransformer, a CPU-only layout pass for fp32 convolutions,
    crashes the process (SIGSEGV) at session creation on the float16 GRU graph
    (gru.pydoc, a Transpose feeding a Scan); an fp16 graph has nothing for it to do.
    """
    return ["NchwcTransformer"] if precision == "fp16" else None


def ort_cuda_version() -> str | None:
    """The CUDA version the installed onnxruntime-gpu was built for ("13.0"), as its own
    start-up check reads it (`onnxruntime.capi.build_and_package_info.cuda_version`, which
    CPU builds do not have); None when it is not recorded."""
    try:
        from onnxruntime.capi import build_and_package_info as info
    except ImportError:
        return None
    return getattr(info, "cuda_version", None) or None


def cuda_major_mismatch(ort_cuda: str | None, torch_cuda: str | None, torch_version: str = "") -> str | None:
    """Why ONNX Runtime's CUDA provider cannot load next to this torch, or None.

    onnxruntime-gpu links one CUDA major's libraries (libcudart.so.12 or .so.13, cuBLAS,
    cuDNN), and in a pip environment those come from the nvidia-* wheels torch brings.
    When the majors differ the provider's library fails to load and ONNX Runtime falls
    back to the CPU provider with only a logged error (issue 17, finding 4), so the
    mismatch is named here instead. Unknown versions are not judged."""
    if not ort_cuda or not torch_cuda:
        return None
    ort_major, torch_major = ort_cuda.split(".")[0], torch_cuda.split(".")[0]
    if ort_major == torch_major:
        return None
    return (f"onnxruntime-gpu is built for CUDA {ort_cuda} but torch {torch_version} brings CUDA {torch_cuda} "
            f"libraries, so ONNX Runtime's CUDA provider would fail to load (and fall back to the CPU); "
            f"install the onnxruntime-gpu build for CUDA {torch_major} or a torch build for CUDA {ort_major}")


def _index(device: str) -> int:
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


