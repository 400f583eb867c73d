"""The server's pure parts, without a server: the v2 tensor codec round-trips every
datatype exactly (binary and JSON), and ragged batching pads and cuts back so that each
request's share of a batch has its own shapes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from zoo.serve import datatypes as dt
from zoo.serve.batcher import Work, merge, split
from zoo.serve.errors import ProtocolError, message_for, scrub, status_for
from zoo.serve.protocol import decode_request, decode_response, encode_request, encode_response

ARRAYS = {
    "FP32": np.array([[1.5, -2.25e-8], [3.4e38, 0.0]], np.float32),
    "FP16": np.array([1.0, -0.5, 65504.0], np.float16),
    "INT64": np.array([[-(2 ** 63), 2 ** 63 - 1]], np.int64),
    "INT32": np.array([7, -7], np.int32),
    "INT8": np.array([-128, 127], np.int8),
    "UINT8": np.array([0, 255], np.uint8),
    "BOOL": np.array([True, False, True]),
}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_request_round_trip(binary):
    inputs = {f"x_{k.lower()}": v for k, v in ARRAYS.items()}
    inputs["text"] = ["héllo", "", "a\x00b"]
    body, headers = encode_request(inputs, binary=binary, request_id="r1")
    request = decode_request(body, headers.get("Inference-Header-Content-Length"))
    assert request.id == "r1" and [t.name for t in request.inputs] == list(inputs)
    for t in request.inputs[:-1]:
        np.testing.assert_array_equal(t.data, inputs[t.name])
        assert t.data.dtype == inputs[t.name].dtype
    assert list(request.inputs[-1].data) == [b"h\xc3\xa9llo", b"", b"a\x00b"]


def test_response_round_trip_and_bf16():
    values = np.array([1.0, -3.140625, 65280.0], np.float32)  # exactly representable in bfloat16
    raw = dt.to_bytes("BF16", values)
    assert len(raw) == 6
    np.testing.assert_array_equal(dt.from_bytes("BF16", raw, 3), values)
    from zoo.serve.protocol import Tensor

    outputs = [Tensor("a", "FP32", (2, 2), ARRAYS["FP32"]), Tensor("b", "BYTES", (2,), dt.bytes_array([b"x", b"\xff"]))]
    body, headers = encode_response("m", "1", "id9", outputs, {"a": True, "b": True})
    doc, arrays = decode_response(body, headers["Inference-Header-Content-Length"])
    assert doc["id"] == "id9" and doc["model_name"] == "m"
    np.testing.assert_array_equal(arrays["a"], ARRAYS["FP32"])
    assert list(arrays["b"]) == [b"x", b"\xff"]


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'{"inputs": {}}', b"\xff\xfe", b"[" * 50_000])
def test_garbage_is_a_protocol_error(body):
    with pytest.raises(ProtocolError):
        decode_request(body, None)


def work(rows: int, seq: int) -> Work:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
    finally:
        loop.close()
    tokens = np.arange(1, rows * seq + 1, dtype=np.int64).reshape(rows, seq)
    return Work({"tokens": tokens, "mask": np.ones_like(tokens)}, rows, {"seq": seq}, future)


def test_ragged_merge_pads_with_zeros_and_split_cuts_back():
    works = [work(1, 3), work(2, 5), work(1, 2)]
    merged = merge(works, ["tokens", "mask"])
    assert merged["tokens"].shape == (4, 5)
    np.testing.assert_array_equal(merged["mask"].sum(axis=1), [3, 5, 5, 2])
    np.testing.assert_array_equal(merged["tokens"][0], [1, 2, 3, 0, 0])
    hidden = np.repeat(merged["tokens"][:, :, None], 4, axis=2).astype(np.float32)  # a per-token output
    pooled = merged["tokens"].sum(axis=1, keepdims=True)
    parts = split({"hidden": hidden, "pooled": pooled}, works, {"hidden": {1: "seq"}, "pooled": {}})
    for w, part in zip(works, parts):
        assert part["hidden"].shape == (w.rows, w.sizes["seq"], 4)
        np.testing.assert_array_equal(part["hidden"][..., 0], w.inputs["tokens"])
        np.testing.assert_array_equal(part["pooled"][:, 0], w.inputs["tokens"].sum(axis=1))


def test_failure_reasons_are_the_documented_ones():
    from zoo.errors import InputError, ZooError
    from zoo.serve import errors

    assert [errors.reason_for(e) for e in (InputError("x"), errors.RequestFailedError("x"),
                                           errors.QueueFullError("x"), errors.ModelNotReadyError("x"),
                                           errors.BackendFailureError("x"), errors.RequestTimeoutError("x"),
                                           ZooError("x"), KeyError("x"))] == \
        ["bad_request", "bad_request", "queue_full", "not_ready", "backend", "timeout", "internal", "internal"]


def test_error_table_and_scrubbing():
    from zoo.errors import InputError, ZooError

    assert status_for(ProtocolError("x")) == status_for(InputError("x")) == 400
    assert status_for(ZooError("x")) == 500 and status_for(ValueError("x")) is None
    assert scrub("cannot load /work/main/exports/a/1/model.onnx: bad") == "cannot load <path>: bad"
    # a request error quotes the request as it was sent (a SMILES with stereo bonds, an API path);
    # any other error may carry a library's text, whose paths are hidden
    assert message_for(InputError("invalid SMILES 'C/C=C/C(C'")) == "invalid SMILES 'C/C=C/C(C'"
    assert message_for(ProtocolError("register it first (POST /v2/systemsharedmemory/region/NAME/register)")) \
        .endswith("(POST /v2/systemsharedmemory/region/NAME/register)")
    assert message_for(ZooError("cannot load /srv/models/a/1/model.onnx")) == "cannot load <path>"
    assert message_for(InputError("x" * 2000)).endswith("...") and len(message_for(InputError("x" * 2000))) == 1003
