"""NVIDIA Triton's HTTP QA tests (L0_http), ported to `zoo serve` with Triton's own models.

Source: the GitHub repository triton-inference-server/server, `qa/L0_http/http_test.py`
(class HttpTest, 17 tests), the parts of `qa/L0_http/test.sh` that set up and run it and
its curl checks of binary/JSON outputs, `qa/L0_http/http_request_many_chunks.py`
(HTTPRequestManyChunksTest) and `qa/L0_http/http_input_size_limit_test.py`
(InferSizeLimitTest), with the client example `simple_http_model_control.py` that test.sh
runs. Triton's tests are © NVIDIA CORPORATION & AFFILIATES under the BSD-3-Clause
license; this is our own code.

Where tests/test_serve_triton_http.py sends L0_http's requests to zoo's own models, this
file builds the models Triton's test.sh copies into its repository, as zoo specs exported
to ONNX (as tests/test_serve_triton_infer_qa.py does): `onnx_zero_1_float32` (an FP32
identity, INPUT0 [-1] -> OUTPUT0, batched), `onnx_zero_1_float16` (an FP16 identity with
two variable dimensions), `onnx_zero_3_float32` (three FP32 identities),
`simple_identity_int64` (an INT64 identity of shape [1]) and `simple` (INT32 add/sub of
two [16] inputs), and sends Triton's requests with Triton's clients (`requests`,
tritonclient.http, raw sockets). Each test gives its Triton name, asserts Triton's status
code, and the meaning of Triton's error text (zoo words its messages its own way; the
words each test looks for are the point of Triton's message), and ends by checking that
the server is still live. Where zoo differs by design, the test asserts zoo's behaviour
and cites the row of docs/serving.md, "Differences from Triton". Sizes: Triton's input
size tests send 64 to 128 MiB bodies against `--http-max-input-size`; here the main
server runs with `--max-request-size` 1 MiB (LIMIT) and the same boundaries are sent
scaled to it; the default limit (64 MiB) is checked from Content-Length alone, which zoo
refuses before reading a byte of the body.

Not ported, and why:
- test_byte, test_byte_too_many_elements (onnx_zero_1_object[_1_element]): BYTES identity
  models; a zoo artifact is a torch module exported to an engine, and no engine export
  here has string tensors, so no served model has a BYTES tensor input for a raw request
  to fill (zoo's rule, zoo/serve/protocol.py raw_request, is Triton's: exactly one element).
- test_json_recursion_depth_limit's BYTES rows (simple_identity): same reason; its INT64
  rows are ported.
- test_large_string_in_json: the same boundary (exactly the limit: 200, one byte more:
  refused) is ported with an FP32 JSON body padded with whitespace, not a BYTES string.
- test_loading_large_invalid_model: a 2.8 GB body; ported as its Content-Length alone
  (zoo refuses it from the header, 413, docs row "body over the size limit").
- http_input_size_limit_test.py's RSS check of 100 gzip requests is ported with 30.
- http_request_many_chunks.py's RSS check (100 requests of 1,000,000 chunks each): ported
  with 3 requests of 200,000 chunks (each refused at chunk 65,537, as Triton refuses them; 600 MB of wire bytes
  would take minutes here).
- test.sh: the C++ clients and cc_client_test (C++), image_client (densenet_onnx and
  its image), the string client (BYTES add/sub), the CUDA shared memory clients (not
  offered), the sequence clients and dyna_sequence models (sequence batching is not
  offered), generate_endpoint_test.py (no generate extension: 404, docs row), the
  basic-auth test behind nginx, http_client_plugin_test.py (a client-side plugin that adds
  headers; nothing server-side), http_restricted_api_test.py and the
  --http-restricted-api start-up checks (Triton's restricted-API feature; zoo has no
  such flag), python_http_aio_test.py (ported in tests/test_serve_triton_http.py), and
  the model-control config override that Triton applies (zoo refuses overrides, docs row
  "model load with config or file overrides").
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as tritonhttpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec

pytest.register_assert_rewrite("serve_support")
from serve_support import ServerProcess  # noqa: E402

pytest_plugins = ["serve_support"]

MIB = 1 << 20
LIMIT = 1 * MIB  # the main server's --max-request-size, standing for Triton's --http-max-input-size
DEFAULT_LIMIT = 64 * MIB  # zoo's default, as Triton's
OFFSET_ELEMENTS = 32  # http_input_size_limit_test.py's "just over/under" offset
HEADER = "Inference-Header-Content-Length"
K_MAX_CHUNKED_CHUNKS = 65536  # Triton's kMaxChunkedChunks (http_server.cc)
TORCH = {"float32": torch.float32, "float16": torch.float16, "int64": torch.int64, "int32": torch.int32}


# ---------------------------------------------------------------- Triton's models, as zoo specs


class Identity(torch.nn.Module):
    """gen_qa_identity_models.py's identity: OUTPUTi = INPUTi."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {f"OUTPUT{i}": x.clone() for i, x in enumerate(inputs)}


