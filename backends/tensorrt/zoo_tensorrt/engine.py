"""Building a TensorRT engine (a serialized "plan") from a verified ONNX file.

The steps are the TensorRT Python API's, as NVIDIA's samples
(`samples/python/*/build_engine.py`) and the API reference describe them:
`trt.Builder` -> `create_network(flags)` -> `trt.OnnxParser.parse_from_file` ->
`create_builder_config` (workspace pool limit, TF32 off for fp32, one optimization
profile, timing cache) -> `build_serialized_network`.

One build path for TensorRT 10.x and 11.x: the network is always strongly typed, and no
precision flag is set. Every tensor has the type the ONNX graph gives it, so the
precision is chosen by the graph the backend hands over: the fp32 export as is, the
fp16 graph (`zoo_onnx.fp16`: ONNX Runtime's converter, float32 I/O, numerically sensitive
ops kept fp32) for fp16, the calibrated Q/DQ graph (`quantize.qdq_for_tensorrt`) for
int8 ("Use explicit quantization with Strong Typing. Precision-control build flags are
not required and should not be specified", TensorRT docs, Explicit Quantization).
`build` checks that the parsed network holds what its precision promises (float16
tensors for fp16, Q/DQ layers for int8, neither for fp32), so an engine is never named
for a precision it does not run in. The calls that differ between the majors are in
`api`.

Nothing here runs without a GPU and TensorRT; it has not yet run on one (see the
plugin's README).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from zoo.errors import UnsupportedError, ZooError
from zoo_onnx.engines import Profile

from . import api, library

#: workspace pool cap. TensorRT's default is all device memory; a cap keeps a build from
#: starving other processes on a shared GPU, and the zoo's models need far less. Tactics
#: that need more are skipped, not failed.
DEFAULT_WORKSPACE = 1 << 30


def timing_cache_path() -> Path:
    """~/.cache/zoo/tensorrt/timing.cache (or under $XDG_CACHE_HOME): shared by every build."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "zoo" / "tensorrt" / "timing.cache"


