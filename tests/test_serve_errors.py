"""Malformed requests against a real `zoo serve`: each gets the right 4xx/5xx status and
a `{"error": ...}` naming what was wrong (never a traceback, an exception class name or
a file path), and the server stays live and correct after every one of them."""

from __future__ import annotations

import gzip
import json
import re
import socket
import struct
import zlib

import httpx
import numpy as np
import pytest

pytest.register_assert_rewrite("serve_support")
from serve_support import DOMAIN_MODELS, ONNX, RAGGED, artifact_name  # noqa: E402

pytest_plugins = ["serve_support"]
IMAGE = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}
TOKENS = {"name": "tokens", "datatype": "INT64", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}
MASK = {"name": "mask", "datatype": "INT64", "shape": [1, 5], "data": [1, 1, 1, 1, 1]}
LIMIT = 1 << 20  # the shared server's --max-request-size


def body(*inputs: dict, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def image(**changes) -> dict:
    return {**IMAGE, **changes}


def binary_image(size: int) -> dict:
    return {**{k: v for k, v in IMAGE.items() if k != "data"}, "parameters": {"binary_data_size": size}}


def binary(json_inputs: list[dict], data: bytes, header: int | str | None = None) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": json_inputs}).encode()
    return head + data, {"Inference-Header-Content-Length": str(len(head) if header is None else header)}


def raw_bytes(name: str, items: list[bytes]) -> tuple[bytes, dict]:
    data = b"".join(struct.pack("<I", len(x)) + x for x in items)
    return binary([{"name": name, "datatype": "BYTES", "shape": [len(items)],
                    "parameters": {"binary_data_size": len(data)}}], data)


FLOATS64 = np.zeros(64, np.float32).tobytes()

#: (id, model, body or (body, headers), status, words the message must contain)
CASES = [
    ("wrong-datatype", ONNX, body(image(datatype="FP64")), 400, "datatype FP64"),
    ("unknown-datatype", ONNX, body(image(datatype="FLOAT")), 400, "is not a datatype"),
    ("data-length-disagrees", ONNX, body(image(data=[0.5] * 63)), 400, "63 elements"),
    ("negative-dimension", ONNX, body(image(shape=[-1, 1, 8, 8])), 400, "negative"),
    ("overflowing-dimensions", ONNX, body(image(shape=[2 ** 62, 2 ** 62, 8, 8])), 400, "more elements"),
    ("dimension-not-integer", ONNX, body(image(shape=[1.5, 1, 8, 8])), 400, "not an integer"),
    ("wrong-rank", ONNX, body(image(shape=[1, 64], data=[0.5] * 64)), 400, "takes [-1, 1, 8, 8]"),
    ("wrong-fixed-dimension", ONNX, body(image(shape=[1, 1, 4, 16])), 400, "dimension 2 must be 8"),
    ("zero-batch", ONNX, body(image(shape=[0, 1, 8, 8], data=[])), 400, "takes 1 to 64"),
    ("batch-over-maximum", ONNX, body(image(shape=[65, 1, 8, 8], data=[0.5] * 65 * 64)), 400, "takes 1 to 64"),
    ("missing-input", RAGGED, body(TOKENS), 400, "missing ['mask']"),
    ("extra-input", RAGGED, body(TOKENS, MASK, {**MASK, "name": "segments"}), 400, "unexpected ['segments']"),
    ("duplicate-input", ONNX, body(IMAGE, IMAGE), 400, "more than once"),
    ("no-inputs", ONNX, body(), 400, "missing ['image']"),
    ("axes-disagree", RAGGED, body(TOKENS, {**MASK, "shape": [1, 6], "data": [1] * 6}), 400, "disagree on axis 'seq'"),
    ("axis-over-range", RAGGED, body({**TOKENS, "shape": [1, 17], "data": [1] * 17},
                                     {**MASK, "shape": [1, 17], "data": [1] * 17}), 400, "takes 2 to 16"),
    ("string-for-fp32", ONNX, body(image(data=["x"] * 64)), 400, "must be numbers"),
    ("float-for-int64", RAGGED, body({**TOKENS, "data": [1.5] * 5}, MASK), 400, "must be integers"),
    ("int64-overflow", RAGGED, body({**TOKENS, "data": [2 ** 70] * 5}, MASK), 400, "outside the range of INT64"),
    ("nested-data-mismatch", ONNX, body(image(data=[[0.5] * 8] * 8)), 400, "does not match shape"),
    ("unknown-output", ONNX, body(IMAGE, outputs=[{"name": "probs"}]), 400, "no output 'probs'"),
    ("duplicate-output", ONNX, body(IMAGE, outputs=[{"name": "logits"}] * 2), 400, "more than once"),
    ("data-and-binary", ONNX, body(image(parameters={"binary_data_size": 256})), 400, "both"),
    ("neither-data-nor-binary", ONNX, body({k: v for k, v in IMAGE.items() if k != "data"}), 400, "neither"),
    ("parameters-not-object", ONNX, body(IMAGE, parameters=[1]), 400, "must be an object"),
    ("id-not-string", ONNX, body(IMAGE, id=7), 400, "`id` must be a string"),
    ("non-json-body", ONNX, b"image=0.5", 400, "not valid JSON"),
    ("json-array-body", ONNX, b"[1, 2]", 400, "JSON object"),
    ("deeply-nested-json", ONNX, b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    ("binary-size-past-end", ONNX, binary([binary_image(256)], FLOATS64[:100]),
     400, "runs past the end"),
    ("binary-bytes-left-over", ONNX, binary([binary_image(256)], FLOATS64 + b"xx"),
     400, "add up to 256"),
    ("binary-size-not-the-shape", ONNX, binary([binary_image(252)], FLOATS64[:252]),
     400, "do not hold 64 FP32"),
    ("header-longer-than-body", ONNX, binary([IMAGE], b"", header=10 ** 6), 400, "Inference-Header-Content-Length"),
    ("header-not-a-number", ONNX, binary([IMAGE], b"", header="ten"), 400, "must be an integer"),
    ("bytes-length-prefix-cut", RAGGED, binary([{"name": "text", "datatype": "BYTES", "shape": [1],
                                                 "parameters": {"binary_data_size": 2}}], b"\x05\x00"),
     400, "cut off"),
    ("invalid-utf8-text", RAGGED, raw_bytes("text", [b"ok text", b"\xff\xfe bad"]), 400, "item 2 is not valid UTF-8"),
    ("text-too-long-for-model", RAGGED, raw_bytes("text", [b"x" * 40]), 400, "takes 2 to 16"),
    ("too-many-items", RAGGED, raw_bytes("text", [b"hello"] * 17), 400, "1 to 16 text items"),
    ("unknown-model", "no-such-model", body(IMAGE), 404, "unknown model 'no-such-model'"),
    ("datatype-object", ONNX, body(image(datatype={})), 400, "`datatype` of JSON type object is not a datatype"),
    ("datatype-list", ONNX, body(image(datatype=["FP32"])), 400, "`datatype` of JSON type array is not a datatype"),
    ("nan-literal", ONNX, body(IMAGE).replace(b"0.5", b"NaN", 1), 400, "the literal NaN"),
    ("infinity-literal", ONNX, body(IMAGE).replace(b"0.5", b"-Infinity", 1), 400, "the literal -Infinity"),
    ("outputs-null", ONNX, body(IMAGE, outputs=None), 400, "leave it out for every output"),
    ("outputs-not-a-list", ONNX, body(IMAGE, outputs={"name": "logits"}), 400, "`outputs` must be a list"),
    ("sequence-parameters", ONNX, body(IMAGE, parameters={"sequence_id": 7, "sequence_start": True}), 400,
     "'sequence_id' of the request belongs to the sequence batching extension"),
    ("priority-parameter", ONNX, body(IMAGE, parameters={"priority": 1}), 400, "priority scheduling extension"),
    ("classification-on-an-input", ONNX, body(image(parameters={"classification": 3})),
     400, "'classification' of the input 'image' belongs on a requested output"),
    ("classification-negative", ONNX, body(IMAGE, outputs=[{"name": "logits", "parameters": {"classification": -1}}]),
     400, "output 'logits': parameter classification must be a positive integer"),
    ("binary-data-on-an-input", ONNX, body(image(parameters={"binary_data": True})), 400,
     "parameter 'binary_data' of the input 'image' belongs on a requested output"),
    ("binary-data-size-on-an-output", ONNX, body(IMAGE, outputs=[{"name": "logits", "parameters": {
        "binary_data_size": 40}}]), 400, "parameter 'binary_data_size' of the output 'logits' belongs on an input"),
    ("binary-data-output-on-an-input", ONNX, body(image(parameters={"binary_data_output": True})), 400,
     "parameter 'binary_data_output' of the input 'image' belongs on the request"),
    ("timeout-on-an-output", ONNX, body(IMAGE, outputs=[{"name": "logits", "parameters": {"timeout": 10 ** 6}}]),
     400, "parameter 'timeout' of the output 'logits' belongs on the request"),
    # Triton's parser keeps a repeated key's first value, Python's its last: refused, so no two servers differ
    ("repeated-key", ONNX, b'{"inputs": [%s], "inputs": []}' % json.dumps(IMAGE).encode(), 400,
     "the request JSON repeats the key 'inputs' in an object"),
    ("repeated-key-in-an-input", ONNX, body(IMAGE).replace(b'"shape": [1, 1, 8, 8]', b'"shape": [2, 1, 8, 8], '
                                                           b'"shape": [1, 1, 8, 8]'), 400, "repeats the key 'shape'"),
    ("repeated-key-in-parameters", ONNX, body(IMAGE, outputs=[{"name": "logits", "parameters": {"binary_data": True}}])
     .replace(b'"binary_data": true', b'"binary_data": true, "binary_data": false'), 400,
     "repeats the key 'binary_data'"),
    ("shared-memory-on-the-request", ONNX, body(IMAGE, parameters={"shared_memory_region": "r"}), 400,
     "'shared_memory_region' of the request belongs on an input or a requested output"),
    ("shared-memory-without-size", ONNX, body(image(parameters={"shared_memory_region": "r"})), 400,
     "shared_memory_byte_size must be given"),
    ("shared-memory-and-data", ONNX, body(image(parameters={"shared_memory_region": "r",
                                                            "shared_memory_byte_size": 256})), 400,
     "has both `data` and shared_memory_region"),
    ("shared-memory-unregistered", ONNX, body({k: v for k, v in image(parameters={"shared_memory_region": "r",
                                                                         "shared_memory_byte_size": 256}).items()
                                      if k != "data"}), 400, "unknown shared memory region"),
    ("reserved-request-parameter", ONNX, body(IMAGE, parameters={"triton_enable_empty_final_response": True}),
     400, "names starting with triton_ are reserved"),
    ("custom-parameter-not-scalar", ONNX, body(IMAGE, parameters={"temperature": [0.5]}), 400,
     "must be a string, number or boolean"),
    ("id-null", ONNX, body(IMAGE, id=None), 400, "`id` must be a string"),
    ("parameters-null", ONNX, body(IMAGE, parameters=None), 400, "`parameters` of the request must be an object"),
    ("input-parameters-null", ONNX, body(image(parameters=None)), 400, "`parameters` of the input 'image'"),
    ("output-parameters-null", ONNX, body(IMAGE, outputs=[{"name": "logits", "parameters": None}]), 400,
     "`parameters` of the output 'logits'"),
    ("number-overflowing-to-infinity", ONNX, body(IMAGE).replace(b"0.5", b"1e999", 1), 400,
     "outside the range of FP32 (JSON numbers must be finite"),
    ("number-beyond-float32", ONNX, body(image(data=[3.5e38] + [0.5] * 63)), 400, "outside the range of FP32"),
    ("shared-memory-offset-without-region", ONNX, body(image(parameters={"shared_memory_offset": 0})), 400,
     "shared_memory_offset and shared_memory_byte_size go with shared_memory_region"),
    ("timeout-not-integer", ONNX, body(IMAGE, parameters={"timeout": "soon"}), 400, "positive integer (microseconds)"),
    ("raw-binary-wrong-size", ONNX, (FLOATS64[:100], {"Inference-Header-Content-Length": "0"}), 400,
     "the body has 100 bytes; a FP32 tensor of shape [1, 1, 8, 8] needs 256"),
    ("raw-binary-two-images", ONNX, (FLOATS64 * 2, {"Inference-Header-Content-Length": "0"}), 400,
     "the body has 512 bytes; a FP32 tensor of shape [1, 1, 8, 8] needs 256"),
    ("raw-binary-two-inputs", RAGGED, (FLOATS64, {"Inference-Header-Content-Length": "0"}), 400,
     "for models with one input"),
]
SMILES_MODEL, IMAGE_MODEL = DOMAIN_MODELS["drug"], DOMAIN_MODELS["vision"]
DOMAIN_CASES = [
    pytest.param("invalid-smiles", SMILES_MODEL and artifact_name(SMILES_MODEL),
                 raw_bytes("smiles", [b"CCO", b"C1CC("]), 400, "invalid SMILES", id="invalid-smiles",
                 marks=pytest.mark.skipif(SMILES_MODEL is None, reason="no drug model with SMILES input yet")),
    pytest.param("undecodable-image", IMAGE_MODEL and artifact_name(IMAGE_MODEL),
                 raw_bytes("image", [b"GIF89a-not"]), 400, "image", id="undecodable-image",
                 marks=pytest.mark.skipif(IMAGE_MODEL is None, reason="no registered vision model with image input")),
]
#: what an error body must never show: tracebacks, exception class names, file system paths
LEAKS = re.compile(r"Traceback|File \"|\b[A-Z]\w*(Error|Exception)\b|/work/|/tmp/|/usr/|site-packages|\.py\b")


def check_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert set(doc) == {"error"} and words in doc["error"], doc
    assert not LEAKS.search(doc["error"]), doc["error"]


def check_still_serving(server) -> None:
    """Live, ready, and a good request still gets the right answer."""
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    x = np.linspace(0, 1, 64, dtype=np.float32)
    first = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=body(image(data=x.tolist())))
    second = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=body(image(data=x.tolist())))
    assert first.status_code == second.status_code == 200
    assert first.json()["outputs"] == second.json()["outputs"]


