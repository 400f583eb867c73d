"""`zoo bench`: every backend measured in its own process, failures reported per row."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import zoo
from zoo import registry
from zoo.bench.measure import _nvml_process_mb, _own_pids, at_length, lengths_of
from zoo.errors import ZooError

SPEC = zoo.get_model("resnet8.digits").tiny()
FAST = {"warmup": 1, "min_time": 0.05, "min_iters": 5}


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
    for r in rows:  # memory, cold start, size and accuracy facts on every row
        assert r["peak_host_mb"] >= r["baseline_host_mb"] > 0 and r["peak_cuda_mb"] is None
        assert r["export_seconds"] > 0 and r["load_seconds"] > 0 and r["artifact_bytes"] > 1000
        assert r["metric_name"] == "accuracy" and r["metric_delta"] == pytest.approx(r["metric"] - r["metric_reference"])
        assert r["lengths"] == {} and 0 <= r["noise"] < float("inf")  # no bound: a shared machine is as noisy as it is
    env = report["environment"]
    assert env["cores"] and env["torch"] and env["onnxruntime"] and env["threads"] and env["command"]
    assert report["models"] == [SPEC.name] and report["options"]["batch_sizes"] == [1, 4]


def test_a_benchmark_keeps_the_form_parameters_and_signature_of_the_artifact_it_measures(repository, tmp_path):
    """A benchmark over a repository being deployed measures its artifacts as they are: before,
    its export rebuilt a python-form, signed artifact in the native form (which the bundled
    Triton cannot serve), dropping its config parameters and its signature."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from zoo.signing import sign, verify_signature

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    art = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True, triton="python",
                     triton_parameters={"enable_mem_arena": "0"})
    sign(art.path, private)
    files = {p.relative_to(art.path): p.stat().st_mtime_ns for p in art.path.rglob("*")}
    report = zoo.benchmark(SPEC, "onnxruntime", 1, repository=repository, random_init=True, **FAST)
    assert [r["status"] for r in report["results"]] == ["ok"], report["results"]
    assert {p.relative_to(art.path): p.stat().st_mtime_ns for p in art.path.rglob("*")} == files
    triton = zoo.Artifact.open(art.path).manifest["triton"]
    assert triton["form"] == "python" and triton["parameters"] == {"enable_mem_arena": "0"}
    verify_signature(art.path, public)


def test_sequence_lengths_are_a_dimension_of_the_matrix(repository):
    spec = zoo.get_model("minilm-l6.all-v2").tiny()
    report = zoo.benchmark(spec, ["onnxruntime"], [2], repository=repository, random_init=True, lengths=[8, 24],
                           **FAST)
    assert [(r["batch"], r["lengths"]) for r in report["results"]] == [(2, {"seq": 8}), (2, {"seq": 24})]
    assert all(r["status"] == "ok" for r in report["results"])
    with pytest.raises(ZooError, match="seq lengths \\[1000\\] are outside"):
        zoo.benchmark(spec, ["onnxruntime"], [2], repository=repository, random_init=True, lengths=[1000], **FAST)


@pytest.mark.parametrize("name", ["minilm-l6.all-v2", "mpnn.freesolv", "gpt.pydoc"])
@pytest.mark.parametrize("length", [3, 40])
def test_inputs_at_a_length_keep_real_content(name, length):
    """Cut or repeated along every dimension named by the axis (atoms: features, both
    sides of the bond matrix, the mask), other dimensions untouched."""
    spec = zoo.get_model(name).tiny()
    axis = next(a for a in spec.axes if a != "batch")
    inputs = spec.sample(2, np.random.default_rng(0))
    shaped = at_length(spec, inputs, axis, length)
    assert lengths_of(spec, shaped) == {axis: length}
    for t in spec.inputs:
        have, got = inputs[t.name], shaped[t.name]
        assert got.dtype == have.dtype and got.shape[0] == 2
        n = min(length, lengths_of(spec, inputs)[axis])
        index = tuple(slice(0, n) if name == axis else slice(None) for name in
                      [t.dynamic_axes.get(i, "") for i in range(have.ndim)])
        np.testing.assert_array_equal(got[index], have[index])


def test_models_by_pattern(repository):
    report = zoo.benchmark("ppo.*", ["tensorrt"], [1], repository=repository)  # no CPU: a hole each, nothing runs
    assert report["models"] == ["ppo.cartpole", "ppo.pendulum"]
    assert [r["status"] for r in report["results"]] == ["unsupported", "unsupported"]
    with pytest.raises(ZooError, match="no model matches"):
        zoo.benchmark("nosuch*", ["onnxruntime"], [1], repository=repository)


@pytest.fixture
def failing_backends():
    plugin = Path(__file__).with_name("bench_plugin.py")
    registry.load_plugin_file(plugin)
    yield
    registry.unload_plugin_file(plugin)


def test_a_failing_combination_is_reported_and_the_rest_go_on(repository, failing_backends):
    """An exporter error, a segfault while loading, a builder that never returns, a backend
    that cannot run here: each is one row with its reason, and the last backend still runs."""
    seen = []
    # exported beforehand (the bench reuses it) so the 10 s that catches the hang is not
    # spent on the sound backend's export in a fresh worker on a slow machine
    zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    report = zoo.benchmark(SPEC, ["broken-test", "crash-test", "hang-test", "tensorrt", "onnxruntime"], [1],
                           repository=repository, random_init=True, timeout=10, **FAST,
                           on_combination=lambda done, total, label: seen.append((done, total)))
    broken, crashed, hung, unsupported, ok = report["results"]
    assert broken["status"] == "failed" and "cannot lower" in broken["error"]
    assert crashed["status"] == "failed" and "crashed (killed by SIGSEGV)" in crashed["error"]
    assert hung["status"] == "failed" and "timed out after 10 s" in hung["error"]
    assert unsupported["status"] == "unsupported" and "does not run on cpu" in unsupported["error"]
    assert ok["status"] == "ok" and ok["p50_ms"] > 0, ok.get("error")
    assert seen == [(i, 5) for i in range(1, 6)]


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


