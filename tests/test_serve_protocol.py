"""`zoo serve` speaks the Open Inference Protocol as Triton does: NVIDIA's own HTTP
client (`tritonclient[http]`) checks health, metadata and runs inference with JSON and
with binary tensors against a real server process, and every result equals the
artifact's own runner. Domain-native BYTES inputs are checked for one model per domain.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import zoo
from zoo.client import Client
from zoo.errors import InputError
from zoo.serve.protocol import HEADER_LENGTH, decode_response, encode_request

pytest.register_assert_rewrite("serve_support")
from serve_support import (  # noqa: E402
    DIGITS,
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
TENSOR_MODELS = [ONNX, f"{DIGITS}.torch.fp32", RAGGED]
_runners: dict = {}


@pytest.fixture(scope="module")
def client(server):
    c = triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


def local(repo, name):
    """The artifact's own spec and runner, loaded in this process."""
    if name not in _runners:
        with plugin_registered():
            art = zoo.Artifact.open(repo / name)
            _runners[name] = (art.spec(), art.load(threads=1))
    return _runners[name]


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "zoo" and "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("name", TENSOR_MODELS)
def test_model_metadata(client, serve_repo, name):
    spec, _ = local(serve_repo, name)
    art = zoo.Artifact.open(serve_repo / name)
    meta = client.get_model_metadata(name)
    assert meta["name"] == name and meta["versions"] == ["1"]
    datatypes = {"float32": "FP32", "int64": "INT64"}
    assert meta["inputs"] == [{"name": t.name, "datatype": datatypes[t.dtype],
                               "shape": [d if isinstance(d, int) else -1 for d in t.shape]} for t in spec.inputs]
    assert [o["name"] for o in meta["outputs"]] == [t.name for t in spec.outputs]
    info = meta["zoo"]
    assert (info["backend"], info["precision"]) == (art.backend, art.precision)
    assert info["parity"] == art.manifest["parity"] and info["parity"]["passed"]
    assert client.get_model_metadata(name, model_version="1") == meta
    assert client.is_model_ready(name) and client.is_model_ready(name, "1")
    config = client.get_model_config(name)
    assert config["max_batch_size"] == spec.axes["batch"].max
    assert [i["name"] for i in config["input"]] == [t.name for t in spec.inputs]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("name", TENSOR_MODELS)