class AddSub(torch.nn.Module):
    """Triton's `simple` model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: N803
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def identity_spec(name: str, count: int, dtype: str, dims: tuple[str | int, ...],
                  axes: dict[str, AxisRange]) -> ModelSpec:
    shape = ("batch", *dims)

    def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        sizes = [axes[d].opt if isinstance(d, str) else d for d in dims]
        return {f"INPUT{i}": rng.integers(-8, 8, (batch, *sizes)).astype(dtype) for i in range(count)}

    return ModelSpec(
        name=name, domain="test", task="identity",
        inputs=tuple(TensorSpec(f"INPUT{i}", dtype, shape) for i in range(count)),
        outputs=tuple(TensorSpec(f"OUTPUT{i}", dtype, shape) for i in range(count)),
        build=lambda: Identity(count), sample=sample, axes={"batch": AxisRange(1, 8, 8), **axes})


def simple_spec() -> ModelSpec:
    def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {n: rng.integers(-100, 100, (batch, 16)).astype(np.int32) for n in ("INPUT0", "INPUT1")}

    shape = ("batch", 16)
    return ModelSpec(
        name="simple", domain="test", task="add-sub",
        inputs=(TensorSpec("INPUT0", "int32", shape), TensorSpec("INPUT1", "int32", shape)),
        outputs=(TensorSpec("OUTPUT0", "int32", shape), TensorSpec("OUTPUT1", "int32", shape)),
        build=AddSub, sample=sample, axes={"batch": AxisRange(1, 8, 8)})


WIDE = AxisRange(1, 8, 1 << 20)  # the variable dimension: up to LIMIT's worth of FP32 and past it
SPECS = {
    "onnx_zero_1_float32": identity_spec("onnx_zero_1_float32", 1, "float32", ("n",), {"n": WIDE}),
    "onnx_zero_1_float16": identity_spec("onnx_zero_1_float16", 1, "float16", ("h", "w"),
                                         {"h": AxisRange(1, 2, 16), "w": AxisRange(1, 2, 16)}),
    "onnx_zero_3_float32": identity_spec("onnx_zero_3_float32", 3, "float32", ("n",), {"n": AxisRange(1, 8, 64)}),
    "simple_identity_int64": identity_spec("simple_identity_int64", 1, "int64", (1,), {}),
    "simple": simple_spec(),
}
#: Triton's model name -> the artifact zoo serves it as
MODEL = {name: f"{name}.onnxruntime.fp32" for name in SPECS}
F32, F16, F32X3, I64, SIMPLE = (MODEL[n] for n in SPECS)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("http_qa") / "exports"
    for spec in SPECS.values():
        zoo.export(spec, "onnxruntime", repository=root, random_init=True)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    """test.sh's `--model-control-mode=explicit --load-model=*`: every model loaded, model
    control on; the request limit scaled down to LIMIT (see the module docstring)."""
    proc = ServerProcess(repo, "--model-control", "--max-request-size", str(LIMIT),
                         log=repo.parent / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def queue_server(repo: Path) -> Iterator[ServerProcess]:
    """test.sh's onnx_zero_1_float32_queue: a 1 s queue delay, preferred batch 8 and room for
    one waiting request (zoo takes these from the command line; its default request limit)."""
    proc = ServerProcess(repo, "--max-queue-size", "1", "--max-queue-delay-ms", "1000",
                         "--preferred-batch-sizes", "8", log=repo.parent / "queue_server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


def infer_url(server: ServerProcess, model: str) -> str:
    return f"{server.url}/v2/models/{model}/infer"


def load_url(server: ServerProcess, model: str) -> str:
    return f"{server.url}/v2/repository/models/{model}/load"


def assert_live(server: ServerProcess) -> None:
    assert requests.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


def error_of(response: requests.Response, status: int) -> str:
    """The `error` of a JSON error body with this status (Triton's shape: {"error": "..."})."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    doc = response.json()
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str), doc
    return doc["error"]


def raw_binary_helper(server: ServerProcess, model: str, input_bytes: bytes, expected_output_bytes: bytes,
                      extra_headers: dict[str, str] | None = None) -> None:
    """http_test.py's _raw_binary_helper: the body is the one input; the answer's binary part is the output."""
    headers = {HEADER: "0", **(extra_headers or {})}
    r = requests.post(infer_url(server, model), data=input_bytes, headers=headers, timeout=60)
    r.raise_for_status()
    header_size = int(r.headers[HEADER])
    assert r.content[header_size:] == expected_output_bytes


def port_of(server: ServerProcess) -> int:
    return int(server.url.rsplit(":", 1)[1])