@pytest.mark.parametrize(("case", "model", "request_body", "status", "words"),
                         [pytest.param(*c, id=c[0]) for c in CASES] + DOMAIN_CASES)
def test_malformed_request(server, case, model, request_body, status, words):
    content, headers = request_body if isinstance(request_body, tuple) else (request_body, {})
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", content=content, headers=headers, timeout=60)
    check_error(response, status, words)
    check_still_serving(server)


def test_unknown_version(server):
    check_error(httpx.post(f"{server.url}/v2/models/{ONNX}/versions/2/infer", content=body(IMAGE)), 404, "no version")
    check_error(httpx.get(f"{server.url}/v2/models/{ONNX}/versions/0"), 404, "no version")
    # Triton answers these two 400; every route here answers a model or version not served 404
    for path in (f"{ONNX}/versions/2/ready", f"{ONNX}/versions/2/stats", "no-such-model/ready", "no-such-model/stats"):
        check_error(httpx.get(f"{server.url}/v2/models/{path}"), 404, "no version" if "versions" in path else
                    "unknown model")


def test_a_version_is_read_as_an_integer_as_triton_reads_it(server):
    """Triton reads a version with std::stol: `01` is version 1. Its HTTP routes take only digits
    there, so a path with a negative or non-numeric version is no endpoint (404, as tritonserver
    2.51 answers, compared side by side); digits past std::stol's range are the request's fault (400)."""
    versioned = f"{server.url}/v2/models/{ONNX}/versions"
    for version in ("01", "0001"):
        assert httpx.get(f"{versioned}/{version}").json()["name"] == ONNX
        assert httpx.get(f"{versioned}/{version}/ready").status_code == 200
        assert httpx.get(f"{versioned}/{version}/config").status_code == 200
        assert httpx.get(f"{versioned}/{version}/stats").json()["model_stats"][0]["version"] == "1"
        response = httpx.post(f"{versioned}/{version}/infer", content=body(IMAGE))
        assert response.status_code == 200 and response.json()["model_version"] == "1", response.text
    for version in ("-1", "one", "1.0", "1abc", "%201"):
        for path in ("", "/ready", "/config", "/stats"):
            check_error(httpx.get(f"{versioned}/{version}{path}"), 404, "a model version in a URL is its number")
        check_error(httpx.post(f"{versioned}/{version}/infer", content=body(IMAGE)), 404, "is its number")
    check_error(httpx.get(f"{versioned}/{'9' * 30}"), 400, "is not a model version (a non-negative integer)")
    check_error(httpx.post(f"{versioned}/{'9' * 30}/infer", content=body(IMAGE)), 400, "is not a model version")
    check_still_serving(server)


