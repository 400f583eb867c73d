"""`zoo bench` as CI uses it: a report directory in every format, then the regression gate
against a baseline, with the exit code a CI job reads."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

ARGS = ["bench", "resnet8.digits", "--backends", "onnxruntime", "--batch-sizes", "1,4", "--random-init",
        "--min-time", "0.1"]


@pytest.fixture
def zoo_cli(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zoo", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)

    return run


def test_report_then_a_planted_slowdown_fails_the_gate(zoo_cli, tmp_path):
    first = zoo_cli(*ARGS, "--report-dir", "base")
    assert first.returncode == 0, first.stderr
    names = {p.name for p in (tmp_path / "base").iterdir()}
    assert {"report.json", "results.csv", "report.md", "latency_vs_batch.png", "throughput.png"} <= names
    report = json.loads((tmp_path / "base" / "report.json").read_text())
    assert [r["batch"] for r in report["results"]] == [1, 4]

    # the baseline claims this code was 50x as fast, with no noise of its own: today's run is a 50x slowdown.
    # (A 2x plant was not enough: on a loaded CI machine the first run alone can be 2x slower than the second.)
    for row in report["results"]:
        row["p50_ms"] /= 50
        row["noise"] = 0.0
    (tmp_path / "planted.json").write_text(json.dumps(report))
    gated = zoo_cli(*ARGS, "--report-dir", "now", "--compare", "planted.json")
    assert gated.returncode == 1, gated.stdout + gated.stderr
    # both rows are flagged unless this machine's own measured noise was too large to tell
    assert "regressions: 0," not in gated.stdout and "slower" in gated.stdout
    assert (tmp_path / "now" / "report.json").is_file()  # the evidence is kept when the gate fails

    # a baseline none of whose rows this run measured: nothing compared is not a pass
    for row in report["results"]:
        row["device"] = "cuda"
    (tmp_path / "elsewhere.json").write_text(json.dumps(report))
    nothing = zoo_cli(*ARGS, "--report-dir", "other", "--compare", "elsewhere.json")
    assert nothing.returncode == 1, nothing.stdout + nothing.stderr
    assert nothing.stderr.splitlines()[-1].startswith("error: --compare elsewhere.json: no row of the baseline")
    assert "missing: 2" in nothing.stdout and (tmp_path / "other" / "report.json").is_file()


def test_the_same_artifact_named_twice_is_measured_once(zoo_cli, tmp_path):
    """By its name in the repository and by its path: one artifact, one row per batch.
    And a report that cannot be written after the run still prints every measurement."""
    import zoo

    art = zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=tmp_path / "exports",
                     random_init=True)
    (tmp_path / "r" / "report.json").mkdir(parents=True)  # a writable directory, but report.json cannot be written
    done = zoo_cli("bench", "--artifact", art.name, "--artifact", f"exports/{art.name}", "--batch-sizes", "1",
                   "--min-time", "0.05", "--report-dir", "r", "--json")
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == "error: cannot write the benchmark report into r: Is a directory"
    report = json.loads(done.stdout)  # printed before the files were written
    assert [(r["model"], r["batch"], r["status"]) for r in report["results"]] == [("resnet8.digits", 1, "ok")]
    assert report["options"]["artifacts"] == [art.name]


def test_a_bad_baseline_fails_before_the_run(zoo_cli, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    result = zoo_cli(*ARGS, "--compare", "bad.json")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and "bad.json" in result.stderr
    assert not (tmp_path / "reports").exists()


def test_loadgen_scenarios_per_combination_keep_their_summaries(zoo_cli, tmp_path):
    result = zoo_cli("bench", "resnet8.digits", "--backends", "onnxruntime,tensorrt", "--random-init", "--scenario",
                     "singlestream,server", "--target-qps", "100", "--min-time", "0.5", "--report-dir", "lg")
    assert result.returncode == 0, result.stdout + result.stderr  # tensorrt: unsupported here, not a failure
    report = json.loads((tmp_path / "lg" / "report.json").read_text())
    runs = {(r["backend"], r["scenario"]): r for r in report["loadgen"]}
    for scenario in ("singlestream", "server"):
        ran = runs[("onnxruntime", scenario)]
        assert ran["valid"] and ran["p90_ms"] > 0, ran
        summary = tmp_path / "lg" / "loadgen" / "resnet8.digits.onnxruntime.fp32.cpu" / ran["summary"].split("/")[-2]
        assert "Result is : VALID" in (summary / "mlperf_log_summary.txt").read_text()
        assert runs[("tensorrt", scenario)]["status"] == "unsupported"
    assert runs[("onnxruntime", "server")]["target_qps"] == 100
    assert "LoadGen" in (tmp_path / "lg" / "report.md").read_text()
    lines = list(csv.DictReader((tmp_path / "lg" / "results.csv").open()))  # one per run, not a header only
    assert [(r["backend"], r["scenario"], r["valid"]) for r in lines] == [
        ("onnxruntime", "singlestream", "True"), ("onnxruntime", "server", "True"),
        ("tensorrt", "singlestream", "False"), ("tensorrt", "server", "False")]


def _baseline(tmp_path, **row) -> str:
    """A one-row baseline report, with `row`'s fields over a sound ok row."""
    sound = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "fp32", "device": "cpu", "batch": 1,
             "lengths": {}, "status": "ok", "p50_ms": 0.1, "noise": 0.01}
    (tmp_path / "base.json").write_text(json.dumps({"environment": {}, "results": [{**sound, **row}]}))
    return "base.json"


