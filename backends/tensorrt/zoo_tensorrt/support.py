"""Can TensorRT build this ONNX graph? A CPU check of operators and data types.

Run before any build, so a model TensorRT cannot take fails in a second with a list of
what to change instead of minutes into a build with a parser error about one node. The
tables are onnx-tensorrt's operator support matrix (`docs/operators.md`, ONNX-TensorRT
10.1 GA, onnx/onnx-tensorrt@96e7811): the operators marked "Y", those marked "N", and
the data types "TensorRT supports ... DOUBLE [limited], FLOAT32, FLOAT16, BFLOAT16,
INT32, INT64, FP8, INT8, INT4, UINT8, and BOOL", where "UINT8 is only supported as
network input or output tensor types" and DOUBLE is cast down to FLOAT, "clamping values
to +-FLT_MAX".

The table is the floor, not the ceiling: newer TensorRT releases parse more operators,
so `check_onnx` takes the installed parser's `supports_operator` and accepts what it
accepts. Per-operator restrictions (attributes that must be initializers, pooling only
in 2D/3D ...) are left to the parser, which reports them with the node's name.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Callable, Iterable, Iterator

import onnx
from onnx import TensorProto

#: ONNX operators (default domain) onnx-tensorrt marks "Y".
SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh
CumSum DeformConv DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand
EyeLike Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool
GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization HardSigmoid
HardSwish Hardmax Identity If ImageScaler InstanceNormalization IsInf IsNaN LRN LSTM
LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization LpPool
MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression
NonZero Not OneHot Or PRelu Pad ParametricSoftplus Pow QuantizeLinear RNN RandomNormal
RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2
ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign Round ScaledTanh Scan Scatter
ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax
Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile
TopK Transpose Trilu Unsqueeze Upsample Where Xor
""".split())

#: ONNX operators onnx-tensorrt marks "N": named as such in the problem list.
UNSUPPORTED_OPS = frozenset("""
AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BlackmanWindow
CenterCropPad Col2Im Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear
HammingWindow HannWindow ImageDecoder MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix
Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement
QLinearConv QLinearMatMul RegexFullMatch STFT SequenceAt SequenceConstruct SequenceEmpty
SequenceErase SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss
SplitToSequence StringConcat StringNormalizer StringSplit TfIdfVectorizer Unique
""".split())

#: tensor element types TensorRT takes (FP8 is E4M3FN; INT4 and FP8 only via Q/DQ).
SUPPORTED_TYPES = frozenset({
    TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT32,
    TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL,
    TensorProto.FLOAT8E4M3FN, TensorProto.INT4,
})
_WHY = {
    TensorProto.DOUBLE: "TensorRT casts float64 down to float32, clamping to +-FLT_MAX; "
                        "export the model in float32",
    TensorProto.STRING: "TensorRT has no string tensors; turn text into ids in the spec's preprocess",
}
MIN_OPSET = 9  # "TensorRT 10.0 supports operators in the inclusive range of opset 9 to opset 20"
_STANDARD_DOMAINS = ("", "ai.onnx")


def check_onnx(model: onnx.ModelProto | str | Path,
               supports_operator: Callable[[str], bool] | None = None) -> list[str]:
    """Human-readable reasons TensorRT cannot build `model`; empty when none is known.

    `supports_operator` is the installed parser's `OnnxParser.supports_operator`, when
    there is one: an operator it accepts is accepted even if the table predates it.
    """
    if not isinstance(model, onnx.ModelProto):
        # Types and operators are all in the graph; weights stored beside it are not needed.
        model = onnx.load(str(model), load_external_data=False)
    try:
        model = onnx.shape_inference.infer_shapes(model)  # fills value_info: intermediate types
    except Exception:  # noqa: BLE001 - inference is a bonus; inputs, outputs, weights still checked
        pass
    problems = _opset_problems(model)
    problems += _operator_problems(model, supports_operator)
    problems += _type_problems(model)
    return problems


def _opset_problems(model: onnx.ModelProto) -> list[str]:
    for opset in model.opset_import:
        if opset.domain in _STANDARD_DOMAINS and opset.version < MIN_OPSET:
            return [f"the graph uses ONNX opset {opset.version}; TensorRT parses opset {MIN_OPSET} "
                    f"and later (re-export with a newer opset)"]
    return []


