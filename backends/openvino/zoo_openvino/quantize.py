"""int8 OpenVINO IR by NNCF, the post-training quantizer OpenVINO documents (its older
Post-training Optimization Tool was removed in 2024.0), by the method the spec names.

- "static" (CNNs): `nncf.quantize` inserts FakeQuantize nodes whose scales come from
  running calibration batches; the CPU plugin then runs convolutions and MatMuls on
  int8 kernels end to end. Graphs with attention get `ModelType.TRANSFORMER`, which
  keeps the parts that quantize badly (softmax, layer norm, the attention scores'
  additions) in float and smooths activation outliers first (SmoothQuant).
- "dynamic" (transformers, recurrent nets, MLPs): `nncf.compress_weights` stores the
  MatMul and embedding weights as int8, and the CPU plugin quantizes each activation
  per call in groups (`DYNAMIC_QUANTIZATION_GROUP_SIZE`, on by default for FullyConnected
  layers with compressed weights), so no fixed activation scale is needed.

See "Post-training Quantization" and "Weight Compression" in the NNCF documentation.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any, Iterator

from zoo.calibration import DEFAULT_SAMPLES, calibration_batches
from zoo.errors import ExportError, UnsupportedError
from zoo.spec import ModelSpec

if TYPE_CHECKING:
    import openvino


def quantize(model: "openvino.Model", spec: ModelSpec) -> tuple["openvino.Model", dict[str, Any]]:
    """`model` quantized to int8 by the spec's method, and what was done, for the manifest."""
    # nncf sends usage telemetry unless told it runs in CI or a consent file opts out
    # (nncf/telemetry/wrapper.py); an export must not contact the network.
    os.environ.setdefault("NNCF_CI", "1")
    import nncf

    nncf.set_log_level(logging.ERROR)  # no per-layer notes in `zoo export` (its progress bars stay)
    methods = {"static": _static, "dynamic": _dynamic}
    if spec.quantization not in methods:
        raise UnsupportedError(f"model {spec.name} names no int8 method (spec.quantization is {spec.quantization!r})")
    return methods[spec.quantization](nncf, model, spec)


def _static(nncf: Any, model: "openvino.Model", spec: ModelSpec) -> tuple["openvino.Model", dict[str, Any]]:
    from nncf.quantization.advanced_parameters import OverflowFix
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    # The samples every backend calibrates on, one per call as in NNCF's examples, so
    # that `subset_size` counts samples.
    batches = calibration_batches(spec, samples=DEFAULT_SAMPLES, batch_size=1, seed=0)
    transformer = has_attention(model)
    # Activation ranges from the smallest min and largest max seen (ONNX Runtime's MinMax).
    # NNCF's default averages each call's min and max, which with one sample per call
    # clips the largest activations: on the trained digit CNNs that moved logits by 2-3.6
    # against 0.2-1.0 with MINMAX, at the same accuracy and speed.
    # Weights of every layer in 7 bits (NNCF's overflow fix; its default fixes the first
    # layer only): CPUs without VNNI (AVX2 only) add u8 x s8 products in int16, which
    # saturates with 8-bit weights, so results depended on the CPU: resnet18's int8 logits
    # moved up to 0.33 (tolerance 0.03) on an AVX2 machine in some runs.
    advanced = nncf.AdvancedQuantizationParameters(
        activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX, overflow_fix=OverflowFix.ENABLE)
    with _nncf_errors(spec, "static"):
        quantized = nncf.quantize(model, nncf.Dataset(batches), subset_size=len(batches),
                                  target_device=nncf.TargetDevice.CPU, advanced_parameters=advanced,
                                  model_type=nncf.ModelType.TRANSFORMER if transformer else None)
    return quantized, {"method": "static", "tool": "nncf.quantize", "calibration_samples": len(batches),
                       "activation_ranges": "minmax", "overflow_fix": "all layers", "model_type": "transformer" if transformer else "default"}


def _dynamic(nncf: Any, model: "openvino.Model", spec: ModelSpec) -> tuple["openvino.Model", dict[str, Any]]:
    with _nncf_errors(spec, "dynamic"):
        # INT8_ASYM: per-output-channel uint8 weights with a zero point, NNCF's int8 default.
        quantized = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    return quantized, {"method": "dynamic", "tool": "nncf.compress_weights", "weights": "int8_asym",
                       "activations": "quantized per call by the CPU plugin"}


@contextlib.contextmanager
def _nncf_errors(spec: ModelSpec, method: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # nncf's errors share no base class; say which model and why
        raise ExportError(f"NNCF could not quantize {spec.name} ({method} int8): {exc}") from exc


def has_attention(model: "openvino.Model") -> bool:
    """Whether the graph computes attention: a Softmax and a MatMul of two activations
    (queries by keys), which convolutions and MLPs, whose MatMuls take a weight, lack."""
    ops = model.get_ordered_ops()
    softmax = any(op.get_type_name() == "Softmax" for op in ops)
    return softmax and any(op.get_type_name() == "MatMul" and not any(_constant(op.input_value(i).get_node())
                                                                          for i in range(2)) for op in ops)


def _constant(node: Any) -> bool:
    """A weight, possibly behind a Convert (fp16 weights) or the ONNX frontend's Transpose."""
    while node.get_type_name() in ("Convert", "Transpose", "Reshape") and node.get_input_size():
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Constant"