@pytest.mark.parametrize("args, message", [
    (["--device", "CPU"], "--device: unknown 'CPU'; choose from cpu"),
    (["--precision", "fp32,fp23"], "--precision: unknown 'fp23'; choose from fp32"),
    (["--sigmas", "-1", "--compare", "base.json"], "--sigmas must be a non-negative number, got -1"),
    (["--min-change", "-0.05", "--compare", "base.json"], "--min-change must be a non-negative number, got -0.05"),
    (["--min-time", "-1"], "--min-time must be a positive number, got -1"),
    (["--min-time", "0"], "--min-time must be a positive number, got 0"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--timeout", "0"], "--timeout must be a positive number, got 0"),
    (["--batch-sizes", "1,0"], "--batch-sizes must be at least 1, got 0"),
    (["--scenario", "server", "--target-qps", "-5"], "--target-qps must be a positive number, got -5"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "-2"], "--concurrency must be at least 1, got -2"),
    (["--url", "http://127.0.0.1:9", "--min-time", "0"], "--min-time must be a positive number, got 0"),
    (["--report-dir", "afile"], "--report-dir afile: exists and is not a directory"),
    (["--report-dir", "afile/sub"], "--report-dir afile/sub: afile is not a directory"),
    (["--output", "somedir/"], "--output somedir: is a directory"),
    (["--output", "afile/r.json"], "--output afile/r.json: afile is not a directory"),
    (["--url", "http://127.0.0.1:9", "--output", "somedir"], "--output somedir: is a directory"),
    (["--compare", "empty.json"], "empty.json has no results"),
    (["--compare", "noise.json"], "results[0] has noise 'abc'"),
])
def test_values_no_run_can_use_are_refused_before_it(tmp_path, monkeypatch, args, message):
    """Found after the run they cost all of it (a bad destination lost every measurement);
    some (an unknown device, no model) made every row a hole and passed --compare."""
    from typer.testing import CliRunner

    from zoo.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "somedir").mkdir()
    (tmp_path / "empty.json").write_text(json.dumps({"results": []}))
    (tmp_path / "noise.json").write_text((tmp_path / _baseline(tmp_path, noise="abc")).read_text())
    result = CliRunner().invoke(app, [*ARGS[:2], *args])
    assert result.exit_code == 1 and message in str(result.exception), (result.exception, result.output)
    assert not (tmp_path / "reports").exists() and not (tmp_path / "exports").exists()
    empty = CliRunner().invoke(app, ["bench", ""])
    assert empty.exit_code == 1 and "MODEL '' names no model" in str(empty.exception)


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "4"], "--concurrency does nothing without --url"),
    (["--model-name", "m"], "--model-name does nothing without --url"),
    (["--json-data"], "--json-data does nothing without --url"),
    (["--target-qps", "5"], "--target-qps does nothing without --scenario"),
    (["--find-qps", "--latency-bound-ms", "9"], "--find-qps, --latency-bound-ms do nothing without --scenario"),
    (["--url", "http://127.0.0.1:9", "--timeout", "5"], "--timeout does nothing with --url:"),
    (["--url", "http://127.0.0.1:9", "--target-qps", "5"], "--target-qps does nothing with --url:"),
    *[(["--url", "http://127.0.0.1:9", "--scenario", "server", "--target-qps", "5", *extra],
       f"{extra[0]} does nothing with --url and --scenario: LoadGen drives the server")
      for extra in (["--backends", "torch"], ["--precision", "int8"], ["--device", "cuda"], ["--random-init"],
                    ["--threads", "2"], ["--timeout", "5"])],
    (["--lengths", "8"], "--lengths 8: resnet8.digits has no sequence or atom axis"),
])
def test_options_a_mode_ignores_are_refused(tmp_path, monkeypatch, args, message):
    from typer.testing import CliRunner

    from zoo.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "resnet8.digits", *args])
    assert result.exit_code == 1 and message in str(result.exception), (result.exception, result.output)
    assert not (tmp_path / "exports").exists()


