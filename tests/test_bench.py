"""`zoo bench`: every backend measured in its own process, failures reported per row."""

from __future__ import annotations

import dataclasses

import pytest
from zoo_torch import TorchBackend

import zoo
from zoo import registry
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


class BrokenExport(TorchBackend):
    """A backend whose exporter hits a library error, as a real one might."""

    name = "broken-test"

    def export(self, module, spec, example, path, precision, device):
        raise RuntimeError("the exporter met an operator it cannot lower")


@pytest.fixture
def broken_backend():
    class Plugin:
        @zoo.hookimpl
        def zoo_register_backends(self, register):
            register(BrokenExport())

    plugin = Plugin()
    registry.register_plugin(plugin)
    yield
    registry.unregister_plugin(plugin)


def test_a_failing_backend_is_reported_and_the_rest_go_on(repository, broken_backend):
    report = zoo.benchmark(SPEC, ["broken-test", "tensorrt", "onnxruntime"], [1], repository=repository,
                           random_init=True, **FAST)
    failed, unsupported, ok = report["results"]
    assert failed["status"] == "failed" and "cannot lower" in failed["error"]
    assert unsupported["status"] == "unsupported" and "does not run on cpu" in unsupported["error"]
    assert ok["status"] == "ok"


def test_the_matrix_spans_precisions_and_marks_the_holes(repository):
    no_int8 = dataclasses.replace(SPEC, tolerances={"fp32": SPEC.tolerances["fp32"]})
    report = zoo.benchmark(no_int8, ["onnxruntime"], [1], precision=["fp32", "int8"], repository=repository,
                           random_init=True, **FAST)
    fp32, int8 = report["results"]
    assert (fp32["precision"], fp32["status"]) == ("fp32", "ok")
    assert (int8["precision"], int8["status"]) == ("int8", "unsupported") and "no tolerance for" in int8["error"]


def test_batch_outside_the_exported_range_is_refused(repository):
    with pytest.raises(ZooError, match="outside"):
        zoo.benchmark(SPEC, ["onnxruntime"], [1, 1000], repository=repository, random_init=True, **FAST)
