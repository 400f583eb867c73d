"""A model without a batch axis (tests/user_plugins/no_batch_axis.py: a 4x4 matrix in,
4x3 out) takes one shape, and is checked, verified and benchmarked at it once.

Found by a tester: `zoo check`, the export's parity and its test vectors ran it at batches
1, 8 and 32 (three runs of the one shape, the vectors three identical sets), and
`zoo bench --batch-sizes 1,4` reported batch 4 at 4x the samples/s of batch 1, for the
same single input.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import zoo
from zoo import registry
from zoo.bench.matrix import default_batch_sizes
from zoo.check import check
from zoo.verify import verify_artifact

from cli_support import zoo_cli

PLUGIN = Path(__file__).parent / "user_plugins" / "no_batch_axis.py"
NOTE = "matrix.fixed has no batch axis: its inputs have one shape, run once"


@pytest.fixture(scope="module")
def spec():
    """The plugin file loaded as `zoo --plugin` loads it."""
    registry.load_plugin_file(PLUGIN)
    yield zoo.get_model("matrix.fixed")
    registry.unload_plugin_file(PLUGIN)


def test_it_is_run_at_batch_1_alone(spec):
    assert not spec.has_batch_axis and spec.batch_sizes() == (1,)
    assert zoo.get_model("resnet8.digits").has_batch_axis


def test_check_runs_its_one_shape_once_and_says_so(spec):
    report = check(spec, spec.build().eval())
    assert [(c.name, c.batch, c.passed) for c in report.checks] == [
        ("sample", None, True), ("forward", None, True), ("outputs", None, True), ("state", None, True)]
    assert report.notes == [NOTE] and report.to_json()["notes"] == [NOTE]


def test_export_holds_it_to_parity_and_records_its_vectors_once(spec, tmp_path):
    art = zoo.export(spec.name, backend="onnxruntime", random_init=True, repository=tmp_path)
    assert [(c["batch"], c["output"]) for c in art.manifest["parity"]["checks"]] == [(None, "out")]
    assert art.manifest["parity"]["notes"] == [NOTE]
    test_data = art.manifest["test_data"]
    assert test_data["sets"] == [{"file": "test_data/set_0.safetensors", "axes": {"batch": 1}}]
    assert test_data["notes"] == [NOTE]
    verified = verify_artifact(art.path)
    assert [(c["batch"], c["output"]) for c in verified["parity"]["checks"]] == [(None, "out")]
    assert verified["test_vectors"]["sets"] == 1


def test_check_and_export_say_so_and_bench_refuses_batch_sizes_it_does_not_have(tmp_path):
    checked = zoo_cli("--plugin", str(PLUGIN), "check", "matrix.fixed", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert NOTE in checked.stdout and checked.stdout.count("passed") == 4
    exported = zoo_cli("--plugin", str(PLUGIN), "export", "matrix.fixed", "-b", "onnxruntime", "--random-init",
                       "-r", "own", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip().splitlines()[-1] == NOTE
    bench = zoo_cli("--plugin", str(PLUGIN), "bench", "matrix.fixed", "--backends", "onnxruntime", "--batch-sizes",
                    "1,4", "--random-init", "--min-time", "0.1", cwd=tmp_path)
    assert bench.returncode == 2, bench.stdout + bench.stderr
    assert bench.stderr.strip().splitlines()[-1] == (
        "error: --batch-sizes: matrix.fixed has no batch axis (its inputs have one shape): benchmark it with "
        "--batch-sizes 1")
    assert not (tmp_path / "exports").exists()  # refused before any export


def test_bench_without_batch_sizes_measures_its_one_shape(tmp_path):
    # before: the default 1,8,32 was refused as if the user had given it ("--batch-sizes:
    # ... benchmark it with --batch-sizes 1")
    bench = zoo_cli("--plugin", str(PLUGIN), "bench", "matrix.fixed", "--backends", "onnxruntime", "-r", "own",
                    "--random-init", "--min-time", "0.05", "--json", cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr
    rows = json.loads(bench.stdout)["results"]
    assert [r["batch"] for r in rows] == [1] and rows[0]["status"] == "ok", rows


def test_default_batch_sizes_are_those_one_models_range_holds(spec):
    def ranged(low, high):
        return dataclasses.replace(zoo.get_model("resnet8.digits"), axes={"batch": zoo.AxisRange(low, low, high)})
    assert default_batch_sizes(spec) == [1]
    assert default_batch_sizes(ranged(1, 16)) == [1, 8, 16]  # before: 32, past its range, refused
    assert default_batch_sizes(ranged(2, 64)) == [2, 8, 32]
    assert default_batch_sizes(ranged(1, 16), defaults=(8,)) == [8]
    assert default_batch_sizes(["resnet8.digits", spec]) == [1, 8, 32]  # several: each one's holes in the matrix


def test_optimize_ranks_it_at_its_one_shape(spec, tmp_path, monkeypatch):
    # before: --objective throughput measured it at its "typical batch" of 8, the one input
    # counted 8 times, and --batch 4 was taken
    import zoo.optimize

    asked = []

    def benchmark(spec, backends, batch_sizes, *args, **kwargs):
        asked.append(batch_sizes)
        raise KeyboardInterrupt  # what it was asked is all this test needs

    monkeypatch.setattr(zoo.optimize, "benchmark", benchmark)
    with pytest.raises(KeyboardInterrupt):
        zoo.optimize.optimize(spec, objective="throughput", random_init=True, repository=tmp_path)
    assert asked == [[1]]
    with pytest.raises(zoo.errors.UsageError, match="matrix.fixed has no batch axis"):
        zoo.optimize.optimize(spec, objective="throughput", batch=4, random_init=True, repository=tmp_path)
    assert asked == [[1]] and not any(tmp_path.iterdir())


def test_the_python_api_without_batch_sizes_measures_its_one_shape(spec, tmp_path):
    # before: zoo.benchmark's own default (1, 8, 32) was refused as a usage error, where
    # `zoo bench` without --batch-sizes measured the one shape
    report = zoo.benchmark(spec, backends="onnxruntime", repository=tmp_path, random_init=True, min_time=0.05,
                           min_iters=2)
    assert [(r["batch"], r["status"]) for r in report["results"]] == [(1, "ok")], report["results"]
    assert report["options"]["batch_sizes"] == [1]
