"""Open Inference Protocol (v2) inference requests and responses over HTTP.

A request is a JSON object, optionally followed by binary tensor data (the binary
tensor data extension): the `Inference-Header-Content-Length` header gives the JSON's
length, each binary input names its `binary_data_size`, and the binary parts follow the
JSON in the order of `inputs`. An output is sent as binary when the request asks for it
(`binary_data` on the output, or `binary_data_output` on the request).

Both directions live here so that the server, `zoo.client` and the load generator
agree byte for byte. Every defect is a `ProtocolError` (400) naming the field.

JSON is strict both ways (RFC 8259): `NaN`/`Infinity` literals in a request are refused,
and so is a key repeated in one object (`unique_keys`); an output holding NaN or infinity
is never written as JSON; the client is told to ask for it as binary data, where every
float travels as is.

Parameters: the server reads the protocol's own (`binary_data_output` and `timeout` on the
request, `binary_data_size` on an input, `binary_data` on a requested output) and those of
the extensions it offers (`GET /v2`): `classification` on a requested output (the
classification extension), and `shared_memory_region`, `shared_memory_offset`,
`shared_memory_byte_size` on an input or a requested output (system shared memory, when
the server has it on). One of these in the wrong place (where Triton ignores it), a
parameter of an extension the server does not offer (sequence batching, priorities) or
one of Triton's reserved `triton_` names is refused with a 400 naming it, never ignored,
so a client never believes such a feature took effect. Other (custom) parameters with
scalar values are accepted as Triton accepts them; Triton hands them to the model's
backend, and no zoo runner reads any. An output's `classification: 0` is "not set" over
HTTP, as Triton's HTTP front end reads it (its gRPC front end refuses it, as `requested` does).

The gRPC service (`grpc.py`) builds the same `InferRequest` from its messages through
the same checks (`check_parameters`, `check_header`, `tensor_from_bytes`), so both
transports refuse a request with the same message.

Raw binary requests (`Inference-Header-Content-Length: 0`): the whole body is the raw
tensor of the model's only input, its shape deduced as Triton does (see `raw_request`),
and the outputs come back as binary data, as Triton sends them.
"""

from __future__ import annotations

import json
import math
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..arguments import domain_items
from ..arrays import as_numpy
from ..errors import InputError
from . import datatypes as dt
from .errors import InputMismatchError, PayloadTooLargeError, ProtocolError, named

HEADER_LENGTH = "Inference-Header-Content-Length"
#: parameters of extensions this server does not offer -> the extension, for the error message
UNOFFERED = {"sequence_id": "sequence batching", "sequence_start": "sequence batching",
             "sequence_end": "sequence batching", "priority": "priority scheduling"}
#: parameters this server reads -> where they may appear
PLACED = {"binary_data_output": ("request",), "timeout": ("request",), "binary_data_size": ("input",),
          "binary_data": ("output",), "classification": ("output",), "shared_memory_region": ("input", "output"),
          "shared_memory_offset": ("input", "output"), "shared_memory_byte_size": ("input", "output")}
PLACES = {"request": "the request", "input": "an input", "output": "a requested output"}
MAX_RANK = 16  # no zoo model has more axes; also bounds how deep `data` may nest
MAX_ELEMENTS = 1 << 40  # a shape past this cannot be backed by any body the server accepts
ABSENT = object()  # a field left out of the request, as against one given as null
BF16_MAX = 3.3895313892515355e38  # bfloat16's largest finite value: past it, rounding to bfloat16 gives infinity
FLOAT_PIECE = 1 << 16  # JSON numbers converted to an array this many at a time (float64 first, to check range)


@dataclass(frozen=True)
class Region:
    """A part of a registered system shared-memory region (`shm.Regions`)."""

    name: str
    offset: int
    byte_size: int


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None  # shaped; BYTES as an object array of bytes; None until `region` is read
    region: Region | None = None  # an input sent in shared memory


