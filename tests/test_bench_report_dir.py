"""A report directory over several runs: a reused `--report-dir` holds one run's report,
never two mixed; an interrupted run's report says so in every format, and is refused as a
`--compare` baseline; Ctrl-C while the report is written says what is left. The runs are
stand-ins (`zoo.bench.benchmark` replaced): what is tested is what lands on disk."""

from __future__ import annotations

import csv
import json
import sys

import pytest
from typer.testing import CliRunner

import zoo.bench
from zoo.cli import app

ROW = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "fp32", "device": "cpu", "batch": 1,
       "lengths": {}, "status": "ok", "p50_ms": 0.67, "p90_ms": 0.7, "p99_ms": 0.8, "throughput": 1500.0,
       "noise": 0.02}
ARGS = ["bench", "resnet8.digits", "--random-init", "--backends", "onnxruntime", "--batch-sizes", "1",
        "--report-dir", "r"]


def run_with(monkeypatch, rows: list[dict], interrupted: bool = False):
    """`zoo.bench.benchmark` as a run that measured `rows` (or was interrupted after them)."""
    from zoo.bench.matrix import Interrupted

    def benchmark(*args, **kwargs):
        report = {"models": ["resnet8.digits"], "options": {"backends": ["onnxruntime"]},
                  "environment": {"cpu": "x"}, "results": rows}
        if interrupted:
            raise Interrupted(report)
        return report

    monkeypatch.setattr(zoo.bench, "benchmark", benchmark)


def test_a_reused_report_dir_holds_only_the_last_runs_report(tmp_path, monkeypatch):
    """The plots of a run that made them stayed beside the report of one that made none,
    and LoadGen's logs of an earlier run beside a later run's. Only a report's own names are
    removed: anything else in the directory stays."""
    monkeypatch.chdir(tmp_path)
    run_with(monkeypatch, [ROW])
    assert CliRunner().invoke(app, ARGS).exit_code == 0
    assert (tmp_path / "r" / "latency_vs_batch.png").is_file()
    (tmp_path / "r" / "loadgen" / "old").mkdir(parents=True)
    (tmp_path / "r" / "notes.txt").write_text("mine")
    run_with(monkeypatch, [{**ROW, "status": "failed", "error": "no", "p50_ms": None}])
    again = CliRunner().invoke(app, ARGS)
    assert again.exit_code == 1, again.output  # a failed row
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["notes.txt", "report.json", "report.md",
                                                                   "results.csv"]


def test_an_interrupted_report_says_so_in_every_file_and_is_no_baseline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_with(monkeypatch, [ROW], interrupted=True)
    stopped = CliRunner().invoke(app, ARGS)
    assert stopped.exit_code == 130, stopped.output
    assert json.loads((tmp_path / "r" / "report.json").read_text())["interrupted"] is True
    assert "Interrupted: this run was stopped" in (tmp_path / "r" / "report.md").read_text()
    line, = csv.DictReader((tmp_path / "r" / "results.csv").open())
    assert line["interrupted"] == "True"

    run_with(monkeypatch, [ROW])
    gated = CliRunner().invoke(app, [*ARGS[:-1], "now", "--compare", "r/report.json"])
    assert gated.exception.exit_code == 2 and not (tmp_path / "now").exists()
    assert str(gated.exception).startswith("--compare r/report.json is the report of an interrupted run"), \
        gated.exception


def test_ctrl_c_while_the_report_is_written_says_what_is_left(tmp_path, monkeypatch, capsys):
    from zoo.bench import plots
    from zoo.cli import main

    def interrupted(report, dpi=100):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    run_with(monkeypatch, [ROW])
    monkeypatch.setattr(plots, "render", interrupted)
    monkeypatch.setattr(sys, "argv", ["zoo", *ARGS])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interrupted while writing the report: r holds part of it (report.json, results.csv, report.md), each file "
        "complete")


def test_a_run_that_fails_or_is_stopped_before_its_report_leaves_the_earlier_one(tmp_path, monkeypatch):
    """The earlier report went before the run: Ctrl-C (or a crash) before any combination
    finished then left no report at all. It goes only when the new one is written."""
    monkeypatch.chdir(tmp_path)
    run_with(monkeypatch, [ROW])
    assert CliRunner().invoke(app, ARGS).exit_code == 0
    (tmp_path / "r" / "notes.txt").write_text("mine")
    earlier = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert "report.json" in earlier and "latency_vs_batch.png" in earlier
    run_with(monkeypatch, [], interrupted=True)  # Ctrl-C before any combination finished
    assert CliRunner().invoke(app, ARGS).exit_code == 130
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == earlier

    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(zoo.bench, "benchmark", crash)
    assert CliRunner().invoke(app, ARGS).exit_code != 0
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == earlier
    assert json.loads((tmp_path / "r" / "report.json").read_text())["results"] == [ROW]


def test_a_report_write_that_fails_part_way_leaves_no_file_of_the_earlier_run(tmp_path, monkeypatch):
    """A full disk while the plots were written left the new report.json beside the earlier
    run's plots: one directory, two runs. What the new report did not replace goes then too."""
    import errno

    import zoo.bench.report

    monkeypatch.chdir(tmp_path)
    run_with(monkeypatch, [ROW])
    assert CliRunner().invoke(app, ARGS).exit_code == 0
    assert (tmp_path / "r" / "latency_vs_batch.png").is_file()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zoo.bench.report, "atomic_write_bytes", full)
    run_with(monkeypatch, [{**ROW, "p50_ms": 9.99}])
    assert CliRunner().invoke(app, ARGS).exit_code == 1
    left = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert not [name for name in left if name.endswith(".png")], left
    assert json.loads((tmp_path / "r" / "report.json").read_text())["results"][0]["p50_ms"] == 9.99


def test_a_loadgen_run_that_fails_keeps_the_earlier_runs_logs(tmp_path, monkeypatch):
    """A --scenario run cleared loadgen/ before it ran (LoadGen writes there as it runs): one
    that failed left the earlier report without the logs it names. They wait aside now."""
    import zoo.cli_bench
    from zoo.errors import ZooError

    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "r" / "loadgen"
    logs.mkdir(parents=True)
    (logs / "mlperf_log_summary.txt").write_text("earlier")
    (tmp_path / "r" / "report.json").write_text(json.dumps({"loadgen": {"scenarios": []}}))

    def failing(o, directory):
        (directory / "loadgen").mkdir(exist_ok=True)
        (directory / "loadgen" / "mlperf_log_detail.txt").write_text("partial")
        raise ZooError("LoadGen failed")

    monkeypatch.setattr(zoo.cli_bench, "_loadgen", failing)
    result = CliRunner().invoke(app, ARGS + ["--scenario", "offline"])
    assert result.exit_code == 1, result.output
    assert sorted(p.name for p in logs.iterdir()) == ["mlperf_log_summary.txt"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["loadgen", "report.json"]