def test_infer_equals_the_runner(client, serve_repo, name, binary):
    spec, runner = local(serve_repo, name)
    inputs = spec.sample(3, np.random.default_rng(7))
    request = []
    for t in spec.inputs:
        tensor = triton_http.InferInput(t.name, list(inputs[t.name].shape), "FP32" if t.dtype == "float32" else "INT64")
        tensor.set_data_from_numpy(inputs[t.name], binary_data=binary)
        request.append(tensor)
    outputs = [triton_http.InferRequestedOutput(t.name, binary_data=binary) for t in spec.outputs]
    result = client.infer(name, request, outputs=outputs, request_id="req-7")
    assert result.get_response()["id"] == "req-7"
    want = runner(inputs)
    tol = spec.tolerance("fp32")
    for t in spec.outputs:
        np.testing.assert_allclose(result.as_numpy(t.name), want[t.name], atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("domain", domain_params())
def test_domain_native_inputs(client, serve_repo, domain):
    model = DOMAIN_MODELS[domain]
    name = artifact_name(model)
    spec, runner = local(serve_repo, name)
    items = sample_items(spec, 3)
    tensor = triton_http.InferInput(spec.raw_kind, [len(items)], "BYTES")
    tensor.set_data_from_numpy(np.array(items, dtype=object), binary_data=True)
    result = client.infer(name, [tensor], outputs=[triton_http.InferRequestedOutput("result", binary_data=True)])
    got = [json.loads(x) for x in result.as_numpy("result")]
    want = json.loads(json.dumps(zoo.predict(spec, runner, items)))
    tol = spec.tolerance("fp32")
    assert_close(got, want, tol.atol * 10, tol.rtol * 10)
    native = client.get_model_metadata(name)["zoo"]["domain_native"]
    assert native["inputs"][0] == {"name": spec.raw_kind, "datatype": "BYTES", "shape": [-1]}


def test_ragged_text_through_json_bytes(server, serve_repo):
    """BYTES as JSON strings; per-token outputs come back cut to each request's own length."""
    spec, runner = local(serve_repo, RAGGED)
    body, headers = encode_request({"text": ["hello", "hi there, world"]}, binary=False)
    response = httpx.post(f"{server.url}/v2/models/ragged.test/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    _, outputs = decode_response(response.content, response.headers.get(HEADER_LENGTH))
    got = [json.loads(x) for x in outputs["result"]]
    assert_close(got, zoo.predict(spec, runner, [b"hello", b"hi there, world"]), 1e-5, 1e-5)


def test_requested_outputs_binary_and_json_mixed(server, serve_repo):
    spec, runner = local(serve_repo, RAGGED)
    inputs = spec.sample(2, np.random.default_rng(3))
    body, headers = encode_request(inputs, binary=True)
    doc_end = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:doc_end])
    doc["outputs"] = [{"name": "hidden", "parameters": {"binary_data": True}}, {"name": "logits"}]
    doc.pop("parameters", None)
    head = json.dumps(doc).encode()
    response = httpx.post(f"{server.url}/v2/models/{RAGGED}/versions/1/infer", content=head + body[doc_end:],
                          headers={**headers, HEADER_LENGTH: str(len(head))})
    assert response.status_code == 200, response.text
    meta, outputs = decode_response(response.content, response.headers.get(HEADER_LENGTH))
    assert [o["name"] for o in meta["outputs"]] == ["hidden", "logits"]
    assert "data" in meta["outputs"][1] and "binary_data_size" in meta["outputs"][0]["parameters"]
    want = runner(inputs)
    for name in ("hidden", "logits"):
        np.testing.assert_allclose(outputs[name], want[name], atol=1e-5, rtol=1e-5)


def test_an_empty_id_is_left_out_of_the_answer_and_statistics_have_response_stats(server):
    """As Triton 2.51 answers: an empty request `id` is not echoed, and each model's
    statistics carry `response_stats` (per-response counts of decoupled models: none here)."""
    image = {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}
    for request_id, answered in (("", None), ("r-1", "r-1")):
        response = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", json={"id": request_id, "inputs": [image]})
        assert response.status_code == 200 and response.json().get("id") == answered, response.text
    (stats,) = httpx.get(f"{server.url}/v2/models/{ONNX}/stats").json()["model_stats"]
    assert stats["response_stats"] == {}


def test_bare_model_name_is_an_alias_only_when_unambiguous(server):
    response = httpx.get(f"{server.url}/v2/models/ragged.test")
    assert response.status_code == 200 and response.json()["name"] == RAGGED
    response = httpx.get(f"{server.url}/v2/models/{DIGITS}")  # served through onnxruntime and torch
    assert response.status_code == 404 and "several artifacts" in response.json()["error"]


def test_metrics(server, client, serve_repo):
    """Self-contained: the request it counts is its own (a model's samples appear in
    /metrics only once it has had a request, which no other test need have sent)."""
    sample = f'zoo_inference_requests_total{{model="{ONNX}",version="1"}}'

    def requests(text: str) -> float:
        found = re.search(re.escape(sample) + r" ([0-9.e+]+)", text)
        return float(found[1]) if found else 0.0

    before = requests(httpx.get(f"{server.url}/metrics").text)
    spec, _ = local(serve_repo, ONNX)
    inputs, request = spec.sample(1, np.random.default_rng(0)), []
    for t in spec.inputs:
        tensor = triton_http.InferInput(t.name, list(inputs[t.name].shape), "FP32" if t.dtype == "float32" else "INT64")
        tensor.set_data_from_numpy(inputs[t.name])
        request.append(tensor)
    client.infer(ONNX, request)
    text = httpx.get(f"{server.url}/metrics").text
    for family in ("zoo_inference_requests_total", "zoo_inference_request_duration_seconds_bucket",
                   "zoo_inference_queue_duration_seconds_sum", "zoo_inference_compute_duration_seconds_count",
                   "zoo_inference_batch_size_bucket", "zoo_http_responses_total", "zoo_model_ready"):
        assert family in text
    assert sample in text and requests(text) - before == 1