@pytest.mark.parametrize("args, message", [
    (["--min-time", "-1"], "error: --min-time must be a positive number, got -1"),
    (["--concurrency", "4"], "error: --concurrency does nothing without --url"),
    (["--device", "CPU"], "error: --device: unknown 'CPU'; choose from cpu"),
    # /proc takes no files, also for root (whom permission bits let write anywhere)
    (["--report-dir", "/proc/zoo-reports"], "error: --report-dir /proc/zoo-reports: /proc is not writable"),
    # found by an exploratory pass: each ran (a failed row, an export) or exited 1
    (["--backends", "nosuch"], "error: --backends: unknown 'nosuch'; choose from "),
    (["--batch-sizes", "100000"], "error: --batch-sizes: batch sizes [100000] are outside resnet8.digits's exported"),
    (["--scenario", "server"], "error: --scenario server needs --target-qps N, or --find-qps"),
    (["--sigmas", "2"], "error: --sigmas does nothing without --compare"),
])
def test_a_usage_error_exits_2_in_one_line_before_anything_runs(tmp_path, args, message):
    """As `zoo bench --help` says: 2 for a usage error (a failed run is 1), as a
    command-line parser's own errors; nothing is exported or written."""
    result = subprocess.run([sys.executable, "-m", "zoo", "bench", "resnet8.digits", "--backends", "onnxruntime",
                             *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    # defect 3 of the exploratory pass: options silently ignored
    (["--sigmas", "2"], "--sigmas does nothing without --compare: it sets the regression gate's threshold"),
    (["--min-change", "0.1"], "--min-change does nothing without --compare"),
    (["--scenario", "offline", "--target-qps", "5"], "--target-qps does nothing without the server scenario"),
    (["--scenario", "singlestream,offline", "--latency-bound-ms", "5"],
     "--latency-bound-ms does nothing without the server scenario"),
    (["--scenario", "server", "--find-qps", "--target-qps", "5"],
     "--target-qps does nothing with --find-qps: the search sets the QPS itself"),
    # defect 4: usage errors that exited 1, some after the run started
    (["--backends", "onnxruntime,nosuch"], "--backends: unknown 'nosuch'; choose from "),
    (["--scenario", "multistream"], "--scenario: unknown 'multistream'; choose from singlestream, offline, server"),
    (["--scenario", "server"], "--scenario server needs --target-qps N, or --find-qps"),
    (["--batch-sizes", "100000"], "--batch-sizes: batch sizes [100000] are outside resnet8.digits's exported range"),
    (["--scenario", "offline", "--batch-sizes", "100000"], "--batch-sizes: batch sizes [100000] are outside"),
    (["--lengths", "8"], "--lengths 8: resnet8.digits has no sequence or atom axis"),
    (["--batch-sizes", "a"], "--batch-sizes: expected whole numbers separated by commas, got 'a'"),
    (["--lengths", "8,x"], "--lengths: expected whole numbers separated by commas, got '8,x'"),
    (["--url", "http://127.0.0.1:9", "--concurrency", "1,two"], "--concurrency: expected whole numbers"),
    (["--url", "ftp://127.0.0.1:9"], "--url must be http://HOST:PORT or grpc://HOST:PORT"),
    (["--url", "grpc://127.0.0.1:9"], "give --metrics-url http://HOST:PORT"),
    (["--url", "ftp://127.0.0.1:9", "--scenario", "offline"], "--url must be http://HOST:PORT with --scenario"),
    # defect 5: LoadGen against a gRPC port failed after starting
    (["--url", "grpc://127.0.0.1:9", "--scenario", "singlestream"],
     "--url grpc://127.0.0.1:9: --scenario drives the server with LoadGen over HTTP"),
    # defect 7: an empty --report-dir wrote into the working directory
    (["--backends", "nosuch", "--report-dir", ""], "--report-dir is empty"),
])
def test_usage_errors_exit_2_before_anything_runs(tmp_path, monkeypatch, args, message):
    """Each a `UsageError` (`zoo.cli.main` exits with its exit_code, 2) naming the option,
    raised before any export, measurement, load or report."""
    from typer.testing import CliRunner

    from zoo.cli import app
    from zoo.errors import UsageError

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "resnet8.digits", *args])
    assert isinstance(result.exception, UsageError), (result.exception, result.output)
    assert result.exception.exit_code == 2 and message in str(result.exception), str(result.exception)
    assert not any(tmp_path.iterdir())


