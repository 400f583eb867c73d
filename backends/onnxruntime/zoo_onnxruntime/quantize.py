"""int8 ONNX models with ONNX Runtime's own quantization tool.

The method must fit the model (`ModelSpec.quantization`, overridable per export):

- "static": weights and activations in 8 bits, activation scales fixed beforehand from
  calibration batches of the model's training data (`zoo.calibration`), written as
  QuantizeLinear/DequantizeLinear pairs (Q/DQ) around each op. ONNX Runtime fuses each
  DQ -> Conv -> Q into one int8 convolution, which is where CNNs gain 2-4x over fp32.
- "dynamic": int8 weights of MatMul only, activations quantized per call from their
  own range. Right for transformers, recurrent nets and MLPs, whose activations vary
  too much between inputs for fixed scales; on CNNs it is slower than fp32 (every
  Conv re-quantizes its input), and quantizing every op type (embeddings, attention
  scores) instead of only weight MatMuls cost all-MiniLM-L6-v2 its accuracy (issue 6:
  embedding cosine 0.94 with defaults, 0.99 per-channel and MatMul-only).

Transformers (graphs with LayerNormalization) carry outlier channels: in all-MiniLM-L6-v2
a few LayerNorm output channels reach 30 and a few GELU outputs 25 (at [CLS]), while 99%
of values lie within +-2. One int8 scale per activation tensor spends its 256 steps on
those few, 0.1-0.15 apart, which rounds the typical values away, so for these graphs:

- dynamic quantizes each row's activations per block of 32 (`BLOCKWISE`: ONNX Runtime's
  MatMulNBits, 8-bit weights, int8 compute): embedding cosine with PyTorch fp32 0.9995 on
  real sentences, 0.998 on one-word queries alone, where one scale per tensor per call
  (`SETTINGS["dynamic"]`) kept 0.989 and 0.96, below the models' 0.99;
- static is refused (`_STATIC_TRANSFORMER`): one scale per tensor fixed in advance is
  worse still. ONNX Runtime's QDQ defaults (every op type, MatMul outputs quantized too:
  the FFN's output reaches 195, a scale of 0.77) kept 0.17; MatMul-only with float outputs
  0.983 on sentences and 0.92 on one-word queries; SmoothQuant-style channel scaling
  (alpha 0.6) 0.994 and 0.969. No per-tensor setting reached 0.99 on short queries.

Both run `quant_pre_process` first (shape inference and ONNX Runtime's basic graph
optimizations, e.g. BatchNorm folded into Conv), as the quantization docs advise:
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html
The steps TensorRT's Q/DQ graph shares with these are `zoo_onnx.quantize`'s.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

from zoo.calibration import DEFAULT_SAMPLES, calibration_rows
from zoo.errors import ExportError, UnsupportedError
from zoo.spec import QUANTIZATIONS, ModelSpec
from zoo_onnx.quantize import calibration_reader, computed_weight_nodes, pre_process, quantized_ops, run_quietly

#: What each method is run with; recorded in the manifest with the counts of the ops it
#: produced. Static uses uint8 activations and int8 weights (U8S8): on the development
#: machine's AVX-512 VNNI CPU, ONNX Runtime fused every DQ -> Conv -> Q of ResNet-18 into an int8 QLinearConv and
#: ran it 3.5x faster than fp32, while with int8 activations (S8S8) it fused fewer than
#: half of them and gained ~20%.
#: Results must not depend on the CPU. On x86 CPUs without VNNI (AVX2 only, as many AMD
#: EPYC machines are) ONNX Runtime's U8S8 kernels add pairs of u8 x s8 products in int16,
#: which saturates with full 8-bit signed weights: there, resnet50's logits moved 0.053
#: (tolerance 0.03), CartPole's int8 actions agreed 85.7% (needs 90%) and the GRU's
#: perplexity rose 2.4 (allows 0.1), while the same exports passed on AVX-512 VNNI
#: machines. ONNX Runtime's quantization docs give two remedies, and each method takes the
#: one that held every zoo model's gates on the AVX2 machine: static keeps U8S8 (for the
#: fused QLinearConv above) with 7-bit weights (`reduce_range`); dynamic takes unsigned
#: 8-bit weights (U8U8), which no kernel saturates, since its small MLP policies lost
#: their episode returns with 7-bit weights.
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "static": {"format": "QDQ", "activations": "QUInt8", "weights": "QInt8", "per_channel": True,
               "reduce_range": True, "calibration": "MinMax", "calibration_samples": DEFAULT_SAMPLES},
    "dynamic": {"weights": "QUInt8", "per_channel": True, "reduce_range": False, "op_types": ["MatMul"],
                "matmul_const_b_only": True},
}
#: dynamic int8 of a transformer's MatMuls (see the module's docstring): ONNX Runtime's
#: MatMulNBits with 8-bit symmetric weights per block of 32 along K, and accuracy level 4,
#: its int8 compute: each row of the activations quantized per block of 32 at run time,
#: symmetric. Measured on an AVX-512 VNNI CPU only: whether ONNX Runtime's kernel for CPUs
#: without VNNI saturates as the U8S8 ones above do was not, no such machine being at hand.
BLOCKWISE: Mapping[str, Any] = {"form": "MatMulNBits", "weights": "QInt8", "bits": 8, "block_size": 32,
                                "symmetric": True, "accuracy_level": 4, "op_types": ["MatMul"],
                                "activations": "int8 per row and block, at run time"}
#: the ops that mark a transformer: their outputs carry the outlier channels
TRANSFORMER_OPS = frozenset({"LayerNormalization"})
_STATIC_TRANSFORMER = (
    "static int8 fixes one scale per activation tensor from calibration, and a transformer's activations "
    "(its graph has {norms} LayerNormalization ops) carry outlier channels that such a scale cannot hold: "
    "all-MiniLM-L6-v2's LayerNorm outputs reach 30 where 99% of values lie within +-2, and its static int8 "
    "embeddings kept cosine 0.98 with PyTorch fp32 on sentences and 0.92 on one-word queries (0.99 needed). "
    "Use --quantization dynamic, which quantizes each row's activations per block of 32 (0.998)")


def quantize_onnx(fp32: Path, out: Path, spec: ModelSpec, method: str | None) -> dict[str, Any]:
    """Write `fp32` (an ONNX file) quantized to int8 at `out`; returns what was done."""
    if method not in QUANTIZATIONS:
        raise UnsupportedError(f"model {spec.name} names no int8 method (quantization={method!r}); "
                               f"pass --quantization {' or '.join(QUANTIZATIONS)}")
    norms = transformer_ops(fp32)
    if method == "static" and norms:
        raise UnsupportedError(f"model {spec.name}: {_STATIC_TRANSFORMER.format(norms=norms)}")
    with tempfile.TemporaryDirectory(prefix="zoo-quantize-") as tmp:
        pre = Path(tmp) / "preprocessed.onnx"
        preprocess = pre_process(fp32, pre)
        if method == "static":
            _static(pre, out, spec)
        elif norms:
            _blockwise(pre, out)
        else:
            _dynamic(pre, out)
    ops = quantized_ops(out)
    if not ops:
        other = "" if norms else f"try --quantization {'static' if method == 'dynamic' else 'dynamic'}, or "
        raise ExportError(f"{method} quantization left model {spec.name} without a single int8 op (its graph has "
                          f"none of the ops {method} quantization covers); {other}keep fp32")
    settings = BLOCKWISE if norms else SETTINGS[method]
    info = {"method": method, **settings, "preprocess": preprocess, "quantized_ops": ops}
    if "calibration_samples" in info:  # what the reader gave: the split may hold fewer than asked
        info["calibration_samples"] = calibration_rows(spec, info["calibration_samples"])
    return info


def transformer_ops(path: Path) -> int:
    """How many of `TRANSFORMER_OPS` the ONNX graph at `path` has (0: not a transformer)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(n.op_type in TRANSFORMER_OPS for n in graph.node)


