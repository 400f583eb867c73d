"""`zoo serve` over gRPC, through the real clients: tritonclient.grpc (sync and aio) and
the `GRPCInferenceServiceStub` generated from Triton's `grpc_service.proto` (for typed
`contents`, which tritonclient never sends).

Every answer is checked against something the server did not compute through gRPC: the
artifact's own runner, or the HTTP front end's answer for the same request. Malformed
requests get the status code Triton gives and the very message the HTTP front end gives
for the same request; the server stays live after each.
"""

from __future__ import annotations

import asyncio
import json
import math

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

import zoo
from zoo.serve.protocol import HEADER_LENGTH, decode_response, encode_request

pytest.register_assert_rewrite("serve_support")
from serve_support import (  # noqa: E402
    DOMAIN_MODELS,
    ONNX,
    RAGGED,
    artifact_name,
    assert_close,
    domain_params,
    plugin_registered,
    sample_items,
)

pytest_plugins = ["serve_support"]
PIXELS = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(1, 1, 8, 8)
#: the HTTP status of a kind of error -> the gRPC code Triton gives it
CODES = {400: "StatusCode.INVALID_ARGUMENT", 404: "StatusCode.NOT_FOUND", 403: "StatusCode.UNIMPLEMENTED",
         503: "StatusCode.UNAVAILABLE"}


@pytest.fixture(scope="module")
def client(server):
    with triton_grpc.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def runners(serve_repo):
    with plugin_registered():
        return {name: (zoo.Artifact.open(serve_repo / name).spec(), zoo.load(serve_repo / name, threads=1))
                for name in (ONNX, RAGGED)}


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else triton_grpc.np_to_triton_dtype(array.dtype)
        item = triton_grpc.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def http_infer(server, model: str, arrays: dict, outputs: list[dict] | None = None) -> dict[str, np.ndarray]:
    body, headers = encode_request(arrays, binary=True)
    if outputs is not None:
        doc_end = int(headers.get(HEADER_LENGTH, len(body)))
        doc = json.loads(body[:doc_end])
        doc["outputs"] = outputs
        doc.pop("parameters", None)
        head = json.dumps(doc).encode()
        body, headers = head + body[doc_end:], {**headers, HEADER_LENGTH: str(len(head))}
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return decode_response(response.content, response.headers.get(HEADER_LENGTH))[1]


# ---------------------------------------------------------------- health, metadata, configuration


def test_health_metadata_and_configuration_agree_with_http(server, client):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(ONNX)
    meta = client.get_server_metadata(as_json=True)
    http_meta = httpx.get(f"{server.url}/v2").json()
    assert meta["name"] == "zoo" and meta["extensions"] == http_meta["extensions"]
    assert {"statistics", "classification", "system_shared_memory"} <= set(meta["extensions"])
    for name in (ONNX, RAGGED):
        model = client.get_model_metadata(name, as_json=True)
        http_model = httpx.get(f"{server.url}/v2/models/{name}").json()
        for part in ("inputs", "outputs"):
            assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in model[part]] == \
                [(t["name"], t["datatype"], t["shape"]) for t in http_model[part]]
        config = client.get_model_config(name, as_json=True)["config"]
        http_config = httpx.get(f"{server.url}/v2/models/{name}/config").json()
        assert int(config.get("max_batch_size", 0)) == http_config["max_batch_size"]
        assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == \
            [(t["name"], t["data_type"], t["dims"]) for t in http_config["input"]]
    index = client.get_model_repository_index(as_json=True)["models"]
    http_index = httpx.post(f"{server.url}/v2/repository/index").json()
    assert [(m["name"], m.get("state")) for m in index] == [(m["name"], m["state"]) for m in http_index]
    # as Triton answers (its L0_lifecycle tests): a model or version it does not serve is not ready, not an error
    assert client.is_model_ready("no-such-model") is False and client.is_model_ready(ONNX, "7") is False
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no-such-model")
    assert info.value.status() == "StatusCode.NOT_FOUND" and "unknown model 'no-such-model'" in info.value.message()


# ---------------------------------------------------------------- inference