def socket_request(server: ServerProcess, head: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """A request sent byte for byte (requests would fix its framing headers); the status,
    headers and body of the answer, read until the server closes (Connection: close). The
    server may answer and close before it has read the whole body, as Triton's
    http_request_many_chunks.py allows for."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=60) as s:
        s.sendall(head.encode() + b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
        try:
            s.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            data += chunk
    assert data, "the server closed the connection without an answer"
    top, _, content = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, content


def chunked(body: bytes, size: int) -> bytes:
    """`body` in Transfer-Encoding: chunked framing, `size` bytes a chunk."""
    parts = [f"{len(body[i:i + size]):X}\r\n".encode() + body[i:i + size] + b"\r\n" for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


# ---------------------------------------------------------------- http_test.py: raw binary requests


def test_raw_binary(server: ServerProcess) -> None:
    # Triton: test_raw_binary. 8 FP32 in, the same 8 out (shape [1, 8] deduced).
    input_bytes = np.arange(8, dtype=np.float32).tobytes()
    raw_binary_helper(server, F32, input_bytes, input_bytes)
    assert_live(server)


def test_raw_binary_longer(server: ServerProcess) -> None:
    # Triton: test_raw_binary_longer (32 elements).
    input_bytes = np.arange(32, dtype=np.float32).tobytes()
    raw_binary_helper(server, F32, input_bytes, input_bytes)
    assert_live(server)


def test_raw_binary_output_header(server: ServerProcess) -> None:
    # Triton: test_raw_binary, the JSON part its helper skips: the output is described as binary data.
    input_bytes = np.arange(8, dtype=np.float32).tobytes()
    r = requests.post(infer_url(server, F32), data=input_bytes, headers={HEADER: "0"}, timeout=60)
    assert r.status_code == 200, r.text
    doc = json.loads(r.content[:int(r.headers[HEADER])])
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("OUTPUT0", "FP32", [1, 8])
    assert out["parameters"]["binary_data_size"] == 32
    assert_live(server)


def test_multi_variable_dimensions(server: ServerProcess) -> None:
    # Triton: test_multi_variable_dimensions: 400 "The shape of the raw input 'INPUT0' can not be
    # deduced because there are more than one variable-sized dimension".
    data = np.ones([2, 2], dtype=np.float16).tobytes()
    r = requests.post(infer_url(server, F16), data=data, headers={HEADER: "0"}, timeout=60)
    message = error_of(r, 400)
    assert "INPUT0" in message and "more than one dynamic axis" in message, message
    assert_live(server)


def test_multi_inputs(server: ServerProcess) -> None:
    # Triton: test_multi_inputs: 400 "Raw request must only have 1 input (found 1) to be deduced
    # but got 3 inputs in 'onnx_zero_3_float32' model configuration".
    data = np.arange(24, dtype=np.float32).tobytes()
    r = requests.post(infer_url(server, F32X3), data=data, headers={HEADER: "0"}, timeout=60)
    message = error_of(r, 400)
    assert "one input" in message and all(f"INPUT{i}" in message for i in range(3)), message
    assert_live(server)


def test_content_encoding_chunked_manually(server: ServerProcess) -> None:
    # Triton: test_content_encoding_chunked_manually. `requests` sends the hand-made chunks with
    # its own Content-Length beside the Transfer-Encoding header: Triton decodes the chunks (200);
    # zoo answers 400 with a JSON error (docs/serving.md, Differences from Triton: "both
    # Transfer-Encoding and Content-Length").
    input_bytes = np.arange(8, dtype=np.float32).tobytes()
    encoded = f"{len(input_bytes):X}\r\n".encode() + input_bytes + b"\r\n" + b"0\r\n\r\n"
    r = requests.post(infer_url(server, F32), data=encoded,
                      headers={HEADER: "0", "Transfer-Encoding": "chunked"}, timeout=60)
    assert "Content-Length" in r.request.headers  # what makes the framing ambiguous
    error_of(r, 400)
    # the same chunks framed by Transfer-Encoding alone, as a chunked client sends them: decoded
    head = f"POST /v2/models/{F32}/infer HTTP/1.1\r\n{HEADER}: 0\r\nTransfer-Encoding: chunked\r\n"
    status, headers, content = socket_request(server, head, encoded)
    assert status == 200, content
    assert content[int(headers[HEADER.lower()]):] == input_bytes
    assert_live(server)


def test_content_encoding_unsupported_client(server: ServerProcess) -> None:
    # Triton: test_content_encoding_unsupported_client: the Python client refuses Transfer-Encoding itself.
    np_input = np.arange(8, dtype=np.float32).reshape(1, -1)
    for encoding in ["chunked", "compress", "deflate", "gzip"]:
        inputs = [tritonhttpclient.InferInput("INPUT0", np_input.shape, np_to_triton_dtype(np_input.dtype))]
        inputs[0].set_data_from_numpy(np_input)
        with tritonhttpclient.InferenceServerClient(server.url.removeprefix("http://")) as client:
            with pytest.raises(InferenceServerException, match="Unsupported HTTP header"):
                client.infer(model_name=F32, inputs=inputs, headers={"Transfer-Encoding": encoding})
    assert_live(server)


def test_descriptive_status_code(queue_server: ServerProcess) -> None:
    # Triton: test_descriptive_status_code (onnx_zero_1_float32_queue, max_queue_size 1): while
    # one request waits out the 1 s queue delay, a second is refused with 503 (unavailable).
    input_bytes = np.arange(8, dtype=np.float32).tobytes()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            raw_binary_helper(queue_server, F32, input_bytes, input_bytes)
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.5)
    with pytest.raises(requests.exceptions.HTTPError) as context:
        raw_binary_helper(queue_server, F32, input_bytes, input_bytes)
    assert context.value.response.status_code == 503
    t.join()
    assert not errors, errors
    assert_live(queue_server)


# ---------------------------------------------------------------- http_test.py: malformed JSON requests


def test_buffer_size_overflow(server: ServerProcess) -> None:
    # Triton: test_buffer_size_overflow: 400 "causes total element count to exceed maximum size
    # of" (2**4 x (2**60 + 2)) and 400 "byte size overflow for input" (2**2 x (2**60 + 2)).
    for shape in ([2 ** 4, 2 ** 60 + 2], [2 ** 2, 2 ** 60 + 2]):
        payload = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
        r = requests.post(infer_url(server, F32), json=payload, timeout=60)
        message = error_of(r, 400)
        assert "INPUT0" in message and "more elements than any request may carry" in message, message
    assert_live(server)


def test_negative_dimensions(server: ServerProcess) -> None:
    # Triton: test_negative_dimensions: 500 "Unable to parse 'shape': attempt to access JSON
    # non-unsigned-integer as unsigned-integer". zoo: 400 naming the dimension
    # (docs/serving.md, Differences from Triton: "a negative dimension in `shape`").
    payload = {"inputs": [{"name": "INPUT0", "shape": [2, -5], "datatype": "FP32", "data": [1.0]}]}
    r = requests.post(infer_url(server, F32), json=payload, timeout=60)
    message = error_of(r, 400)
    assert "shape" in message and "negative dimension" in message, message
    assert_live(server)


def nested(depth: int, value: str) -> Any:
    """http_test.py's create_nested_json."""
    for _ in range(depth):
        value = f"[{value}]"
    return json.loads(value)


@pytest.mark.parametrize("depth", [120, 50])
def test_json_recursion_depth_limit(server: ServerProcess, depth: int) -> None:
    # Triton: test_json_recursion_depth_limit, its INT64 rows (simple_identity_int64, shape [1, 1]):
    # Triton takes `data` 50 deep (200) and refuses 120 ("JSON nesting depth exceeds maximum
    # allowed limit (100)"). zoo takes `data` flat or nested exactly as `shape` and refuses any
    # other nesting, 50 deep too (docs/serving.md, Differences from Triton: "`data` nested
    # differently from `shape`").
    payload = {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 1], "data": nested(depth, "123")}]}
    r = requests.post(infer_url(server, I64), json=payload, timeout=60)
    message = error_of(r, 400)
    assert "nested" in message, message
    for data in ([[123]], [123]):  # as the shape, and flat: served
        payload["inputs"][0]["data"] = data
        r = requests.post(infer_url(server, I64), json=payload, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [123]
    assert_live(server)


def test_duplicate_output_names(server: ServerProcess) -> None:
    # Triton: test_duplicate_output_names: 400 "output 'OUTPUT0' already exists in request".
    payload = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 8],
                           "data": [np.arange(8, dtype=np.float32).tolist()]}],
               "outputs": [{"name": "OUTPUT0"} for _ in range(2)]}
    r = requests.post(infer_url(server, F32), json=payload, timeout=60)
    message = error_of(r, 400)
    assert "'OUTPUT0'" in message and "more than once" in message, message
    assert requests.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


