"""Where the protocol's reference behaviour (Triton's) decides: `"outputs": []` asks for
every output, raw binary requests, outputs JSON cannot carry, `GET .../config` agreeing
with the artifact's own `config.pbtxt`, and the repository index listing every artifact.
"""

from __future__ import annotations

import json
import os

import httpx
import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

pytest.register_assert_rewrite("serve_support")
from serve_support import ONNX, RAGGED, SCALED  # noqa: E402

from zoo.serve.protocol import decode_response  # noqa: E402

pytest_plugins = ["serve_support"]
X = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 1, 8, 8)  # the digits' image range


def infer(server, doc: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{ONNX}/infer", json=doc, timeout=30)


def image(x: np.ndarray = X) -> dict:
    return {"name": "image", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}


def test_empty_outputs_list_means_every_output(server):
    everything = infer(server, {"inputs": [image()]}).json()["outputs"]
    assert infer(server, {"inputs": [image()], "outputs": []}).json()["outputs"] == everything
    assert [o["name"] for o in everything] == ["logits"]


def test_raw_binary_request_is_the_one_input(server):
    """Inference-Header-Content-Length: 0: the body is the tensor, batch 1 (Triton's rule)."""
    response = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=X.tobytes(),
                          headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 200, response.text
    head, outputs = decode_response(response.content, response.headers["Inference-Header-Content-Length"])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 40  # binary, as Triton answers raw requests
    want = infer(server, {"inputs": [image()]}).json()["outputs"][0]
    np.testing.assert_array_equal(outputs["logits"].reshape(-1), np.float32(want["data"]))
    zeros = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=X.tobytes(),
                       headers={"Inference-Header-Content-Length": "00"})  # any spelling of zero
    assert zeros.status_code == 200 and zeros.content == response.content


def test_outputs_json_cannot_carry_are_refused_unless_binary(server):
    x = np.array([[np.nan, 1, 2, 3]], np.float32)  # NaN in, NaN out (binary input: JSON has no NaN either)
    scale = np.ones(1, np.float32)  # scaled.test: an input without a range, which refuses no NaN
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters":
                                   {"binary_data_size": 16}},
                                  {"name": "scale", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    url = f"{server.url}/v2/models/{SCALED}/infer"
    as_json = httpx.post(url, content=head + x.tobytes(), headers={"Inference-Header-Content-Length": str(len(head))})
    assert as_json.status_code == 400 and "ask for it as binary data" in as_json.json()["error"]
    binary_head = head[:-1] + b', "parameters": {"binary_data_output": true}}'
    as_binary = httpx.post(url, content=binary_head + x.tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(binary_head))})
    assert as_binary.status_code == 200, as_binary.text
    length = int(as_binary.headers["Inference-Header-Content-Length"])
    assert np.isnan(np.frombuffer(as_binary.content[length:], np.float32)).any() and scale.all()


#: the backend Triton fills in for a config.pbtxt that names only a platform (its AutoCompleteBackendFields)
BACKEND_OF = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt"}
#: the model file it fills in for one that names none
FILE_OF = {"python": "model.py", "onnxruntime": "model.onnx", "tensorrt": "model.plan", "openvino": "model.xml"}


def test_config_endpoint_agrees_with_config_pbtxt(server, serve_repo):
    """Inputs and outputs (dims, reshape) as Triton reads them from the artifact's file, with
    the defaults tritonserver 2.51 fills in (its NormalizeModelConfig, compared side by side:
    tests/test_triton_server.py): the backend of a platform, the model file, `version_policy`,
    each instance group's name, the preferred batch size a dynamic batcher without one uses.
    Over HTTP every field is written, at its default where unset, as Triton writes them (a
    client reading `input[0]["format"]` finds it); over gRPC the same message."""
    import tritonclient.grpc as triton_grpc

    client = triton_grpc.InferenceServerClient(server.grpc_url)
    for row in httpx.post(f"{server.url}/v2/repository/index").json():
        if row["state"] != "READY":
            continue
        name = row["name"]
        doc = httpx.get(f"{server.url}/v2/models/{name}/config").json()
        served = json_format.ParseDict(doc, model_config_pb2.ModelConfig(), ignore_unknown_fields=False)
        assert served == client.get_model_config(name).config, name
        written = text_format.Parse((serve_repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert list(served.input) == list(written.input), name
        assert list(served.output) == list(written.output), name
        # the runtime the file names: a platform, or `backend: "python"` for the Python-backend form
        backend = written.backend or BACKEND_OF[written.platform]
        assert (served.platform, served.backend, served.default_model_filename) == \
            (written.platform, backend, written.default_model_filename or FILE_OF[backend]), name
        assert served.version_policy.latest.num_versions == 1, name
        assert [g.name for g in served.instance_group] == [f"{name}_{k}" for k in range(len(served.instance_group))]
        if written.HasField("dynamic_batching"):
            assert list(served.dynamic_batching.preferred_batch_size) == \
                (list(written.dynamic_batching.preferred_batch_size) or [written.max_batch_size]), name
        everything = json_format.MessageToDict(served, preserving_proto_field_name=True,
                                               always_print_fields_with_no_presence=True)
        assert set(doc) == set(everything) and doc["input"][0]["format"] == "FORMAT_NONE", name
        assert isinstance(doc["input"][0]["dims"][0], int) and "optimization" not in doc, name
        meta = httpx.get(f"{server.url}/v2/models/{name}").json()
        assert meta["platform"] == (written.platform or written.backend), name
    client.close()
    assert any(text_format.Parse((serve_repo / n / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
               .backend == "python" for n in os.listdir(serve_repo)), "no Python-backend artifact was compared"


def test_repository_index_lists_every_artifact_and_honours_ready(server, serve_repo):
    url = f"{server.url}/v2/repository/index"
    rows = httpx.post(url).json()
    on_disk = sorted(p.name for p in serve_repo.iterdir() if (p / "zoo.json").is_file())
    assert [r["name"] for r in rows] == on_disk
    assert all(set(r) >= {"name", "state"} and ("reason" in r) == (r["state"] != "READY") for r in rows)
    ready = httpx.post(url, json={"ready": True}).json()
    assert [r["name"] for r in ready] == [r["name"] for r in rows if r["state"] == "READY"]
    assert RAGGED in {r["name"] for r in ready}
    assert httpx.post(url, json={"ready": "yes"}).status_code == 400
