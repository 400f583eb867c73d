"""float16 ONNX graphs from ONNX Runtime's own converter, numerically sensitive ops kept fp32.

The converter is `onnxruntime.transformers.float16.convert_float_to_float16`, the tool
ONNX Runtime's docs name for this ("Create Float16 and Mixed Precision Models",
https://onnxruntime.ai/docs/performance/model-optimizations/float16.html). It rewrites
every float tensor to float16 except around the op types in `op_block_list`, where it
inserts Casts so those ops compute in float32. Its DEFAULT_OP_BLOCK_LIST holds ops with
no fp16 kernel or whose fp16 result is wrong by construction (Range, CumSum, TopK,
NonMaxSuppression, Min/Max ...). On top of it we keep the op types whose fp16 arithmetic
overflows (fp16 tops out at 65504) or loses the result (11 significant bits) in the
graphs the dynamo exporter writes for the zoo's models, `FP32_OPS` below: the
encoders' LayerNormalization and Softmax (MiniLM, gpt.pydoc), MiniLM's pooling ReduceSum
and normalizing ReduceL2, and the message-passing nets' ReduceSum over atoms (mpnn).
Convolutions, Gemm/MatMul and pointwise ops stay fp16, which is where the speed is.

`keep_io_types=True` leaves the graph's float inputs and outputs float32, so an fp16
artifact has the same signature as the fp32 one; the export info records which op
types stayed fp32 and how many nodes of each (`fp32_ops`).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Mapping

import onnx

#: op type -> why it stays float32 in fp16 artifacts (beyond the converter's defaults).
FP32_OPS: Mapping[str, str] = {
    # "Running layernorm after self-attention in FP16 may cause overflow ... forcing
    # layernorm layers to run in FP32 precision can help" (TensorRT's builder warning;
    # NVIDIA/TensorRT#2564: "in most of large transformer models, the layernorm overflows
    # in FP16"); ONNX Runtime's GPT-2 fp16 recipe keeps LayerNormalization fp32 too
    # (onnxruntime.transformers.convert_generation, op_block_list "auto").
    "LayerNormalization": "its variance squares activations and its mean subtraction cancels digits",
    "Softmax": "exp of attention scores; fused attention kernels compute softmax in fp32",
    "ReduceSum": "sums over a sequence or atom axis grow with its length",
    "ReduceL2": "squares its input: |x| > 255 overflows fp16",
    "ReduceSumSquare": "squares its input: |x| > 255 overflows fp16",
    "Pow": "x**2 and higher overflow fp16 for moderate x",
    "Exp": "overflows fp16 above x = 11.1",
    "Log": "inputs below 6.1e-5 are subnormal or zero in fp16",
}


def op_block_list() -> list[str]:
    """The converter's defaults plus `FP32_OPS`: what an fp16 artifact computes in fp32."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return sorted({*DEFAULT_OP_BLOCK_LIST, *FP32_OPS})


def convert_fp16(path: Path, external: bool = False) -> dict[str, Any]:
    """Convert the ONNX file at `path` to float16 in place; returns the export info to record.

    `external` keeps the weights in `<file>.data` (models over 2 GiB).
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    path = Path(path)
    blocked = op_block_list()
    model = onnx.load(str(path))
    _drop_initializer_value_info(model.graph)
    model = convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked)
    _drop_duplicate_casts(model.graph)
    # The converter appends its casts at the end of the node list; ONNX Runtime does not
    # mind, but the ONNX checker (and TensorRT's parser) want a sorted graph.
    OnnxModel(model).topological_sort()
    for part in (path, path.with_name(f"{path.name}.data")):
        part.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=external, location=f"{path.name}.data")
    counts = collections.Counter(n.op_type for n in model.graph.node if n.op_type in blocked)
    return {"converter": "onnxruntime.transformers.float16", "keep_io_types": True,
            "fp32_ops": dict(sorted(counts.items()))}


def _drop_initializer_value_info(graph: onnx.GraphProto) -> None:
    """Remove the value_info entries the dynamo exporter writes for initializers.

    An initializer carries its own type. The converter turns every float value_info to
    float16, these included, so a weight used only by a blocked (fp32) node stays fp32
    while its value_info says fp16: the converter then puts a float->float Cast before the
    node and the graph no longer passes strict type inference.
    """
    names = {i.name for i in graph.initializer}
    kept = [v for v in graph.value_info if v.name not in names]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _drop_duplicate_casts(graph: onnx.GraphProto) -> None:
    """Remove the second of two identical Cast nodes the converter writes for one tensor.

    When one float16 tensor feeds two nodes that need it in float32 (two Resize nodes
    sharing their scales, as in centernet.shapes; two blocked nodes sharing an input),
    the converter (onnxruntime 1.31) emits `<name>_cast_to_fp32` once per consumer, same
    name, same output, which breaks the graph's single assignment. The copies are
    identical, so keeping the first is exact.
    """
    seen: set[bytes] = set()
    keep = []
    for node in graph.node:
        if node.op_type == "Cast":
            key = node.SerializeToString(deterministic=True)
            if key in seen:
                continue
            seen.add(key)
        keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    infos: dict[str, onnx.ValueInfoProto] = {}
    for info in graph.value_info:  # the converter also adds one value_info per copy
        infos.setdefault(info.name, info)
    if len(infos) != len(graph.value_info):
        kept = list(infos.values())
        del graph.value_info[:]
        graph.value_info.extend(kept)