def test_inference_header_content_length_out_of_range(server: ServerProcess) -> None:
    # Triton: test_inference_header_content_length_out_of_range (past INT_MAX): 400, server alive.
    r = requests.post(infer_url(server, F32), json={"inputs": []}, headers={HEADER: "99999999999"}, timeout=60)
    assert HEADER in error_of(r, 400)
    assert_live(server)


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "", "0x10", "+8", "12 3"])
def test_inference_header_content_length_invalid(server: ServerProcess, value: str) -> None:
    # Triton: test_inference_header_content_length_out_of_range, the other values std::stoi refused
    # or misread: 400 naming the header, server alive.
    r = requests.post(infer_url(server, F32), json={"inputs": []}, headers={HEADER: value}, timeout=60)
    assert HEADER in error_of(r, 400)
    assert_live(server)


@pytest.mark.parametrize(("body", "headers", "words"), [
    pytest.param(b"", {}, "not valid JSON", id="no-body"),
    pytest.param(b'{"inputs": [', {}, "not valid JSON", id="truncated-json"),
    pytest.param(b'["inputs"]', {}, "JSON object", id="not-an-object"),
    pytest.param(b'{"inputs": [{"name": "INPUT0"}]}', {}, "datatype", id="no-datatype"),
    pytest.param(b'{"inputs": []}', {HEADER: "100"}, "the body has 14 bytes", id="header-past-body"),
    pytest.param(b'{"inputs": []}xx', {HEADER: "14"}, "binary data after the JSON", id="unclaimed-binary"),
])
def test_malformed_requests(server: ServerProcess, body: bytes, headers: dict[str, str], words: str) -> None:
    # Triton: http_test.py's malformed-request tests (test_negative_dimensions,
    # test_inference_header_content_length_out_of_range) carried to the other ways a body can be
    # malformed: 400 with a JSON error saying what is wrong, and the server stays live.
    r = requests.post(infer_url(server, F32), data=body, headers=headers, timeout=60)
    message = error_of(r, 400)
    assert words in message, message
    assert_live(server)


