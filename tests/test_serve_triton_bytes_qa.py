"""NVIDIA Triton's BYTES (string) QA tests, ported to `zoo serve`'s domain-native BYTES inputs.

Source: the GitHub repository triton-inference-server/server: `qa/L0_string_io/
string_client_test.py` (ClientStringTest.test_unicode_bytes, with the clients its `_test_bytes`
lists: gRPC, and HTTP with binary or JSON input and output) and its `test.sh`;
`qa/L0_http/http_test.py`'s two BYTES cases that tests/test_serve_triton_http_qa.py left out
(test_byte, test_byte_too_many_elements); and the BYTES parts of `qa/L0_input_validation` that
tests/test_serve_triton_validation_qa.py does not send (test_input_string_shape_validation as
JSON; input_byte_size_test's ValidStringInputByteSize, StringCountMismatch and
StringSizeMisalign, which is triton-inference-server/core `src/test/input_byte_size_test.cc`, on
zoo's own text and SMILES models). The messages Triton asserts come from triton-inference-server/
core `src/infer_request.cc` (ValidateBytesInputs). Triton's tests are (c) NVIDIA CORPORATION &
AFFILIATES under the BSD-3-Clause license; this is our own code. Each test gives its Triton name.

Triton's BYTES models are identities (`string_identity`, `onnx_zero_1_object`): a string goes in
and comes back. zoo has no string tensors (a zoo artifact is a torch module exported to an
engine); its BYTES inputs are the domain-native ones ("A model whose spec has preprocessing
(`raw_kind`) also takes one BYTES input named after the kind, shape `[n]`", docs/serving.md,
Domain-native inputs), answered with one JSON document per item, or the tensor outputs of a
byte-level language model. So where Triton checks the echo, this port checks that every client
form (gRPC, HTTP binary or JSON each way) gives the same answer, and that it equals what the
artifact's own runner gives through `zoo predict`'s functions (`zoo.predict.predictor` /
`predict`) and the `zoo predict` command. Models, exported at tiny size with random weights:
`minilm-l6.all-v2` (text -> embedding), `mpnn.solubility` (SMILES -> property) and `gpt.pydoc`
(byte-level text -> logits). Each test ends with the server live and every model answering.

Beyond Triton's cases, what real clients send to a text or SMILES model: invalid UTF-8, a SMILES
RDKit cannot parse (or with whitespace inside, empty, too many atoms, a NUL), an empty batch
and one over `max_items`, a string over `--max-request-size`, wrong binary length prefixes,
JSON `data` that is not strings, one bad request among concurrent ones, a gRPC stream.

Differences asserted as docs/serving.md documents them:
- non-UTF-8 items: Triton's identity echoes `_test_unicode_bytes_dtype`'s protobuf blobs; a text
  or SMILES item is UTF-8 ("`text` (UTF-8), `smiles` (UTF-8, no whitespace inside)"), and "invalid
  UTF-8" is in the status table's 400 row, so sent as binary (HTTP or gRPC) they are a 400 /
  INVALID_ARGUMENT naming the item. As JSON, tritonclient refuses them before sending, as in
  Triton's test (its `binary_false_clients` raise).
- an item the model's preprocessing refuses (empty prompt to a language model, bad SMILES):
  "a bad item is a 400 naming it, items counted from 1".
- a string over the size limit: "body over the size limit | 400 (`--http-max-input-size`) | 413
  (`--max-request-size`)", and over gRPC "413 -> RESOURCE_EXHAUSTED"; this server's limit is 1 MiB.
- test_byte_too_many_elements: Triton's rule ("For BYTE datatype raw input 'INPUT0', the model
  must have input shape [1]") holds, but a raw binary request is for "the model's only input (a
  model with several inputs answers 400)": the raw body is read as the model's tensor inputs,
  never as its domain-native `[n]` BYTES input.

Not ported, and why:
- test_byte (onnx_zero_1_object_1_element, a raw body echoed): needs a BYTES input of shape [1];
  every zoo BYTES input is domain-native, shape [n], which Triton's own rule refuses raw (the
  test_byte_too_many_elements case here).
- the echo itself (`np.array_equal(input_, out0)`): zoo's text models return embeddings and
  logits; equality with the artifact's own runner stands for it.
- input_byte_size_test's split buffers (ValidStringInputByteSize's three appends,
  StringSizeMisalign's length indicator split over two buffers): the C API appends one input's
  data in several buffers, which no wire protocol can; the same bytes are sent as one buffer.
  StringCountMismatchGPU: CUDA memory.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import zoo
from zoo.predict import predict, predictor

pytest.register_assert_rewrite("serve_support")
from serve_support import ServerProcess, assert_close  # noqa: E402

MINILM, MPNN, GPT = "minilm-l6.all-v2", "mpnn.solubility", "gpt.pydoc"
MODELS = (MINILM, MPNN, GPT)
LIMIT = 1 << 20  # --max-request-size
MAX_ITEMS = 32  # the batch axis maximum of every model here (metadata zoo.domain_native.max_items)
HEADER = "Inference-Header-Content-Length"

# Triton's _test_unicode_bytes_dtype: serialized protobufs, not UTF-8 (its 8 strings, the first 3)
BLOBS = [
    b"\nF\n'\n\x01a\x12\"\x1a \n\x1e\xfa\x03\x94\x01\x0f\xd7\x02\xf1\x05\xdf\x01\x82\x03\xb5\x05\xc1\x07\xba\x06"
    b"\xff\x06\xc7\x07L\xf5\x03\xe2\x07\xa9\x03\n\x0c\n\x01b\x12\x07\x1a\x05\n\x03\x89\xcc=\n\r\n\x01c\x12\x08\x12"
    b"\x06\n\x04\xdf\\\xcb\xbf",
    b"\n:\n\x1a\n\x01a\x12\x15\x1a\x13\n\x11*\xe3\x05\xc5\x06\xda\x07\xcb\x06~\xb1\x05\xb3\x01\xa9\x02\x15\n\r\n"
    b"\x01b\x12\x08\x1a\x06\n\x04\xf6\xa2\xc5\x01\n\r\n\x01c\x12\x08\x12\x06\n\x04\xbb[\n\xbf",
    b"\n&\n\x07\n\x01a\x12\x02\x1a\x00\n\x0c\n\x01b\x12\x07\x1a\x05\n\x03\x89\xcc=\n\r\n\x01c\x12\x08\x12\x06\n"
    b"\x04{\xbc\x0e>\x00\x00\x00",
]
# the strings real clients send: empty, non-ASCII, embedded NULs, long (past MiniLM's 256 tokens
# and GPT's context window), and Triton's _test_str_dtype numbers as text
TEXTS = ["", "héllo wörld ✓ 日本語 🚀 Ünïcödé", "a\x00b\x00", "word " * 2000, "10000", "\x00"]
PROMPTS = ["def f(x):", "héllo ✓", "a\x00b", "import os\n" * 200]
SMILES = ["CCO", "c1ccccc1O", " CCO\n", "C[N+](C)(C)C", "C[C@H](N)C(=O)O", "CC(=O)Oc1ccccc1C(=O)O"]
ITEMS = {MINILM: TEXTS, MPNN: SMILES, GPT: PROMPTS}
INPUT = {MINILM: "text", MPNN: "smiles", GPT: "text"}


def artifact(model: str) -> str:
    return f"{model}.onnxruntime.fp32"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bytes_qa")
    repo = root / "exports"
    for model in MODELS:
        zoo.export(zoo.get_model(model).tiny(), "onnxruntime", repository=repo, random_init=True)
    server = ServerProcess(repo, "--max-request-size", str(LIMIT), "--max-queue-delay-ms", "5",
                           log=root / "server.log")
    try:
        server.wait_ready()
        server.repo = repo
        server.local = {model: predictor(artifact=repo / artifact(model)) for model in MODELS}
        yield server
    finally:
        server.kill()


@pytest.fixture
def server(world) -> Iterator[ServerProcess]:
    """The module's server; each test ends with it live and every model answering."""
    yield world
    assert httpx.get(f"{world.url}/v2/health/live", timeout=10).status_code == 200
    assert httpx.get(f"{world.url}/v2/health/ready", timeout=10).status_code == 200
    with triton_grpc.InferenceServerClient(world.grpc_url) as client:
        for model in MODELS:
            assert client.is_model_ready(artifact(model)), model
            sent = triton_grpc.InferInput(INPUT[model], [1], "BYTES")
            sent.set_data_from_numpy(np.array([ITEMS[model][1].encode()], dtype=object))
            assert client.infer(artifact(model), [sent]) is not None


