"""Outputs that hold nothing: tests/user_plugins/selection.py keeps the positions of its
input above a threshold (an axis only its outputs have, `AxisRange(0, ...)`, as the boxes
a detector keeps). Checked and exported by the user's commands, then run where it keeps
nothing and where it keeps everything, by each artifact's own runner and by a real `zoo
serve` through Triton's HTTP and gRPC clients, without the plugin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import zoo
from zoo import registry
from zoo.check import check_model

from serve_support import ServerProcess

PLUGIN = str(Path(__file__).parent / "user_plugins" / "selection.py")
MODEL = "peaks.threshold"
BACKENDS = ("onnxruntime", "torch")
#: nothing above the threshold; one position per row; every position of the largest batch
INPUTS = {"none": np.zeros((3, 8), np.float32),
          "one": np.where(np.eye(4, 8) > 0, 0.9, 0.1).astype(np.float32),
          "all": np.full((16, 8), 0.75, np.float32)}
KEPT = {"none": 0, "one": 4, "all": 128}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """The plugin loaded in this process as `--plugin` loads it, checked as `zoo check`
    checks it, and exported; unloaded after, so no other test module sees the model."""
    root = tmp_path_factory.mktemp("selection") / "exports"
    registry.load_plugin_file(PLUGIN)
    try:
        report, _ = check_model(zoo.get_model(MODEL), random_init=True)
        assert report.passed, report
        for backend in BACKENDS:
            zoo.export(MODEL, backend, repository=root, random_init=True)
    finally:
        registry.unload_plugin_file(PLUGIN)
    return root


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", INPUTS)
def test_each_runner_answers_empty_and_full_selections(repository, backend, case):
    x = INPUTS[case]
    out = zoo.load(repository / f"{MODEL}.{backend}.fp32")({"x": x})
    assert out["kept"].dtype == np.int64 and out["kept"].shape == (KEPT[case], 2)
    np.testing.assert_array_equal(out["kept"], np.argwhere(x > 0.5))
    assert out["scores"].dtype == np.float32 and out["scores"].shape == (KEPT[case],)
    assert ((0 < out["scores"]) & (out["scores"] < 1)).all()


def test_both_engines_score_the_kept_positions_alike(repository):
    """Both artifacts hold the same random-init weights (exports seed them): the scores
    of what either keeps are one computation."""
    runners = [zoo.load(repository / f"{MODEL}.{backend}.fp32") for backend in BACKENDS]
    for case in ("one", "all"):
        scores = [runner({"x": INPUTS[case]})["scores"] for runner in runners]
        assert len(set(scores[0].round(3).tolist())) > 1  # not one constant
        np.testing.assert_allclose(scores[0], scores[1], atol=1e-5)


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    proc = ServerProcess(repository, log=tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


@pytest.mark.parametrize("transport", ["http-binary", "http-json", "grpc"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_answers_empty_outputs_with_their_shape(server, transport, backend):
    client_module = grpcclient if transport == "grpc" else httpclient
    url = server.grpc_url if transport == "grpc" else server.url.removeprefix("http://")
    client = client_module.InferenceServerClient(url)
    try:
        for case in ("none", "one"):
            x = INPUTS[case]
            item = client_module.InferInput("x", list(x.shape), "FP32")
            if transport == "grpc":
                item.set_data_from_numpy(x)
            else:
                item.set_data_from_numpy(x, binary_data=transport == "http-binary")
            result = client.infer(f"{MODEL}.{backend}.fp32", [item])
            kept, scores = result.as_numpy("kept"), result.as_numpy("scores")
            assert kept.dtype == np.int64 and kept.shape == (KEPT[case], 2), (case, kept.shape)
            assert scores.dtype == np.float32 and scores.shape == (KEPT[case],), (case, scores.shape)
            np.testing.assert_array_equal(kept, np.argwhere(x > 0.5))
    finally:
        client.close()
