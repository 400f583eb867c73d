"""`zoo bench`: every backend measured in its own process, failures reported per row."""

from __future__ import annotations

import pytest

import zoo
from zoo.errors import ZooError

SPEC = zoo.get_model("resnet8.digits").tiny()
FAST = dict(warmup=1, min_time=0.05, min_iters=5)


def test_benchmark_reports_percentiles_per_backend_and_batch(repository):
    report = zoo.benchmark(SPEC, ["torch", "onnxruntime"], [1, 4], repository=repository, random_init=True, **FAST)
    rows = report["results"]
    assert [(r["backend"], r["batch"]) for r in rows] == [("torch", 1), ("torch", 4), ("onnxruntime", 1),
                                                           ("onnxruntime", 4)]
    for r in rows:
        assert r["status"] == "ok", r
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["iterations"] >= 5 and r["throughput"] > 0
        assert r["max_abs_error"] < 1e-3
    env = report["environment"]
    assert env["cores"] and env["torch"] and env["onnxruntime"] and env["threads"]


def test_a_failing_backend_is_reported_and_the_rest_go_on(repository):
    report = zoo.benchmark(SPEC, ["tensorrt", "onnxruntime"], [1], repository=repository, random_init=True, **FAST)
    failed, ok = report["results"]
    assert failed["status"] == "failed" and "tensorrt" in failed["error"].lower()
    assert ok["status"] == "ok"


def test_batch_outside_the_exported_range_is_refused(repository):
    with pytest.raises(ZooError, match="outside"):
        zoo.benchmark(SPEC, ["onnxruntime"], [1, 1000], repository=repository, random_init=True, **FAST)