@pytest.mark.parametrize("name", [ONNX, RAGGED])
def test_raw_contents_equal_the_artifacts_own_runner(client, runners, name):
    spec, runner = runners[name]
    rng = np.random.default_rng(3)
    for batch in (1, 3):
        arrays = spec.sample(batch, rng)
        result = client.infer(name, grpc_inputs(arrays), request_id=f"r{batch}")
        assert result.get_response().id == f"r{batch}"
        want = runner(arrays)
        tol = spec.tolerance("fp32")
        for key, value in want.items():
            np.testing.assert_allclose(result.as_numpy(key), value, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_calls(client, runners, algorithm):
    # tritonclient's compression_algorithm: grpcio compresses the call, the server's
    # grpcio reads it (and answers in kind), as Triton's gRPC front end does
    spec, runner = runners[ONNX]
    arrays = spec.sample(2, np.random.default_rng(8))
    result = client.infer(ONNX, grpc_inputs(arrays), compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("logits"), runner(arrays)["logits"], atol=1e-4, rtol=1e-4)


def test_typed_contents_equal_raw_contents(stub, client):
    typed = pb.ModelInferRequest(model_name=ONNX)
    typed.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8]).contents.fp32_contents.extend(PIXELS.ravel())
    answer = stub.ModelInfer(typed)
    logits = np.frombuffer(answer.raw_output_contents[0], np.float32)
    raw = client.infer(ONNX, grpc_inputs({"image": PIXELS})).as_numpy("logits")
    np.testing.assert_array_equal(logits.reshape(raw.shape), raw)

    tokens = pb.ModelInferRequest(model_name=RAGGED)
    for name, values in (("tokens", [5, 6, 7, 8]), ("mask", [1, 1, 1, 0])):
        tokens.inputs.add(name=name, datatype="INT64", shape=[1, 4]).contents.int64_contents.extend(values)
    typed_answer = stub.ModelInfer(tokens)
    arrays = {"tokens": np.array([[5, 6, 7, 8]]), "mask": np.array([[1, 1, 1, 0]])}
    raw_answer = client.infer(RAGGED, grpc_inputs(arrays))
    for k, out in enumerate(typed_answer.outputs):
        got = np.frombuffer(typed_answer.raw_output_contents[k], triton_grpc.triton_to_np_dtype(out.datatype))
        np.testing.assert_array_equal(got.reshape(list(out.shape)), raw_answer.as_numpy(out.name))


@pytest.mark.parametrize("domain", domain_params())
def test_domain_native_items_answer_as_over_http(server, client, stub, domain):
    name = artifact_name(DOMAIN_MODELS[domain])
    spec = zoo.get_model(DOMAIN_MODELS[domain])
    items = sample_items(spec, 3)
    array = np.array(items, dtype=object)
    via_grpc = [json.loads(x) for x in client.infer(name, grpc_inputs({spec.raw_kind: array})).as_numpy("result")]
    via_http = [json.loads(x) for x in http_infer(server, name, {spec.raw_kind: array})["result"]]
    tol = spec.tolerance("fp32")
    assert_close(via_grpc, via_http, max(tol.atol, 1e-5), max(tol.rtol, 1e-5))
    typed = pb.ModelInferRequest(model_name=name)  # the same items as typed bytes_contents
    typed.inputs.add(name=spec.raw_kind, datatype="BYTES", shape=[3]).contents.bytes_contents.extend(items)
    answer = stub.ModelInfer(typed)
    assert answer.outputs[0].name == "result" and answer.outputs[0].datatype == "BYTES"


def test_aio_client_concurrent_requests_match_the_runner(server, runners):
    spec, runner = runners[RAGGED]
    rng = np.random.default_rng(8)
    requests = [spec.sample(int(rng.integers(1, 4)), rng) for _ in range(16)]

    async def send() -> list:
        async with triton_grpc_aio.InferenceServerClient(server.grpc_url) as aio:
            assert await aio.is_server_live()
            return await asyncio.gather(*(aio.infer(RAGGED, grpc_inputs(x)) for x in requests))

    tol = spec.tolerance("fp32")
    for inputs, result in zip(requests, asyncio.run(send())):
        for key, value in runner(inputs).items():
            np.testing.assert_allclose(result.as_numpy(key), value, atol=tol.atol, rtol=tol.rtol)