@pytest.mark.parametrize("path, content", [
    ("/v2/repository/index", b'{"ready": true, "ready": false}'),
    ("/v2/systemsharedmemory/region/r/register", b'{"key": "/a", "key": "/b", "offset": 0, "byte_size": 8}'),
], ids=["index", "register"])
def test_a_repeated_key_is_refused_in_every_request_body(server, path, content):
    check_error(httpx.post(f"{server.url}{path}", content=content), 400, "repeats the key")
    check_still_serving(server)


def test_oversized_body_is_refused_before_it_is_read(server):
    big = b"0" * (LIMIT + 1)
    check_error(httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=big), 413, "exceeds the limit")
    check_still_serving(server)


def test_oversized_chunked_body(server):
    def chunks():
        for _ in range(2 * LIMIT // (64 << 10)):
            yield b"0" * (64 << 10)

    response = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=chunks())
    assert "content-length" not in response.request.headers  # it really was sent chunked
    check_error(response, 413, "exceeds the limit")
    check_still_serving(server)


def test_compressed_inference_requests_and_answers(server):
    """As Triton's HTTP front end: an inference body in gzip or deflate (zlib-wrapped) is
    read, and an answer goes in the coding Accept-Encoding weighs highest."""
    x = np.linspace(0, 1, 64, dtype=np.float32)
    url = f"{server.url}/v2/models/{ONNX}/infer"
    plain = httpx.post(url, content=body(image(data=x.tolist())), headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    packers = {"gzip": gzip.compress, "deflate": zlib.compress}
    for coding, pack in packers.items():
        for accept, answered in ((coding, coding), (f"identity;q=0.5, {coding}", coding),
                                 (f"{coding};q=0.1, identity", None), ("br", None)):
            response = httpx.post(url, content=pack(body(image(data=x.tolist()))),
                                  headers={"Content-Encoding": coding, "Accept-Encoding": accept})
            assert response.status_code == 200, response.text
            assert response.headers.get("content-encoding") == answered, accept
            # httpx decodes what Content-Encoding names: a body not in that coding would fail here
            assert response.json()["outputs"] == plain.json()["outputs"]
    check_still_serving(server)


@pytest.mark.parametrize("headers, where, status, words", [
    ({"Content-Encoding": "br"}, "infer", 415, "Content-Encoding 'br' is not supported"),
    ({"Content-Encoding": "gzip, gzip"}, "infer", 415, "in one coding: gzip or deflate"),
    ({"Content-Encoding": "gzip"}, "index", 415, "only an inference request may be compressed"),
    ({"Content-Encoding": "gzip"}, "infer", 400, "not valid gzip data"),
    ({"Content-Encoding": "deflate"}, "truncated", 400, "not valid deflate data (truncated"),
    ({"Content-Encoding": "gzip"}, "bomb", 413, "decompressed, exceeds the limit of 1048576 bytes"),
], ids=["unknown-coding", "two-codings", "not-inference", "not-gzip", "truncated", "inflates-past-the-limit"])
def test_compressed_bodies_refused(server, headers, where, status, words):
    url = f"{server.url}/v2/models/{ONNX}/infer"
    content = body(IMAGE)
    if where == "index":
        url, content = f"{server.url}/v2/repository/index", gzip.compress(b"{}")
    elif where == "truncated":
        content = zlib.compress(body(IMAGE))[:-6]
    elif where == "bomb":  # 2 MiB of spaces, a few kB compressed: under the limit on the wire, past it inflated
        content = gzip.compress(body(IMAGE)[:-1] + b" " * (2 << 20) + b"}")
        assert len(content) < LIMIT
    response = httpx.post(url, content=content, headers=headers)
    check_error(response, status, words)
    if status == 415 and where == "infer":
        assert response.headers["accept-encoding"] == "gzip, deflate"  # what it reads, as Triton says
    check_still_serving(server)


def test_unknown_route_and_method(server):
    check_error(httpx.get(f"{server.url}/v2/nothing/here"), 404, "no endpoint")
    check_error(httpx.get(f"{server.url}/v2/models/{ONNX}/infer"), 405, "GET is not allowed")


def test_model_control_is_off_by_default(server):
    response = httpx.post(f"{server.url}/v2/repository/models/{ONNX}/load")
    check_error(response, 403, "--model-control")
    check_error(httpx.post(f"{server.url}/v2/repository/models/{ONNX}/unload"), 403, "--model-control")
    assert httpx.get(f"{server.url}/v2/models/{ONNX}/ready").status_code == 200


def test_failures_are_counted_by_reason_and_route(server):
    """Self-contained: it sends what it counts. A 413 refused from the headers alone is
    counted under its route, not as unmatched."""
    httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=body(image(datatype="FP64")))
    httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=b"0" * (LIMIT + 1))
    httpx.get(f"{server.url}/v2/nothing/here")
    text = httpx.get(f"{server.url}/metrics").text
    assert re.search(rf'zoo_inference_failures_total{{model="{re.escape(ONNX)}",reason="bad_request",version="1"}} '
                     r'[1-9]', text), text[-2000:]
    assert re.search(r'zoo_http_responses_total{code="413",route="/v2/models/{model}/infer"} [1-9]', text)
    assert re.search(r'zoo_http_responses_total{code="404",route="unmatched"} [1-9]', text)