def test_lengths_outside_the_models_axis_are_a_usage_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from zoo.cli import app
    from zoo.errors import UsageError

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "minilm-l6.all-v2", "--backends", "onnxruntime", "--lengths", "100000"])
    assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2, result.exception
    assert "--lengths: seq lengths [100000] are outside minilm-l6.all-v2's exported range" in str(result.exception)
    assert not any(tmp_path.iterdir())


def test_no_model_and_no_artifact_is_not_called_both_and_help_names_every_exit_1():
    from typer.testing import CliRunner

    from zoo.cli import app

    neither = CliRunner().invoke(app, ["bench"])
    assert str(neither.exception) == ("name MODEL(s) to export and measure, or --artifact to measure existing "
                                      "artifacts"), neither.exception
    text = " ".join(CliRunner().invoke(app, ["bench", "--help"], terminal_width=200).output.split())
    assert "compared nothing" in text and "too noisy" in text


def test_two_artifacts_alike_are_refused_with_compare_and_told_apart_without(zoo_cli, tmp_path):
    """`--artifact a/X --artifact b/X --compare B` measured both, then failed "the current
    report measures (...) twice" and wrote no report. Now refused before measuring (exit 2);
    without --compare both are measured, each row naming its artifact's path."""
    import shutil

    import zoo

    art = zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=tmp_path / "a",
                     random_init=True)
    shutil.copytree(art.path, tmp_path / "b" / art.name)
    args = ["bench", "--artifact", f"a/{art.name}", "--artifact", f"b/{art.name}", "--batch-sizes", "1",
            "--min-time", "0.05"]
    refused = zoo_cli(*args, "--compare", _baseline(tmp_path), "--report-dir", "r")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.startswith(f"error: --artifact a/{art.name} and b/{art.name} are both resnet8.digits "
                                      "onnxruntime fp32 cpu: --compare pairs rows by"), refused.stderr
    assert not (tmp_path / "r").exists()
    both = zoo_cli(*args, "--report-dir", "r", "--json")
    assert both.returncode == 0, both.stderr[-3000:]
    rows = json.loads(both.stdout)["results"]
    assert [(r["status"], r["artifact_path"]) for r in rows] == [("ok", f"a/{art.name}"), ("ok", f"b/{art.name}")]


def test_the_report_is_written_before_a_comparison_that_cannot_pair_rows(tmp_path):
    """The gate's own error (here: a report that measures one row twice) comes after the
    report is written, so the measurements are kept."""
    from zoo.cli_bench import _report
    from zoo.errors import ZooError

    row = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "fp32", "device": "cpu", "batch": 1,
           "lengths": {}, "status": "ok", "p50_ms": 0.1, "p90_ms": 0.1, "p99_ms": 0.1, "throughput": 1e4,
           "noise": 0.01}
    report = {"models": ["resnet8.digits"], "environment": {"cpu": "x"}, "results": [row, dict(row)]}
    with pytest.raises(ZooError, match="--compare base.json: the current report measures .* twice"):
        _report(report, tmp_path / "r", {"environment": {}, "results": [row]}, None, as_json=True, sigmas=3.0,
                min_change=0.05, strict=False, compare_path="base.json")
    assert json.loads((tmp_path / "r" / "report.json").read_text())["results"] == [row, row]


