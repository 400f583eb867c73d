"""int8 for TensorRT by explicit quantization: a Q/DQ ONNX graph calibrated on the model's data.

TensorRT builds an int8 engine from QuantizeLinear/DequantizeLinear (Q/DQ) nodes in the
ONNX graph ("When TensorRT detects Q/DQ layers in a network, it builds an engine using
explicit quantization processing logic"); its own calibrators (implicit quantization)
are deprecated since TensorRT 10.1 and gone in 11. The Q/DQ graph is written here, on
the CPU, by ONNX Runtime's `quantize_static`, calibrated on `zoo.calibration`'s batches,
which every backend's int8 uses, shaped by what TensorRT takes and recommends
(TensorRT docs, "Working with Quantized Types" and its "Explicit Quantization" page,
https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html):

- Symmetric int8 activations and weights, zero point 0: "TensorRT employs a symmetric
  quantization scheme", and a Q/DQ layer's "zeroPt must only contain zero-valued
  coefficients, because only symmetric quantization is supported" (TensorRT API,
  IQuantizeLayer/IDequantizeLayer). Activations are scaled per tensor (scalar scales).
- Weights per output channel, stored as int8 behind a DequantizeLinear ("When using
  pre-quantized weights, an IDequantizeLayer is required between the weights and the
  linear operator that uses them").
- Q/DQ only on the inputs of the weighted operations (Conv, ConvTranspose, Gemm, MatMul):
  the Q/DQ placement recommendations say to quantize all inputs of weighted operations
  and, by default, not their outputs; TensorRT then fuses each DQ -> Conv (-> BN -> ReLU)
  -> Q into one int8 kernel. Only ops whose weight is a constant count: MatMuls between
  two activations (attention's Q*K^T and P*V) stay float, as in ONNX Runtime's own int8
  of the transformers (its `MatMulConstBOnly` option is honoured by its QOperator and
  dynamic modes but not by QDQ, so those nodes are excluded by name here).
  ONNX Runtime quantizes a tensor once for all of its readers, so a residual Add that
  reads a convolution's input reads the same DQ; that follows the guide's advice for
  skip connections (with the residual input quantized, TensorRT fuses the Add into the
  convolution with an int8 output instead of stopping in float).
- Biases stay float (`QuantizeBias` off): TensorRT takes the bias of its int8 kernels
  in float and has no int32 bias DequantizeLinear.

`quant_pre_process` runs first, as for ONNX Runtime's own int8 (BatchNorm folded into
Conv, shape inference; the steps both share are `zoo_onnx.quantize`'s); the settings and
the op counts go into the manifest.
"""

from __future__ import annotations

import collections
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import onnx

from zoo.calibration import DEFAULT_SAMPLES, calibration_rows
from zoo.errors import ExportError
from zoo.spec import ModelSpec
from zoo_onnx.quantize import calibration_reader, computed_weight_nodes, pre_process, quantized_ops, run_quietly

#: ONNX ops with weights: the only ones whose inputs get Q/DQ.
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")

#: what `qdq_for_tensorrt` runs with, recorded in the manifest with the op counts.
SETTINGS: Mapping[str, Any] = {
    "method": "static", "format": "QDQ", "activations": "QInt8", "weights": "QInt8", "symmetric": True,
    "per_channel": True, "op_types": list(WEIGHTED_OPS), "constant_weights_only": True, "quantize_bias": False,
    "calibration": "MinMax", "calibration_samples": DEFAULT_SAMPLES,
}


def qdq_for_tensorrt(fp32_onnx: Path, out: Path, spec: ModelSpec) -> dict[str, Any]:
    """Write `fp32_onnx` with calibrated int8 Q/DQ at `out`; returns what was done.

    Raises ExportError when ONNX Runtime fails, or when the graph has no weighted op to
    quantize (the engine would be an fp32 one named int8).
    """
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-tensorrt-qdq-") as tmp:
        pre = Path(tmp) / "preprocessed.onnx"
        preprocess = pre_process(Path(fp32_onnx), pre)
        run_quietly(_quantize, pre, Path(out), spec)
    seconds = time.perf_counter() - started
    ops = quantized_ops(Path(out))
    if not ops:
        raise ExportError(f"int8 quantization for TensorRT left model {spec.name} without a single Q/DQ node: its "
                          f"graph has none of the weighted ops {', '.join(WEIGHTED_OPS)} (with a constant "
                          f"weight) whose inputs TensorRT runs in int8; build it in fp16 or fp32 instead")
    return {**SETTINGS, "calibration_samples": calibration_rows(spec, SETTINGS["calibration_samples"]),
            "preprocess": preprocess, "quantized_ops": ops, "weighted_ops": weighted_ops(Path(out)),
            "seconds": round(seconds, 3)}


def _quantize(model: Path, out: Path, spec: ModelSpec) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        str(model), str(out), calibration_reader(spec, SETTINGS["calibration_samples"]), quant_format=QuantFormat.QDQ,
        activation_type=QuantType[SETTINGS["activations"]], weight_type=QuantType[SETTINGS["weights"]],
        per_channel=SETTINGS["per_channel"], op_types_to_quantize=list(SETTINGS["op_types"]),
        nodes_to_exclude=computed_weight_nodes(model, WEIGHTED_OPS),
        calibrate_method=CalibrationMethod[SETTINGS["calibration"]],
        extra_options={
            "ActivationSymmetric": SETTINGS["symmetric"], "WeightSymmetric": SETTINGS["symmetric"],
            "QuantizeBias": SETTINGS["quantize_bias"], "OpTypesToExcludeOutputQuantization": list(SETTINGS["op_types"]),
        })


def weighted_ops(path: Path) -> dict[str, int]:
    """How many weighted ops of each type read a DequantizeLinear (run in int8 by TensorRT)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    counts = collections.Counter(n.op_type for n in graph.node
                                 if n.op_type in WEIGHTED_OPS and any(i in dequantized for i in n.input))
    return dict(sorted(counts.items()))