def test_a_combination_refused_by_verification_is_not_a_failure(repository, failing_backends, tmp_path):
    """`zoo bench` exits 0 when verification refuses a combination (reported as "refused"
    with the parity error), and 1 with --strict; a crashed combination fails either way."""
    from typer.testing import CliRunner

    from zoo.cli import app

    plugin = str(Path(__file__).with_name("bench_plugin.py"))
    args = ["--plugin", plugin, "bench", SPEC.name, "--batch-sizes", "1", "--random-init", "--repository",
            str(repository), "--min-time", "0.05", "--report-dir", str(tmp_path / "r"), "--json"]
    refused = CliRunner().invoke(app, [*args, "--backends", "wrong-test"])
    assert refused.exit_code == 0, refused.output
    row, = json.loads(refused.stdout)["results"]
    assert row["status"] == "refused" and "differs from PyTorch fp32" in row["error"], row
    strict = CliRunner().invoke(app, [*args, "--backends", "wrong-test", "--strict"])
    assert strict.exit_code == 1 and json.loads(strict.stdout)["results"][0]["status"] == "refused"
    crashed = CliRunner().invoke(app, [*args, "--backends", "broken-test"])
    assert crashed.exit_code == 1 and json.loads(crashed.stdout)["results"][0]["status"] == "failed"


@pytest.mark.parametrize("mode, option, value", [("--url", "--compare", "base.json"), ("--url", "--precision", "int8"),
                                                  ("--url", "--report-dir", "r"), ("--scenario", "--lengths", "8"),
                                                  ("--scenario", "--compare", "base.json")])
def test_options_a_mode_does_not_use_are_refused(mode, option, value):
    from typer.testing import CliRunner

    from zoo.cli import app

    target = "http://127.0.0.1:9" if mode == "--url" else "offline"
    result = CliRunner().invoke(app, ["bench", SPEC.name, mode, target, option, value])
    assert result.exit_code != 0
    why = {"--url": "it measures the server as it runs", "--lengths": "LoadGen runs each combination at its own sizes",
           "--compare": "the regression gate compares the timed benchmark's rows (latency per batch size), and LoadGen "
                        "judges its own runs (VALID or INVALID)"}
    assert str(result.exception) == f"{option} does nothing with {mode}: {why[mode if mode == '--url' else option]}; " \
                                    "leave it out"


def test_an_artifact_is_measured_as_it_is_without_its_plugin(tmp_path):
    """`zoo bench --artifact`: no export, and the plugin that defined the model is not
    loaded (a fresh process without --plugin): the artifact describes its model itself."""
    import os
    import subprocess
    import sys

    from typer.testing import CliRunner

    from zoo.cli import app

    plugin = Path(__file__).with_name("raw_kind_plugin.py")
    registry.load_plugin_file(plugin)
    try:
        art = zoo.export("loudness.test", "onnxruntime", repository=tmp_path / "repo", random_init=True)
    finally:
        registry.unload_plugin_file(plugin)
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    done = subprocess.run([sys.executable, "-m", "zoo", "bench", "--artifact", str(art.path), "--batch-sizes", "1,4",
                           "--min-time", "0.05", "--report-dir", str(tmp_path / "report"), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    rows = report["results"]
    assert [(r["model"], r["backend"], r["batch"], r["status"]) for r in rows] == [
        ("loudness.test", "onnxruntime", 1, "ok"), ("loudness.test", "onnxruntime", 4, "ok")]
    assert all(r["p50_ms"] > 0 and r["artifact"] == art.name and r["max_abs_error"] is not None for r in rows)
    assert report["options"]["artifacts"] == [art.name] and (tmp_path / "report" / "report.json").is_file()
    for args, message in ((["--artifact", str(art.path), "--backends", "torch"],
                           "--backends does nothing with --artifact"),
                          (["resnet8.digits", "--artifact", str(art.path)], "or --artifact to measure existing"),
                          (["--artifact", str(tmp_path / "nothing")], "no artifact directory")):
        refused = CliRunner().invoke(app, ["bench", *args])
        assert refused.exit_code != 0 and message in str(refused.exception), (args, refused.exception)


def test_gpu_memory_is_matched_by_the_pid_nvml_sees_inside_a_container():
    """Issue 17, finding 4: NVML lists host PIDs; in a container os.getpid() is another one.
    Every PID /proc/self/status lists for this process (NSpid) is matched."""
    import os
    import types

    status = f"Name:\tpython\nPid:\t{os.getpid()}\nNSpid:\t48213\t{os.getpid()}\nPPid:\t1\n"
    pids = _own_pids(status)
    assert pids == {48213, os.getpid()}
    listed = [types.SimpleNamespace(pid=777, usedGpuMemory=5 << 20),  # another process
              types.SimpleNamespace(pid=48213, usedGpuMemory=300 << 20)]  # this one, by its host PID
    assert _nvml_process_mb(listed, pids) == 300
    assert _nvml_process_mb(listed, {os.getpid()}) is None  # what matching on os.getpid() alone found
    hidden = [types.SimpleNamespace(pid=48213, usedGpuMemory=None)]  # "not available" in some containers
    assert _nvml_process_mb(hidden, pids) is None
    assert os.getpid() in _own_pids()  # the real /proc/self/status
