"""A JSON request body costs the server several times its size while it is parsed (Python
objects for every number; docs/benchmarks.md, "A JSON request body's parse"), so `zoo serve`
parses at most `JSON_PARSES` large JSON bodies at once (a parse holds the GIL: two at a
time lose no speed), and converts the numbers to their array a piece at a time. Three
clients each sending a 64 MiB JSON tensor took the server to 2.3 GB before; binary bodies,
which cost their size, are not held back.
"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from starlette.testclient import TestClient

import zoo.serve.app as app_module
from zoo.serve.app import Settings, create_app
from zoo.serve.protocol import decode_request
from zoo.serve.repository import ServeOptions
from zoo.serve.service import JSON_PARSES

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, export  # noqa: E402

ROWS = 64  # the model's most: 64 x 64 numbers, a JSON body of 100 KB (indented), over the 64 KiB parsed off the loop


def _body() -> bytes:
    x = np.random.default_rng(0).random((ROWS, 1, 8, 8), dtype=np.float32)
    tensor = {"name": "image", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}, indent=1).encode()


def test_large_json_bodies_are_parsed_two_at_a_time(tmp_path, monkeypatch):
    export(DIGITS, "onnxruntime", tmp_path / "exports")
    lock, running, seen = threading.Lock(), [0], [0]

    def counted(body, header):  # the real parse, with how many run at once around it
        with lock:
            running[0] += 1
            seen[0] = max(seen[0], running[0])
        try:
            time.sleep(0.3)
            return decode_request(body, header)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(app_module, "decode_request", counted)
    body = _body()
    assert len(body) > app_module.OFFLOAD_BYTES
    with TestClient(create_app(Settings(tmp_path / "exports", ServeOptions()))) as client, \
            ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: client.post(f"/v2/models/{ONNX}/infer", content=body), range(4)))
    assert [a.status_code for a in answers] == [200] * 4, answers[0].text
    assert seen[0] == JSON_PARSES


def test_a_json_tensor_costs_its_parse_not_a_float64_copy_more():
    """The numbers went to a float64 array whole (and two boolean arrays beside it) before
    their float32 one: 6.8x the body at peak; now a piece at a time, 5.6x."""
    n = 1_000_000
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [n], "data": [0.125] * n}]}).encode()
    tracemalloc.start()
    try:
        decoded = decode_request(body, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoded.inputs[0].data.dtype == np.float32 and decoded.inputs[0].data.shape == (n,)
    assert peak < 6 * len(body), peak / len(body)
