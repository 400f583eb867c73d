"""`TensorRTBackend`: native TensorRT engines built from the verified ONNX export.

export: module -> the ONNX graph of the precision (`onnx_for_build`: zoo-onnx's verified
exporter; for fp16 its fp16 graph, the converter and block list ONNX Runtime CUDA's fp16
uses; for int8 the Q/DQ graph calibrated on the model's data, `quantize.qdq_for_tensorrt`)
-> CPU support check -> TensorRT build (a strongly typed network on TensorRT 10 and 11,
no precision flag, workspace cap, the spec's optimization profile, persistent timing
cache) -> `model.plan`, with the engine's provenance returned for the manifest. The
provenance hashes the graph that was built, so the fp16 conversion and the int8
calibration are part of the engine's key.
load: provenance checked against this machine (a stale engine is refused, never
loaded) -> deserialized once -> a runner on torch CUDA tensors.

Importing this module imports neither tensorrt nor onnx: the plugin registers and
`probe` explains itself on machines that have neither a GPU nor TensorRT.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import zoo
from zoo.errors import BackendUnavailableError, StaleArtifactError, UnsupportedError
from zoo_onnx import engines

from . import api, library, provenance

if TYPE_CHECKING:
    import torch

    from zoo.spec import ModelSpec

    from .runner import TensorRTRunner


class TensorRTBackend(zoo.Backend):
    """Serialized TensorRT engines (Triton's `tensorrt_plan`), CUDA only."""

    name: ClassVar[str] = "tensorrt"
    # int8 is explicit quantization (calibrated Q/DQ in the ONNX graph), see quantize.py.
    precisions: ClassVar[Mapping[str, tuple[str, ...]]] = {"cuda": ("fp32", "fp16", "int8")}
    filename: ClassVar[str] = "model.plan"
    triton: ClassVar[Mapping[str, str]] = {"platform": "tensorrt_plan"}
    description: ClassVar[str] = "NVIDIA TensorRT engines built from the ONNX export (CUDA)"
    compiles: ClassVar[bool] = True

    def __init__(self, workspace: int | None = None, timing_cache: Path | None = None) -> None:
        from .engine import DEFAULT_WORKSPACE, timing_cache_path  # no tensorrt import there

        self.workspace = workspace or DEFAULT_WORKSPACE
        self.timing_cache = timing_cache or timing_cache_path()

    def versions(self) -> dict[str, str]:
        version = library.version()
        return {"tensorrt": version} if version else {}

    def probe(self, device: str) -> zoo.Availability:
        try:
            if not device.startswith("cuda"):
                return zoo.Availability(False, "TensorRT runs on CUDA devices only")
            api.check_version(library.import_tensorrt())
            import torch

            if not torch.cuda.is_available():
                return zoo.Availability(False, "no CUDA device")
            index = torch.device(device).index
            if index is not None and index >= torch.cuda.device_count():
                return zoo.Availability(False, f"no CUDA device {device} ({torch.cuda.device_count()} found)")
            return zoo.Availability(True)
        except BackendUnavailableError as exc:
            return zoo.Availability(False, str(exc))
        except Exception as exc:  # noqa: BLE001 - probe never raises, it explains
            return zoo.Availability(False, f"TensorRT check failed: {exc}")

    def export(self, module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
               path: Path, precision: str, device: str) -> dict[str, Any]:
        self.check_supported(precision, device)
        if precision == "int8":
            _check_int8(spec)
        elif precision == "fp16":
            _check_fp16()
        self._require(device)
        import torch

        from . import support
        from .engine import EngineBuilder

        profile = engines.profile_for(spec)
        machine = provenance.current_machine(device)
        # The ONNX file is an intermediate: it lives beside the plan only for the build, in
        # the artifact's temporary directory, so an interrupted export leaves nothing behind.
        # TensorRT builds for the current CUDA device: make it the one asked for.
        with (tempfile.TemporaryDirectory(dir=path.parent, prefix=".tensorrt-onnx-") as tmp,
              torch.cuda.device(torch.device(device))):
            onnx_path, info = onnx_for_build(module, spec, example, Path(tmp), precision)
            builder = EngineBuilder()
            problems = support.check_onnx(onnx_path, builder.supports_operator)
            if problems:
                raise UnsupportedError(f"TensorRT cannot build {spec.name}:\n  - " + "\n  - ".join(problems))
            record = engines.engine_provenance(
                weights_sha256=provenance.weights_sha256(module), onnx_sha256=engines.onnx_sha256(onnx_path),
                precision=precision, profile=profile, machine=machine)
            started = time.perf_counter()
            builder.parse(onnx_path)
            plan = builder.build(profile, precision, workspace=self.workspace, timing_cache=self.timing_cache)
            build_seconds = time.perf_counter() - started
        path.write_bytes(plan)
        return {"build_seconds": round(build_seconds, 3), "provenance": record,
                "provenance_key": engines.provenance_key(record), **info}

    def load(self, path: Path, spec: "ModelSpec", precision: str, device: str,
             threads: int | None = None, info: Mapping[str, Any] | None = None) -> "TensorRTRunner":
        # `threads` caps CPU threads; TensorRT runs on the GPU, so there is nothing to cap.
        self.check_supported(precision, device)
        recorded = provenance.recorded_provenance(info, spec.name, precision, device)  # before the GPU
        self._require(device)
        from .runner import TensorRTRunner

        profile = engines.profile_for(spec)
        provenance.check_provenance(recorded, machine=provenance.current_machine(device),
                                    precision=precision, profile=profile, model=spec.name, device=device)
        return TensorRTRunner(Path(path).read_bytes(), spec, profile, device)

    def check_compatible(self, recorded: Mapping[str, str], artifact: str) -> None:
        """Require the exact TensorRT version: engines do not load across versions."""
        built, now = recorded.get("tensorrt"), self.versions().get("tensorrt")
        if built is not None and built != now:
            model, precision = _model_and_precision(artifact)
            raise StaleArtifactError(
                f"artifact {artifact} holds a TensorRT {built} engine but this machine has "
                f"{'TensorRT ' + now if now else 'no TensorRT'}; TensorRT engines run only with the exact "
                f"version that built them. Rebuild it with `{provenance.rebuild_command(model, precision)}`")

    def _require(self, device: str) -> None:
        availability = self.probe(device)
        if not availability.ok:
            raise BackendUnavailableError(f"backend tensorrt cannot run on {device}: {availability.reason}")


def onnx_for_build(module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
                   directory: Path, precision: str) -> tuple[Path, dict[str, Any]]:
    """Write the ONNX graph TensorRT builds `precision` from into `directory`; (its path, the
    export info). The engine is strongly typed, so the graph's types are the engine's:
    fp32 as exported, fp16 converted by `zoo_onnx.fp16` (float32 inputs and outputs, the
    same converter and block list as ONNX Runtime CUDA's fp16), int8 as calibrated Q/DQ
    on the fp32 graph. Runs on the CPU: nothing here needs TensorRT or a GPU."""
    try:
        from zoo_onnx.export import export_onnx  # the verified ONNX graph to build from
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the TensorRT backend builds from zoo-onnx's ONNX export, which fails to import: {exc}") from exc
    onnx_path = Path(directory) / "model.onnx"
    info: dict[str, Any] = {"onnx": export_onnx(module, spec, example, onnx_path,
                                                precision="fp16" if precision == "fp16" else "fp32")}
    if precision == "int8":  # the engine is built from (and keyed by) the Q/DQ graph
        from .quantize import qdq_for_tensorrt

        qdq_path = Path(directory) / "model.qdq.onnx"
        info["quantization"] = qdq_for_tensorrt(onnx_path, qdq_path, spec)
        onnx_path = qdq_path
    return onnx_path, info


def _check_fp16() -> None:
    """Refuse, before any work, an fp16 export without ONNX Runtime's fp16 converter.

    TensorRT takes fp16 from the graph's types (the only way on TensorRT 11, which has no
    FP16 builder flag), and the graph is converted by `onnxruntime.transformers.float16`,
    which both onnxruntime and onnxruntime-gpu ship. It was chosen over NVIDIA ModelOpt's
    AutoCast because the ONNX Runtime CUDA backend already converts with it, so both
    CUDA engines run the same fp16 graph with the same ops kept fp32, and the
    converter is tested on every registered model on the CPU; ModelOpt is a large
    package from NVIDIA's index that would add a second converter to keep in step.
    """
    try:
        importlib.import_module("onnxruntime.transformers.float16")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"TensorRT fp16 is built from an fp16 ONNX graph written by onnxruntime's converter, which fails "
            f"to import ({exc}); pip install onnxruntime (or onnxruntime-gpu)") from exc


