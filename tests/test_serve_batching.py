"""Dynamic and ragged batching in a real server: concurrent requests of different batch
sizes and sequence lengths are batched together (fewer executions than requests), and
each response equals what its request alone gives the artifact's runner, within the
model's fp32 tolerance (padding is masked out by the model)."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import httpx
import numpy as np
import pytest

import zoo
from zoo.serve.protocol import HEADER_LENGTH, decode_response, encode_request

pytest.register_assert_rewrite("serve_support")
from serve_support import ONNX, RAGGED, assert_close, plugin_registered  # noqa: E402

pytest_plugins = ["serve_support"]


def counters(server, model: str) -> tuple[float, float]:
    """(requests, executions) the server has counted for `model`."""
    text = httpx.get(f"{server.url}/metrics").text

    def value(family: str) -> float:
        match = re.search(rf'{family}{{model="{re.escape(model)}",version="1"}} ([0-9.e+]+)', text)
        return float(match[1]) if match else 0.0

    return value("zoo_inference_requests_total"), value("zoo_inference_executions_total")


async def send_all(url: str, bodies: list[tuple[bytes, dict]]) -> list[dict[str, np.ndarray]]:
    async with httpx.AsyncClient(timeout=60) as client:
        responses = await asyncio.gather(*(client.post(url, content=b, headers=h) for b, h in bodies))
    for r in responses:
        assert r.status_code == 200, r.text
    return [decode_response(r.content, r.headers.get(HEADER_LENGTH))[1] for r in responses]


@pytest.fixture(scope="module")
def runners(serve_repo):
    with plugin_registered():
        return {name: (zoo.Artifact.open(serve_repo / name).spec(), zoo.load(serve_repo / name, threads=1))
                for name in (ONNX, RAGGED)}


@pytest.mark.parametrize("name", [ONNX, RAGGED])
def test_concurrent_requests_batch_and_match_their_own_inputs(server, runners, name):
    spec, runner = runners[name]
    rng = np.random.default_rng(11)
    requests = [spec.sample(int(rng.integers(1, 4)), rng) for _ in range(24)]  # ragged.test: seq 3..12 each
    before = counters(server, name)
    got = asyncio.run(send_all(f"{server.url}/v2/models/{name}/infer",
                               [encode_request(x, binary=k % 2 == 0) for k, x in enumerate(requests)]))
    requests_delta, executions_delta = (a - b for a, b in zip(counters(server, name), before))
    assert requests_delta == 24
    assert executions_delta < 24, "no two requests were batched together"
    tol = spec.tolerance("fp32")
    for inputs, outputs in zip(requests, got):
        want = runner(inputs)  # this request alone
        assert set(outputs) == set(want)
        for key in want:
            assert outputs[key].shape == want[key].shape  # per-token outputs cut back to this request's length
            np.testing.assert_allclose(outputs[key], want[key], atol=tol.atol, rtol=tol.rtol)


def test_domain_native_requests_of_different_lengths_batch(server, runners):
    spec, runner = runners[RAGGED]
    texts = [b"hi", b"a longer text", b"mid size", b"0123456789abcdef", b"ok!"] * 4
    bodies = [encode_request({"text": [t]}, outputs=["result"]) for t in texts]
    before = counters(server, RAGGED)
    got = asyncio.run(send_all(f"{server.url}/v2/models/{RAGGED}/infer", bodies))
    assert counters(server, RAGGED)[1] - before[1] < len(texts)
    for text, outputs in zip(texts, got):
        (result,) = [json.loads(x) for x in outputs["result"]]
        assert_close(result, zoo.predict(spec, runner, [text])[0], 1e-5, 1e-5)


def test_batch_sizes_are_observed(server, runners):
    """The batch-size histogram counts executions, its sum their rows: after requests of
    one row each that were batched, the mean batch exceeds one row (this test's own
    requests: it holds whatever ran before it, in any order)."""
    spec, _ = runners[RAGGED]

    def histogram() -> tuple[float, float]:
        text = httpx.get(f"{server.url}/metrics").text
        found = [re.search(rf'zoo_inference_batch_size_{part}{{model="{re.escape(RAGGED)}",version="1"}} ([0-9.]+)',
                           text) for part in ("count", "sum")]
        return tuple(float(m[1]) if m else 0.0 for m in found)

    before = histogram()
    rng = np.random.default_rng(5)
    asyncio.run(send_all(f"{server.url}/v2/models/{RAGGED}/infer",
                         [encode_request(spec.sample(1, rng)) for _ in range(16)]))
    executions, rows = (a - b for a, b in zip(histogram(), before))
    assert rows == 16 and 0 < executions < 16


def test_batch_settings_a_model_cannot_take_are_said_not_dropped_silently(caplog):
    """`--max-batch-size 1000` and `--preferred-batch-sizes 0,4,128` are one setting for every
    model served: a model whose batch axis ends at 32 was served at 32, and the sizes outside
    1 to 32 left out, without a word."""
    from zoo.serve.repository import ServeOptions, policy_for

    spec = zoo.get_model("resnet8.digits").tiny()
    top = spec.axes["batch"].max
    with caplog.at_level(logging.WARNING, logger="zoo.serve"):
        policy = policy_for(spec, ServeOptions(max_batch_size=top + 968, preferred_batch_sizes=(0, 4, top + 96)), "")
    assert policy.max_batch_size == top and policy.preferred_batch_sizes == (4,)
    said = [r.getMessage() for r in caplog.records]
    assert f"model {spec.name} takes at most {top} rows: --max-batch-size {top + 968} is {top} for it" in said
    assert f"model {spec.name} batches at most {top} rows: preferred batch sizes 0, {top + 96} left out" in said
