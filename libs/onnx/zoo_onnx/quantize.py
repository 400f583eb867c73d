"""The graph-level steps of int8 that the backends quantizing an ONNX graph share.

ONNX Runtime's own int8 (`zoo_onnxruntime.quantize`) and TensorRT's calibrated Q/DQ
graph (`zoo_tensorrt.quantize`) are both written by ONNX Runtime's quantization tool,
with different settings; what they do alike lives here: `quant_pre_process` before
quantizing (shape inference and basic graph optimizations, e.g. BatchNorm folded into
Conv, as https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html
advises), the calibration batches as the tool's data reader, the attention MatMuls that
stay float, the count of int8 ops that shows what was quantized, and the tool's errors
as one `ExportError`.

`onnxruntime.quantization` is imported inside the functions: onnxruntime and
onnxruntime-gpu both ship it and cannot be installed together, so the environment
provides one of them (zoo-onnxruntime's `cpu` or `gpu` extra) and this package names
neither.
"""

from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from zoo.calibration import calibration_batches
from zoo.errors import ExportError
from zoo.spec import ModelSpec

if TYPE_CHECKING:
    from onnxruntime.quantization import CalibrationDataReader

#: ops whose presence shows what was quantized (static: the Q/DQ pairs; dynamic: the
#: integer MatMuls, fused or not, or a transformer's block-quantized MatMulNBits).
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "ConvInteger", "QLinearConv",
                           "QLinearMatMul", "MatMulNBits"})


def pre_process(fp32: Path, out: Path) -> str:
    """`quant_pre_process`; its symbolic shape inference (which dynamic quantization of
    the MLPs needs) merges conflicting symbolic dims (`auto_merge`) rather than give up
    on the detector's in-graph decoding, and is skipped where it crashes (on MiniLM's
    attention), leaving ONNX's own shape inference."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        run_quietly(quant_pre_process, str(fp32), str(out), auto_merge=True)
        return "symbolic shape inference, onnx shape inference, basic graph optimizations"
    except ExportError as exc:
        run_quietly(quant_pre_process, str(fp32), str(out), skip_symbolic_shape=True)
        cause = exc.__cause__ or exc
        return (f"onnx shape inference, basic graph optimizations (symbolic shape inference failed: "
                f"{type(cause).__name__}: {_first_line(cause)})")


def calibration_reader(spec: ModelSpec, samples: int) -> "CalibrationDataReader":
    """The training-split batches every backend calibrates on (`zoo.calibration`), as the
    data reader `quantize_static` takes."""
    from onnxruntime.quantization import CalibrationDataReader

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration_batches(spec, samples=samples))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    return Batches()


def quantized_ops(path: Path) -> dict[str, int]:
    """How many of each int8 op the model at `path` has."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(sorted(collections.Counter(n.op_type for n in graph.node if n.op_type in QUANTIZED_OPS).items()))


def computed_weight_nodes(path: Path, op_types: tuple[str, ...] = ("MatMul", "Gemm")) -> list[str]:
    """Nodes of `op_types` whose second input is computed rather than a constant weight:
    attention's activation x activation MatMuls (Q*K^T, P*V), which stay float. The
    tool's `MatMulConstBOnly` option does this in its QOperator and dynamic modes only,
    not in QDQ."""
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {i.name for i in graph.initializer}
    return [n.name for n in graph.node
            if n.op_type in op_types and (len(n.input) < 2 or n.input[1] not in constants)]


def run_quietly(fn, *args, **kwargs) -> None:
    """Run a quantization step; its advice is logged at INFO/WARNING by the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the tool raises bare Exceptions, ValueErrors and onnx errors alike
        raise ExportError(f"onnxruntime could not quantize the model: {type(exc).__name__}: "
                          f"{_first_line(exc)}"[:500]) from exc
    finally:
        root.setLevel(level)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