@dataclass(frozen=True)
class Requested:
    """How one requested output is to be returned."""

    binary: bool | None = None  # as binary data (HTTP; None: the request-wide default)
    classification: int | None = None  # the top K classes as "score:index[:label]" strings
    region: Region | None = None  # written into shared memory instead of the response


@dataclass
class InferRequest:
    inputs: list[Tensor]
    id: str | None = None
    #: requested outputs by name; None or {}: every output, as the request-wide defaults say
    outputs: dict[str, Requested] | None = None
    binary_output: bool = False  # the request-wide default (`binary_data_output`)
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None  # seconds, from the `timeout` parameter (microseconds)


# ---------------------------------------------------------------- server: requests in


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse a request body (and its `Inference-Header-Content-Length`, if any)."""
    json_end = len(body) if header_length is None else json_length(header_length, len(body))
    try:  # the body itself where it is all JSON: a slice would copy it
        doc = json.loads(body if json_end == len(body) else body[:json_end], parse_constant=_no_constant,
                         object_pairs_hook=unique_keys)
    except RecursionError:
        raise ProtocolError("the request JSON is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"the request body is not valid JSON ({_json_reason(exc)})") from None
    if not isinstance(doc, dict):
        raise ProtocolError("the request must be a JSON object with an `inputs` list")
    parameters = check_parameters(doc.get("parameters", ABSENT), "request", "request")
    request_id = doc.get("id")
    if "id" in doc and not isinstance(request_id, str):
        raise ProtocolError("`id` must be a string (leave it out for none)")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise ProtocolError("`inputs` must be a list of tensors")
    binary = memoryview(body)[json_end:]
    offset, inputs, seen = 0, [], set()
    try:
        for i, item in enumerate(raw_inputs):
            tensor, offset = _input(item, i, binary, offset)
            if tensor.name in seen:
                raise InputMismatchError(f"input {tensor.name!r} is given more than once")
            seen.add(tensor.name)
            inputs.append(tensor)
    except InputMismatchError as exc:  # a byte size, an input twice: Triton's core names the request
        raise named(exc, request_id) from None
    if offset != len(binary):
        raise ProtocolError(f"the body has {len(binary)} bytes of binary data after the JSON, but the inputs' "
                            f"binary_data_size add up to {offset}")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise ProtocolError("parameter `binary_data_output` must be true or false")
    if "outputs" in doc and doc["outputs"] is None:
        raise ProtocolError("`outputs` must be a list of {\"name\": ...} objects; leave it out for every output")
    return InferRequest(inputs, request_id, _outputs(doc.get("outputs")), binary_output, parameters,
                        request_timeout(parameters))


def json_length(header: str, body_size: int) -> int:
    """The `Inference-Header-Content-Length` header's value, checked against the body's
    size. ASCII digits only: `int()` would also take '²', '+1' and '1_0', and refuse
    thousands of digits with an error of its own."""
    digits = header.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise ProtocolError(f"{HEADER_LENGTH} must be an integer (the JSON's length in bytes), got {header[:40]!r}")
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(body_size)) or int(significant) > body_size:
        shown = significant[:40] + ("..." if len(significant) > 40 else "")
        raise ProtocolError(f"{HEADER_LENGTH} is {shown} but the body has {body_size} bytes")
    return int(significant)


def request_timeout(parameters: Mapping[str, Any]) -> float | None:
    """Seconds from the request's `timeout` parameter (microseconds), if given."""
    timeout = parameters.get("timeout")
    if timeout is not None and (type(timeout) is not int or timeout <= 0):
        raise ProtocolError("parameter `timeout` must be a positive integer (microseconds)")
    return None if timeout is None else timeout / 1e6