# ---------------------------------------------------------------- helpers


def local_results(server, model: str, items: list) -> list:
    """What the artifact's own runner gives through zoo predict's functions."""
    spec, fn, _ = server.local[model]
    return predict(spec, fn, items)


def local_logits(server, items: list[bytes]) -> np.ndarray:
    spec, fn, _ = server.local[GPT]
    return np.asarray(fn(spec.preprocess(items))["logits"])


def encode(items: list) -> np.ndarray:
    return np.array([x.encode() if isinstance(x, str) else x for x in items], dtype=object)


# (name, client module, binary input, binary output): Triton's _test_bytes clients
CLIENTS = [("grpc", triton_grpc, True, True), ("http-bin-bin", triton_http, True, True),
           ("http-bin-json", triton_http, True, False), ("http-json-bin", triton_http, False, True),
           ("http-json-json", triton_http, False, False)]
CLIENT_IDS = [c[0] for c in CLIENTS]


def client_infer(server, client_case, model: str, array: np.ndarray, output: str = "result") -> np.ndarray:
    """Triton's _test_infer_unicode: `array` as the model's BYTES input, the output as asked."""
    _, module, binary_in, binary_out = client_case
    sent = module.InferInput(INPUT[model], list(array.shape), "BYTES")
    if module is triton_http:
        sent.set_data_from_numpy(array, binary_data=binary_in)
        outputs = [triton_http.InferRequestedOutput(output, binary_data=binary_out)]
        with triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60) as client:
            return client.infer(artifact(model), [sent], outputs=outputs).as_numpy(output)
    sent.set_data_from_numpy(array)
    with triton_grpc.InferenceServerClient(server.grpc_url) as client:
        return client.infer(artifact(model), [sent], outputs=[triton_grpc.InferRequestedOutput(output)]).as_numpy(output)


