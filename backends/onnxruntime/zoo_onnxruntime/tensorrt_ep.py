"""The same ONNX file run by ONNX Runtime's TensorRT execution provider.

TensorRT compiles the graph into an engine for this GPU, one optimization profile and
one precision (fp16 on or off per artifact); ONNX Runtime keeps that engine, and
TensorRT's timing cache, in a cache directory. The directory is named by the engine's
provenance key: the record and key of the native `tensorrt` backend (`zoo_onnx.engines`:
weights and ONNX hashes, precision, shape profile, TensorRT version, GPU name, compute
capability) plus the onnxruntime version, whose TensorRT provider writes the cache
files. A changed fact never meets a stale engine: it gets a fresh directory and a fresh
build. The record is written into the directory as `provenance.json`, so a user can see
what a cache directory belongs to. Both TensorRT paths build the same optimization
profile (`zoo_onnx.engines.profile_for`). Nodes TensorRT cannot compile run on the CUDA
execution provider listed after it.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from zoo.backend import device_kind
from zoo.errors import UnsupportedError
from zoo.fsutil import atomic_write_text
from zoo_onnx.engines import Machine, Profile, engine_provenance, onnx_sha256, profile_for, provenance_key

from .backend import OnnxRuntimeBackend, _index, cuda_options

if TYPE_CHECKING:
    import torch

    from zoo.spec import ModelSpec

#: sonames of the TensorRT runtime that onnxruntime-gpu builds link against (10.x, 8.x).
_NVINFER = ("libnvinfer.so.10", "libnvinfer.so.8")
#: written into every engine cache directory: the record its name is the key of.
PROVENANCE_FILE = "provenance.json"


class OnnxRuntimeTensorRTBackend(OnnxRuntimeBackend):
    name = "onnxruntime-trt"
    description = "ONNX run by ONNX Runtime's TensorRT execution provider (CUDA provider for the rest)"
    #: fp16 only (issue 17, finding 2): TensorRT builds fp32 layers in TF32 by default
    #: (BuilderFlag.TF32: 10-bit mantissas) and the provider has no option that clears it,
    #: so its "fp32" would be held to a tolerance it cannot meet, or to a looser one under
    #: fp32's name. IEEE fp32 on a GPU: `tensorrt` (TF32 cleared) or `onnxruntime` (use_tf32 off).
    precisions: ClassVar[Mapping[str, tuple[str, ...]]] = {"cuda": ("fp16",)}
    provider_names: ClassVar[Mapping[str, str]] = {"cuda": "TensorrtExecutionProvider"}

    def check_supported(self, precision: str, device: str) -> None:
        if precision == "fp32" and device == "cuda":
            raise UnsupportedError(
                f"backend {self.name} does not offer fp32: ONNX Runtime's TensorRT provider builds fp32 "
                "layers in TF32 (TensorRT's default) and has no option to turn that off, so it cannot hold "
                "fp32's tolerance; for IEEE fp32 on a GPU use --backend tensorrt or --backend onnxruntime")
        super().check_supported(precision, device)

    def unavailable(self, device: str) -> str | None:
        reason = super().unavailable(device)
        if reason is None and not load_tensorrt_libraries():
            reason = ("the TensorRT libraries (libnvinfer) are not installed or not on the library path "
                      "(pip install tensorrt)")
        return reason

    def export(self, module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
               path: Path, precision: str, device: str) -> dict[str, Any]:
        from zoo.tensors import state_dict_sha256
        from zoo_onnx.export import export_onnx

        self.check_supported(precision, device_kind(device))
        # The graph stays fp32 for every precision: TensorRT lowers it itself
        # (trt_fp16_enable) and keeps layers in fp32 where fp16 would lose accuracy,
        # a choice a graph converted to fp16 beforehand would take away from it.
        # The weights hash is recorded for the engine cache's provenance (read back at load).
        return {**export_onnx(module, spec, example, path, precision="fp32"), "graph_precision": "fp32",
                "weights_sha256": state_dict_sha256(module.state_dict())}

    def providers(self, path: Path, spec: "ModelSpec", precision: str, device: str, *,
                  info: Mapping[str, Any] | None = None,
                  stream: int | None = None) -> list[tuple[str, dict[str, Any]]]:
        import onnxruntime

        load_tensorrt_libraries()
        index = _index(device)  # the provider's device_id: "cuda" is device 0 to it
        record = cache_provenance(
            weights_sha256=(info or {}).get("weights_sha256"), onnx_sha256=onnx_sha256(path),
            precision=precision, profile=profile_for(spec), machine=Machine.of(f"cuda:{index}", tensorrt_version()),
            onnxruntime=onnxruntime.__version__)
        return provider_options(spec, precision, index, engine_cache_dir(record), stream)


def cache_provenance(*, weights_sha256: str | None, onnx_sha256: str, precision: str, profile: Profile,
                     machine: Machine, onnxruntime: str) -> dict[str, Any]:
    """The native backend's engine provenance plus the onnxruntime version.

    `weights_sha256` is the manifest's weights hash, which the export recorded in the
    backend info; None where the runner is loaded without it (an ONNX file outside an
    artifact). The key stays exact either way: the weights are inside the ONNX file,
    whose hash is part of the record.
    """
    return {**engine_provenance(weights_sha256=weights_sha256, onnx_sha256=onnx_sha256, precision=precision,
                                profile=profile, machine=machine),
            "onnxruntime": onnxruntime}


def engine_cache_dir(record: Mapping[str, Any], root: Path | None = None) -> Path:
    """`<cache>/zoo/ort-trt/<provenance key>`, created, with `provenance.json` in it.

    The provider writes into the directory but does not create it. The record is
    written atomically (several processes may load the same artifact at once) and only
    when it is missing or differs, so a read-only cache that is complete still works.
    """
    base = Path(root) if root is not None else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = provenance_key(record)
    directory = base / "zoo" / "ort-trt" / key
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"provenance_key": key, "provenance": dict(record)}, indent=2, sort_keys=True) + "\n"
    written = directory / PROVENANCE_FILE
    if not written.is_file() or written.read_text() != text:
        atomic_write_text(written, text)
    return directory


def provider_options(spec: "ModelSpec", precision: str, index: int, cache: Path,
                     stream: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """TensorRT then CUDA, with the engine and timing caches in `cache`.

    `stream` (a CUDA stream handle) is the compute stream both providers run on, shared
    with torch (see `OnnxRuntimeRunner`). Both take it as `user_compute_stream` alone,
    which sets the `has_user_compute_stream` field itself ("It implicitly sets the
    has_user_compute_stream option", CUDA Execution Provider docs). That field is not a key
    the Python binding parses: onnxruntime_pybind_state.cc throws "Invalid TensorRT EP
    option" for any key it does not know, and the session then falls back to the next
    provider (tests/test_onnxruntime_gpu_paths.py holds these options to the keys it parses).
    """
    tensorrt: dict[str, Any] = {
        "device_id": index,
        "trt_fp16_enable": precision == "fp16",
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache),
        **profile_shapes(spec),
    }
    if stream:
        tensorrt["user_compute_stream"] = str(stream)
    return [("TensorrtExecutionProvider", tensorrt), ("CUDAExecutionProvider", cuda_options(index, stream))]


def profile_shapes(spec: "ModelSpec") -> dict[str, str]:
    """The optimization profile (`zoo_onnx.engines.profile_for`) in the provider's option format.

    E.g. {"trt_profile_min_shapes": "image:1x1x8x8", ...}; only inputs with a dynamic
    axis are named, as the provider expects. Without an explicit profile TensorRT would
    build for the first shapes it sees and rebuild whenever a larger one arrives.
    """
    profile = profile_for(spec)
    dynamic = [t.name for t in spec.inputs if t.dynamic_axes]
    if not dynamic:
        return {}
    return {f"trt_profile_{point}_shapes": ",".join(
        f"{name}:{'x'.join(str(d) for d in getattr(profile[name], point))}" for name in dynamic)
        for point in ("min", "opt", "max")}


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


def tensorrt_version() -> str:
    """The TensorRT version for the provenance: `tensorrt.__version__` where the wheel
    imports, as the native backend records it, so equal facts give equal keys; else the
    system library's own number."""
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
