"""Triton's classification extension: an output returned as its top K classes.

A client asks for it per output, `"parameters": {"classification": K}` (tritonclient's
`InferRequestedOutput(name, class_count=K)`); the output then comes back as a BYTES
tensor of strings "<value>:<index>" or "<value>:<index>:<label>" instead of the raw
tensor. `classify` builds that tensor as Triton does. Sources (triton-inference-server):
server `src/classification.cc` (`TopkClassifications`, `AddClassResults`), server
`src/http_server.cc` and `src/grpc/infer_handler.h` (shape and batch split), core
`src/label_provider.cc` and `src/infer_response.cc` (labels), server
`docs/protocol/extension_classification.md`.

- Rows. For a batched model (Triton's `max_batch_size > 0`, zoo's `triton.batched`)
  the first axis is the batch and each batch item is one row; otherwise the whole
  tensor is one row. Triton does not require the classes to be the only non-batch axis:
  a row is every element of the item, flattened in row-major order, and <index> is the
  flat index within the row (for [batch, C] logits that is the class).
- Shape. [batch, min(K, row size)] batched, [min(K, row size)] otherwise. K larger than
  the row is clamped, not refused. One quirk kept as Triton has it: a batched output with
  batch 0 is read as unbatched, so it comes back as shape [0], not [0, K].
- Order. Descending by value, compared in the output's own datatype (no softmax, no
  cast). Triton sorts with `std::sort` and `>`, which leaves the order of equal values
  unspecified; here it is stable: equal values in ascending index order (what
  `np.argsort(-row, kind="stable")` gives, and what libstdc++'s std::sort gives for rows
  of up to 16 elements). NaN, which `>` leaves unordered in Triton, comes last here.
- Value. C++ `std::to_string`: integers in decimal; FP32 (widened to double) and FP64
  as printf's "%f", six decimals ("3.300000", "-0.000001", "inf", "-inf", "nan",
  "-nan").
- Datatypes. UINT8/16/32/64, INT8/16/32/64, FP32 and FP64 only. Triton refuses the rest,
  FP16 and BF16 included ("class result not available for output due to unsupported
  type"), and so does `classify`. zoo carries BF16 widened to float32, so the caller
  passes `datatype="BF16"` to have it refused as Triton would.
- Size. Triton refuses a row of more than 1,000,000 elements ("classification output
  tensor too large"); so does `classify`.
- Labels. Triton reads them from the output's `label_filename` in config.pbtxt, one per
  line, line i labelling index i; zoo takes them from the output's `TensorSpec.labels`.
  An index with no label (past the end of the list) or an empty label gets none: the
  string is then "<value>:<index>".
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import Sequence

import numpy as np

from ..errors import InputError

#: Triton's `kMaxClassificationElements`: the largest row it classifies.
MAX_ELEMENTS = 1_000_000
#: the v2 datatypes Triton classifies (`TopkClassifications`' switch).
DATATYPES = ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
_V2 = {np.dtype(t): n for t, n in [("u1", "UINT8"), ("u2", "UINT16"), ("u4", "UINT32"), ("u8", "UINT64"),
                                    ("i1", "INT8"), ("i2", "INT16"), ("i4", "INT32"), ("i8", "INT64"),
                                    ("f2", "FP16"), ("f4", "FP32"), ("f8", "FP64"), ("?", "BOOL")]}


def classify(array: np.ndarray, k: int, batched: bool, labels: Sequence[str] | None = None, *,
             name: str | None = None, datatype: str | None = None) -> np.ndarray:
    """The top `k` classes of `array` as Triton's classification extension returns them:
    an object array of bytes "<value>:<index>[:<label>]", shape [batch, min(k, row)]
    when `batched` (the first axis is the batch), else [min(k, row)] (module docstring).

    labels: the label of each (flat, per row) index; none past its end or where empty.
    name: the output's name, for messages. datatype: the output's v2 datatype where the
    array does not show it (BF16 travels as float32); Triton's rules apply to it too.
    Raises `InputError` for k < 1, a datatype Triton does not classify, or a row larger
    than Triton classifies.
    """
    what = f"output {name!r}" if name else "the output"
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
        raise InputError(f"classification of {what} asks for {k!r} classes; it takes a positive integer, "
                         f"the number of top classes to return")
    array = np.asarray(array)
    native = _V2.get(array.dtype.newbyteorder("=")) if array.dtype.kind in "uifb" else None
    for kind in ([datatype] if datatype else []) + [native or str(array.dtype)]:
        if kind not in DATATYPES:
            raise InputError(f"classification is not available for {what}: its datatype is {kind}, and "
                             f"classes are read from {', '.join(DATATYPES)} outputs only (as Triton's "
                             f"classification extension)")
    batch = array.shape[0] if batched and array.ndim > 0 and array.shape[0] > 0 else None
    width = array.size if batch is None else math.prod(array.shape[1:])
    rows = array.reshape(1 if batch is None else batch, width)
    if width > MAX_ELEMENTS:
        raise InputError(f"classification is not available for {what}: each {'batch item' if batch else 'tensor'} "
                         f"has {width} elements, more than the {MAX_ELEMENTS} Triton classifies")
    count = min(int(k), width)
    order = _descending(rows)[:, :count]
    text = _format_float if rows.dtype.kind == "f" else _format_int
    out = np.empty((len(rows), count), dtype=object)
    for r, (row, indices) in enumerate(zip(rows, order)):
        for c, i in enumerate(indices.tolist()):
            item = f"{text(row[i])}:{i}".encode()
            label = labels[i] if labels is not None and i < len(labels) else None
            if label:
                item += b":" + (label.encode() if isinstance(label, str) else bytes(label))
            out[r, c] = item
    return out if batch is not None else out.reshape(count)


def _descending(rows: np.ndarray) -> np.ndarray:
    """Per row, the indices by descending value; equal values in ascending index order,
    NaN last."""
    if rows.dtype.kind == "f":  # negation is exact, keeps NaN (sorted last) and ties -0.0 with 0.0
        return np.argsort(-rows, axis=1, kind="stable")
    # integers: negation would overflow (INT64 min, any unsigned), so sort the reversed
    # row ascending, stably, and read it backwards: ties come out in ascending index order
    width = rows.shape[1]
    return width - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1]


def _format_int(value) -> str:
    return str(int(value))


def _format_float(value) -> str:
    """C's "%f" of the value as a double: `std::to_string(float)` and `(double)`."""
    x = float(value)
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return "%f" % x