def test_stream_infer_answers_every_request_and_errors_in_place(server, runners):
    spec, runner = runners[ONNX]
    rng = np.random.default_rng(4)
    requests = [spec.sample(1 + k % 3, rng) for k in range(6)]

    async def stream() -> list:
        async with triton_grpc_aio.InferenceServerClient(server.grpc_url) as aio:
            async def messages():
                for k, x in enumerate(requests):
                    yield {"model_name": ONNX, "inputs": grpc_inputs(x), "request_id": str(k)}
                yield {"model_name": "no-such-model", "inputs": grpc_inputs(requests[0]), "request_id": "bad"}
            return [item async for item in aio.stream_infer(messages())]

    answers = asyncio.run(stream())
    assert len(answers) == 7
    by_id = {}
    for result, error in answers:
        if error is not None:
            assert "unknown model 'no-such-model'" in error.message()
            by_id["bad"] = error
        else:
            by_id[result.get_response().id] = result
            # Triton marks each stream response final (stream_infer_handler.cc); clients read it
            assert result.get_response().parameters["triton_final_response"].bool_param is True
    assert set(by_id) == {*map(str, range(6)), "bad"}
    for k, x in enumerate(requests):
        np.testing.assert_allclose(by_id[str(k)].as_numpy("logits"), runner(x)["logits"], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- errors, as HTTP words them

IMAGE = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": PIXELS.ravel().tolist()}
TOKENS = {"name": "tokens", "datatype": "INT64", "shape": [1, 5], "data": [1, 2, 3, 4, 5]}
MASK = {"name": "mask", "datatype": "INT64", "shape": [1, 5], "data": [1, 1, 1, 1, 1]}
FIELDS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents", "INT32": "int_contents"}


def image(**changes) -> dict:
    return {**IMAGE, **changes}


#: (id, model, the request as JSON: inputs, outputs, parameters) sent both ways
CASES = [
    ("wrong-datatype", ONNX, [image(datatype="FP64")], None, None),
    ("unknown-datatype", ONNX, [image(datatype="FLOAT")], None, None),
    ("negative-dimension", ONNX, [image(shape=[-1, 1, 8, 8])], None, None),
    ("wrong-rank", ONNX, [image(shape=[1, 64])], None, None),
    ("wrong-fixed-dimension", ONNX, [image(shape=[1, 1, 4, 16])], None, None),
    ("zero-batch", ONNX, [image(shape=[0, 1, 8, 8], data=[])], None, None),
    ("batch-over-maximum", ONNX, [image(shape=[65, 1, 8, 8], data=[0.5] * 65 * 64)], None, None),
    ("missing-input", RAGGED, [TOKENS], None, None),
    ("extra-input", RAGGED, [TOKENS, MASK, {**MASK, "name": "segments"}], None, None),
    ("duplicate-input", ONNX, [IMAGE, IMAGE], None, None),
    ("no-inputs", ONNX, [], None, None),
    ("axes-disagree", RAGGED, [TOKENS, {**MASK, "shape": [1, 6], "data": [1] * 6}], None, None),
    ("axis-over-range", RAGGED, [{**TOKENS, "shape": [1, 17], "data": [1] * 17},
                                 {**MASK, "shape": [1, 17], "data": [1] * 17}], None, None),
    ("token-out-of-range", RAGGED, [{**TOKENS, "data": [1, 2, 3, 4, 10 ** 9]}, MASK], None, None),
    ("unknown-output", ONNX, [IMAGE], [{"name": "probs"}], None),
    ("duplicate-output", ONNX, [IMAGE], [{"name": "logits"}] * 2, None),
    ("sequence-parameters", ONNX, [IMAGE], None, {"sequence_id": 7}),
    ("priority-parameter", ONNX, [IMAGE], None, {"priority": 1}),
    ("reserved-parameter", ONNX, [IMAGE], None, {"triton_final_response": True}),
    ("classification-on-an-input", ONNX, [image(parameters={"classification": 3})], None, None),
    ("classification-negative", ONNX, [IMAGE], [{"name": "logits", "parameters": {"classification": -1}}], None),
    ("binary-data-on-an-input", ONNX, [image(parameters={"binary_data": True})], None, None),
    ("binary-data-size-on-an-output", ONNX, [IMAGE], [{"name": "logits", "parameters": {"binary_data_size": 40}}],
     None),
    ("binary-data-output-on-an-input", ONNX, [image(parameters={"binary_data_output": True})], None, None),
    ("timeout-on-an-output", ONNX, [IMAGE], [{"name": "logits", "parameters": {"timeout": 10 ** 6}}], None),
    ("shared-memory-on-the-request", ONNX, [IMAGE], None, {"shared_memory_region": "r"}),
    ("shared-memory-unregistered", ONNX, [{k: v for k, v in image(parameters={
        "shared_memory_region": "r", "shared_memory_byte_size": 256}).items() if k != "data"}], None, None),
    ("timeout-not-integer", ONNX, [IMAGE], None, {"timeout": "soon"}),
    ("unknown-model", "no-such-model", [IMAGE], None, None),
]


def as_message(model: str, inputs: list[dict], outputs: list[dict] | None, parameters: dict | None):
    message = pb.ModelInferRequest(model_name=model)
    for item in inputs:
        tensor = message.inputs.add(name=item["name"], datatype=item["datatype"], shape=item["shape"])
        _set_parameters(tensor.parameters, item.get("parameters"))
        if "data" in item:
            getattr(tensor.contents, FIELDS.get(item["datatype"], "fp32_contents")).extend(item["data"])
    for item in outputs or []:
        _set_parameters(message.outputs.add(name=item["name"]).parameters, item.get("parameters"))
    _set_parameters(message.parameters, parameters)
    return message


def _set_parameters(target, values: dict | None) -> None:
    for key, value in (values or {}).items():
        field = {bool: "bool_param", int: "int64_param", str: "string_param", float: "double_param"}[type(value)]
        setattr(target[key], field, value)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_requests_get_triton_codes_and_the_http_message(server, stub, case):
    _, model, inputs, outputs, parameters = case
    doc = {"inputs": inputs, **({"outputs": outputs} if outputs is not None else {}),
           **({"parameters": parameters} if parameters is not None else {})}
    http = httpx.post(f"{server.url}/v2/models/{model}/infer", json=doc, timeout=30)
    assert http.status_code in CODES, http.text
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(as_message(model, inputs, outputs, parameters), timeout=30)
    assert str(info.value.code()) == CODES[http.status_code]
    assert info.value.details() == http.json()["error"]
    assert stub.ServerLive(pb.ServerLiveRequest()).live


def test_the_empty_final_response_parameter_is_taken_over_grpc_only(server, stub, runners):
    # Triton's gRPC front end takes the one `triton_` request parameter it reserves for
    # clients (TRITON_RESERVED_REQUEST_PARAMS), as a bool; tritonclient's C++ client and
    # perf_analyzer send it with every request. Its HTTP front end refuses every `triton_` key.
    message = as_message(ONNX, [IMAGE], None, {"triton_enable_empty_final_response": True})
    answer = stub.ModelInfer(message, timeout=30)
    want = runners[ONNX][1]({"image": PIXELS.reshape(1, 1, 8, 8)})["logits"]
    np.testing.assert_allclose(np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(want.shape), want,
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(as_message(ONNX, [IMAGE], None, {"triton_enable_empty_final_response": "yes"}), timeout=30)
    assert str(info.value.code()) == "StatusCode.INVALID_ARGUMENT"
    assert info.value.details() == ("invalid value type for 'triton_enable_empty_final_response' parameter, "
                                    "expected bool_param")
    http = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", timeout=30,
                      json={"inputs": [IMAGE], "parameters": {"triton_enable_empty_final_response": True}})
    assert http.status_code == 400 and "reserved" in http.json()["error"]


# ---------------------------------------------------------------- the request's id in an error, as Triton's core

#: (id, model, inputs, outputs) of requests tritonserver 2.51's core refuses naming the request:
#: `[request id: ID] ` before its message, `<id_unknown>` for a request without an id, over HTTP,
#: gRPC and gRPC streams alike (compared side by side; tests/test_triton_server.py checks it
#: against the real server). Triton's words follow in each comment; zoo's own follow the prefix.
NAMED = [
    ("wrong-datatype", ONNX, [image(datatype="FP64")], None),  # inference input 'image' data-type is 'FP64', ...
    ("wrong-rank", ONNX, [image(shape=[1, 64])], None),  # unexpected shape for input 'image' ... Expected [-1,1,8,8]
    ("wrong-fixed-dimension", ONNX, [image(shape=[1, 1, 4, 16])], None),  # the same
    ("zero-batch", ONNX, [image(shape=[0, 1, 8, 8], data=[])], None),  # input byte size mismatch ... got 0
    ("batch-over-maximum", ONNX, [image(shape=[65, 1, 8, 8], data=[0.5] * 65 * 64)], None),  # batch-size must be <= 64
    ("missing-input", RAGGED, [TOKENS], None),  # expected 2 inputs but got 1 inputs for model ...
    ("extra-input", RAGGED, [TOKENS, MASK, {**MASK, "name": "segments"}], None),  # expected 2 inputs but got 3 ...
    ("no-inputs", ONNX, [], None),  # expected 1 inputs but got 0 inputs ...
    ("duplicate-input", ONNX, [IMAGE, IMAGE], None),  # input 'image' already exists in request
]
#: requests its front ends or the model itself refuse: no id
UNNAMED = [
    ("unknown-model", "no-such-model", [IMAGE], None),  # Request for unknown model: 'no-such-model' is not found
    ("unknown-input", ONNX, [{**IMAGE, "name": "pixels"}], None),  # unexpected inference input 'pixels' for model ...
    ("unknown-output", ONNX, [IMAGE], [{"name": "probs"}]),  # unexpected inference output 'probs' for model ...
    # a dynamic axis outside its range, axes that disagree, a value out of range: the artifact's own checks,
    # which Triton's Python backend makes (dims -1 let the request through its core)
    ("axis-over-range", RAGGED, [{**TOKENS, "shape": [1, 17], "data": [1] * 17},
                                 {**MASK, "shape": [1, 17], "data": [1] * 17}], None),
    ("axes-disagree", RAGGED, [TOKENS, {**MASK, "shape": [1, 6], "data": [1] * 6}], None),
    ("token-out-of-range", RAGGED, [{**TOKENS, "data": [1, 2, 3, 4, 10 ** 9]}, MASK], None),
]


def _streamed_error(stub, message) -> str:
    answers = list(stub.ModelStreamInfer(iter([message]), timeout=30))
    assert len(answers) == 1 and answers[0].error_message, answers
    return answers[0].error_message


@pytest.mark.parametrize("case", [(*c, True) for c in NAMED] + [(*c, False) for c in UNNAMED],
                         ids=[c[0] for c in NAMED + UNNAMED])
def test_an_error_names_its_request_where_tritons_core_does(server, stub, case):
    _, model, inputs, outputs, named = case
    for request_id in ("r-7", ""):
        doc = {**({"id": request_id} if request_id else {}), "inputs": inputs,
               **({"outputs": outputs} if outputs is not None else {})}
        http = httpx.post(f"{server.url}/v2/models/{model}/infer", json=doc, timeout=30)
        message = as_message(model, inputs, outputs, None)
        message.id = request_id
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message, timeout=30)
        words = http.json()["error"]
        assert (info.value.details(), _streamed_error(stub, message)) == (words, words)
        prefix = f"[request id: {request_id or '<id_unknown>'}] "
        assert words.startswith(prefix) is named and words.count("[request id: ") == named, words


