"""The same ONNX file run by ONNX Runtime's TensorRT execution provider.

TensorRT compiles the graph into an engine for this GPU, the shape ranges of one
optimization profile and one precision; ONNX Runtime keeps that engine in a cache
directory. The directory is named by a hash of everything the engine depends on (model
file, precision, onnxruntime and TensorRT versions, GPU, shape profile), so a changed
input never meets a stale engine: it gets a fresh directory and a fresh build.
Nodes TensorRT cannot compile run on the CUDA execution provider listed after it.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from .backend import OnnxRuntimeBackend, _index, _kind

if TYPE_CHECKING:
    import torch

    from zoo.spec import ModelSpec

#: sonames of the TensorRT runtime that onnxruntime-gpu builds link against (10.x, 8.x).
_NVINFER = ("libnvinfer.so.10", "libnvinfer.so.8")


class OnnxRuntimeTensorRTBackend(OnnxRuntimeBackend):
    name = "onnxruntime-trt"
    description = "ONNX run by ONNX Runtime's TensorRT execution provider (CUDA provider for the rest)"
    precisions: ClassVar[Mapping[str, tuple[str, ...]]] = {"cuda": ("fp32", "fp16")}
    provider_names: ClassVar[Mapping[str, str]] = {"cuda": "TensorrtExecutionProvider"}

    def unavailable(self, device: str) -> str | None:
        reason = super().unavailable(device)
        if reason is None and not load_tensorrt_libraries():
            reason = ("the TensorRT libraries (libnvinfer) are not installed or not on the library path "
                      "(pip install tensorrt)")
        return reason

    def export(self, module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
               path: Path, precision: str, device: str) -> dict[str, Any]:
        from .export import export_onnx

        self.check_supported(precision, _kind(device))
        # The graph stays fp32 for every precision: TensorRT lowers it itself
        # (trt_fp16_enable) and keeps layers in fp32 where fp16 would lose accuracy,
        # a choice a graph converted to fp16 beforehand would take away from it.
        return {**export_onnx(module, spec, example, path, precision="fp32"), "graph_precision": "fp32"}

    def providers(self, path: Path, spec: "ModelSpec", precision: str,
                  device: str) -> list[tuple[str, dict[str, Any]]]:
        load_tensorrt_libraries()
        index = _index(device)
        profile = profile_shapes(spec)
        cache = engine_cache_dir(path, precision, device, profile)
        cache.mkdir(parents=True, exist_ok=True)  # the provider writes into it but does not create it
        tensorrt = {
            "device_id": index,
            "trt_fp16_enable": precision == "fp16",
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
            **profile,
        }
        return [("TensorrtExecutionProvider", tensorrt), ("CUDAExecutionProvider", {"device_id": index})]


def profile_shapes(spec: "ModelSpec") -> dict[str, str]:
    """The TensorRT optimization profile from `spec.axes`, in the provider's option format.

    E.g. {"trt_profile_min_shapes": "image:1x1x8x8", ...}; only inputs with a dynamic
    axis are named, as the provider expects. Without an explicit profile TensorRT would
    build for the first shapes it sees and rebuild whenever a larger one arrives.
    """
    dynamic = [t for t in spec.inputs if t.dynamic_axes]
    if not dynamic:
        return {}
    out = {}
    for point in ("min", "opt", "max"):
        shapes = []
        for t in dynamic:
            dims = [str(getattr(spec.axes[d], point)) if isinstance(d, str) else str(d) for d in t.shape]
            shapes.append(f"{t.name}:{'x'.join(dims)}")
        out[f"trt_profile_{point}_shapes"] = ",".join(shapes)
    return out


def engine_cache_dir(path: Path, precision: str, device: str, profile: Mapping[str, str]) -> Path:
    """~/.cache/zoo/ort-trt/<key>, the key a sha256 over what the engine depends on."""
    import onnxruntime
    import torch

    index = _index(device)
    h = hashlib.sha256()
    h.update(_sha256_file(path).encode())
    h.update(b"|" + precision.encode())
    h.update(b"|onnxruntime " + onnxruntime.__version__.encode())
    h.update(b"|tensorrt " + _tensorrt_version().encode())
    h.update(b"|" + torch.cuda.get_device_name(index).encode())
    h.update(b"|sm %d.%d" % torch.cuda.get_device_capability(index))
    h.update(b"|" + repr(sorted(profile.items())).encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "zoo" / "ort-trt" / h.hexdigest()[:32]


def load_tensorrt_libraries() -> bool:
    """Whether the TensorRT runtime library is loaded or loadable into this process.

    The TensorRT provider dlopens libnvinfer by soname. The `tensorrt` wheel keeps it in
    site-packages, off the library path; importing the wheel loads it into the process,
    where the provider's dlopen then finds it.
    """
    try:
        importlib.import_module("tensorrt")
        return True
    except Exception:  # not installed, or installed for another CUDA: try the system library
        pass
    if os.name != "posix":
        return True  # Windows finds nvinfer.dll on PATH; let session creation report it
    for soname in _NVINFER:
        try:
            ctypes.CDLL(soname)
            return True
        except OSError:
            continue
    return False


def _tensorrt_version() -> str:
    try:
        return importlib.import_module("tensorrt").__version__
    except Exception:
        pass
    for soname in _NVINFER:  # a system TensorRT: ask the library itself (e.g. 100900 for 10.9.0)
        try:
            return str(ctypes.CDLL(soname).getInferLibVersion())
        except (OSError, AttributeError):
            continue
    return "unknown"


def _sha256_file(path: Path) -> str:
    """The model file and, for models over 2 GiB, its external weights file."""
    h = hashlib.sha256()
    for part in (path, path.with_name(f"{path.name}.data")):
        if part.exists():
            with open(part, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()
