"""NVIDIA Triton's HTTP QA tests, ported to `zoo serve`.

Source: the GitHub repository triton-inference-server/server, `qa/L0_http/http_test.py`
(class HttpTest), `qa/L0_http/test.sh` (the curl checks of binary/JSON outputs),
`qa/L0_http/http_request_many_chunks.py`, `qa/L0_http/python_http_aio_test.py` and
`qa/L0_parameters/parameters_test.py`. Triton's tests are © NVIDIA CORPORATION &
AFFILIATES under the BSD-3-Clause license; this is our own code. It sends the same kind
of request to our models instead of Triton's identity models. Each test gives its Triton
name in a comment, asserts Triton's status and error text where we should agree (ours
where we differ by design, see docs/serving.md "Differences from Triton"), and then
checks that `/v2/health/live` still answers 200, as Triton's QA does.

Not ported, and why:
- test_byte, test_byte_too_many_elements: need BYTES identity models with shape [1]; we have none.
- test_multi_variable_dimensions: no served model has one input with two variable dimensions.
- test_descriptive_status_code: needs a 1-deep queue; test_serve_lifecycle.py checks the 503 of a full queue.
- test_loading_large_invalid_model, http_input_size_limit_test.py: 64 MiB to 2 GiB bodies;
  test_serve_errors.py checks the size limit (413 here, 400 in Triton).
- test_duplicate_output_names, the curl "data does not match shape" checks, nested_json_crash.py:
  test_serve_errors.py has the same requests (duplicate-output, data-length-disagrees, deeply-nested-json).
- generate_endpoint_test.py, generate_error_status_test.py, llm_test.py: the generate extension and LLMs.
- http_basic_auth_test.py, http_restricted_api_test.py, http_client_plugin_test.py: Triton-only features.
- parameters_test.py test_headers*: header forwarding (--http-header-forward-pattern) is Triton-only.
- python_http_aio_test.py trace calls: an extension we do not implement (404).
- test.sh sequence clients and CUDA shared memory clients: sequence batching and CUDA shm are Triton-only.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from zoo.serve.protocol import HEADER_LENGTH, decode_response

pytest.register_assert_rewrite("serve_support")
from serve_support import ONNX, RAGGED, ServerProcess  # noqa: E402

pytest_plugins = ["serve_support"]
PIXELS = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(1, 1, 8, 8)
IMAGE: dict[str, Any] = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": PIXELS.ravel().tolist()}
TOKENS = {"name": "tokens", "datatype": "INT64", "shape": [1, 4], "data": [5, 6, 7, 8]}
MASK = {"name": "mask", "datatype": "INT64", "shape": [1, 4], "data": [1, 1, 1, 1]}
RAW = {HEADER_LENGTH: "0"}  # Triton's raw binary request: the whole body is the one input's tensor


def url(server: ServerProcess, model: str) -> str:
    return f"{server.url}/v2/models/{model}/infer"


def assert_live(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


def error_of(response: httpx.Response, status: int) -> str:
    """The `error` of a JSON error body with this status (Triton's shape: {"error": "..."})."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers.get("content-type", "").startswith("application/json"), response.text[:500]
    doc = response.json()
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str), doc
    return doc["error"]


def raw_http(server: ServerProcess, head: str, body: bytes) -> httpx.Response:
    """Send a request byte for byte as given (httpx would fix its framing headers)."""
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head.encode() + b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    top, _, content = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = [(k, v.strip()) for k, v in (line.split(":", 1) for line in lines)]
    assert "transfer-encoding" not in {k.lower() for k, _ in headers}, "chunked responses are not parsed here"
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=content)