def _static(model: Path, out: Path, spec: ModelSpec) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    settings = SETTINGS["static"]
    run_quietly(quantize_static, str(model), str(out), calibration_reader(spec, settings["calibration_samples"]),
                quant_format=QuantFormat.QDQ, per_channel=settings["per_channel"],
                reduce_range=settings["reduce_range"], nodes_to_exclude=computed_weight_nodes(model),
                activation_type=QuantType[settings["activations"]], weight_type=QuantType[settings["weights"]],
                calibrate_method=CalibrationMethod[settings["calibration"]])


def _dynamic(model: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = SETTINGS["dynamic"]
    run_quietly(quantize_dynamic, str(model), str(out), per_channel=settings["per_channel"],
                reduce_range=settings["reduce_range"], weight_type=QuantType[settings["weights"]],
                op_types_to_quantize=list(settings["op_types"]),
                extra_options={"MatMulConstBOnly": settings["matmul_const_b_only"]})


def _blockwise(model: Path, out: Path) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    def write() -> None:
        quantizer = MatMulNBitsQuantizer(str(model), bits=BLOCKWISE["bits"], block_size=BLOCKWISE["block_size"],
                                         is_symmetric=BLOCKWISE["symmetric"],
                                         accuracy_level=BLOCKWISE["accuracy_level"],
                                         op_types_to_quantize=tuple(BLOCKWISE["op_types"]))
        quantizer.process()
        quantizer.model.save_model_to_file(str(out), use_external_data_format=False)

    run_quietly(write)