def documents(result: np.ndarray) -> list:
    return [json.loads(x) for x in result.reshape(-1)]


def bytes_items(*items: bytes) -> bytes:
    """BYTES elements as the binary tensor data extension lays them out."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def http_json(server, model: str, data: Any, shape: list[int], name: str | None = None,
              datatype: str = "BYTES") -> httpx.Response:
    body = {"inputs": [{"name": name or INPUT[model], "datatype": datatype, "shape": shape, "data": data}]}
    return httpx.post(f"{server.url}/v2/models/{artifact(model)}/infer", json=body, timeout=60)


def http_binary(server, model: str, raw: bytes, shape: list[int]) -> httpx.Response:
    head = json.dumps({"inputs": [{"name": INPUT[model], "datatype": "BYTES", "shape": shape,
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return httpx.post(f"{server.url}/v2/models/{artifact(model)}/infer", content=head + raw,
                      headers={HEADER: str(len(head))}, timeout=60)


def grpc_raw(server, model: str, shape: list[int], raw: bytes | None = None,
             typed: list[bytes] | None = None) -> Any:
    """A ModelInferRequest sent as it is: `raw` as raw_input_contents, or `typed` as
    contents.bytes_contents."""
    request = service_pb2.ModelInferRequest(model_name=artifact(model))
    tensor = request.inputs.add(name=INPUT[model], datatype="BYTES", shape=shape)
    if typed is not None:
        tensor.contents.bytes_contents.extend(typed)
    if raw is not None:
        request.raw_input_contents.append(raw)
    with grpc.insecure_channel(server.grpc_url) as channel:
        return service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)


def refused_everywhere(server, model: str, items: list[bytes], *words: str) -> None:
    """`items` refused with 400 / INVALID_ARGUMENT naming `words`: HTTP binary, gRPC raw and
    gRPC typed contents, and HTTP JSON where every item is UTF-8, all with the same message."""
    messages = []
    answer = http_binary(server, model, bytes_items(*items), [len(items)])
    assert answer.status_code == 400, answer.text
    messages.append(answer.json()["error"])
    for kwargs in ({"raw": bytes_items(*items)}, {"typed": items}):
        with pytest.raises(grpc.RpcError) as info:
            grpc_raw(server, model, [len(items)], **kwargs)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        messages.append(info.value.details())
    if all(_utf8(x) for x in items):
        answer = http_json(server, model, [x.decode() for x in items], [len(items)])
        assert answer.status_code == 400, answer.text
        messages.append(answer.json()["error"])
    assert len(set(messages)) == 1, messages
    for word in words:
        assert word in messages[0], (word, messages[0])


def _utf8(item: bytes) -> bool:
    try:
        item.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ---------------------------------------------------------------- L0_string_io


@pytest.mark.parametrize("client_case", CLIENTS, ids=CLIENT_IDS)
@pytest.mark.parametrize("dtype", [None, np.object_, np.bytes_])
def test_unicode_bytes_str_dtype(server, client_case, dtype):
    # Triton: test_unicode_bytes, _test_str_dtype: "10000".."10007" as str, and as ints, in an
    # object or np.bytes_ array (None: tritonclient's default, object), through every client.
    for values in ([str(i) for i in range(10000, 10008)], list(range(10000, 10008))):
        array = np.array(values, dtype=dtype or np.object_)
        got = documents(client_infer(server, client_case, MINILM, array))
        assert got == local_results(server, MINILM, [str(i) for i in range(10000, 10008)])


@pytest.mark.parametrize("client_case", CLIENTS, ids=CLIENT_IDS)
@pytest.mark.parametrize("dtype", [np.object_, np.bytes_, "|S78"])
def test_unicode_bytes_non_utf8(server, client_case, dtype):
    # Triton: test_unicode_bytes, _test_unicode_bytes_dtype: serialized protobufs (not UTF-8).
    # Triton's identity echoes them through binary input; JSON input fails (client-side).
    # A text item is UTF-8 (docs: "`text` (UTF-8)"; "invalid UTF-8" is a 400), so zoo
    # refuses them naming the first bad item.
    array = np.array(BLOBS, dtype=dtype)
    if not client_case[2]:  # Triton's binary_false_clients: tritonclient refuses before sending
        with pytest.raises(InferenceServerException, match="Failed to encode"):
            client_infer(server, client_case, MINILM, array)
        return
    with pytest.raises(InferenceServerException) as info:
        client_infer(server, client_case, MINILM, array)
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), info.value
    assert "item 1 is not valid UTF-8" in info.value.message()


@pytest.mark.parametrize("client_case", CLIENTS, ids=CLIENT_IDS)
@pytest.mark.parametrize("model", [MINILM, MPNN])
def test_strings_every_client_equal_runner(server, client_case, model):
    # L0_string_io's point (strings arrive intact through HTTP JSON, HTTP binary and gRPC) on
    # empty, non-ASCII, NUL-holding and long strings: each client form answers what the
    # artifact's own runner answers for the same strings, exactly.
    items = ITEMS[model]
    got = documents(client_infer(server, client_case, model, encode(items)))
    assert got == local_results(server, model, items)


@pytest.mark.parametrize("client_case", CLIENTS, ids=CLIENT_IDS)
def test_language_model_strings_equal_runner(server, client_case):
    # a model with preprocessing but no postprocessing answers its tensor outputs: the logits
    # of byte-level prompts (non-ASCII, an embedded NUL, one past the context window).
    got = client_infer(server, client_case, GPT, encode(PROMPTS), output="logits")
    want = local_logits(server, [p.encode() for p in PROMPTS])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_zoo_predict_command_equals_served(server):
    # `zoo predict` (the command) on the artifact and against the server (`--url`, 40 items:
    # two requests of at most max_items) gives what the server answers, item for item.
    items = [SMILES[k % len(SMILES)].strip() for k in range(40)]
    common = [sys.executable, "-m", "zoo", "predict"]
    local = subprocess.run([*common, "-", "-a", str(server.repo / artifact(MPNN)), "--json", *items],
                           capture_output=True, text=True, timeout=120)
    remote = subprocess.run([*common, artifact(MPNN), "--url", server.url, "--json", *items],
                            capture_output=True, text=True, timeout=120)
    assert local.returncode == 0 and remote.returncode == 0, (local.stderr, remote.stderr)
    want = json.loads(local.stdout)["results"]
    assert json.loads(remote.stdout)["results"] == want
    answer = http_json(server, MPNN, items[:MAX_ITEMS], [MAX_ITEMS])
    assert answer.status_code == 200, answer.text
    assert [json.loads(x) for x in answer.json()["outputs"][0]["data"]] == want[:MAX_ITEMS]


# ---------------------------------------------------------------- L0_http BYTES cases


@pytest.mark.parametrize("model", MODELS)
def test_byte_too_many_elements(server, model):
    # Triton: test_byte_too_many_elements: "427" as a raw binary body (Inference-Header-
    # Content-Length: 0) for a model whose BYTES input is not of shape [1]: 400. zoo reads a
    # raw body as the model's tensor inputs, never its domain-native [n] input.
    answer = httpx.post(f"{server.url}/v2/models/{artifact(model)}/infer", content=b"427",
                        headers={HEADER: "0"}, timeout=60)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert "raw binary request" in message, message


# ---------------------------------------------------------------- L0_input_validation BYTES


@pytest.mark.parametrize("model", [MINILM, MPNN])
def test_input_string_shape_validation_json(server, model):
    # Triton: test_input_string_shape_validation (there gRPC and HTTP binary, ported in
    # test_serve_triton_validation_qa.py), here with JSON data: 2 strings for shape [3] and 4
    # for shape [3]: 400 naming the input and the counts.
    for count in (2, 4):
        answer = http_json(server, model, [s.strip() for s in SMILES[:count]], [3])
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]
        assert f"'{INPUT[model]}'" in message and f"has {count} elements" in message and "[3]" in message, message


@pytest.mark.parametrize("model", [MINILM, MPNN])
def test_valid_string_input_byte_size(server, model):
    # Triton: input_byte_size_test ValidStringInputByteSize: three length-prefixed elements
    # (here in one buffer): answered, over HTTP binary and gRPC raw, as the runner answers.
    items = [s.strip().encode() for s in SMILES[:3]]
    answer = http_binary(server, model, bytes_items(*items), [3])
    assert answer.status_code == 200, answer.text
    want = local_results(server, model, items)
    assert [json.loads(x) for x in answer.json()["outputs"][0]["data"]] == want
    reply = grpc_raw(server, model, [3], raw=bytes_items(*items))
    (raw,) = reply.raw_output_contents
    got, offset = [], 0
    while offset < len(raw):
        (n,) = struct.unpack_from("<I", raw, offset)
        got.append(json.loads(raw[offset + 4:offset + 4 + n]))
        offset += 4 + n
    assert got == want


@pytest.mark.parametrize("model", [MINILM, MPNN])
def test_string_count_mismatch_binary(server, model):
    # Triton: input_byte_size_test StringCountMismatch: 2 elements for shape [3] ("expected 3
    # string elements ..., got 2") and 2 for shape [1] ("unexpected number of string elements 2
    # ..., expecting 1"); one buffer here, over HTTP binary and gRPC raw.
    raw = bytes_items(b"CCO", b"CCN")
    for shape, words in (([3], "holds 2 elements"), ([1], "holds more than the 1 elements")):
        answer = http_binary(server, model, raw, shape)
        assert answer.status_code == 400 and words in answer.json()["error"], answer.text
        with pytest.raises(grpc.RpcError) as info:
            grpc_raw(server, model, shape, raw=raw)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()


@pytest.mark.parametrize("model", [MINILM, MPNN])
@pytest.mark.parametrize("raw, words", [
    (bytes_items(b"CCO")[:2], "cut off inside its 4-byte length"),  # StringSizeMisalign
    (bytes_items(b"CCOCCO")[:-1], "claims 6 bytes; only 5 remain"),  # a prefix one too long
    (struct.pack("<I", 0xFFFFFFFF) + b"CCO", "claims 4294967295 bytes; only 3 remain"),  # no allocation of 4 GiB
    (struct.pack("<I", 2) + b"CCO", "holds more than the 1 elements"),  # a prefix one too short
    (bytes_items(b"CCO") + b"\x00", "holds more than the 1 elements"),  # a stray byte after the last element
], ids=["misalign", "prefix-long", "prefix-huge", "prefix-short", "trailing"])
def test_wrong_length_prefix(server, model, raw, words):
    # Triton: input_byte_size_test StringSizeMisalign ("incomplete string length indicator ...
    # expecting 4 bytes but only 2 bytes available"), and ValidateBytesInputs' count of an
    # element that runs past the data: a wrong prefix is never read as other items.
    answer = http_binary(server, model, raw, [1])
    assert answer.status_code == 400, answer.text
    assert f"'{INPUT[model]}'" in answer.json()["error"] and words in answer.json()["error"], answer.text
    with pytest.raises(grpc.RpcError) as info:
        grpc_raw(server, model, [1], raw=raw)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()


# ---------------------------------------------------------------- what real clients send


@pytest.mark.parametrize("model, items, bad", [
    (MINILM, [b"ok", b"caf\xe9"], 2),  # Latin-1, not UTF-8
    (MINILM, [b"\xed\xa0\x80"], 1),  # an encoded surrogate
    (MINILM, [b"ok", b"fine", b"\xc3"], 3),  # a sequence cut short
    (MPNN, [b"CCO", b"C\xffC"], 2),
    (GPT, [b"\x80def"], 1),
])
def test_invalid_utf8(server, model, items, bad):
    refused_everywhere(server, model, items, f"item {bad} is not valid UTF-8")


def test_lone_surrogate_in_json(server):
    body = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["\\ud800"]}]}'
    answer = httpx.post(f"{server.url}/v2/models/{artifact(MINILM)}/infer", content=body, timeout=60)
    assert answer.status_code == 400 and "lone surrogate" in answer.json()["error"], answer.text


@pytest.mark.parametrize("items, words", [
    ([b"CCO", b"C1CC("], ("invalid SMILES 'C1CC(' (item 2)", "not valid SMILES syntax")),
    ([b"c1cccc1"], ("invalid SMILES 'c1cccc1' (item 1)",)),  # RDKit: can't kekulize
    ([b"C(C)(C)(C)(C)C"], ("invalid SMILES", "(item 1)")),  # a pentavalent carbon
    ([b"CCO", b"C C"], ("'C C' (item 2) contains whitespace",)),
    ([b""], ("empty SMILES (item 1)",)),
    ([b"CCO", b"  \t"], ("empty SMILES (item 2)",)),
    ([b"C\x00C"], ("SMILES 'C\\x00C' (item 1) holds '\\x00' (U+0000) at position 2",)),
    ([b"C" * 65], ("(item 1) has 65 heavy atoms", "at most 64")),
])
def test_smiles_rdkit_cannot_parse(server, items, words):
    refused_everywhere(server, MPNN, items, *words)


def test_empty_prompt_to_language_model(server):
    refused_everywhere(server, GPT, [b"def", b""], "item 2 is empty")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("count", [0, MAX_ITEMS + 1])
def test_empty_and_oversized_batch(server, model, count):
    # an empty batch of strings (shape [0]) and one over max_items: 400 over every form,
    # naming the range; max_items is what the metadata advertises.
    meta = httpx.get(f"{server.url}/v2/models/{artifact(model)}", timeout=10).json()
    assert meta["zoo"]["domain_native"]["max_items"] == MAX_ITEMS
    words = f"1 to {MAX_ITEMS}"
    answer = http_json(server, model, ["CCO"] * count, [count])
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    answer = http_binary(server, model, bytes_items(*[b"CCO"] * count), [count])
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    array = np.array([b"CCO"] * count, dtype=object)
    with pytest.raises(InferenceServerException) as info:
        client_infer(server, CLIENTS[0], model, array)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and words in info.value.message()
    answer = http_json(server, model, ["CCO"] * MAX_ITEMS, [MAX_ITEMS])
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("data", [[1], [None], [True], [{"a": "b"}], [["CCO"]], [1.5], "CCO"],
                         ids=["int", "null", "bool", "object", "nested", "float", "not-a-list"])
def test_json_non_strings_for_bytes(server, data):
    answer = http_json(server, MINILM, data, [1])
    assert answer.status_code == 400, answer.text
    assert "'text'" in answer.json()["error"], answer.text


def test_string_over_the_request_limit(server):
    # the only documented length limit on an item is the body's (--max-request-size, here 1
    # MiB): over it, 413 / RESOURCE_EXHAUSTED; just under it, answered as the runner answers
    # (MiniLM truncates at 256 tokens).
    big = "x" * LIMIT
    assert http_json(server, MINILM, [big], [1]).status_code == 413
    assert http_binary(server, MINILM, bytes_items(big.encode()), [1]).status_code == 413
    with pytest.raises(grpc.RpcError) as info:
        grpc_raw(server, MINILM, [1], raw=bytes_items(big.encode()))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    text = "word " * ((LIMIT - 4096) // 5)
    answer = http_binary(server, MINILM, bytes_items(text.encode()), [1])
    assert answer.status_code == 200, answer.text
    assert [json.loads(x) for x in answer.json()["outputs"][0]["data"]] == local_results(server, MINILM, [text])


def test_wrong_datatype_for_the_text_input(server):
    # Triton: "unexpected datatype TYPE_UINT8 for inference input 'text', expecting
    # TYPE_STRING"; zoo: 400 naming the BYTES input it takes.
    answer = http_json(server, MINILM, [104, 105], [2], datatype="UINT8")
    assert answer.status_code == 400, answer.text
    assert "one BYTES input 'text'" in answer.json()["error"], answer.text


def test_one_bad_request_among_concurrent(server):
    # fault isolation with strings: 12 concurrent requests, batched together by the 5 ms
    # delay; the one with invalid UTF-8 and the one with a bad SMILES fail alone, every other
    # answer is the runner's (within the model's tolerance: merged requests are padded).
    jobs = [(MINILM, [TEXTS[k % 3].encode(), b"more text"]) for k in range(5)] + [(MINILM, [b"ok", b"\xff"])]
    jobs += [(MPNN, [SMILES[k].strip().encode()]) for k in range(5)] + [(MPNN, [b"C1CC("])]

    def send(job):
        model, items = job
        return http_binary(server, model, bytes_items(*items), [len(items)])

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(send, jobs))
    for (model, items), answer in zip(jobs, answers):
        if items in ([b"ok", b"\xff"], [b"C1CC("]):
            assert answer.status_code == 400, answer.text
            continue
        assert answer.status_code == 200, answer.text
        got = [json.loads(x) for x in answer.json()["outputs"][0]["data"]]
        assert_close(got, local_results(server, model, items), atol=1e-4, rtol=1e-4)


def test_stream_with_bad_strings(server):
    # ModelStreamInfer: "an error goes in that response's `error_message` and the stream goes on".
    items = [[b"CCO"], [b"C1CC("], [b"\xff"], [b"c1ccccc1O"]]
    requests = []
    for k, batch in enumerate(items):
        request = service_pb2.ModelInferRequest(model_name=artifact(MPNN), id=str(k))
        request.inputs.add(name="smiles", datatype="BYTES", shape=[len(batch)])
        request.raw_input_contents.append(bytes_items(*batch))
        requests.append(request)
    with grpc.insecure_channel(server.grpc_url) as channel:
        replies = list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests), timeout=60))
    assert len(replies) == 4
    by_id = {r.infer_response.id: r for r in replies}
    assert "invalid SMILES 'C1CC('" in by_id["1"].error_message
    assert "not valid UTF-8" in by_id["2"].error_message
    for k in ("0", "3"):
        assert by_id[k].error_message == ""
        raw = by_id[k].infer_response.raw_output_contents[0]
        assert [json.loads(raw[4:])] == local_results(server, MPNN, items[int(k)])


def test_result_output_classification_refused(server):
    # Triton's classification extension reads numeric outputs only; `result` is BYTES.
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}],
            "outputs": [{"name": "result", "parameters": {"classification": 2}}]}
    answer = httpx.post(f"{server.url}/v2/models/{artifact(MINILM)}/infer", json=body, timeout=60)
    assert answer.status_code == 400 and "BYTES" in answer.json()["error"], answer.text
