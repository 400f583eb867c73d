"""The --compare gate through `zoo bench`: a run whose rows pair with the baseline's but
none of which was measured in both (unsupported on both sides) compared nothing, so it
fails (exit 1) saying so; and the gate's verdict is kept in the report directory
(report.json's "comparison", report.md's section), not only on --json's stdout. The
run's report is made here (`zoo.bench.benchmark` replaced): the gate is what is tested."""

from __future__ import annotations

import json

import pytest

from zoo.errors import ZooError

ROW = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "fp32", "device": "cpu", "batch": 1,
       "lengths": {}}
OK = {**ROW, "status": "ok", "p50_ms": 0.1, "p90_ms": 0.1, "p99_ms": 0.1, "throughput": 1e4, "noise": 0.01}
UNSUPPORTED = {**ROW, "backend": "openvino", "status": "unsupported", "error": "openvino is not installed"}


def gate(tmp_path, monkeypatch, base: list[dict], now: list[dict]):
    from typer.testing import CliRunner

    import zoo.bench
    from zoo.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(zoo.bench, "benchmark", lambda *a, **k: {"models": ["resnet8.digits"], "options": {},
                                                                   "environment": {"cpu": "x"}, "results": now})
    (tmp_path / "base.json").write_text(json.dumps({"environment": {"cpu": "x"}, "results": base}))
    return CliRunner().invoke(app, ["bench", "resnet8.digits", "--random-init", "--backends", "onnxruntime,openvino",
                                    "--batch-sizes", "1", "--compare", "base.json", "--report-dir", "r"],
                              terminal_width=250)


def test_pairs_unsupported_on_both_sides_compared_nothing_and_fail_the_gate(tmp_path, monkeypatch):
    done = gate(tmp_path, monkeypatch, [UNSUPPORTED, {**OK, "batch": 4}], [UNSUPPORTED, OK])
    assert "unchanged: 1, missing: 1, new: 1" in done.output
    assert isinstance(done.exception, ZooError) and done.exception.exit_code == 1, (done.exception, done.output)
    assert "no row paired with the baseline's was measured (ok) in both runs" in str(done.exception)
    assert str(done.exception).endswith("so nothing was compared")
    assert (tmp_path / "r" / "report.json").is_file()  # the measurements are kept


@pytest.mark.parametrize("p50_ms, verdict", [(0.1, "unchanged"), (0.3, "regressions")])
def test_the_gates_verdict_is_kept_in_the_report_directory(tmp_path, monkeypatch, p50_ms, verdict):
    done = gate(tmp_path, monkeypatch, [OK], [{**OK, "p50_ms": p50_ms}])
    assert done.exit_code == (1 if verdict == "regressions" else 0), (done.exception, done.output)
    saved = json.loads((tmp_path / "r" / "report.json").read_text())["comparison"]
    assert saved["baseline"] == "base.json" and len(saved[verdict]) == 1
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Against the baseline" in md and "Baseline: base.json." in md
    assert f"{verdict.replace('_', ' ')}: 1" in md
    if verdict == "regressions":
        assert "| regressions | resnet8.digits | onnxruntime |" in md and "3.00x" in md and "slower" in md