def chunked(body: bytes, size: int) -> bytes:
    """`body` in Transfer-Encoding: chunked framing, `size` bytes a chunk."""
    parts = [f"{len(body[i:i + size]):X}\r\n".encode() + body[i:i + size] + b"\r\n" for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


@pytest.fixture(scope="module")
def reference(server: ServerProcess) -> np.ndarray:
    """The logits of PIXELS, asked for as plain JSON."""
    response = httpx.post(url(server, ONNX), json={"inputs": [IMAGE]}, timeout=60)
    assert response.status_code == 200, response.text
    return np.array(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(1, 10)


def image_input() -> triton_http.InferInput:
    tensor = triton_http.InferInput("image", [1, 1, 8, 8], "FP32")
    tensor.set_data_from_numpy(PIXELS)
    return tensor


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    c = triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


def assert_raw_answer(response: httpx.Response, reference: np.ndarray) -> None:
    """Triton answers a raw request with binary outputs after an Inference-Header-Content-Length JSON header."""
    assert response.status_code == 200, response.text[:500]
    assert HEADER_LENGTH in response.headers, dict(response.headers)  # Triton's QA reads it
    meta, outputs = decode_response(response.content, response.headers[HEADER_LENGTH])
    assert [o["name"] for o in meta["outputs"]] == ["logits"] and meta["outputs"][0]["shape"] == [1, 10]
    np.testing.assert_allclose(outputs["logits"], reference, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- raw binary requests (http_test.py)


def test_raw_binary(server: ServerProcess, reference: np.ndarray) -> None:
    # Triton: test_raw_binary. One input, so the whole body is its tensor; shape [1] + config dims.
    response = httpx.post(url(server, ONNX), content=PIXELS.tobytes(), headers=RAW, timeout=60)
    assert_raw_answer(response, reference)
    assert_live(server)


def test_raw_binary_longer(server: ServerProcess) -> None:
    # Triton: test_raw_binary_longer (32 FP32 elements). Our model's input holds 64 per row,
    # so 128 bytes cannot be deduced into a shape: 400, naming the size that was sent.
    response = httpx.post(url(server, ONNX), content=np.arange(32, dtype=np.float32).tobytes(), headers=RAW)
    assert "128" in error_of(response, 400)
    assert_live(server)


def test_multi_inputs(server: ServerProcess) -> None:
    # Triton: test_multi_inputs. Triton: "Raw request must only have 1 input (found 1) to be
    # deduced but got 2 inputs in '<model>' model configuration"; ours need only say so.
    response = httpx.post(url(server, RAGGED), content=np.arange(24, dtype=np.int64).tobytes(), headers=RAW)
    message = error_of(response, 400)
    assert re.search(r"(?i)\braw\b", message) and re.search(r"(?i)\b(1|one|single) input\b", message), message
    assert_live(server)


def test_a_raw_or_binary_tensor_of_the_wrong_size_names_its_request_as_tritons_core_does(server: ServerProcess) -> None:
    # As tritonserver 2.51 answers (compared side by side): a raw binary request has no id, "[request id:
    # <id_unknown>] input byte size mismatch for input 'raw_input' ... Expected 256, got 128"; binary data of
    # the wrong size, "[request id: b-2] input byte size mismatch for input 'image' ...". Its core words
    # these; JSON `data` of the wrong length is its HTTP front end's refusal, without an id.
    raw = httpx.post(url(server, ONNX), content=PIXELS.tobytes()[:128], headers=RAW, timeout=60)
    assert error_of(raw, 400).startswith("[request id: <id_unknown>] input 'image' (raw binary request)")
    multi = httpx.post(url(server, RAGGED), content=np.arange(24, dtype=np.int64).tobytes(), headers=RAW)
    assert error_of(multi, 400).startswith("[request id: <id_unknown>] a raw binary request")
    for request_id, named in (("b-2", "b-2"), (None, "<id_unknown>")):
        head = json.dumps({**({"id": request_id} if request_id else {}), "inputs": [
            {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "parameters": {"binary_data_size": 20}}]})
        binary = httpx.post(url(server, ONNX), content=head.encode() + b"\0" * 20,
                            headers={HEADER_LENGTH: str(len(head))}, timeout=60)
        assert error_of(binary, 400).startswith(f"[request id: {named}] input 'image': 20 bytes of binary data")
        short = httpx.post(url(server, ONNX), timeout=60, json={
            **({"id": request_id} if request_id else {}), "inputs": [{**IMAGE, "data": [0.5] * 10}]})
        assert error_of(short, 400).startswith("input 'image': `data` has 10 elements")
    assert_live(server)


def test_content_encoding_chunked_manually(server: ServerProcess, reference: np.ndarray) -> None:
    # Triton: test_content_encoding_chunked_manually, with Transfer-Encoding alone (chunks of 100 bytes).
    head = f"POST /v2/models/{ONNX}/infer HTTP/1.1\r\n{HEADER_LENGTH}: 0\r\nTransfer-Encoding: chunked\r\n"
    assert_raw_answer(raw_http(server, head, chunked(PIXELS.tobytes(), 100)), reference)
    assert_live(server)


def test_content_encoding_chunked_with_content_length(server: ServerProcess) -> None:
    # Triton: test_content_encoding_chunked_manually as `requests` really sends it: Transfer-Encoding
    # *and* Content-Length. Triton decodes the chunks (200); we refuse the ambiguous framing
    # (RFC 9112 section 6.3 allows it; it is how requests are smuggled), but as a JSON error.
    body = chunked(PIXELS.tobytes(), 256)
    head = (f"POST /v2/models/{ONNX}/infer HTTP/1.1\r\n{HEADER_LENGTH}: 0\r\nTransfer-Encoding: chunked\r\n"
            f"Content-Length: {len(body)}\r\n")
    error_of(raw_http(server, head, body), 400)
    assert_live(server)


def test_content_encoding_unsupported_client(client: triton_http.InferenceServerClient, server: ServerProcess) -> None:
    # Triton: test_content_encoding_unsupported_client. The Python client itself refuses the header.
    for encoding in ("chunked", "compress", "deflate", "gzip"):
        with pytest.raises(InferenceServerException, match="Unsupported HTTP header"):
            client.infer(ONNX, [image_input()], headers={"Transfer-Encoding": encoding})
    assert_live(server)


# ---------------------------------------------------------------- malformed JSON requests (http_test.py)

#: (shape, our words) with Triton's words in the comment; Triton answers 400, 400 and 500
SHAPES = [
    # "causes total element count to exceed maximum size of"
    pytest.param([2 ** 4, 2 ** 60 + 2], "more elements", id="test_buffer_size_overflow-element-count"),
    # "byte size overflow for input"
    pytest.param([2 ** 2, 2 ** 60 + 2], "more elements", id="test_buffer_size_overflow-byte-size"),
    # 500 "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    pytest.param([2, -5], "negative dimension", id="test_negative_dimensions"),
]


@pytest.mark.parametrize(("shape", "words"), SHAPES)
def test_bad_shapes(server: ServerProcess, shape: list[int], words: str) -> None:
    # Triton: test_buffer_size_overflow, test_negative_dimensions. Products past 2**64 must not wrap.
    response = httpx.post(url(server, ONNX), json={"inputs": [{**IMAGE, "shape": shape, "data": [1.0]}]})
    assert words in error_of(response, 400)
    assert_live(server)


def test_inference_header_content_length_out_of_range(server: ServerProcess) -> None:
    # Triton: test_inference_header_content_length_out_of_range (past INT_MAX: Triton once crashed).
    response = httpx.post(url(server, ONNX), json={"inputs": []}, headers={HEADER_LENGTH: "99999999999"})
    assert HEADER_LENGTH in error_of(response, 400)
    assert_live(server)


def test_json_recursion_depth_limit(server: ServerProcess) -> None:
    # Triton: test_json_recursion_depth_limit. Triton takes `data` nested up to 100 deep in any
    # form ("JSON nesting depth exceeds maximum allowed limit (100)" past that); we take it flat
    # or nested exactly as `shape`, and refuse any other nesting, deep or not.
    def nested(depth: int, value: Any) -> Any:
        for _ in range(depth):
            value = [value]
        return value

    for depth in (120, 50):
        response = httpx.post(url(server, ONNX), json={"inputs": [{**IMAGE, "data": nested(depth, IMAGE["data"])}]})
        assert "nested" in error_of(response, 400)
    exact = PIXELS.tolist()  # [1][1][8][8], as the shape
    response = httpx.post(url(server, ONNX), json={"inputs": [{**IMAGE, "data": exact}]})
    assert response.status_code == 200, response.text
    assert_live(server)


# ---------------------------------------------------------------- repository and model control (http_test.py)


def test_repository_index_deeply_nested_json(server: ServerProcess) -> None:
    # Triton: test_repository_index_deeply_nested_json: 400 "Invalid value for 'ready': expected a boolean".
    depth = 250_000
    body = b'{"ready":' + b"[" * depth + b"true" + b"]" * depth + b"}"
    response = httpx.post(f"{server.url}/v2/repository/index", content=body, timeout=60)
    message = error_of(response, 400)
    assert re.search(r"(?i)ready|nest|deep", message), message  # names what is wrong with the body
    assert_live(server)
    # and {"ready": true} lists only the models that are ready
    rows = httpx.post(f"{server.url}/v2/repository/index", json={"ready": True}).json()
    assert rows and all(r["state"] == "READY" for r in rows), rows


def test_repository_index_is_a_post_and_a_ready_row_has_no_reason(server: ServerProcess) -> None:
    # As tritonserver 2.51 answers (compared side by side): the index is POST only (GET: 405),
    # and a READY model's row is name, version and state, without an empty reason.
    assert httpx.get(f"{server.url}/v2/repository/index").status_code == 405
    rows = httpx.post(f"{server.url}/v2/repository/index").json()
    ready = [r for r in rows if r["state"] == "READY"]
    assert ready and all(sorted(r) == ["name", "state", "version"] for r in ready), rows
    assert all(r.get("reason") for r in rows if r["state"] != "READY"), rows


@pytest.mark.parametrize("body", [b"[]", b"null", b"1", b'"ready"', b"true", b'[{"ready": true}]', b"NaN"])
def test_repository_index_takes_any_json_that_is_not_an_object_as_no_filter(server: ServerProcess,
                                                                           body: bytes) -> None:
    # As tritonserver 2.51 answers (compared side by side): it reads `ready` only from an object, and any other
    # JSON document is a request with no filter (200, every model), as `{}` and an empty body are. A `ready`
    # that is not a boolean is refused (Triton 2.51: 500 "attempt to access JSON non-boolean as boolean";
    # later Triton: 400 "Invalid value for 'ready': expected a boolean"), and so is JSON that does not parse.
    index = f"{server.url}/v2/repository/index"
    everything = httpx.post(index, content=b"{}").json()
    response = httpx.post(index, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json() == everything
    for refused in (b'{"ready": "yes"}', b'{"ready": null}', b"{", b'{"ready": true} x'):
        assert httpx.post(index, content=refused).status_code == 400, refused


def test_load_oversized_file_parameter(server: ServerProcess) -> None:
    # Triton: test_load_oversized_file_parameter (Triton: 500 "failed to poll from model repository").
    # Model control is off on the shared server: 403, and the server stays ready.
    payload = {"parameters": {"file:" + "A" * 256: "YQ==", "config": "{}"}}
    response = httpx.post(f"{server.url}/v2/repository/models/{ONNX}/load", json=payload)
    assert "--model-control" in error_of(response, 403)
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


# ---------------------------------------------------------------- many chunks (http_request_many_chunks.py)

#: (Triton's test, route, our status): Triton answers 400 to each (its parser or raw-input check);
#: ours has no trace/logging/generate routes (404) and model control is off (403).
CHUNKED_ROUTES = [
    pytest.param(f"/v2/models/{RAGGED}/infer", 400, id="test_infer"),
    pytest.param("/v2/repository/index", 400, id="test_registry_index"),
    pytest.param(f"/v2/repository/models/{ONNX}/load", 403, id="test_model_control-load"),
    pytest.param(f"/v2/repository/models/{ONNX}/unload", 403, id="test_model_control-unload"),
    pytest.param(f"/v2/models/{RAGGED}/trace/setting", 404, id="test_trace"),
    pytest.param("/v2/logging", 404, id="test_logging"),
    pytest.param("/v2/systemsharedmemory/region/r/register", 400, id="test_system_shm_register"),
    pytest.param("/v2/cudasharedmemory/region/r/register", 400, id="test_cuda_shm_register"),
    pytest.param(f"/v2/models/{RAGGED}/generate", 404, id="test_generate"),
]


@pytest.mark.parametrize(("route", "status"), CHUNKED_ROUTES)
def test_request_many_chunks(server: ServerProcess, route: str, status: int) -> None:
    # Triton: HTTPRequestManyChunksTest. Triton sends 1,000,000 one-byte chunks (against an
    # alloca); 10,000 (60 kB) exercise the chunk parser and fit the socket buffers even where
    # the server answers without reading the body.
    raw = f"{HEADER_LENGTH}: 0\r\n" if route.endswith("/infer") else ""
    head = f"POST {route} HTTP/1.1\r\n{raw}Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
    error_of(raw_http(server, head, chunked(b"A" * 10_000, 1)), status)
    assert_live(server)


# ---------------------------------------------------------------- binary and JSON outputs (test.sh)

#: (case, request parameters, requested outputs, which outputs come back binary)
COMBINATIONS = [
    ("no parameters, no outputs == json output", None, None, set()),
    ("empty outputs == every output, json", None, [], set()),
    ("binary_data true and false", None, [("logits", True), ("hidden", False)], {"logits"}),
    ("binary_data true and not given", None, [("logits", True), ("hidden", None)], {"logits"}),
    ("binary_data_output, no outputs", {"binary_data_output": True}, None, {"logits", "hidden"}),
    # a named output is binary by its own `binary_data` only, the request's flag being the
    # default of unnamed ones (Triton's http_server.cc, CheckBinaryOutputData; a real Triton
    # 2.51 answers both outputs as JSON here)
    ("binary_data_output, false and not given", {"binary_data_output": True}, [("logits", False), ("hidden", None)],
     set()),
    ("binary_data_output, true and not given", {"binary_data_output": True}, [("logits", True), ("hidden", None)],
     {"logits"}),
]


@pytest.mark.parametrize(("parameters", "outputs", "binary"), [pytest.param(*c[1:], id=c[0]) for c in COMBINATIONS])
def test_binary_json_combinations(server: ServerProcess, parameters: dict | None,
                                  outputs: list[tuple[str, bool | None]] | None, binary: set[str]) -> None:
    # Triton: test.sh "Test combinations of binary and JSON data" (model `simple`, OUTPUT0/OUTPUT1);
    # the empty `outputs` list is ours: Triton then returns every output, as when it is absent.
    doc: dict[str, Any] = {"inputs": [TOKENS, MASK]}
    if parameters is not None:
        doc["parameters"] = parameters
    if outputs is not None:
        doc["outputs"] = [{"name": n, **({} if b is None else {"parameters": {"binary_data": b}})} for n, b in outputs]
    response = httpx.post(url(server, RAGGED), json=doc, timeout=60)
    assert response.status_code == 200, response.text[:500]
    meta, arrays = decode_response(response.content, response.headers.get(HEADER_LENGTH))
    assert sorted(o["name"] for o in meta["outputs"]) == ["hidden", "logits"]
    for o in meta["outputs"]:
        assert ("data" not in o) == (o["name"] in binary), o
    assert arrays["logits"].shape == (1, 3) and arrays["hidden"].shape == (1, 4, 4)
    assert_live(server)


# ---------------------------------------------------------------- request parameters (L0_parameters)

RESERVED = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
            "binary_data_output", "triton_enable_empty_final_response", "triton_final_response")


@pytest.mark.parametrize("parameters", [{"key1": "value1", "key2": "value2"}, {"key1": 1, "key2": 2},
                                        {"key1": 123.123, "key2": 321.321}, {"key1": True, "key2": "value2"}],
                         ids=["string", "int", "float", "bool"])
def test_params(client: triton_http.InferenceServerClient, server: ServerProcess, reference: np.ndarray,
                parameters: dict[str, Any]) -> None:
    # Triton: InferenceParametersTest.test_params. Custom parameters are accepted (Triton hands
    # them to the backend; we ignore them) and the answer is the same.
    result = client.infer(ONNX, [image_input()], parameters=parameters)
    np.testing.assert_allclose(result.as_numpy("logits"), reference, atol=1e-5, rtol=1e-5)
    response = httpx.post(url(server, ONNX), json={"inputs": [IMAGE], "parameters": parameters})
    assert response.status_code == 200, response.text
    assert_live(server)


@pytest.mark.parametrize("request_coding, response_coding", [("gzip", "gzip"), ("deflate", "deflate"),
                                                               ("gzip", None), (None, "deflate")])
def test_compression(client: triton_http.InferenceServerClient, server: ServerProcess, reference: np.ndarray,
                     request_coding: str | None, response_coding: str | None) -> None:
    # tritonclient's request_compression_algorithm (Content-Encoding) and
    # response_compression_algorithm (Accept-Encoding), which Triton's HTTP front end reads;
    # the client checks the answer's Content-Encoding and inflates it itself.
    result = client.infer(ONNX, [image_input()], request_compression_algorithm=request_coding,
                          response_compression_algorithm=response_coding)
    np.testing.assert_allclose(result.as_numpy("logits"), reference, atol=1e-5, rtol=1e-5)

    async def aio() -> np.ndarray:
        c = triton_aio.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            return (await c.infer(ONNX, [image_input()], request_compression_algorithm=request_coding,
                                  response_compression_algorithm=response_coding)).as_numpy("logits")
        finally:
            await c.close()

    np.testing.assert_allclose(asyncio.run(aio()), reference, atol=1e-5, rtol=1e-5)


def test_params_reserved_rejected(client: triton_http.InferenceServerClient, server: ServerProcess) -> None:
    # Triton: InferenceParametersTest.test_params_reserved_rejected. The client refuses reserved
    # keys itself; sent raw, `triton_*` keys are a 400 (Triton: "...reserved for Triton usage and
    # should not be specified."), and so is a binary_data_output that is not a boolean.
    for key in RESERVED:
        with pytest.raises(InferenceServerException, match="is a reserved parameter"):
            client.infer(ONNX, [image_input()], parameters={key: "dummy-value"})
    response = httpx.post(url(server, ONNX), json={"inputs": [IMAGE], "parameters": {"triton_final_response": "x"}})
    assert "triton_final_response" in error_of(response, 400)
    response = httpx.post(url(server, ONNX), json={"inputs": [IMAGE], "parameters": {"binary_data_output": "x"}})
    assert "binary_data_output" in error_of(response, 400)
    assert_live(server)


# ---------------------------------------------------------------- the asyncio client (python_http_aio_test.py)


def test_http_aio_client(server: ServerProcess) -> None:
    # Triton: TestHttpAioClient (is_server_live ... unload_model, get_inference_statistics,
    # the system shared memory calls); trace calls are left out (an extension we do not implement).
    async def run() -> None:
        c = triton_aio.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            assert await c.is_server_live() and await c.is_server_ready() and await c.is_model_ready(ONNX)
            assert (await c.get_server_metadata())["name"] == "zoo"  # Triton: "triton"
            assert (await c.get_model_metadata(ONNX))["name"] == ONNX
            assert (await c.get_model_config(ONNX))["name"] == ONNX
            assert {ONNX, RAGGED} <= {m["name"] for m in await c.get_model_repository_index()}
            for call in (c.load_model, c.unload_model):  # Triton: "...not allowed if polling is enabled"
                with pytest.raises(InferenceServerException, match="--model-control"):
                    await call(ONNX)
            stats = (await c.get_inference_statistics(ONNX))["model_stats"]
            assert [s["name"] for s in stats] == [ONNX] and "success" in stats[0]["inference_stats"]
            assert isinstance(await c.get_system_shared_memory_status(), list)
            await c.unregister_system_shared_memory()
            with pytest.raises(InferenceServerException, match="unknown shared memory region"):
                await c.get_system_shared_memory_status("no-such-region")
            # CUDA shared memory as Triton built without GPUs answers it: none registered,
            # unregistering succeeds, registering is refused (400)
            assert await c.get_cuda_shared_memory_status() == []
            await c.unregister_cuda_shared_memory()
            await c.unregister_cuda_shared_memory("r")
            with pytest.raises(InferenceServerException, match="no GPU memory") as info:
                await c.register_cuda_shared_memory("r", b"\0" * 64, 0, 64)
            assert info.value.status() == "400"
            with pytest.raises(InferenceServerException, match="unknown CUDA shared memory region"):
                await c.get_cuda_shared_memory_status("r")
        finally:
            await c.close()

    asyncio.run(run())
    assert_live(server)