def test_raw_binary_header_zero_spellings(server: ServerProcess) -> None:
    # Triton: test_raw_binary with the header spelled "00": std::stoi reads it as 0, a raw request.
    input_bytes = np.arange(8, dtype=np.float32).tobytes()
    r = requests.post(infer_url(server, F32), data=input_bytes, headers={HEADER: "00"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.content[int(r.headers[HEADER]):] == input_bytes
    assert_live(server)


# ---------------------------------------------------------------- http_test.py: repository and model control


def test_repository_index_deeply_nested_json(server: ServerProcess) -> None:
    # Triton: test_repository_index_deeply_nested_json: 400 "Invalid value for 'ready': expected a
    # boolean" for {"ready": [[...250000 deep...true...]]}, and the server stays live.
    depth = 250000
    payload = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    assert len(payload) < LIMIT
    r = requests.post(f"{server.url}/v2/repository/index", data=payload,
                      headers={"Content-Type": "application/json"}, timeout=60)
    message = error_of(r, 400)
    assert "nested too deeply" in message, message
    assert_live(server)
    # and a `ready` of the wrong type, not nested: 400, saying it must be a boolean
    r = requests.post(f"{server.url}/v2/repository/index", json={"ready": [True]}, timeout=60)
    assert "`ready` is true or false" in error_of(r, 400)


def test_loading_large_invalid_model(server: ServerProcess) -> None:
    # Triton: test_loading_large_invalid_model: a load request whose JSON (a 2**31-byte file,
    # base64) is past the input size limit: not 200, "request JSON size ... exceeds the maximum
    # allowed input size". zoo: 413 from Content-Length alone, before the body is read
    # (docs/serving.md, Differences from Triton: "body over the size limit").
    size = len(base64.b64encode(b"A" * 3)) * ((1 << 31) // 3 + 1) + 100
    head = (f"POST /v2/repository/models/invalid_onnx/load HTTP/1.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n")
    status, headers, content = socket_request(server, head, b'{"parameters": {"config": ')
    assert status == 413, content
    assert "exceeds the limit" in json.loads(content)["error"]
    assert_live(server)


def test_load_oversized_file_parameter(server: ServerProcess) -> None:
    # Triton: test_load_oversized_file_parameter: a `file:` override whose path component is past
    # NAME_MAX: Triton 500 "failed to poll from model repository", and the server stays ready.
    # zoo refuses every override with 400 (docs/serving.md, Differences from Triton: "model load
    # with config or file overrides").
    payload = {"parameters": {"file:" + "A" * 256: "YQ==", "config": "{}"}}
    r = requests.post(load_url(server, F32), json=payload, timeout=60)
    assert "overrides are not supported" in error_of(r, 400)
    assert requests.get(f"{server.url}/v2/health/ready", timeout=10).status_code == 200
    assert requests.get(f"{server.url}/v2/models/{F32}/ready", timeout=10).status_code == 200


def test_model_control(server: ServerProcess) -> None:
    # Triton: test.sh's simple_http_model_control.py (explicit mode): load `simple`, ready; a
    # config override (Triton: refused when malformed, applied when well formed; zoo: refused
    # either way, docs row "model load with config or file overrides"); unload, not ready; load
    # again; an unknown model fails to load.
    client = tritonhttpclient.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        assert {MODEL[n] for n in SPECS} <= {m["name"] for m in client.get_model_repository_index()}
        client.load_model(SIMPLE)
        assert client.is_model_ready(SIMPLE)
        for config in ('"parameters": {"config": {{"max_batch_size": "16"}}}', '{"max_batch_size":"16"}'):
            with pytest.raises(InferenceServerException, match="overrides are not supported"):
                client.load_model(SIMPLE, config=config)
        assert client.get_model_config(SIMPLE)["max_batch_size"] == 8
        client.unload_model(SIMPLE)
        assert not client.is_model_ready(SIMPLE)
        client.load_model(SIMPLE)
        assert client.is_model_ready(SIMPLE)
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("wrong_model_name")
        assert "wrong_model_name" in str(failed.value)
    finally:
        client.close()
    assert_live(server)


# ---------------------------------------------------------------- test.sh: clients and curl checks of `simple`

ONES = list(range(1, 17))
BOTH = [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": ONES} for n in ("INPUT0", "INPUT1")]
SUM, DIFF = "[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]", "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]"


def curl(server: ServerProcess, doc: dict[str, Any]) -> tuple[int, str]:
    """test.sh's `curl -d'<json>' localhost:8000/v2/models/simple/infer`: the status and the
    body as text (binary bytes as latin-1), grepped as test.sh greps it."""
    r = requests.post(infer_url(server, SIMPLE), data=json.dumps(doc, separators=(",", ":")), timeout=60)
    return r.status_code, r.content.decode("latin-1")


#: (test.sh's comment, request parameters, outputs, SUM found, DIFF found)
COMBINATIONS = [
    ("no parameters, no outputs == json output", None, None, True, True),
    ("binary_data=true on INPUT0, binary_data=false on INPUT1", None,
     [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1", "parameters": {"binary_data": False}}],
     False, True),
    ("binary_data=true on INPUT0, binary_data not given on INPUT1", None,
     [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}], False, True),
    ("binary_data_output=true, no outputs requested", {"binary_data_output": True}, None, False, False),
    ("binary_data_output=true, binary_data=false on INPUT0, binary_data not given on INPUT1",
     {"binary_data_output": True}, [{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT1"}],
     True, True),
]


@pytest.mark.parametrize(("parameters", "outputs", "sum_json", "diff_json"),
                         [pytest.param(*c[1:], id=c[0]) for c in COMBINATIONS])
def test_binary_json_combinations(server: ServerProcess, parameters: dict | None, outputs: list | None,
                                  sum_json: bool, diff_json: bool) -> None:
    # Triton: test.sh "Test combinations of binary and JSON data": 200, and the sum and difference
    # found as JSON text exactly where the outputs are to be JSON.
    doc: dict[str, Any] = {"inputs": BOTH}
    if parameters is not None:
        doc["parameters"] = parameters
    if outputs is not None:
        doc["outputs"] = outputs
    status, text = curl(server, doc)
    assert status == 200, text
    assert text.count(SUM) == int(sum_json), text
    assert text.count(DIFF) == int(diff_json), text
    assert_live(server)


def test_data_shape_mismatch(server: ServerProcess) -> None:
    # Triton: test.sh "bad request where the 'data' field misaligns with the 'shape' field": 15
    # and 18 elements for shape [1, 16]: not 200, {"error":"...shape does not match true shape..."};
    # then a good request is still answered.
    for count in (15, 18):
        status, text = curl(server, {"inputs": [{**BOTH[0], "data": list(range(1, count + 1))}]})
        assert status == 400, text
        message = json.loads(text)["error"]
        assert f"{count} elements" in message and "[1, 16]" in message, message
    status, text = curl(server, {"inputs": BOTH})
    assert status == 200 and text.count(SUM) == 1 and text.count(DIFF) == 1, text
    assert_live(server)


def simple_inputs(module: Any = tritonhttpclient, binary: bool = True) -> list[Any]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(data, binary_data=binary)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32), binary_data=binary)
    return inputs


def test_simple_clients(server: ServerProcess) -> None:
    # Triton: test.sh's simple_http_health_metadata.py, simple_http_infer_client.py,
    # simple_http_async_infer_client.py and reuse_infer_objects_client.py against `simple`.
    client = tritonhttpclient.InferenceServerClient(server.url.removeprefix("http://"), concurrency=2)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(SIMPLE)
        assert client.get_server_metadata()["name"] == "zoo"  # Triton: "triton" (docs row "server metadata")
        metadata = client.get_model_metadata(SIMPLE)
        assert metadata["name"] == SIMPLE and [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        outputs = [tritonhttpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                   tritonhttpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
        for binary in (True, False):  # the same InferInput/InferRequestedOutput objects reused
            inputs = simple_inputs(binary=binary)
            for _ in range(2):
                result = client.infer(SIMPLE, inputs, outputs=outputs, request_id="1")
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)
                assert result.get_response()["id"] == "1"
        pending = [client.async_infer(SIMPLE, simple_inputs()) for _ in range(4)]
        for request in pending:
            np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), a + 1)
    finally:
        client.close()
    assert_live(server)


def test_base_path_url(server: ServerProcess) -> None:
    # Triton: test.sh "Test with the base path in url": `-u localhost:8000/base_path` makes the
    # client POST /base_path/v2/models/simple/infer, which fails.
    client = tritonhttpclient.InferenceServerClient(server.url.removeprefix("http://") + "/base_path")
    try:
        with pytest.raises(InferenceServerException) as failed:
            client.infer(SIMPLE, simple_inputs())
        assert "/base_path/v2/models" in str(failed.value)
    finally:
        client.close()
    assert_live(server)


# ---------------------------------------------------------------- http_request_many_chunks.py


def send_chunked_request(server: ServerProcess, model: str, chunk_count: int) -> tuple[int, str]:
    """HTTPRequestManyChunksTest.send_chunked_request: a raw infer request of `chunk_count`
    one-byte chunks ("1\\r\\nA\\r\\n"); the status and the body of the answer."""
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\n{HEADER}: 0\r\n"
            "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n")
    status, _, content = socket_request(server, head, b"1\r\nA\r\n" * chunk_count + b"0\r\n\r\n")
    return status, content.decode(errors="replace")


def test_chunked_infer_at_max_chunks(server: ServerProcess) -> None:
    # Triton: test_chunked_infer_at_max_chunks: 65536 chunks to `simple` (two inputs): 400 "Raw
    # request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model
    # configuration".
    status, body = send_chunked_request(server, SIMPLE, K_MAX_CHUNKED_CHUNKS)
    assert status == 400, body
    assert "one input" in body and "INPUT0" in body and "INPUT1" in body, body
    assert_live(server)


CHUNKS_REFUSED = (f"Chunked request body exceeds maximum of {K_MAX_CHUNKED_CHUNKS} non-empty chunks. Send fewer or "
                  "larger HTTP chunks.")


def test_chunked_infer_rejected_over_max_chunks(server: ServerProcess) -> None:
    # Triton: test_chunked_infer_rejected_over_max_chunks: 65537 chunks: 400 "Chunked request body
    # exceeds maximum of 65536 non-empty chunks. Send fewer or larger HTTP chunks."
    status, body = send_chunked_request(server, SIMPLE, K_MAX_CHUNKED_CHUNKS + 1)
    assert status == 400, body
    assert json.loads(body) == {"error": CHUNKS_REFUSED}
    assert_live(server)


@pytest.mark.parametrize("chunks, status", [(K_MAX_CHUNKED_CHUNKS, 200), (K_MAX_CHUNKED_CHUNKS + 1, 400)])
def test_chunked_infer_max_chunks_one_input(server: ServerProcess, chunks: int, status: int) -> None:
    # Triton's test_chunked_infer_at_max_chunks / _rejected_over_max_chunks on a model whose
    # raw-input check passes (the one-input identity), so that only the chunk count can refuse
    # it: chunks of 3 FP32 each (786 KB, under LIMIT). The server reads the body 64 KiB at a
    # time, so some chunks' data arrive split over two reads: each still counts once.
    head = (f"POST /v2/models/{F32}/infer HTTP/1.1\r\n{HEADER}: 0\r\n"
            "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n")
    values = np.arange(3 * chunks, dtype=np.float32)
    body = chunked(values.tobytes(), 12)
    assert body.count(b"\r\nC\r\n") == chunks - 1  # every chunk 12 bytes ("C"), the first at the start
    answer, headers, content = socket_request(server, head, body)
    assert_live(server)
    assert answer == status, (answer, content[:200])
    if status == 400:
        assert json.loads(content) == {"error": CHUNKS_REFUSED}
    else:
        np.testing.assert_array_equal(np.frombuffer(content[int(headers[HEADER.lower()]):], dtype=np.float32),
                                      values)


def test_chunked_infer_over_max_chunks_reject_with_bounded_rss_growth(server: ServerProcess) -> None:
    # Triton: test_chunked_infer_over_max_chunks_reject_with_bounded_rss_growth: requests of far
    # more chunks than the limit allows are refused, the server's RSS stays bounded. Here
    # 200,000 one-byte chunks and 200,000 chunks of 8 bytes (1.6 MB, past LIMIT too): 400 at
    # chunk 65,537, before the size limit; 20,000 chunks of 64 bytes (1.3 MB): 413 as the
    # size passes LIMIT, before the chunk limit.
    many = 200_000
    status, body = send_chunked_request(server, F32, many)  # warm up
    assert status == 400 and json.loads(body) == {"error": CHUNKS_REFUSED}, body[:300]
    head = (f"POST /v2/models/{F32}/infer HTTP/1.1\r\n{HEADER}: 0\r\n"
            "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n")
    status, _, content = socket_request(server, head, chunked(b"A" * 64 * 20_000, 64))
    assert status == 413 and "exceeds the limit" in json.loads(content)["error"], content[:300]
    over = (b"8\r\nAAAAAAAA\r\n" * many) + b"0\r\n\r\n"
    rss_before = server.rss_bytes()
    for _ in range(3):
        status, _, content = socket_request(server, head, over)
        assert status == 400 and json.loads(content) == {"error": CHUNKS_REFUSED}, content[:300]
    growth = server.rss_bytes() - rss_before
    assert growth < 8 * MIB, f"RSS grew by {growth / MIB:.1f} MiB over 3 over-limit chunked requests"
    assert_live(server)


def test_chunked_body_does_not_stall_other_requests(server: ServerProcess) -> None:
    # Triton: HTTPRequestManyChunksTest's point (a body of very many chunks must not take the
    # server down): while a body of 1-byte chunks (just under the size limit) arrives, the
    # server still answers others promptly, and refuses it at chunk 65,537.
    head = (f"POST /v2/models/{F32}/infer HTTP/1.1\r\n{HEADER}: 0\r\n"
            "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n")
    count = (LIMIT // 4) * 4 - 4096
    done = threading.Event()
    result: list[Any] = []

    def slow() -> None:
        result.append(socket_request(server, head, b"1\r\nA\r\n" * count + b"0\r\n\r\n"))
        done.set()

    start = time.monotonic()
    t = threading.Thread(target=slow)
    t.start()
    worst = 0.0
    while not done.is_set() and time.monotonic() - start < 60:
        t0 = time.monotonic()
        assert requests.get(f"{server.url}/v2/health/live", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.05)
    t.join(60)
    assert result and result[0][0] == 400 and json.loads(result[0][2]) == {"error": CHUNKS_REFUSED}, result[:1]
    assert worst < 1.0, f"a health request took {worst:.2f} s while a chunked body arrived"


# ---------------------------------------------------------------- http_input_size_limit_test.py


def test_default_limit_raw_binary(server: ServerProcess, queue_server: ServerProcess) -> None:
    # Triton: test_default_limit_raw_binary / test_large_input_raw_binary: (limit/4 + 32) FP32
    # elements: 400 "exceeds the maximum allowed value"; (limit/4 - 32): 200, the identity's
    # output equals the input. zoo: 413 (docs/serving.md, Differences from Triton: "body over
    # the size limit"), at LIMIT; the default 64 MiB from Content-Length alone.
    large = np.ones(LIMIT // 4 + OFFSET_ELEMENTS, dtype=np.float32).tobytes()
    assert len(large) > LIMIT
    r = requests.post(infer_url(server, F32), data=large, headers={HEADER: "0"}, timeout=60)
    assert "exceeds the limit" in error_of(r, 413)
    small = np.ones(LIMIT // 4 - OFFSET_ELEMENTS, dtype=np.float32)
    r = requests.post(infer_url(server, F32), data=small.tobytes(), headers={HEADER: "0"}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    np.testing.assert_array_equal(np.frombuffer(r.content[int(r.headers[HEADER]):], dtype=np.float32), small)
    head = f"POST /v2/models/{F32}/infer HTTP/1.1\r\n{HEADER}: 0\r\nContent-Length: {DEFAULT_LIMIT + 128}\r\n"
    status, _, content = socket_request(queue_server, head, b"\0" * 4096)
    assert status == 413 and str(DEFAULT_LIMIT) in json.loads(content)["error"], content
    assert_live(server)


def test_default_limit_json(server: ServerProcess) -> None:
    # Triton: test_default_limit_json / test_large_input_json: (limit/4 + 32) FP32 elements as
    # JSON: 400 "request JSON size of ... bytes exceeds the maximum allowed input size of ...";
    # (limit/4 - 32) * 4 / 5 elements: 200 with that shape. zoo: 413 (docs row "body over the
    # size limit").
    shape_size = LIMIT // 4 + OFFSET_ELEMENTS
    payload = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, shape_size], "data": [1.0] * shape_size}]}
    r = requests.post(infer_url(server, F32), json=payload, timeout=60)
    assert "exceeds the limit" in error_of(r, 413)
    shape_size = (LIMIT // 4 - OFFSET_ELEMENTS) * 4 // 5
    payload["inputs"][0].update(shape=[1, shape_size], data=[1.0] * shape_size)
    assert len(json.dumps(payload).encode()) < LIMIT
    r = requests.post(infer_url(server, F32), json=payload, timeout=60)
    assert r.status_code == 200, r.text[:300]
    (out,) = r.json()["outputs"]
    assert out["shape"] == [1, shape_size]
    assert_live(server)


def json_of_size(target: int) -> bytes:
    """An FP32 request whose JSON is exactly `target` bytes (test_large_string_in_json pads a
    BYTES string; whitespace inside the object pads here)."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]})
    padded = body[:-1] + " " * (target - len(body)) + body[-1]
    assert len(padded) == target
    return padded.encode()


def test_large_string_in_json(server: ServerProcess) -> None:
    # Triton: test_large_string_in_json: a body of the limit + 1 bytes is refused ("request JSON
    # size of ..."), one of exactly the limit is served. zoo: 413 (docs row "body over the size limit").
    r = requests.post(infer_url(server, F32), data=json_of_size(LIMIT + 1), timeout=60)
    assert "exceeds the limit" in error_of(r, 413)
    r = requests.post(infer_url(server, F32), data=json_of_size(LIMIT), timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert_live(server)


def test_json_dtype_size_expansion_exceeds_limit_error(server: ServerProcess) -> None:
    # Triton: test_json_dtype_size_expansion_exceeds_limit_error: base64 `data` whose INT64 shape
    # is 8 times its bytes, POSTed to .../generate: 400 "request JSON size of ...". zoo has no
    # generate endpoint (docs row "generate endpoints": 404); at .../infer, `data` must be a list
    # (400), and the same body past the limit is 413 (docs row "body over the size limit").
    input_bytes = np.ones(LIMIT // 8, dtype=np.int8).tobytes()
    data_str = base64.b64encode(input_bytes).decode()
    shape = [1, LIMIT // 8 // 8]
    payload = {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": shape, "data": data_str}]}
    headers = {"Content-Type": "application/json", HEADER: str(len(input_bytes))}
    r = requests.post(f"{server.url}/v2/models/{F32}/generate", json=payload, headers=headers, timeout=60)
    error_of(r, 404)
    r = requests.post(infer_url(server, F32), json=payload, timeout=60)
    assert "must be a list" in error_of(r, 400)
    big = {"inputs": [{**payload["inputs"][0], "data": data_str * 8}]}
    r = requests.post(infer_url(server, F32), json=big, timeout=60)
    assert "exceeds the limit" in error_of(r, 413)
    assert_live(server)


def gzip_payload(target_size: int) -> tuple[bytes, int]:
    """http_input_size_limit_test.py's _create_compressed_payload: 1000 FP32 padded with whitespace."""
    json_str = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1000],
                                       "data": [1.0] * 1000}]}, indent=4)
    padded = (json_str[:-1] + " " * (target_size - len(json_str)) + json_str[-1]).encode()
    return gzip.compress(padded), len(padded)