def raw_request(body: bytes, name: str, datatype: str, dims: Sequence[int]) -> InferRequest:
    """A raw binary request: `body` is the tensor of the model's only input `name`, of
    `datatype`, whose shape is `dims` (-1 for a dynamic axis; a batched model's batch
    axis already 1) with the one dynamic axis, if any, deduced from the body's size, as
    Triton deduces it. The outputs come back as binary data."""
    where = f"input {name!r} (raw binary request)"
    dynamic = [d for d, n in enumerate(dims) if n < 0]
    if len(dynamic) > 1:
        raise ProtocolError(f"{where}: the shape {list(dims)} has more than one dynamic axis, so it cannot be "
                            "deduced from the body; send a JSON header with the shape")
    shape = list(dims)
    if datatype == "BYTES":
        if dynamic or math.prod(shape) != 1:
            raise ProtocolError(f"{where}: a raw BYTES input must have exactly one element; its shape is {list(dims)}")
        tensor = Tensor(name, datatype, tuple(shape), dt.bytes_array([bytes(body)]).reshape(shape))
        return InferRequest([tensor], binary_output=True)
    unit = dt.element_size(datatype) * math.prod(n for n in shape if n >= 0)
    if dynamic and len(body) % unit or not dynamic and len(body) != unit:
        need = f"a multiple of {unit}" if dynamic else str(unit)
        raise ProtocolError(f"{where}: the body has {len(body)} bytes; a {datatype} tensor of shape {list(dims)} "
                            f"needs {need}")
    if dynamic:
        shape[dynamic[0]] = len(body) // unit
    try:
        flat = dt.from_bytes(datatype, body, math.prod(shape))
    except ValueError as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    return InferRequest([Tensor(name, datatype, tuple(shape), flat.reshape(shape))], binary_output=True)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of a request's JSON (`json.loads`'s object_pairs_hook), refusing a key
    given twice: parsers disagree on which value counts (Python's keeps the last, Triton's
    rapidjson the first), so such a request would mean one thing here and another there.
    About 0.2 µs per object, and a request has a few (docs/serving.md, "Strict JSON")."""
    doc = dict(pairs)
    if len(doc) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ProtocolError(f"the request JSON repeats the key {key[:60]!r} in an object; give each key "
                                    "once")
            seen.add(key)
    return doc


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"the request JSON has the literal {name}, which JSON (RFC 8259) does not allow; send "
                        "non-finite floats as binary data")


def _json_reason(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "malformed"


def check_parameters(value: Any, where: str, kind: str) -> dict[str, Any]:
    """The `parameters` object of the request, an input or an output (`kind`, described
    as `where` in messages); ABSENT when it is left out (null is not an object, so it is
    refused as the protocol types it)."""
    if value is ABSENT:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"`parameters` of the {where} must be an object")
    for key, v in value.items():
        if not isinstance(v, (str, int, float, bool)):
            raise ProtocolError(f"parameter {key[:60]!r} of the {where} must be a string, number or boolean")
        if key in UNOFFERED:
            raise ProtocolError(f"parameter {key!r} of the {where} belongs to the {UNOFFERED[key]} extension, which "
                                "this server does not offer (GET /v2 lists the extensions it offers)")
        if key in PLACED and kind not in PLACED[key]:
            raise ProtocolError(f"parameter {key!r} of the {where} belongs on "
                                f"{' or '.join(PLACES[k] for k in PLACED[key])}")
        if key.startswith("triton_"):
            raise ProtocolError(f"parameter {key[:60]!r} of the {where}: names starting with triton_ are reserved")
    return value


def region_of(parameters: Mapping[str, Any], where: str) -> Region | None:
    """The shared-memory part named by an input's or output's parameters, or None."""
    name = parameters.get("shared_memory_region")
    if name is None:
        if "shared_memory_offset" in parameters or "shared_memory_byte_size" in parameters:
            raise ProtocolError(f"{where}: shared_memory_offset and shared_memory_byte_size go with "
                                "shared_memory_region")
        return None
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: shared_memory_region must be a region's name")
    size, offset = parameters.get("shared_memory_byte_size"), parameters.get("shared_memory_offset", 0)
    if type(size) is not int or size < 0:
        raise ProtocolError(f"{where}: shared_memory_byte_size must be given as a non-negative integer")
    if type(offset) is not int or offset < 0:
        raise ProtocolError(f"{where}: shared_memory_offset must be a non-negative integer")
    return Region(name, offset, size)


def check_header(name: Any, datatype: Any, shape: Any, index: int) -> tuple[str, str, tuple[int, ...]]:
    """An input's name, datatype and shape, checked."""
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"input {index + 1} needs a `name` string")
    where = f"input {name[:200]!r}"
    if not isinstance(datatype, str) or datatype not in dt.NUMPY_TYPES:
        shown = repr(datatype[:40]) if isinstance(datatype, str) else f"of JSON type {_json_type(datatype)}"
        raise ProtocolError(f"{where}: `datatype` {shown} is not a datatype (one of {', '.join(dt.NUMPY_TYPES)})")
    return name, datatype, _shape(shape, where)


