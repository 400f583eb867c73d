"""`zoo bench` as CI uses it: a report directory in every format, then the regression gate
against a baseline, with the exit code a CI job reads."""

from __future__ import annotations

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
