"""`zoo serve` through KServe's own Python clients, as a KServe user calls them:
`kserve.InferenceRESTClient` (v2 REST over httpx) and `kserve.InferenceGRPCClient`
(grpc.aio over KServe's `grpc_predict_v2.proto`, whose `inference.GRPCInferenceService`
is the subset of Triton's that the server implements), with `kserve.InferRequest` and
`kserve.InferInput` built by `set_data_from_numpy` (binary and JSON/typed contents).
KServe ships no synchronous variants of these clients; metadata, which the clients do
not ask for, goes through the `GRPCInferenceServiceStub` generated from KServe's proto.

Every answer is checked against something the server did not compute: the artifact's
own runner (`zoo.load`), the model's own preprocessing and postprocessing, or, for
errors, the HTTP front end's JSON answer to the same request sent as plain JSON: the
REST client raises `httpx.HTTPStatusError` whose message starts with that JSON's
`error`, the gRPC client raises `grpc.aio.AioRpcError` with the code Triton gives that
kind of error and the very same message.

The kserve package registers KServe's `inference.*` protobuf messages under the same
names as Triton's (tritonclient.grpc), and one Python process cannot import both: so
this file is not collected with the others (its name does not start with `test_`);
tests/test_serve_kserve_clients.py runs it with pytest in a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re

import grpc
import httpx
import numpy as np
import pytest

import zoo

pytestmark = pytest.mark.skipif(importlib.util.find_spec("kserve") is None, reason="kserve is not installed")

pytest.register_assert_rewrite("serve_support")
from serve_support import (  # noqa: E402
    BASE,
    ONNX,
    RAGGED,
    ServerProcess,
    assert_close,
    export,
    plugin_registered,
)

#: the HTTP status of a kind of error -> the gRPC code Triton gives it
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
         503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
PIXELS = np.linspace(0.0, 1.0, 64, dtype=np.float32).reshape(1, 1, 8, 8)
TOKENS = {"tokens": np.array([[5, 7, 9, 0], [3, 4, 0, 0]], np.int64),
          "mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int64)}
TEXTS = [b"a wonderful film", b"ok", "\u00e9t\u00e9".encode()]


def kserve_modules():
    import kserve
    from kserve.protocol.grpc import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc

    return kserve, grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc


@pytest.fixture(scope="module")
def serve_repo(tmp_path_factory):
    """Only the two artifacts these tests need (of `serve_support`'s repository, whose
    every domain model would take most of the file's time to export)."""
    root = tmp_path_factory.mktemp("kserve") / "exports"
    with plugin_registered():
        for name in (ONNX, RAGGED):
            export(*BASE[name], root)
    return root


@pytest.fixture(scope="module")
def server(serve_repo, tmp_path_factory):
    """`zoo serve` as `serve_support`'s shared server runs it: a 1 MiB request limit and a
    5 ms queue delay."""
    proc = ServerProcess(serve_repo, "--max-request-size", str(1 << 20), "--max-queue-delay-ms", "5",
                         log=tmp_path_factory.mktemp("kserve-server") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def runners(serve_repo):
    with plugin_registered():
        return {name: (zoo.Artifact.open(serve_repo / name).spec(), zoo.load(serve_repo / name, threads=1))
                for name in (ONNX, RAGGED)}


@pytest.fixture(scope="module")
def ragged_spec():
    """The ragged test model's registered spec: its preprocessing and postprocessing."""
    with plugin_registered():
        return zoo.get_model("ragged.test")


def infer_inputs(arrays: dict[str, np.ndarray], binary: bool) -> list:
    kserve = kserve_modules()[0]
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else {"float32": "FP32", "int64": "INT64"}[array.dtype.name]
        item = kserve.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    return inputs


def request(model: str, arrays: dict[str, np.ndarray], binary: bool = True, **kwargs):
    return kserve_modules()[0].InferRequest(model, infer_inputs(arrays, binary), **kwargs)


async def call(server, via: str, infer_request):
    """The request through one KServe client, made on this event loop: ("rest" | "grpc")."""
    kserve = kserve_modules()[0]
    if via == "rest":
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", retries=0, timeout=60))
        try:
            return await client.infer(server.url, infer_request, model_name=infer_request.model_name)
        finally:
            await client.close()
    async with kserve.InferenceGRPCClient(server.grpc_url, retries=0, timeout=60) as client:
        return await client.infer(infer_request)


def infer(server, via: str, infer_request):
    return asyncio.run(call(server, via, infer_request))


def outputs_of(response) -> dict[str, np.ndarray]:
    return {out.name: out.as_numpy() for out in response.outputs}


def http_json_error(server, model: str, body: dict) -> tuple[int, str]:
    """The HTTP front end's status and `error` for the request as plain JSON."""
    answer = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)
    assert answer.status_code >= 400 and answer.headers["content-type"] == "application/json", answer.text
    return answer.status_code, answer.json()["error"]


def json_body(arrays: dict[str, np.ndarray], **extra) -> dict:
    inputs = [{"name": k, "datatype": "BYTES" if v.dtype == object else
               {"float32": "FP32", "int64": "INT64"}[v.dtype.name], "shape": list(v.shape),
               "data": [x.decode() if isinstance(x, bytes) else x for x in v.ravel().tolist()]}
              for k, v in arrays.items()]
    return {"inputs": inputs, **extra}


def assert_refused_as_over_http(server, via: str, infer_request, body: dict) -> None:
    status, message = http_json_error(server, infer_request.model_name, body)
    if via == "rest":
        with pytest.raises(httpx.HTTPStatusError) as info:
            infer(server, via, infer_request)
        assert info.value.response.status_code == status
        # KServe's client puts the JSON `error` first, then the status line and URL; it gives each
        # request an id of its own (a UUID), which an error Triton's core words names
        # (`[request id: ID] `, errors.InputMismatchError): the plain JSON, without one, `<id_unknown>`
        unnamed = message.removeprefix("[request id: <id_unknown>] ")
        got = str(info.value)
        if unnamed != message:
            assert re.match(r"\[request id: [0-9a-f-]{36}\] ", got), got
            got = got.split("] ", 1)[1]
        assert got.startswith(f"{unnamed}, '{status} ")
    else:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            infer(server, via, infer_request)
        assert info.value.code() == CODES[status] and info.value.details() == message
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


# ---------------------------------------------------------------- health and metadata


def test_health_and_model_readiness(server):
    kserve = kserve_modules()[0]

    async def check():
        rest = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", retries=0))
        try:
            assert await rest.is_server_live(server.url) is True
            assert await rest.is_server_ready(server.url) is True
            assert await rest.is_model_ready(server.url, ONNX) is True
            assert await rest.is_model_ready(server.url, "ragged.test") is True  # the bare name, one artifact
            assert await rest.is_model_ready(server.url, "no-such-model") is False
        finally:
            await rest.close()
        async with kserve.InferenceGRPCClient(server.grpc_url, retries=0) as g:
            assert await g.is_server_live() is True and await g.is_server_ready() is True
            assert await g.is_model_ready(ONNX) is True and await g.is_model_ready("ragged.test") is True
            assert await g.is_model_ready("no-such-model") is False  # as Triton: not ready, not an error

    asyncio.run(check())


def test_metadata_through_kserves_stub_equals_http(server):
    _, pb, pb_grpc = kserve_modules()
    http_server = httpx.get(f"{server.url}/v2", timeout=10).json()
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = stub.ServerMetadata(pb.ServerMetadataRequest())
        assert (meta.name, meta.version, list(meta.extensions)) == \
            (http_server["name"], http_server["version"], http_server["extensions"])
        for name in (ONNX, RAGGED):
            model = stub.ModelMetadata(pb.ModelMetadataRequest(name=name))
            http_model = httpx.get(f"{server.url}/v2/models/{name}", timeout=10).json()
            assert (model.name, list(model.versions), model.platform) == \
                (http_model["name"], http_model["versions"], http_model["platform"])
            for got, want in ((model.inputs, http_model["inputs"]), (model.outputs, http_model["outputs"])):
                assert [(t.name, t.datatype, list(t.shape)) for t in got] == \
                    [(t["name"], t["datatype"], t["shape"]) for t in want]
        assert stub.ModelReady(pb.ModelReadyRequest(name=ONNX, version="1")).ready
        assert not stub.ModelReady(pb.ModelReadyRequest(name=ONNX, version="2")).ready
        for req, url in ((pb.ModelMetadataRequest(name="no-such-model"), "/v2/models/no-such-model"),
                         (pb.ModelMetadataRequest(name=ONNX, version="3"), f"/v2/models/{ONNX}/versions/3")):
            http = httpx.get(server.url + url, timeout=10)
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelMetadata(req)
            assert http.status_code == 404 and info.value.code() == grpc.StatusCode.NOT_FOUND
            assert info.value.details() == http.json()["error"]


# ---------------------------------------------------------------- inference


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("via", ["rest", "grpc"])
@pytest.mark.parametrize("name", [ONNX, RAGGED], ids=["fp32", "int64"])
def test_tensors_equal_the_artifacts_own_runner(server, runners, name, via, binary):
    spec, runner = runners[name]
    arrays = {"image": np.concatenate([PIXELS, PIXELS[:, :, ::-1]])} if name == ONNX else TOKENS
    response = infer(server, via, request(name, arrays, binary, request_id=f"{via}-{binary}"))
    assert response.model_name == name and response.id == f"{via}-{binary}"
    got, want = outputs_of(response), runner(arrays)
    assert set(got) == set(want)
    tol = spec.tolerance("fp32")
    for key, value in want.items():
        assert got[key].dtype == np.float32 and got[key].shape == value.shape
        np.testing.assert_allclose(got[key], value, atol=tol.atol, rtol=tol.rtol)


def test_input_data_given_directly_as_array_or_list(server, runners):
    """`InferInput(..., data=ndarray)` (the clients call `set_data_from_numpy` themselves:
    JSON over REST, raw over gRPC) and `data=list` (JSON, typed `fp32_contents`)."""
    kserve = kserve_modules()[0]
    spec, runner = runners[ONNX]
    want = runner({"image": PIXELS})["logits"]
    tol = spec.tolerance("fp32")
    for data in (PIXELS, PIXELS.ravel().tolist()):
        for via in ("rest", "grpc"):
            req = kserve.InferRequest(ONNX, [kserve.InferInput("image", [1, 1, 8, 8], "FP32", data=data)])
            got = outputs_of(infer(server, via, req))["logits"]
            np.testing.assert_allclose(got, want, atol=tol.atol, rtol=tol.rtol)


def test_binary_and_json_inputs_mixed_over_rest(server, runners):
    spec, runner = runners[RAGGED]
    req = request(RAGGED, {"tokens": TOKENS["tokens"]}, True)
    req.inputs += infer_inputs({"mask": TOKENS["mask"]}, False)
    got, want = outputs_of(infer(server, "rest", req)), runner(TOKENS)
    tol = spec.tolerance("fp32")
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("via", ["rest", "grpc"])
def test_bytes_text_items_equal_the_models_own_pipeline(server, runners, ragged_spec, via, binary):
    spec, runner = runners[RAGGED]
    items = np.array(TEXTS, dtype=object)
    response = infer(server, via, request(RAGGED, {"text": items}, binary))
    [out] = response.outputs
    assert (out.name, out.datatype, out.shape) == ("result", "BYTES", [len(TEXTS)])
    got = [json.loads(x) for x in out.as_numpy()]
    want = ragged_spec.postprocess(runner(ragged_spec.preprocess(TEXTS)))
    tol = spec.tolerance("fp32")
    assert_close(got, want, max(tol.atol, 1e-5), max(tol.rtol, 1e-5))


@pytest.mark.parametrize("binary_data", [True, False, None])
@pytest.mark.parametrize("via", ["rest", "grpc"])
def test_requested_outputs(server, runners, via, binary_data):
    kserve = kserve_modules()[0]
    from kserve.protocol.infer_type import RequestedOutput

    spec, runner = runners[RAGGED]
    parameters = None if binary_data is None else {"binary_data": binary_data}
    response = infer(server, via, request(RAGGED, TOKENS, request_outputs=[RequestedOutput("logits", parameters)]))
    assert isinstance(response, kserve.InferResponse) and [o.name for o in response.outputs] == ["logits"]
    tol = spec.tolerance("fp32")
    np.testing.assert_allclose(outputs_of(response)["logits"], runner(TOKENS)["logits"], atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("via", ["rest", "grpc"])
def test_request_parameters(server, runners, via):
    """`binary_data_output`, `timeout` and custom parameters (strings, integers, booleans:
    what `to_grpc_parameters` can carry) are accepted; the answer is the runner's."""
    spec, runner = runners[ONNX]
    want = runner({"image": PIXELS})["logits"]
    tol = spec.tolerance("fp32")
    for parameters in ({"binary_data_output": True}, {"timeout": 30_000_000},
                       {"customer": "acme", "n_best": 3, "trace": False}):
        got = outputs_of(infer(server, via, request(ONNX, {"image": PIXELS}, parameters=parameters)))["logits"]
        np.testing.assert_allclose(got, want, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("via", ["rest", "grpc"])
def test_classification_output_equals_http(server, runners, via):
    from kserve.protocol.infer_type import RequestedOutput

    response = infer(server, via, request(ONNX, {"image": PIXELS},
                                          request_outputs=[RequestedOutput("logits", {"classification": 3})]))
    [out] = response.outputs
    assert (out.name, out.datatype, out.shape) == ("logits", "BYTES", [1, 3])
    got = [x.decode() if isinstance(x, bytes) else x for x in out.as_numpy().ravel()]
    http = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", timeout=60, json=json_body(
        {"image": PIXELS}, outputs=[{"name": "logits", "parameters": {"classification": 3}}])).json()
    assert got == http["outputs"][0]["data"]
    top = np.argsort(-runners[ONNX][1]({"image": PIXELS})["logits"][0], kind="stable")[:3]
    assert [int(s.split(":")[1]) for s in got] == top.tolist()


# ---------------------------------------------------------------- errors

ERRORS = {
    "unknown model": ("no-such-model", {"image": PIXELS}, {}),
    "wrong shape": (ONNX, {"image": PIXELS.reshape(1, 1, 4, 16)}, {}),
    "wrong rank": (ONNX, {"image": PIXELS.reshape(1, 64)}, {}),
    "wrong datatype": (ONNX, {"image": (PIXELS * 10).astype(np.int64)}, {}),
    "unknown input": (ONNX, {"pixels": PIXELS}, {}),
    "missing input": (RAGGED, {"tokens": TOKENS["tokens"]}, {}),
    "batch too large": (ONNX, {"image": np.zeros((65, 1, 8, 8), np.float32)}, {}),
    "unoffered extension": (ONNX, {"image": PIXELS}, {"parameters": {"sequence_id": 7}}),
    "timed out": (ONNX, {"image": PIXELS}, {"parameters": {"timeout": 1}}),
}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("via", ["rest", "grpc"])
@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_as_the_http_json_answer(server, case, via, binary):
    model, arrays, extra = ERRORS[case]
    infer_request = request(model, arrays, binary, parameters=extra.get("parameters"))
    assert_refused_as_over_http(server, via, infer_request, json_body(arrays, **extra))


@pytest.mark.parametrize("via", ["rest", "grpc"])
def test_text_that_is_not_utf8_as_the_http_answer(server, via):
    """Binary only: KServe's client refuses to put bytes that are not UTF-8 in JSON."""
    from zoo.serve.protocol import encode_request

    arrays = {"text": np.array([b"ok", b"\xff\xfe"], dtype=object)}
    body, headers = encode_request(arrays, binary=True)
    http = httpx.post(f"{server.url}/v2/models/{RAGGED}/infer", content=body, headers=headers, timeout=60)
    assert http.status_code == 400
    message = http.json()["error"]
    assert "item 2" in message  # items are counted from 1
    if via == "rest":
        with pytest.raises(httpx.HTTPStatusError) as info:
            infer(server, via, request(RAGGED, arrays))
        assert info.value.response.status_code == 400 and str(info.value).startswith(f"{message}, '400 ")
    else:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            infer(server, via, request(RAGGED, arrays))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details() == message


def test_unknown_requested_output_as_the_http_json_answer(server):
    from kserve.protocol.infer_type import RequestedOutput

    body = json_body(TOKENS, outputs=[{"name": "nope"}])
    for via in ("rest", "grpc"):
        req = request(RAGGED, TOKENS, request_outputs=[RequestedOutput("nope")])
        assert_refused_as_over_http(server, via, req, body)


def test_raw_and_typed_contents_mixed_over_grpc_are_refused(server):
    """KServe's gRPC client puts binary inputs in `raw_input_contents` and the others in
    typed `contents`; the protocol forbids mixing them ("If this field is specified then
    InferInputTensor::contents must not be specified for any input tensor"), and Triton
    refuses it too, so the server answers INVALID_ARGUMENT and stays live."""
    req = request(RAGGED, {"tokens": TOKENS["tokens"]}, True)
    req.inputs += infer_inputs({"mask": TOKENS["mask"]}, False)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        infer(server, "grpc", req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in info.value.details()
    assert httpx.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200


def test_empty_binary_tensor_over_rest_answered_as_over_grpc(server):
    """An empty tensor through KServe's REST client: `set_data_from_numpy` gives b"" raw data,
    which `to_rest` (testing `if infer_input._raw_data`) sends as `"data": null` alongside
    `binary_data_size: 0`. The answer should be the one gRPC and plain JSON give: the batch
    axis is 0."""
    arrays = {"image": np.zeros((0, 1, 8, 8), np.float32)}
    assert_refused_as_over_http(server, "grpc", request(ONNX, arrays, True), json_body(arrays))
    assert_refused_as_over_http(server, "rest", request(ONNX, arrays, True), json_body(arrays))