def tensor_from_bytes(name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> Tensor:
    """An input of `shape` from its raw bytes (binary data, gRPC raw contents, shared memory).
    Bytes that do not hold the shape are an `InputMismatchError`, as Triton's core words them."""
    count = math.prod(shape)
    try:
        flat = dt.from_bytes(datatype, raw, count)
    except ValueError as exc:
        size = dt.element_size(datatype)
        error = InputMismatchError if size is None or len(raw) != size * count else ProtocolError
        raise error(f"input {name[:200]!r}: {exc}") from None
    return Tensor(name, datatype, shape, flat.reshape(shape))


def _input(item: Any, index: int, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    if not isinstance(item, dict):
        raise ProtocolError(f"input {index + 1} must be an object with name, shape, datatype and data")
    name, datatype, shape = check_header(item.get("name"), item.get("datatype"), item.get("shape"), index)
    where = f"input {name[:200]!r}"
    parameters = check_parameters(item.get("parameters", ABSENT), where, "input")
    region = region_of(parameters, where)
    size = parameters.get("binary_data_size")
    # `"data": null` is no data: KServe's REST client writes it beside binary_data_size for an empty tensor
    given = [what for what, there in (("`data`", item.get("data") is not None), ("binary_data_size", size is not None),
                                      ("shared_memory_region", region is not None)) if there]
    if len(given) > 1:
        raise ProtocolError(f"{where} has both {given[0]} and {given[1]}; give one")
    if region is not None:
        return Tensor(name, datatype, shape, None, region), offset
    if size is not None:
        if type(size) is not int or size < 0:
            raise ProtocolError(f"{where}: binary_data_size must be a non-negative integer")
        if offset + size > len(binary):
            raise ProtocolError(f"{where}: binary_data_size {size} runs past the end of the body "
                                f"({len(binary) - offset} bytes of binary data remain)")
        return tensor_from_bytes(name, datatype, shape, binary[offset:offset + size]), offset + size
    if item.get("data") is None:
        raise ProtocolError(f"{where} has neither `data` nor a binary_data_size parameter")
    flat_list = _flatten(item["data"], shape, where)
    return Tensor(name, datatype, shape, _typed(flat_list, datatype, where).reshape(shape)), offset


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_RANK:
        raise ProtocolError(f"{where}: `shape` must be a list of at most {MAX_RANK} integers")
    for d in value:
        if type(d) is not int:
            raise ProtocolError(f"{where}: shape {value!r} has a dimension that is not an integer")
        if d < 0:
            raise ProtocolError(f"{where}: shape {value!r} has a negative dimension")
    if math.prod(value) > MAX_ELEMENTS:
        raise ProtocolError(f"{where}: shape {value!r} has more elements than any request may carry")
    if math.prod(d for d in value if d) > MAX_ELEMENTS:  # numpy sizes even an empty array by its other dimensions
        raise ProtocolError(f"{where}: shape {value!r} has dimensions larger than any request may carry")
    return tuple(value)


def _flatten(data: Any, shape: tuple[int, ...], where: str) -> list:
    """`data` as a flat list: either already flat, or nested exactly as `shape`."""
    count = math.prod(shape)
    if not isinstance(data, list):
        raise ProtocolError(f"{where}: `data` must be a list")
    if all(not isinstance(x, list) for x in data):
        if len(data) != count:
            raise ProtocolError(f"{where}: `data` has {len(data)} elements but shape {list(shape)} needs {count}")
        return data
    level = [data]
    for depth, dim in enumerate(shape):
        for node in level:
            if not isinstance(node, list) or len(node) != dim:
                raise ProtocolError(f"{where}: nested `data` does not match shape {list(shape)} at depth {depth + 1}")
        level = [x for node in level for x in node]
    if any(isinstance(x, list) for x in level):
        raise ProtocolError(f"{where}: nested `data` is deeper than shape {list(shape)}")
    return level


def _typed(flat: list, datatype: str, where: str) -> np.ndarray:
    """JSON values -> a flat array of `datatype`, refusing values of the wrong kind or range."""
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise ProtocolError(f"{where}: BYTES data in JSON must be strings (send other bytes as binary data)")
        try:
            return dt.bytes_array([x.encode("utf-8") for x in flat])
        except UnicodeEncodeError:
            raise ProtocolError(f"{where}: a string is not valid Unicode (lone surrogate)") from None
    if datatype == "BOOL":
        if not all(type(x) is bool for x in flat):
            raise ProtocolError(f"{where}: BOOL data must be true or false")
        return np.array(flat, dtype=bool)
    if datatype in dt.INTEGER:
        if not all(type(x) is int for x in flat):
            raise ProtocolError(f"{where}: {datatype} data must be integers")
        info = np.iinfo(dt.numpy_of(datatype))
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise ProtocolError(f"{where}: a value is outside the range of {datatype} [{info.min}, {info.max}]")
        return np.array(flat, dtype=dt.numpy_of(datatype))
    if not all(type(x) in (int, float) for x in flat):
        raise ProtocolError(f"{where}: {datatype} data must be numbers")
    narrow = np.empty(len(flat), np.float16 if datatype == "FP16" else np.float32 if datatype in ("FP32", "BF16")
                      else np.float64)
    for start in range(0, len(flat), FLOAT_PIECE):  # float64 only a piece at a time: the list is large already
        try:
            wide = np.array(flat[start:start + FLOAT_PIECE], dtype=np.float64)
        except OverflowError:
            raise ProtocolError(f"{where}: a value is outside the range of {datatype}") from None
        if not np.isfinite(wide).all():  # a number such as 1e999, which JSON parsers read as infinity
            raise ProtocolError(f"{where}: a value is outside the range of {datatype} (JSON numbers must be finite; "
                                "send non-finite floats as binary data)")
        piece = narrow[start:start + FLOAT_PIECE]
        with np.errstate(over="ignore"):  # overflow is refused next, not written to the server's stderr
            piece[:] = wide
        if not np.isfinite(piece).all() or (datatype == "BF16" and (np.abs(wide) > BF16_MAX).any()):
            raise ProtocolError(f"{where}: a value is outside the range of {datatype}")
    return narrow.astype(dt.numpy_of(datatype), copy=False)


def _outputs(value: Any) -> dict[str, Requested] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ProtocolError("`outputs` must be a list of {\"name\": ...} objects")
    wanted: dict[str, Requested] = {}
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError("each requested output must be an object with a `name` string")
        name = item["name"]
        if name in wanted:
            raise ProtocolError(f"output {name[:200]!r} is requested more than once")
        where = f"output {name[:200]!r}"
        parameters = check_parameters(item.get("parameters", ABSENT), where, "output")
        if type(parameters.get("classification")) is int and parameters["classification"] == 0:
            # Triton's HTTP front end reads 0 as "not set" (its gRPC one refuses it, as `requested` does)
            parameters = {k: v for k, v in parameters.items() if k != "classification"}
        wanted[name] = requested(parameters, where)
    return wanted


def requested(parameters: Mapping[str, Any], where: str) -> Requested:
    """A requested output's options from its (checked) parameters."""
    binary = parameters.get("binary_data", None)
    if binary is not None and not isinstance(binary, bool):
        raise ProtocolError(f"{where}: parameter binary_data must be true or false")
    classes = parameters.get("classification")
    if classes is not None and (type(classes) is not int or classes < 1):
        raise ProtocolError(f"{where}: parameter classification must be a positive integer (the number of classes "
                            "to return)")
    region = region_of(parameters, where)
    if region is not None and binary:
        raise ProtocolError(f"{where}: an output written to shared memory cannot also be sent as binary data")
    if region is not None and classes is not None:  # Triton: "can't set both 'shared_memory_region' and 'classification'"
        raise ProtocolError(f"{where}: an output cannot set both shared_memory_region and classification (its "
                            "classes are strings of a length the client cannot size a region for)")
    return Requested(binary, classes, region)


# ---------------------------------------------------------------- server: responses out


def encode_response(model: str, version: str, request_id: str | None, outputs: Sequence[Tensor],
                    binary: Mapping[str, bool]) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; outputs named true in `binary` go as binary data."""
    described, chunks = [], []
    for t in outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        described.append(entry)
        if t.region is not None:
            # written to shared memory: name, datatype and shape only, as Triton answers
            # (http_server.cc); tritonclient's C++ client (perf_analyzer) reads any output
            # `parameters` as binary data and fails without `binary_data_size`
            continue
        if binary.get(t.name):
            raw = dt.to_bytes(t.datatype, t.data)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif t.datatype == "BYTES":
            entry["data"] = [bytes(x).decode("utf-8", errors="replace") for x in t.data.reshape(-1)]
        else:
            if t.datatype in dt.FLOAT and not np.isfinite(t.data).all():
                raise ProtocolError(f"output {t.name!r} holds NaN or infinity, which JSON cannot carry; ask for it "
                                    "as binary data (output parameter binary_data: true)")
            entry["data"] = t.data.reshape(-1).tolist()
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": described}
    if request_id:  # an empty id is no id, as Triton answers
        doc["id"] = request_id
    head = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if not chunks:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(chunks), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


# ---------------------------------------------------------------- compressed bodies (inference only, as Triton)

#: the Content-Encodings an inference request body may have, and an answer may be given in
#: (Triton's HTTP front end: zlib's gzip and its zlib-wrapped "deflate", both read with
#: window bits 15 | 32, which tells them apart)
CODINGS = ("gzip", "deflate")


def inflate(body: bytes, coding: str, limit: int) -> bytes:
    """A gzip or deflate request body, decompressed; never more than `limit` bytes (a body
    that inflates past the request size limit is refused before it is held whole)."""
    inflater = zlib.decompressobj(15 | 32)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(f"the request body is not valid {coding} data ({exc})") from None
    if len(data) > limit:
        raise PayloadTooLargeError(f"the request body, decompressed, exceeds the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ProtocolError(f"the request body is not valid {coding} data (truncated, or followed by other bytes)")
    return data


def response_coding(accept_encoding: str | None) -> str | None:
    """The coding an answer goes in: of identity, gzip and deflate, the one Accept-Encoding
    weighs highest (the first among equals, as Triton's CompressionTypeUsed); None for identity."""
    best, weight = "identity", 0.0
    for item in (accept_encoding or "").split(","):
        name, _, params = item.partition(";")
        name, q = name.strip().lower(), 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                continue
        if name in ("identity", *CODINGS) and q > weight:
            best, weight = name, q
    return None if best == "identity" else best


def compress(body: bytes, coding: str) -> bytes:
    """`body` in `coding` (gzip or deflate) at zlib's default level, as Triton compresses."""
    packer = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15 | 16 if coding == "gzip" else 15)
    return packer.compress(body) + packer.flush()


# ---------------------------------------------------------------- clients: requests out, responses in


def encode_request(inputs: Mapping[str, Any], binary: bool = True, outputs: Sequence[str] | None = None,
                   request_id: str | None = None, datatypes: Mapping[str, str] | None = None
                   ) -> tuple[bytes, dict[str, str]]:
    """A request body and headers from numpy arrays, torch tensors or (nested) lists of
    numbers, or lists of bytes/str for BYTES; anything else is an `InputError` naming the
    input. `datatypes` gives a numeric input's datatype where its array's dtype does not say it."""
    described, chunks = [], []
    for name, value in inputs.items():
        datatype = (datatypes or {}).get(name)
        array = _request_array(name, value, datatype)
        if array.dtype == object:  # str/bytes items, whatever a tensor of that name would be
            datatype = "BYTES"
        try:
            datatype = datatype or _v2_of(array.dtype)
        except ValueError as exc:
            raise InputError(f"input {name!r}: {exc}") from None
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if binary or datatype == "BYTES" and not _all_utf8(array):
            raw = dt.to_bytes(datatype, array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [x.decode() for x in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1).tolist()
        described.append(entry)
    doc: dict[str, Any] = {"inputs": described}
    if request_id is not None:
        doc["id"] = request_id
    if outputs is not None:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    elif binary:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(chunks), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def _request_array(name: str, value: Any, datatype: str | None) -> np.ndarray:
    """An input of `encode_request` as a numpy array: numeric, or an object array of bytes
    for BYTES. A value can only be a torch tensor where torch is imported already, so this
    module does not import it (`zoo.client` imports no deep-learning library)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = as_numpy(value)
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OSU":
        return value
    if isinstance(value, np.ndarray):
        items, shape = value.reshape(-1).tolist(), value.shape
    elif isinstance(value, (list, tuple)) and all(isinstance(x, (str, bytes, bytearray, memoryview)) for x in value):
        items, shape = list(value), (len(value),)
    elif isinstance(value, (list, tuple)):
        numeric = datatype is not None and datatype != "BYTES"
        try:
            array = np.asarray(value, dtype=dt.numpy_of(datatype) if numeric else None)
        except (ValueError, TypeError):
            array = None  # ragged, or not numbers
        if array is not None and array.dtype.kind in "biuf":
            return array
        raise InputError(f"input {name!r}: a list that is neither numbers of one shape (an array's "
                         f".tolist()) nor str/bytes items")
    else:
        raise InputError(f"input {name!r} is {type(value).__name__}: give a numpy array, a torch tensor, "
                         f"a list of numbers, or a list of str/bytes items for BYTES")
    try:
        return dt.bytes_array(domain_items(items)).reshape(shape)
    except InputError as exc:
        raise InputError(f"input {name!r}: {exc}") from None


def decode_response(body: bytes, header_length: str | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(the response JSON, outputs by name as numpy arrays; BYTES as object arrays of bytes)."""
    end = int(header_length) if header_length is not None else len(body)
    doc = json.loads(body[:end])
    arrays, offset = {}, end
    for out in doc.get("outputs", []):
        shape, datatype = tuple(out["shape"]), out["datatype"]
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            flat = dt.from_bytes(datatype, memoryview(body)[offset:offset + size], math.prod(shape))
            offset += size
        elif datatype == "BYTES":
            flat = dt.bytes_array([x.encode() for x in out["data"]])
        else:
            flat = np.array(out["data"], dtype=dt.numpy_of(datatype))
        arrays[out["name"]] = flat.reshape(shape)
    return doc, arrays


def _v2_of(dtype: np.dtype) -> str:
    for datatype, t in dt.NUMPY_TYPES.items():
        if t is not None and datatype != "BF16" and t.newbyteorder("=") == dtype.newbyteorder("="):
            return datatype
    raise ValueError(f"no Open Inference Protocol datatype for numpy {dtype}")


def _all_utf8(array: np.ndarray) -> bool:
    try:
        for x in array.reshape(-1):
            x.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