def test_python_client_and_predict_cli(server, serve_repo):
    spec, runner = local(serve_repo, RAGGED)
    want = zoo.predict(spec, runner, [b"good movie", b"bad"])
    with Client(server.url) as c:
        assert c.live() and c.ready() and c.raw_kind(RAGGED) == "text"
        assert_close(c.predict(RAGGED, ["good movie", "bad"]), want, 1e-5, 1e-5)
        inputs = spec.sample(2, np.random.default_rng(0))
        np.testing.assert_allclose(c.infer(RAGGED, inputs)["logits"], runner(inputs)["logits"], atol=1e-5)
    cli = subprocess.run([sys.executable, "-m", "zoo", "predict", RAGGED, "good movie", "bad", "--url", server.url,
                          "--json"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert_close(json.loads(cli.stdout)["results"], want, 1e-5, 1e-5)


def test_the_python_client_sends_more_items_than_a_request_may_carry_in_requests_it_admits(server, serve_repo):
    """`zoo predict --url` with more items than the served batch: as many requests as
    needed (metadata's `max_items`), the results in order, equal to the local path's; an
    error in a later request names the input it came from."""
    spec, runner = local(serve_repo, RAGGED)
    with Client(server.url) as c:
        limit = c.metadata(RAGGED)["zoo"]["domain_native"]["max_items"]
        assert limit == spec.axes["batch"].max
        items = [f"{'good' if k % 2 else 'bad'} {k}" for k in range(2 * limit + 3)]  # 2 to 16 bytes each
        assert_close(c.predict(RAGGED, items), zoo.predict(spec, runner, [x.encode() for x in items]), 1e-5, 1e-5)
        bad = [*items[:limit + 1], b"\xff"]
        with pytest.raises(InputError, match=rf"text item 2 is not valid UTF-8 \(among inputs {limit + 1} to "
                                             rf"{limit + 2} of {limit + 2}: item 1 is input {limit + 1}\)"):
            c.predict(RAGGED, bad)


TRITON_PLATFORMS = {"onnxruntime_onnx", "tensorrt_plan", "pytorch_libtorch", "tensorflow_savedmodel",
                    "tensorflow_graphdef", "ensemble"}
TRITON_BACKENDS = {"onnxruntime", "tensorrt", "pytorch", "python", "openvino", "tensorflow"}


def test_repository_is_a_triton_repository(serve_repo):
    """Every config.pbtxt parses as Triton's ModelConfig and names a Triton platform or backend."""
    configs = sorted(serve_repo.glob("*/config.pbtxt"))
    assert len(configs) >= 3
    for path in configs:
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        assert config.name == path.parent.name
        assert config.platform in TRITON_PLATFORMS or config.backend in TRITON_BACKENDS, path.parent.name
        # the engine's file, or the Python backend's model.py for an engine Triton has no backend for
        assert (path.parent / "1" / (config.default_model_filename or "model.py")).is_file()


@pytest.mark.parametrize(("datatype", "values"), [
    ("BF16", [3.4e38]),  # inside float32's range, past bfloat16's: infinity once rounded
    ("FP16", [1.0] * 70_000 + [1e6]),  # out of range in the numbers' second piece
], ids=["bf16-max", "second-piece"])
def test_a_json_number_outside_its_datatype_is_refused_wherever_it_is(datatype, values):
    from zoo.errors import InputError
    from zoo.serve.protocol import decode_request

    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [len(values)], "data": values}]})
    with pytest.raises(InputError, match=f"a value is outside the range of {datatype}"):
        decode_request(body.encode(), None)