def test_strict_fails_the_gate_on_a_row_too_noisy_to_judge(tmp_path, monkeypatch):
    """A slowdown inside a threshold a 2x change would pass is not "unchanged": counted as
    too noisy, exit 0 without --strict (with a note) and 1 with it."""
    from typer.testing import CliRunner

    import zoo.bench
    from zoo.cli import app

    monkeypatch.chdir(tmp_path)
    now = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "fp32", "device": "cpu", "batch": 1,
           "lengths": {}, "status": "ok", "p50_ms": 0.67, "p90_ms": 0.7, "p99_ms": 0.8, "throughput": 1500.0,
           "noise": 0.02}
    # no measurement: the run's report is made here, the gate and its exit code are what is tested
    monkeypatch.setattr(zoo.bench, "benchmark", lambda *a, **k: {"models": ["resnet8.digits"], "options": {},
                                                                   "environment": {"cpu": "x"}, "results": [now]})
    _baseline(tmp_path, p50_ms=0.1, noise=57.4)
    args = ["bench", "resnet8.digits", "--random-init", "--backends", "onnxruntime", "--batch-sizes", "1", "--compare",
            "base.json"]
    lenient = CliRunner().invoke(app, [*args, "--report-dir", "a"], terminal_width=250)
    assert lenient.exit_code == 0, (lenient.exception, lenient.output)
    assert "too noisy: 1, unchanged: 0" in lenient.output and "--strict fails the gate on them" in lenient.output
    strict = CliRunner().invoke(app, [*args, "--report-dir", "b", "--strict"], terminal_width=250)
    assert strict.exit_code == 1 and "too noisy: 1" in strict.output, (strict.exception, strict.output)
    assert (tmp_path / "b" / "report.json").is_file()


@pytest.mark.parametrize("done", [0, 1])
def test_ctrl_c_writes_the_report_of_what_finished_or_nothing_and_exits_130(tmp_path, monkeypatch, done):
    """`zoo bench --scenario` interrupted: a complete report of the runs done before Ctrl-C,
    or no report directory at all when none was; exit 130 either way."""
    from zoo.bench import scenarios
    from zoo.bench.matrix import Interrupted
    from zoo.cli import main

    run = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "fp32", "device": "cpu",
           "scenario": "offline", "target": "in-process", "valid": True, "reasons": [], "p50_ms": 1.0}

    def interrupted(*args, **kwargs):
        raise Interrupted({"models": ["resnet8.digits"], "environment": {"cpu": "x"}, "options": {}, "results": [],
                           "loadgen": [run] * done})

    monkeypatch.setattr(scenarios, "loadgen", interrupted)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", "bench", "resnet8.digits", "--random-init", "--backends", "onnxruntime",
                                      "--scenario",
                                      "offline", "--report-dir", "lg"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 130
    if not done:
        assert not (tmp_path / "lg").exists()
        return
    report = json.loads((tmp_path / "lg" / "report.json").read_text())
    assert report["interrupted"] is True and report["loadgen"] == [run]
    assert len(list(csv.DictReader((tmp_path / "lg" / "results.csv").open()))) == 1


def test_ctrl_c_in_the_matrix_keeps_the_finished_combinations(tmp_path, monkeypatch):
    """The plain matrix: Ctrl-C during the second combination, the first one's rows kept."""
    import zoo
    from zoo.bench import matrix

    def combination(job, timeout):
        if job["backend"] == "openvino":
            raise KeyboardInterrupt
        return "failed", "exporter said no"

    monkeypatch.setattr(matrix, "combination", combination)
    with pytest.raises(matrix.Interrupted) as caught:
        zoo.benchmark("resnet8.digits", ["onnxruntime", "openvino", "torch"], [1], repository=tmp_path, random_init=True)
    report = caught.value.report
    assert report["interrupted"] and [(r["backend"], r["status"]) for r in report["results"]] == [
        ("onnxruntime", "failed")]
