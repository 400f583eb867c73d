"""Open Inference Protocol datatypes: names, numpy types, and the raw bytes of a tensor.

The binary tensor data extension sends a tensor as its elements in row-major order,
little-endian; a BYTES element as a 4-byte little-endian length followed by the bytes
(Triton's `binary_data` layout). BF16 has no numpy type: it travels as the upper half of
the float32 bit pattern and is widened to float32 here, as zoo runners take and return it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: zoo dtype (spec.DTYPES) -> v2 datatype
V2_NAMES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "int64": "INT64", "int32": "INT32",
            "int8": "INT8", "uint8": "UINT8", "bool": "BOOL", "string": "BYTES"}
#: every v2 datatype -> the little-endian numpy type of one element (BYTES: variable length)
NUMPY_TYPES: dict[str, np.dtype | None] = {
    "BOOL": np.dtype("?"), "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"), "BYTES": None,
}
INTEGER = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
FLOAT = {"FP16", "FP32", "FP64", "BF16"}


def v2_name(dtype: str) -> str:
    return V2_NAMES[dtype]


def element_size(datatype: str) -> int | None:
    t = NUMPY_TYPES[datatype]
    return None if t is None else t.itemsize


def numpy_of(datatype: str) -> np.dtype:
    """The numpy type arrays of `datatype` have in memory (BF16 widened, BYTES as objects)."""
    if datatype == "BF16":
        return np.dtype(np.float32)
    t = NUMPY_TYPES[datatype]
    return np.dtype(object) if t is None else t.newbyteorder("=")


def from_bytes(datatype: str, buffer: bytes | memoryview, count: int) -> np.ndarray:
    """`count` elements of `datatype` from raw bytes (flat); ValueError says what disagrees."""
    if datatype == "BYTES":
        return _unpack_bytes(memoryview(buffer), count)
    size = element_size(datatype)
    if len(buffer) != count * size:
        raise ValueError(f"{len(buffer)} bytes of binary data do not hold {count} {datatype} elements "
                         f"({count * size} bytes)")
    array = np.frombuffer(buffer, dtype=NUMPY_TYPES[datatype])
    if datatype == "BOOL":
        raw = array.view(np.uint8)
        if raw.size and raw.max() > 1:
            raise ValueError("BOOL elements must be the bytes 0 or 1")
    if datatype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(numpy_of(datatype), copy=False)


def to_bytes(datatype: str, array: np.ndarray) -> bytes:
    """The raw bytes of `array` as `datatype` (row-major, little-endian)."""
    if datatype == "BYTES":
        return b"".join(len(item).to_bytes(4, "little") + item for item in (_as_bytes(x) for x in array.reshape(-1)))
    if datatype == "BF16":  # round to nearest even, as torch's float32 -> bfloat16 cast does
        bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).astype("<u2").tobytes()
    return np.ascontiguousarray(array, dtype=NUMPY_TYPES[datatype]).tobytes()


def bytes_array(items: Sequence[bytes]) -> np.ndarray:
    """A 1-D object array of bytes (numpy would otherwise strip trailing NUL bytes)."""
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


def _as_bytes(x: object) -> bytes:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode("utf-8")
    raise ValueError(f"a BYTES element must be bytes or str, not {type(x).__name__}")


def _unpack_bytes(buffer: memoryview, count: int) -> np.ndarray:
    items, offset = [], 0
    while offset < len(buffer):
        if len(items) == count:
            raise ValueError(f"binary BYTES data holds more than the {count} elements the shape gives")
        if offset + 4 > len(buffer):
            raise ValueError(f"binary BYTES element {len(items) + 1} is cut off inside its 4-byte length")
        length = int.from_bytes(buffer[offset:offset + 4], "little")
        offset += 4
        if offset + length > len(buffer):
            raise ValueError(f"binary BYTES element {len(items) + 1} claims {length} bytes; "
                             f"only {len(buffer) - offset} remain")
        items.append(bytes(buffer[offset:offset + length]))
        offset += length
    if len(items) != count:
        raise ValueError(f"binary BYTES data holds {len(items)} elements; the shape gives {count}")
    return bytes_array(items)
