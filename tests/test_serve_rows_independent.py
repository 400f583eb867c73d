"""Dynamic batching merges concurrent requests along the batch axis: right only for a model
whose rows do not see each other. A user model that normalizes each row by the batch's mean
(in eval mode) answers a request merged with others differently than alone, so `zoo serve`
asks each model when it loads it (`zoo.padding.rows_independent`) and serves one that
fails without merging requests, and says why; a row-independent model keeps merging.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec
from zoo.padding import rows_independent
from zoo.train import module_fn


class BatchCentered(torch.nn.Module):
    """Each row centred on the batch's mean: a row's output depends on its companions."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x - x.mean(0, keepdim=True))


class Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


def _spec(name: str, build) -> ModelSpec:
    return ModelSpec(
        name=name, domain="tabular", task="regression", build=build,
        inputs=(TensorSpec("x", "float32", ("batch", 4)),), outputs=(TensorSpec("y", "float32", ("batch", 3)),),
        sample=lambda b, rng: {"x": rng.standard_normal((b, 4)).astype(np.float32)},
        axes={"batch": AxisRange(1, 4, 32)})


CENTERED, PLAIN = _spec("rows.centered", BatchCentered), _spec("rows.plain", Plain)


def test_a_model_whose_rows_see_each_other_is_found_dependent():
    torch.manual_seed(0)
    fn = module_fn(CENTERED.build().eval(), CENTERED)
    independent, why = rows_independent(CENTERED, fn, CENTERED.sample(4, np.random.default_rng(0)))
    assert not independent and why.startswith("a row's output y changes when batched with others by up to")
    assert rows_independent(PLAIN, module_fn(PLAIN.build().eval(), PLAIN),
                            PLAIN.sample(4, np.random.default_rng(0)))[0]


def test_duplicate_rows_do_not_hide_a_dependence():
    # rows drawn from a stored set of 2 are repeated (a, b, a, b): halves alike would each
    # have the whole batch's mean; a row alone does not
    torch.manual_seed(0)
    x = CENTERED.sample(2, np.random.default_rng(0))["x"]
    fn = module_fn(CENTERED.build().eval(), CENTERED)
    assert not rows_independent(CENTERED, fn, {"x": np.concatenate([x, x])})[0]


def _infer(client, name: str, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = client.post(f"/v2/models/{name}/infer", content=json.dumps(body))
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def test_concurrent_requests_to_a_row_dependent_model_each_get_what_they_get_alone(tmp_path, caplog):
    """8 concurrent 2-row requests: merged into one batch, each answer of the centred model
    was off by 1.7 to 8.9 from the request alone, and the server said nothing."""
    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app
    from zoo.serve.repository import ServeOptions

    repo = tmp_path / "exports"
    centered = zoo.export(CENTERED, "onnxruntime", repository=repo, random_init=True)
    plain = zoo.export(PLAIN, "onnxruntime", repository=repo, random_init=True)
    rng = np.random.default_rng(1)
    requests = [rng.standard_normal((2, 4)).astype(np.float32) * (1 + k) for k in range(8)]
    tol = CENTERED.tolerance("fp32")
    with caplog.at_level(logging.WARNING, logger="zoo.serve"), \
            TestClient(create_app(Settings(repo, ServeOptions(max_queue_delay_ms=200)))) as client:
        for art in (centered, plain):
            runner = zoo.load(art.path)
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda x, name=art.name: _infer(client, name, x), requests))
            for x, got in zip(requests, answers):
                np.testing.assert_allclose(got, runner({"x": x})["y"], atol=tol.atol, rtol=tol.rtol)
        batching = {name: client.get(f"/v2/models/{name}").json()["zoo"]["batching"]["dynamic_batching"]
                    for name in (centered.name, plain.name)}
        sizes = {name: {b["batch_size"] for b in client.get(f"/v2/models/{name}/stats").json()["model_stats"][0]
                        ["batch_stats"]} for name in (centered.name, plain.name)}
    assert (f"{centered.name}: rows are not independent (a row's output y changes when batched with others by up "
            f"to") in caplog.text
    assert "(its fp32 tolerance: atol=" in caplog.text
    assert "requests are not merged, each runs as its own batch" in caplog.text and plain.name not in caplog.text
    assert not batching[centered.name] and sizes[centered.name] == {2}  # each request its own batch
    assert batching[plain.name] and max(sizes[plain.name]) > 2  # the control keeps merging


def test_the_export_of_a_row_dependent_model_gives_triton_no_dynamic_batching(tmp_path, caplog):
    """The exported config.pbtxt had `dynamic_batching` for the centred model, so Triton (and
    KServe, which runs it) merged requests and each answer depended on the others in flight,
    while `zoo serve` ran them alone. The check warns, the config gives Triton no batch axis
    and no dynamic batching (it runs each request as sent) and says why, the manifest
    records it; a row-independent model keeps both."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    repo = tmp_path / "exports"
    with caplog.at_level(logging.WARNING, logger="zoo"):
        for backend in ("onnxruntime", "torch"):
            centered = zoo.export(CENTERED, backend, repository=repo, random_init=True)
            config = text_format.Parse((centered.path / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
            # no batch axis for Triton (auto-complete may give a batching model without a scheduler a dynamic
            # batcher): each request runs as sent, its batch in the dims
            assert config.max_batch_size == 0 and not config.HasField("dynamic_batching"), config
            assert list(config.input[0].dims) == [-1, 4] and list(config.output[0].dims) == [-1, 3], config
            assert "# rows are not independent (a row's output y changes" in (centered.path / "config.pbtxt").read_text()
            assert centered.manifest["triton"]["rows_dependent"].startswith("a row's output y changes when batched")
    assert "rows.centered: rows are not independent (a row's output y changes when batched with others" in caplog.text
    assert "Triton does not merge requests either" in caplog.text
    plain = zoo.export(PLAIN, "onnxruntime", repository=repo, random_init=True)
    config = text_format.Parse((plain.path / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.HasField("dynamic_batching") and "rows_dependent" not in plain.manifest["triton"]
    assert zoo.verify(centered.path)["parity"]["passed"]


def test_a_model_that_takes_at_least_two_rows_is_probed_in_parts_of_two(tmp_path, caplog):
    """With batch.min 2, the probe's part of one row was refused by the model's own range:
    the check said nothing and the export gave Triton dynamic batching, and the server only
    logged that it could not try and merged requests. Its parts now hold batch.min rows."""
    from dataclasses import replace

    from zoo.check import check

    centered = replace(CENTERED, name="rows.centered2", axes={"batch": AxisRange(2, 4, 32)})
    torch.manual_seed(0)
    module = centered.build().eval()
    assert not rows_independent(centered, module_fn(module, centered), centered.sample(4, np.random.default_rng(0)))[0]
    report = check(centered, module)
    assert report.passed and report.rows_dependent.startswith("a row's output y changes when batched"), report.warnings
    with caplog.at_level(logging.WARNING, logger="zoo"):
        art = zoo.export(centered, "onnxruntime", repository=tmp_path / "exports", random_init=True)
    assert art.manifest["triton"]["rows_dependent"].startswith("a row's output y changes when batched")
    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app
    from zoo.serve.repository import ServeOptions

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zoo.serve"), \
            TestClient(create_app(Settings(tmp_path / "exports", ServeOptions()))) as client:
        assert not client.get(f"/v2/models/{art.name}").json()["zoo"]["batching"]["dynamic_batching"]
    assert f"{art.name}: rows are not independent" in caplog.text and "could not be tried" not in caplog.text