def _operator_problems(model: onnx.ModelProto, supports_operator: Callable[[str], bool] | None) -> list[str]:
    functions = {(f.domain, f.name) for f in model.functions}
    found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for node in _nodes(model):
        if (node.domain, node.op_type) in functions:
            continue  # a model-local function: the parser inlines it; its body is walked below
        found[(node.domain, node.op_type)].append(node.name)
    problems = []
    for (domain, op), names in sorted(found.items()):
        if domain in _STANDARD_DOMAINS and op in SUPPORTED_OPS:
            continue
        if supports_operator is not None and _safe(supports_operator, op):
            continue
        where = _where(names)
        if domain not in _STANDARD_DOMAINS:
            problems.append(f"operator {domain}::{op} {where} is a custom operator; TensorRT needs a plugin for it")
        elif op in UNSUPPORTED_OPS:
            problems.append(f"operator {op} {where} is not supported by TensorRT's ONNX parser")
        else:
            problems.append(f"operator {op} {where} is not in TensorRT's ONNX operator table")
    return problems


def _type_problems(model: onnx.ModelProto) -> list[str]:
    io_names = {v.name for v in [*model.graph.input, *model.graph.output]}
    # dicts as ordered sets: a tensor is named in inputs, value_info and initializers alike
    bad: dict[int, dict[str, None]] = collections.defaultdict(dict)
    uint8_inside: dict[str, None] = {}
    for name, elem_type in _typed_tensors(model):
        if elem_type == TensorProto.UNDEFINED:  # no type stated: nothing to judge
            continue
        if elem_type not in SUPPORTED_TYPES:
            bad[elem_type][name] = None
        elif elem_type == TensorProto.UINT8 and name not in io_names:
            uint8_inside[name] = None
    problems = []
    for elem_type, names in sorted(bad.items()):
        type_name = TensorProto.DataType.Name(elem_type).lower()
        why = _WHY.get(elem_type, f"TensorRT has no {type_name} tensors")
        problems.append(f"{type_name} values {_where(list(names), 'tensor')}: {why}")
    if uint8_inside:
        problems.append(f"uint8 values inside the graph {_where(list(uint8_inside), 'tensor')}: TensorRT takes uint8 "
                        f"only as a network input or output; cast to a float or int32 type")
    return problems


def _graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph and every subgraph (If branches, Loop and Scan bodies), functions' too."""
    stack = [model.graph, *(g for f in model.functions for n in f.node for g in _subgraphs(n))]
    while stack:
        graph = stack.pop()
        yield graph
        for node in graph.node:
            stack.extend(_subgraphs(node))


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for graph in _graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def _typed_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, int]]:
    """(name, element type) of every tensor whose type the graph states."""
    for graph in _graphs(model):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type"):
                yield value.name, value.type.tensor_type.elem_type
        for init in graph.initializer:
            yield init.name, init.data_type
        for node in graph.node:
            yield from _node_types(node)
    for function in model.functions:
        for node in function.node:
            yield from _node_types(node)


def _node_types(node: onnx.NodeProto) -> Iterator[tuple[str, int]]:
    """Types a node creates that value_info may not state: constants and casts."""
    output = node.output[0] if node.output else node.name
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            yield output, attr.t.data_type
        elif node.op_type == "Cast" and attr.name == "to":
            yield output, attr.i
        elif node.op_type == "Constant" and attr.name in ("value_string", "value_strings"):
            yield output, TensorProto.STRING


def _where(names: list[str], noun: str = "node") -> str:
    """`(2 nodes: 'conv1', 'conv2')`: how many, and the first few names."""
    named = [n for n in dict.fromkeys(names) if n]
    shown = ", ".join(repr(n) for n in named[:3]) + (", ..." if len(named) > 3 else "")
    return f"({len(names)} {noun}{'s' if len(names) != 1 else ''}{': ' + shown if shown else ''})"


def _safe(supports_operator: Callable[[str], bool], op: str) -> bool:
    try:
        return bool(supports_operator(op))
    except Exception:  # noqa: BLE001 - a failing live query falls back to the table
        return False
