"""MLPerf LoadGen scenarios (`zoo.bench.loadgen`): short SingleStream, Offline and Server
runs against a tiny exported model, in process and through a real `zoo serve`, judged
by LoadGen itself; INVALID results say why; bad settings are refused before a run.

The settings are short (under a second or two per run) but real: LoadGen's own
validity rules apply, including early stopping, which makes every Server run issue at
least 459 queries. Bounds are generous so a busy 2-core machine still meets them; the
INVALID cases use a bound no machine can meet, a server that refuses the requests, and
a model too slow for the rates tried.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import zoo
from zoo.bench.loadgen import early_stopping_queries, find_peak_qps, print_loadgen, run_scenario
from zoo.bench.loadgen_sut import SampleLibrary
from zoo.errors import ZooError

from serve_support import ServerProcess, free_port

SPEC = zoo.get_model("resnet8.digits").tiny()
SHORT = dict(duration_s=0.5, samples=64)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> zoo.Artifact:
    """resnet8.digits at tiny size through onnxruntime, in a repository of its own (shared
    by this module's tests: exporting and verifying once takes most of their time)."""
    return zoo.export(SPEC, "onnxruntime", repository=tmp_path_factory.mktemp("loadgen") / "exports",
                      random_init=True)


@pytest.fixture(scope="module")
def runner(exported):
    return zoo.load(exported.path, threads=1)


@pytest.fixture(scope="module")
def loadgen_server(exported, tmp_path_factory):
    """`zoo serve` of that repository. Requests are capped at 1 KiB: a one-row request
    (about 400 bytes) passes, an eight-row one (about 2.2 KB) gets 413, so the same server
    shows both a VALID run and server errors."""
    proc = ServerProcess(exported.path.parent, "--max-request-size", "1024", "--max-queue-delay-ms", "2",
                         log=tmp_path_factory.mktemp("loadgen-server") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


def assert_summary(result: dict, scenario: str, verdict: str) -> None:
    """LoadGen's own summary is kept where the result says, and agrees with it."""
    text = Path(result["summary"]).read_text()
    assert f"Scenario : {scenario}" in text and f"Result is : {verdict}" in text
    assert Path(result["detail"]).is_file()


def assert_latencies(result: dict) -> None:
    assert 0 < result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"] <= result["max_ms"]


RAGGED = [n for n in zoo.list_models() if any(len(t.dynamic_axes) > 1 for t in zoo.get_model(n).inputs)]


@pytest.mark.parametrize("name", RAGGED or [pytest.param(None, marks=pytest.mark.skip(
    reason="no registered model has a sequence or atom axis"))])
def test_the_sample_library_keeps_each_samples_length_and_pads_batches(name):
    """One `spec.sample` call per sample, so each keeps its own sequence/atom length (as
    requests to a server do); a batch is zero-padded to its longest row, as the server
    pads, and the same seed gives the same samples."""
    spec = zoo.get_model(name).tiny()
    library = SampleLibrary(spec, 12, seed=3)
    first = spec.inputs[0].name
    lengths = [row.inputs[first].shape[1] for row in library.rows]
    assert len(set(lengths)) > 1
    batch = library.batch([0, 1, 2])
    for t in spec.inputs:
        assert batch[t.name].shape[0] == 3 and batch[t.name].dtype == library.rows[0].inputs[t.name].dtype
    for k in range(3):
        own = library.rows[k].inputs[first][0]
        padded = batch[first][k]
        assert (padded[tuple(slice(0, n) for n in own.shape)] == own).all()
        assert padded.size == own.size or not padded[lengths[k]:].any()
    again = SampleLibrary(spec, 12, seed=3)
    assert all((a.inputs[first] == b.inputs[first]).all() for a, b in zip(library.rows, again.rows))


def test_singlestream_in_process_is_valid(runner, tmp_path):
    result = run_scenario(runner, SPEC, "singlestream", output_dir=tmp_path, **SHORT)
    assert result["valid"], result["reasons"]
    assert result["reasons"] == [] and result["errors"] == []
    assert_latencies(result)
    assert result["queries"] >= 64 and result["samples_per_second"] > 0  # early stopping needs 64 at p90
    assert result["early_stopping_p90_ms"] >= result["p50_ms"]
    assert_summary(result, "SingleStream", "VALID")
    assert Path(result["summary"]).parent == tmp_path / "SingleStream"


@pytest.mark.parametrize("scenario", ["singlestream", "offline"])
def test_a_warm_up_that_underestimates_the_rate_is_corrected(runner, tmp_path, monkeypatch, scenario):
    """A warm-up on a busy machine can measure a fraction of the rate the test then runs
    at; the queries LoadGen generated from it ran out before the minimum duration, and the
    run was INVALID ("ran shorter than"). The test is run again, sized from what it measured."""
    from zoo.bench.loadgen_sut import Target

    monkeypatch.setattr(Target, "estimate", lambda self, sut, duration_s: 2.0)  # samples/s: far too low
    result = run_scenario(runner, SPEC, scenario, output_dir=tmp_path, **SHORT)
    assert result["estimated_samples_per_second"] == 2.0
    assert result["valid"], result["reasons"]
    assert result["samples_per_second"] > 10


def test_server_in_process_is_valid(runner, tmp_path):
    qps = 400.0
    result = run_scenario(runner, SPEC, "server", output_dir=tmp_path, target_qps=qps, latency_bound_ms=200,
                          **SHORT)
    assert result["valid"], result["reasons"]
    assert_latencies(result)
    assert result["p99_ms"] <= 200 and result["latency_bound_ms"] == 200
    assert result["queries"] >= early_stopping_queries(0.99) == 459
    # Poisson arrivals at the target rate: over ~459 queries the realized rate is within ~15 %
    assert 0.7 * qps < result["scheduled_qps"] < 1.3 * qps
    assert 0.7 * qps < result["samples_per_second"] < 1.3 * qps
    assert_summary(result, "Server", "VALID")


def test_offline_in_process_reports_throughput(runner, tmp_path):
    result = run_scenario(runner, SPEC, "offline", output_dir=tmp_path, batch=8, **SHORT)
    assert result["valid"], result["reasons"]
    assert result["samples_per_second"] > 0 and result["batch"] == 8
    assert result["queries"] == 1  # Offline issues every sample in one query
    assert "Samples per second" in Path(result["summary"]).read_text()
    assert_summary(result, "Offline", "VALID")


def test_an_impossible_latency_bound_is_invalid_and_says_why(runner, tmp_path):
    result = run_scenario(runner, SPEC, "server", output_dir=tmp_path, target_qps=1000, latency_bound_ms=1e-4,
                          **SHORT)
    assert not result["valid"]
    assert any("over the 0.0001 ms bound" in r for r in result["reasons"]), result["reasons"]
    assert result["p99_ms"] > 1e-4
    assert_summary(result, "Server", "INVALID")


def server_requests(url: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "zoo_inference_request_duration_seconds_count" and s.labels.get("model") == model)


def test_server_over_http_is_valid(loadgen_server, tmp_path):
    server = loadgen_server
    name = "resnet8.digits.onnxruntime.fp32"
    before = server_requests(server.url, name)
    result = run_scenario(server.url, None, "server", model="resnet8.digits", output_dir=tmp_path, target_qps=150,
                          latency_bound_ms=500, **SHORT)
    assert result["valid"], result["reasons"]
    assert result["target"] == server.url and result["model"] == name  # the alias resolved
    assert result["batch"] == 1  # one request per query; the server batches
    assert_latencies(result)
    assert server_requests(server.url, name) - before >= result["queries"] >= 459
    assert_summary(result, "Server", "VALID")


def test_server_errors_make_the_result_invalid_without_hanging(loadgen_server, tmp_path):
    server = loadgen_server
    start = time.monotonic()
    result = run_scenario(server.url, None, "offline", model="resnet8.digits", output_dir=tmp_path, batch=8, **SHORT)
    assert time.monotonic() - start < 30
    assert not result["valid"]
    assert result["errors"] and "413" in result["errors"][0]
    assert "samples failed" in result["reasons"][0] and "413" in result["reasons"][0], result["reasons"]


def test_find_peak_qps_brackets_the_bound(exported, tmp_path):
    """A model that takes 2 ms per call, one call at a time, serves at most 500 QPS. From
    300 (VALID with room to spare) the search doubles to 600 (overloaded: INVALID), then
    bisects; the peak it reports cannot be far above 500, and every rate it found VALID
    lies below every rate it found INVALID."""
    runner = zoo.load(exported.path, threads=1)

    def slow(inputs):
        time.sleep(0.002)
        return runner(inputs)

    peak = find_peak_qps(slow, SPEC, 50, output_dir=tmp_path, batch=1, duration_s=0.3, samples=16,
                         start_qps=300, max_runs=4)
    tried = peak["tried"]
    valid = [r["target_qps"] for r in tried if r["valid"]]
    invalid = [r["target_qps"] for r in tried if not r["valid"]]
    assert len(tried) == 4 and valid and invalid
    assert peak["peak_qps"] == max(valid) == peak["best"]["target_qps"] < 550
    assert max(valid) < min(invalid)
    assert all(Path(r["summary"]).is_file() for r in tried)


def test_results_print_as_a_table(runner, tmp_path):
    from rich.console import Console

    result = run_scenario(runner, SPEC, "singlestream", output_dir=tmp_path, **SHORT)
    console = Console(record=True, width=200)
    print_loadgen([result, {"scenario": "server", "peak_qps": None, "latency_bound_ms": 1.0, "best": None,
                            "tried": [{**result, "scenario": "server", "valid": False, "reasons": ["too slow"]}]}],
                  console)
    text = console.export_text()
    assert "singlestream" in text and "VALID" in text and "too slow" in text and "none of the tried" in text


@pytest.mark.parametrize("scenario", ["multistream", "bogus", ""])
def test_unknown_scenarios_are_refused(runner, tmp_path, scenario):
    with pytest.raises(ZooError, match="choose from singlestream, offline, server"):
        run_scenario(runner, SPEC, scenario, output_dir=tmp_path)


@pytest.mark.parametrize("settings, message", [
    ({}, "needs a target QPS"),
    ({"target_qps": 0}, "target QPS must be a positive number"),
    ({"target_qps": math.nan}, "target QPS must be a positive number"),
    ({"target_qps": 10, "latency_bound_ms": -5}, "latency bound must be a positive"),
    ({"target_qps": 10, "batch": 0}, "batch must be a whole number from 1 to 64"),
    ({"target_qps": 10, "batch": 65}, "batch must be a whole number from 1 to 64"),
    ({"target_qps": 10, "duration_s": 0}, "duration_s must be a positive"),
    ({"target_qps": 10, "concurrency": 0}, "concurrency must be a whole number"),
    ({"target_qps": 10, "samples": 0}, "samples must be a whole number"),
    ({"target_qps": 10, "min_queries": 2.5}, "min_queries must be a whole number"),
    # LoadGen builds the whole schedule in memory first: 5e8 queries grew past 20 GB
    ({"target_qps": 1e9, "duration_s": 0.5}, "LoadGen would schedule 500,000,000 queries"),
])
def test_bad_settings_are_refused(runner, tmp_path, settings, message):
    with pytest.raises(ZooError, match=message):
        run_scenario(runner, SPEC, "server", output_dir=tmp_path, **settings)
    assert not (tmp_path / "Server").exists()  # refused before LoadGen ran


def test_bad_targets_are_refused(tmp_path):
    with pytest.raises(ZooError, match="no answer from http://127.0.0.1"):
        run_scenario(f"http://127.0.0.1:{free_port()}", SPEC, "singlestream", output_dir=tmp_path, timeout_s=5)
    with pytest.raises(ZooError, match="must be http://HOST:PORT"):
        run_scenario("ftp://example", SPEC, "singlestream", output_dir=tmp_path)
    with pytest.raises(ZooError, match="a zoo Runner or an http://HOST:PORT URL"):
        run_scenario(42, SPEC, "singlestream", output_dir=tmp_path)
    with pytest.raises(ZooError, match="max_runs"):
        find_peak_qps(lambda inputs: inputs, SPEC, 10, output_dir=tmp_path, max_runs=0)


def test_scenarios_against_a_server_take_the_served_name(loadgen_server, tmp_path, monkeypatch):
    """`zoo bench NAME --url URL --scenario ...` looked NAME up in the registry, so the served
    artifact's name (which the concurrency sweep takes) was "unknown model"; the name is now
    the server's to resolve, as the sweep's is."""
    import json

    from typer.testing import CliRunner

    from zoo.cli import app

    monkeypatch.chdir(tmp_path)
    name = "resnet8.digits.onnxruntime.fp32"
    result = CliRunner().invoke(app, ["bench", name, "--url", loadgen_server.url, "--scenario", "singlestream",
                                      "--min-time", "0.5", "--report-dir", "r", "--json"])
    assert result.exit_code == 0, (result.exception, result.output[-3000:])
    report = json.loads(result.stdout)
    run, = report["loadgen"]
    assert run["valid"] and run["model"] == name and report["models"] == [name], run
    assert (tmp_path / "r" / "report.json").is_file()


def _interrupted_at_second_combination(monkeypatch):
    """`_in_own_process` as a run in which Ctrl-C lands while LoadGen drives openvino: its
    logs are half-written, the combination before it finished."""
    from zoo.bench import scenarios

    def in_own_process(fn, job, timeout):
        if fn is scenarios.export_job:
            return {"path": "unused"}
        logs = Path(job["output_dir"]) / "Offline"
        logs.mkdir(parents=True)
        (logs / "mlperf_log_summary.txt").write_text("" if job["backend"] == "openvino" else "Result is : VALID")
        if job["backend"] == "openvino":
            raise KeyboardInterrupt
        return [{"scenario": "offline", "target": "in-process", "valid": True, "reasons": [], "p50_ms": 1.0,
                 "samples_per_second": 100.0, "summary": str(logs / "mlperf_log_summary.txt")}]

    monkeypatch.setattr(scenarios, "_in_own_process", in_own_process)
    return scenarios


def test_ctrl_c_keeps_the_finished_combinations_and_none_of_the_interrupted_ones_logs(tmp_path, monkeypatch):
    from zoo.bench.matrix import Interrupted

    scenarios = _interrupted_at_second_combination(monkeypatch)
    with pytest.raises(Interrupted) as caught:
        scenarios.loadgen("resnet8.digits", ["onnxruntime", "openvino"], ["fp32"], ["cpu"], 1, ["offline"],
                          tmp_path / "lg", repository=tmp_path / "exports", random_init=True, duration_s=0.1)
    report = caught.value.report
    assert isinstance(caught.value, KeyboardInterrupt) and report["interrupted"] is True
    assert [(r["backend"], r["valid"]) for r in report["loadgen"]] == [("onnxruntime", True)]
    assert sorted(p.name for p in (tmp_path / "lg").iterdir()) == ["resnet8.digits.onnxruntime.fp32.cpu"]


def test_ctrl_c_at_the_first_combination_leaves_nothing(tmp_path, monkeypatch):
    from zoo.bench.matrix import Interrupted

    scenarios = _interrupted_at_second_combination(monkeypatch)
    with pytest.raises(Interrupted) as caught:
        scenarios.loadgen("resnet8.digits", ["openvino"], ["fp32"], ["cpu"], 1, ["offline"], tmp_path / "lg",
                          repository=tmp_path / "exports", random_init=True, duration_s=0.1)
    assert caught.value.report["loadgen"] == [] and not (tmp_path / "lg").exists()


def test_the_peak_search_stops_at_the_highest_rate_loadgen_can_schedule(monkeypatch, tmp_path):
    """A target that is VALID at every rate: doubling from 5e4 for 10 s, the search went on to
    6.4e6 QPS (64 million queries held in memory); it stops at `max_server_qps` and says so."""
    from rich.console import Console

    from zoo.bench import loadgen

    def always_valid(t, scenario, s, log_dir):
        return {"scenario": "server", "valid": True, "target_qps": s["target_qps"], "reasons": []}

    monkeypatch.setattr(loadgen, "_run", always_valid)
    peak = find_peak_qps(lambda inputs: None, SPEC, 50, output_dir=tmp_path, start_qps=5e4, samples=4)
    top = loadgen.max_server_qps(10.0)
    assert [r["target_qps"] for r in peak["tried"]] == [5e4, 1e5, top] and top == 2e5
    assert peak["peak_qps"] == top and peak["at_schedule_limit"] is True
    console = Console(record=True, width=300)
    print_loadgen([peak], console)
    assert "the most LoadGen can schedule over the duration: the peak may be higher" in console.export_text()


def test_a_run_in_which_samples_failed_reports_no_rate(tmp_path):
    """LoadGen counts a sample the SUT answered with a failure as completed: a Server run at
    1e6 QPS showed 134,919 samples/s while 497,043 of its samples failed."""
    from zoo.bench.loadgen_report import result

    detail = {"result_validity": "INVALID", "result_completed_samples_per_sec": 134919.0,
              "result_scheduled_samples_per_sec": 999000.0, "result_query_count": 500000}
    settings = {"target_qps": 1e6, "latency_bound_ms": 100.0, "duration_s": 0.5}
    behind = ["the system fell behind: a query waited 1.2 s for a worker (limit 1 s); lower the target QPS"]
    failed = result("Server", settings, detail, behind, 497043, 8, 1, tmp_path)
    assert failed["samples_per_second"] is None and failed["failed_samples"] == 497043
    assert failed["reasons"][0].startswith("497043 samples failed: the system fell behind")
    served = result("Server", settings, {**detail, "result_validity": "VALID"}, [], 0, 8, 1, tmp_path)
    assert served["samples_per_second"] == 134919.0 and served["failed_samples"] == 0


def test_a_timeout_keeps_the_scenarios_that_finished_and_none_of_the_cut_off_ones_logs(tmp_path, monkeypatch):
    """`--timeout 12 --scenario singlestream,server`: the server run outlived the time-out and
    both rows said "failed: timed out", though SingleStream had finished VALID; Server's
    0-byte summary stayed in the report directory."""
    from zoo.bench import scenarios
    from zoo.bench.loadgen import scenario_name
    from zoo.bench.matrix import _Failed
    from zoo.cli_bench import _loadgen_line

    def in_own_process(fn, job, timeout):
        if fn is scenarios.export_job:
            return {"path": "unused"}
        done = []
        for name in job["scenarios"]:
            logs = Path(job["output_dir"]) / scenario_name(name)
            logs.mkdir(parents=True)
            if name == "server":
                (logs / "mlperf_log_summary.txt").write_text("")  # LoadGen's, cut off mid-run
                raise _Failed("failed", f"timed out after {timeout:g} s")
            (logs / "mlperf_log_summary.txt").write_text("Result is : VALID")
            done.append({"scenario": name, "target": "in-process", "valid": True, "reasons": [], "p90_ms": 1.0,
                         "samples_per_second": 100.0, "summary": str(logs / "mlperf_log_summary.txt")})
        return done

    monkeypatch.setattr(scenarios, "_in_own_process", in_own_process)
    report = scenarios.loadgen("resnet8.digits", ["onnxruntime"], ["fp32"], ["cpu"], 1, ["singlestream", "server"],
                               tmp_path / "lg", repository=tmp_path / "exports", random_init=True, duration_s=0.1,
                               target_qps=100.0, timeout=12)
    kept, cut = report["loadgen"]
    assert (kept["scenario"], kept["valid"], kept.get("status")) == ("singlestream", True, None)
    assert (cut["scenario"], cut["valid"], cut["status"], cut["reasons"]) == ("server", False, "failed",
                                                                            ["timed out after 12 s"])
    assert [p.name for p in (tmp_path / "lg" / "resnet8.digits.onnxruntime.fp32.cpu").iterdir()] == ["SingleStream"]
    # the progress line says what the table says: failed, not INVALID (LoadGen judged no such run)
    assert "server: failed[/] timed out after 12 s" in _loadgen_line(cut)