def test_a_request_with_both_content_length_and_transfer_encoding(server):
    """Refused by the HTTP parser itself, before the application: still a JSON error."""
    head = (f"POST /v2/models/{ONNX}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    headers, _, content = rest.partition(b"\r\n\r\n")
    assert status_line.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in headers.lower()
    assert "Transfer-Encoding" in json.loads(content)["error"]
    check_still_serving(server)


def test_two_content_length_headers_are_refused_and_head_answers_as_get(server):
    """Where Triton differs: it takes two equal Content-Length headers, and answers HEAD 405."""
    request = (f"POST /v2/models/{ONNX}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body(IMAGE))}\r\n"
               f"Content-Length: {len(body(IMAGE))}\r\n\r\n").encode() + body(IMAGE)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    head = httpx.head(f"{server.url}/v2/models/{ONNX}")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == httpx.get(f"{server.url}/v2/models/{ONNX}").headers["content-length"]
    check_still_serving(server)


def test_a_request_timeout_parameter_is_honoured(server):
    # Triton's dynamic batcher refuses a request whose timeout expired with UNAVAILABLE, "Request
    # timeout expired" (dynamic_batch_scheduler.cc): 503 over HTTP, UNAVAILABLE over gRPC (zoo
    # answered 504 / DEADLINE_EXCEEDED, a code clients read as their own deadline passing)
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    words = f"request timeout expired: model {ONNX} did not answer within 1e-06 s"
    response = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=body(IMAGE, parameters={"timeout": 1}))
    check_error(response, 503, words)
    with triton_grpc.InferenceServerClient(server.grpc_url) as client:
        image_input = triton_grpc.InferInput("image", [1, 1, 8, 8], "FP32")
        image_input.set_data_from_numpy(np.full((1, 1, 8, 8), 0.5, np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer(ONNX, [image_input], timeout=1)
    assert (info.value.status(), info.value.message()) == ("StatusCode.UNAVAILABLE", words)
    check_still_serving(server)