class EngineBuilder:
    """One network parsed from ONNX and built into one serialized engine."""

    def __init__(self) -> None:
        self._trt = trt = library.import_tensorrt()
        api.check_version(trt)
        self.builder = trt.Builder(library.logger())
        # Networks are explicit-batch on both majors; strongly typed by `api` (10.x opts in,
        # 11.x has no other kind). A network's typing is fixed when it is created.
        self.network = self.builder.create_network(api.strongly_typed_flags(trt))
        self.parser = trt.OnnxParser(self.network, library.logger())

    def supports_operator(self, op_type: str) -> bool:
        """The installed parser's own answer (it may know operators newer than our table)."""
        return bool(self.parser.supports_operator(op_type))

    def parse(self, onnx_path: Path) -> None:
        """Fill the network from the ONNX file; UnsupportedError lists the parser's errors."""
        library.clear_errors()
        # parse_from_file rather than parse(bytes): it finds weights stored beside the
        # graph (ONNX external data, used past 2 GB) relative to the file.
        if not self.parser.parse_from_file(str(onnx_path)):
            errors = [_parser_error(self.parser.get_error(i)) for i in range(self.parser.num_errors)]
            detail = errors or library.recent_errors() or ["no detail was given"]
            raise UnsupportedError("TensorRT's ONNX parser rejected the graph:\n  " + "\n  ".join(detail))

    def build(self, profile: Profile, precision: str, *, workspace: int = DEFAULT_WORKSPACE,
              timing_cache: Path | None = None) -> bytes:
        """Build and serialize the engine for `profile`; `precision` ("fp32" | "fp16" | "int8")
        names what the parsed graph must hold (the module docstring), no flag sets it."""
        trt = self._trt
        if precision not in ("fp32", "fp16", "int8"):
            raise UnsupportedError(f"the TensorRT backend builds fp32, fp16 or int8 engines, not {precision}")
        config = self.builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
        quantized, half = self._has_quantize_layers(), self._has_float16_tensors()
        if precision == "int8" and not quantized:
            raise UnsupportedError("the int8 network has no Quantize/Dequantize layers, so TensorRT would "
                                   "build it in float; build from the Q/DQ graph of quantize.qdq_for_tensorrt")
        if precision == "fp16" and not half:
            raise UnsupportedError("the fp16 network has no float16 tensor, so TensorRT would build it in "
                                   "fp32; build from the fp16 graph (zoo_onnx.export.export_onnx(..., "
                                   "precision='fp16'))")
        if precision == "fp32":
            if quantized or half:
                raise UnsupportedError(f"the fp32 network holds {'Q/DQ layers' if quantized else 'float16 tensors'}; "
                                       f"build fp32 from the fp32 ONNX export")
            # TF32 is on by default: inner products on 10-bit mantissas, off from PyTorch's
            # fp32 by more than the spec's fp32 tolerance.
            api.ieee_fp32(trt, config)
        config.add_optimization_profile(self._optimization_profile(profile))
        cache = _attach_timing_cache(config, timing_cache) if timing_cache else None
        library.clear_errors()
        plan = self.builder.build_serialized_network(self.network, config)
        if plan is None:  # failures are reported through the logger only
            detail = library.recent_errors() or ["no detail was given; run with logging at DEBUG"]
            raise UnsupportedError("TensorRT could not build the engine:\n  " + "\n  ".join(detail))
        if cache is not None and timing_cache is not None:
            try:
                _save_timing_cache(cache, timing_cache)
            except OSError as exc:  # a read-only home must not fail a good build
                library.log.warning("could not save the TensorRT timing cache to %s: %s", timing_cache, exc)
        return bytes(memoryview(plan))

    def _has_quantize_layers(self) -> bool:
        """Whether the parsed network has a Quantize or Dequantize layer (`ILayer.type`)."""
        kinds = {self._trt.LayerType.QUANTIZE, self._trt.LayerType.DEQUANTIZE}
        return any(self.network.get_layer(i).type in kinds for i in range(self.network.num_layers))

    def _has_float16_tensors(self) -> bool:
        """Whether a layer of the parsed network outputs float16 (`ITensor.dtype`, which a
        strongly typed network infers from the graph's types when it is parsed)."""
        for i in range(self.network.num_layers):
            layer = self.network.get_layer(i)
            if any(layer.get_output(j).dtype == self._trt.float16 for j in range(layer.num_outputs)):
                return True
        return False

    def _optimization_profile(self, profile: Profile) -> Any:
        """Profile 0: the spec's min/opt/max for every network input, checked against the graph."""
        opt_profile = self.builder.create_optimization_profile()
        for i in range(self.network.num_inputs):
            tensor = self.network.get_input(i)
            if tensor.name not in profile:
                raise ZooError(f"the ONNX graph has an input {tensor.name!r} the model spec does not "
                               f"declare (spec inputs: {', '.join(profile)})")
            r = profile[tensor.name]
            graph_shape = tuple(tensor.shape)
            if len(graph_shape) != len(r.min):
                raise ZooError(f"input {tensor.name!r} has rank {len(graph_shape)} in the ONNX graph but "
                               f"{len(r.min)} in the model spec")
            for axis, (dim, lo, hi) in enumerate(zip(graph_shape, r.min, r.max)):
                # -1 marks a dynamic dimension; a fixed one must be what the spec says.
                if dim >= 0 and not lo == dim == hi:
                    raise ZooError(
                        f"input {tensor.name!r} axis {axis} is fixed at {dim} in the ONNX graph but the "
                        f"spec declares {lo}..{hi}; the ONNX export lost a dynamic axis")
            opt_profile.set_shape(tensor.name, r.min, r.opt, r.max)
        return opt_profile


def _parser_error(error: Any) -> str:
    """One parser error as `node 'name' (Op): description`."""
    try:
        name, op, desc = error.node_name(), error.node_operator(), error.desc()
    except AttributeError:  # older bindings: the error's own string
        return str(error)
    return f"node {name!r} ({op}): {desc}" if name or op else str(desc)


def _attach_timing_cache(config: Any, path: Path) -> Any:
    """Load the persistent timing cache into `config`; start empty if it does not fit.

    Timing results are "specific to the targeted device, CUDA, TensorRT versions, and
    BuilderConfig parameters" (TensorRT, Optimizing Builder Performance): a cache written
    on another GPU or TensorRT fails its verification header, and is then replaced
    rather than forced in with ignore_mismatch.
    """
    try:
        data = path.read_bytes()
    except OSError:  # none yet (or unreadable): a new, empty cache
        data = b""
    cache = config.create_timing_cache(data)
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        library.log.info("timing cache %s was written by another TensorRT or GPU; starting a new one", path)
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    return cache  # "The cache must not be destroyed until after the engine is built."


def _save_timing_cache(cache: Any, path: Path) -> None:
    """Write the cache, grown by this build's timings, atomically (builds may run at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".timing-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(cache.serialize()))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