def _check_int8(spec: "ModelSpec") -> None:
    """Refuse, before any work, an int8 export that TensorRT cannot build as the spec asks it.

    TensorRT's int8 is static: the activation scales are fixed by calibration, in the
    Q/DQ graph. A model whose plugin chose dynamic int8 (activations scaled per call)
    measured its int8 tolerance on that; static scales cost those models more (trained
    MiniLM's embedding cosine 0.97 against the 0.99 it needs, CartPole's actions 80%
    the same), so a static engine for them is built only when asked for by name.
    """
    spec.tolerance("int8")  # a model that states no int8 tolerance offers no int8
    if spec.quantization != "static":
        raise UnsupportedError(
            f"TensorRT runs int8 with static activation scales (calibrated Q/DQ), but model {spec.name} names "
            f"{spec.quantization} int8 (activations scaled per call); export it with `--quantization static` "
            f"to build a calibrated engine, which the export's checks then hold to the model's int8 "
            f"tolerance, or build fp16")
    try:
        importlib.import_module("onnxruntime.quantization")  # writes the Q/DQ graph (quantize.py)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"TensorRT int8 calibrates its Q/DQ graph with onnxruntime's quantization tool, which fails to "
            f"import ({exc}); pip install onnxruntime (or onnxruntime-gpu)") from exc


def _model_and_precision(artifact: str) -> tuple[str, str]:
    """(`resnet8.digits`, `fp16`) from `exports/resnet8.digits.tensorrt.fp16` (the repository layout);
    an int8 method in the name (`int8-static`, `zoo.artifact.artifact_name`) is left out: the
    rebuild command names TensorRT's only one."""
    name = Path(artifact).name
    head, sep, precision = name.rpartition(".tensorrt.")
    return (head, precision.partition("-")[0]) if sep and head else ("MODEL", "PRECISION")