def test_default_limit_compressed(server: ServerProcess) -> None:
    # Triton: test_default_limit_compressed / test_large_input_compressed: a gzip body that
    # inflates past the limit: 400 "exceeds the maximum allowed value"; one under it: 200.
    # zoo: 413, as for any body past the limit (docs/serving.md, Differences from Triton).
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    data, size = gzip_payload(LIMIT + MIB // 16)
    assert len(data) < LIMIT < size
    r = requests.post(infer_url(server, F32), data=data, headers=headers, timeout=60)
    assert "decompressed, exceeds the limit" in error_of(r, 413)
    data, size = gzip_payload(LIMIT - MIB // 16)
    r = requests.post(infer_url(server, F32), data=data, headers=headers, timeout=60)
    assert r.status_code == 200, r.text[:300]
    plain = requests.post(infer_url(server, F32), data=gzip.decompress(data), timeout=60)
    assert r.json()["outputs"] == plain.json()["outputs"] and len(r.json()["outputs"][0]["data"]) == 1000
    assert_live(server)


def test_no_leak_on_invalid_inference_header_length(server: ServerProcess) -> None:
    # Triton: test_no_leak_on_invalid_inference_header_length: gzip bodies with a bad
    # Inference-Header-Content-Length: 400 each, RSS growth under 32 MiB.
    body = gzip.compress(b" " * MIB)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", HEADER: "9999999"}
    with requests.Session() as session:
        resp = session.post(infer_url(server, F32), data=body, headers=headers, timeout=60)
        assert "Inference-Header-Content-Length" in error_of(resp, 400)
        rss_before = server.rss_bytes()
        for _ in range(30):
            assert session.post(infer_url(server, F32), data=body, headers=headers, timeout=60).status_code == 400
        growth = server.rss_bytes() - rss_before
    assert growth < 32 * MIB, f"RSS grew by {growth / MIB:.1f} MiB"
    assert_live(server)


def test_invalid_max_input_size(repo: Path) -> None:
    # Triton: test.sh "Test with zero/negative max input size - should fail to start": "Error:
    # --http-max-input-size must be greater than 0.". zoo's flag is --max-request-size.
    runs = [subprocess.Popen([sys.executable, "-m", "zoo", "serve", str(repo), "--port", "0", "--grpc-port", "0",
                              "--max-request-size", value], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for value in ("0", "-1024")]
    for proc, value in zip(runs, ("0", "-1024")):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode != 0, out
        assert f"--max-request-size must be at least 1, got {value}" in out.decode(), out