@pytest.mark.parametrize("fix", [lambda m: m.raw_input_contents.append(PIXELS.tobytes()[:100]),
                                 lambda m: m.inputs[0].contents.fp32_contents.extend([0.5] * 63)],
                         ids=["raw-size", "contents-length"])
def test_a_byte_size_error_names_its_request_as_tritons_core_does(stub, fix):
    # tritonserver 2.51, to both: "[request id: b-1] input byte size mismatch for input 'image' for model ...
    # Expected 256, got 100" (252 for the typed contents), "[request id: <id_unknown>] ..." without an id
    for request_id in ("b-1", ""):
        message = pb.ModelInferRequest(model_name=ONNX, id=request_id)
        message.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
        fix(message)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(message, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(f"[request id: {request_id or '<id_unknown>'}] input 'image'")
        assert _streamed_error(stub, message) == info.value.details()


@pytest.mark.parametrize("case, fix, words", [
    ("raw-count", lambda m: m.raw_input_contents.extend([b"", b""]), "raw_input_contents has 2 entries for 1 inputs"),
    ("raw-size", lambda m: m.raw_input_contents.append(PIXELS.tobytes()[:100]), "do not hold 64 FP32"),
    ("contents-and-raw", lambda m: (m.inputs[0].contents.fp32_contents.extend(PIXELS.ravel()),
                                    m.raw_input_contents.append(PIXELS.tobytes())), "has both `contents` and raw"),
    ("neither", lambda m: None, "has neither `contents` nor raw_input_contents"),
    ("contents-length", lambda m: m.inputs[0].contents.fp32_contents.extend([0.5] * 63),
     "contents.fp32_contents has 63 elements but shape [1, 1, 8, 8] needs 64"),
    ("contents-wrong-field", lambda m: m.inputs[0].contents.int_contents.extend([1] * 64),
     "values go in contents.fp32_contents, not int_contents"),
    ("fp16-typed", lambda m: (setattr(m.inputs[0], "datatype", "FP16"), m.inputs[0].contents.fp32_contents.extend(
        [0.5] * 64)), "FP16 has no typed `contents` field"),
    # Triton: "unexpected explicit tensor data", whatever the other field holds
    *((f"stray-{field}", lambda m, field=field, values=values: (
        m.inputs[0].contents.fp32_contents.extend(PIXELS.ravel()), getattr(m.inputs[0].contents, field).extend(values)),
       f"values go in contents.fp32_contents, not {field}")
      for field, values in (("int_contents", [7] * 9), ("bytes_contents", [b"zz"]), ("int64_contents", [1]),
                            ("bool_contents", [True]))),
])
def test_grpc_only_defects(stub, case, fix, words):
    message = pb.ModelInferRequest(model_name=ONNX)
    message.inputs.add(name="image", datatype="FP32", shape=[1, 1, 8, 8])
    fix(message)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()


def test_a_message_over_the_size_limit_is_resource_exhausted(stub):
    message = pb.ModelInferRequest(model_name=ONNX)  # the shared server's limit is 1 MiB
    message.inputs.add(name="image", datatype="FP32", shape=[5000, 1, 8, 8])
    message.raw_input_contents.append(np.zeros(5000 * 64, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.ServerLive(pb.ServerLiveRequest()).live


def test_unoffered_rpcs_say_so(stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.TraceSetting(pb.TraceSettingRequest())
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED and "trace settings" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=ONNX))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED and "--model-control" in info.value.details()
    # as Triton: one repository is served, and a request naming one is not ignored
    with pytest.raises(grpc.RpcError) as info:
        stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other"))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED and "repository_name" in info.value.details()
    assert stub.RepositoryIndex(pb.RepositoryIndexRequest()).models


# ---------------------------------------------------------------- statistics


def _metric(text: str, family: str, model: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(family) and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_statistics_count_every_request_as_metrics_do(server, client):
    before = client.get_inference_statistics(ONNX, as_json=True)["model_stats"][0]
    n, rows = 7, 2
    arrays = {"image": np.repeat(PIXELS, rows, axis=0)}
    for k in range(n):
        client.infer(ONNX, grpc_inputs(arrays))
    with pytest.raises(InferenceServerException):
        client.infer(ONNX, grpc_inputs({"image": np.zeros((1, 1, 4, 16), np.float32)}))
    after = client.get_inference_statistics(ONNX, as_json=True)["model_stats"][0]
    http = httpx.get(f"{server.url}/v2/models/{ONNX}/stats").json()["model_stats"][0]
    metrics = httpx.get(f"{server.url}/metrics").text

    def count(stats, key):
        return int(stats["inference_stats"][key].get("count", 0))

    assert count(after, "success") - count(before, "success") == n
    assert count(after, "fail") - count(before, "fail") == 1
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == n * rows
    for key in ("success", "fail", "queue", "compute_infer"):  # HTTP and gRPC report the same numbers
        assert http["inference_stats"][key] == {k: int(v) for k, v in after["inference_stats"][key].items()} | \
            ({"count": 0, "ns": 0} if not after["inference_stats"][key] else {})
    # the same numbers as /metrics: requests, failures, queue and compute time
    requests = _metric(metrics, "zoo_inference_requests_total", ONNX)
    failures = _metric(metrics, "zoo_inference_failures_total", ONNX)
    assert count(http, "success") + count(http, "fail") == requests and count(http, "fail") == failures
    queue_s = _metric(metrics, "zoo_inference_queue_duration_seconds_sum", ONNX)
    assert math.isclose(http["inference_stats"]["queue"]["ns"] / 1e9, queue_s, rel_tol=1e-6, abs_tol=1e-6)
    executions = _metric(metrics, "zoo_inference_executions_total", ONNX)
    assert http["execution_count"] == executions == sum(
        b["compute_infer"]["count"] for b in http["batch_stats"])
    assert {b["batch_size"] for b in http["batch_stats"]} >= {rows}
    every = httpx.get(f"{server.url}/v2/models/stats").json()["model_stats"]
    assert ONNX in {s["name"] for s in every}


# ---------------------------------------------------------------- classification


def test_classification_returns_the_top_k_as_triton_does(server, client):
    rng = np.random.default_rng(5)
    images = rng.random((3, 1, 8, 8), dtype=np.float32)
    logits = client.infer(ONNX, grpc_inputs({"image": images})).as_numpy("logits")
    k = 3
    got = client.infer(ONNX, grpc_inputs({"image": images}),
                       outputs=[triton_grpc.InferRequestedOutput("logits", class_count=k)]).as_numpy("logits")
    via_http = http_infer(server, ONNX, {"image": images}, [{"name": "logits", "parameters": {"classification": k}}])
    assert got.shape == (3, k) and via_http["logits"].shape == (3, k)
    np.testing.assert_array_equal(got, via_http["logits"])
    for row, want in zip(got, logits):
        parts = [x.decode().split(":") for x in row]
        order = np.argsort(-want, kind="stable")[:k]
        assert [int(p[1]) for p in parts] == order.tolist()
        np.testing.assert_allclose([float(p[0]) for p in parts], want[order], atol=1e-5)
        assert all(len(p) == 3 and p[2] == p[1] for p in parts)  # the digits' labels are "0" to "9"


def test_classification_zero_is_not_set_over_http_and_refused_over_grpc(server, stub):
    """As Triton's front ends: HTTP reads `classification: 0` as not set and returns the
    tensor; gRPC refuses a count that is not positive (ParseClassificationParams)."""
    plain = http_infer(server, ONNX, {"image": PIXELS}, [{"name": "logits", "parameters": {"binary_data": True}}])
    zero = http_infer(server, ONNX, {"image": PIXELS},
                      [{"name": "logits", "parameters": {"classification": 0, "binary_data": True}}])
    assert zero["logits"].dtype == np.float32 and zero["logits"].shape == plain["logits"].shape == (1, 10)
    np.testing.assert_array_equal(zero["logits"], plain["logits"])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(as_message(ONNX, [IMAGE], [{"name": "logits", "parameters": {"classification": 0}}], None),
                        timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "positive integer" in info.value.details()


# ---------------------------------------------------------------- versions


def test_a_version_is_read_as_an_integer_as_triton_reads_it(stub):
    """Triton reads a version with std::stol: `01` and ` 1` are version 1, `-1` is
    INVALID_ARGUMENT; a version it does not serve stays NOT_FOUND (ModelReady: not ready)."""
    for version in ("01", " 1", "0001"):
        message = as_message(ONNX, [IMAGE], None, None)
        message.model_version = version
        assert stub.ModelInfer(message, timeout=30).model_version == "1"
        assert stub.ModelMetadata(pb.ModelMetadataRequest(name=ONNX, version=version)).name == ONNX
        assert stub.ModelReady(pb.ModelReadyRequest(name=ONNX, version=version)).ready
        assert stub.ModelConfig(pb.ModelConfigRequest(name=ONNX, version=version)).config.name == ONNX
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=ONNX, version=version)).model_stats
        assert [s.version for s in stats] == ["1"]
    for version in ("-1", "one", "1 "):
        for call, request in ((stub.ModelMetadata, pb.ModelMetadataRequest(name=ONNX, version=version)),
                              (stub.ModelReady, pb.ModelReadyRequest(name=ONNX, version=version))):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, version
            assert f"{version!r} is not a model version" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelMetadata(pb.ModelMetadataRequest(name=ONNX, version="2"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert stub.ModelReady(pb.ModelReadyRequest(name=ONNX, version="02")).ready is False


# ---------------------------------------------------------------- system shared memory


@pytest.fixture
def regions():
    """Regions made as same-host clients make them (tritonclient.utils.shared_memory),
    destroyed after the test."""
    import uuid

    import tritonclient.utils.shared_memory as shm

    made = []

    def make(byte_size: int):
        key = f"/zoo-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key.strip("/"), key, byte_size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_a_shared_memory_round_trip_equals_the_plain_one(server, regions, transport):
    import tritonclient.http as triton_http
    import tritonclient.utils.shared_memory as shm

    module = triton_grpc if transport == "grpc" else triton_http
    url = server.grpc_url if transport == "grpc" else server.url.removeprefix("http://")
    images = np.random.default_rng(6).random((4, 1, 8, 8), dtype=np.float32)
    in_key, in_handle = regions(64 + images.nbytes)  # the input sits 64 bytes into its region
    out_key, out_handle = regions(4 * 10 * 4)
    shm.set_shared_memory_region(in_handle, [images], offset=64)
    with module.InferenceServerClient(url) as c:
        plain = c.infer(ONNX, [_input(module, images)]).as_numpy("logits")
        c.unregister_system_shared_memory()
        c.register_system_shared_memory(f"in-{transport}", in_key, 64 + images.nbytes)
        c.register_system_shared_memory(f"out-{transport}", out_key, 160)
        status = c.get_system_shared_memory_status(as_json=True) if transport == "grpc" else \
            c.get_system_shared_memory_status()
        listed = status["regions"] if transport == "grpc" else {r["name"]: r for r in status}
        assert {f"in-{transport}", f"out-{transport}"} <= set(listed)
        item = module.InferInput("image", list(images.shape), "FP32")
        item.set_shared_memory(f"in-{transport}", images.nbytes, offset=64)
        out = module.InferRequestedOutput("logits") if transport == "grpc" else \
            module.InferRequestedOutput("logits", binary_data=True)
        out.set_shared_memory(f"out-{transport}", 160)
        result = c.infer(ONNX, [item], outputs=[out])
        described = result.get_output("logits")
        shape = [int(d) for d in (described.shape if transport == "grpc" else described["shape"])]
        got = shm.get_contents_as_numpy(out_handle, np.float32, shape)
        np.testing.assert_array_equal(got, plain)

        bad = module.InferInput("image", list(images.shape), "FP32")  # past the end of its region
        bad.set_shared_memory(f"in-{transport}", images.nbytes, offset=128)
        with pytest.raises(InferenceServerException) as info:
            c.infer(ONNX, [bad])
        assert "runs past the end of the region" in info.value.message()
        assert f"in-{transport}" not in info.value.message()  # region names are never echoed
        c.unregister_system_shared_memory(f"in-{transport}")
        with pytest.raises(InferenceServerException) as info:
            c.infer(ONNX, [item])
        assert "unknown shared memory region" in info.value.message()
        assert f"in-{transport}" not in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            c.register_system_shared_memory("escape", "/../../etc/passwd", 16)
        c.unregister_system_shared_memory()
        assert c.infer(ONNX, [_input(module, images)]).as_numpy("logits").shape == plain.shape  # still serving


def _input(module, array: np.ndarray):
    item = module.InferInput("image", list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return item
