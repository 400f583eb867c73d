"""`zoo optimize`'s usage errors: an option value no run can use exits 2 (as `zoo bench`'s
do), and an empty --backends or --precisions list is refused, not read as "all of them".
All are refused before anything is benchmarked or written."""

from __future__ import annotations

import sys

import pytest

import zoo
import zoo.optimize
from zoo import cli
from zoo.errors import UsageError
from zoo.optimize import optimize


@pytest.fixture(autouse=True)
def no_benchmark(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran: the option should have been refused first")

    monkeypatch.setattr(zoo.optimize, "benchmark", refuse)


@pytest.mark.parametrize("options, match", [
    (dict(backends=[]), "at least one backend"),
    (dict(precisions=[]), "at least one precision"),
    (dict(objective="speed"), "unknown objective"),
    (dict(batch=0), "outside"),
    (dict(min_time=0), "--min-time"),
    (dict(threads=0), "--threads"),
    (dict(max_metric_drop=-1.0), ">= 0"),
    (dict(max_metric_drop=float("inf")), "a finite number >= 0"),  # was written to the manifest as Infinity
])
def test_options_no_run_can_use_are_usage_errors(tmp_path, options, match):
    with pytest.raises(UsageError, match=match):
        optimize(zoo.get_model("resnet8.digits").tiny(), repository=tmp_path / "exports", random_init=True,
                 **options)
    assert not (tmp_path / "exports").exists()


@pytest.mark.parametrize("args, match", [
    (["--backends", ","], "at least one backend"),
    (["--backends", ""], "at least one backend"),
    (["--precisions", ","], "at least one precision"),
    (["--objective", "speed"], "unknown objective"),
    (["--batch", "0"], "outside"),
    (["--max-metric-drop", "nan"], ">= 0"),
    # names no run can know: usage errors as in `zoo bench`, not exit-1 library errors
    (["--backends", "nosuch"], "--backends: unknown backend 'nosuch'"),
    (["--precisions", "int4"], "--precisions: unknown int4"),
    (["--device", "tpu"], "--device: unknown 'tpu'; choose from cpu"),
    # a repository that cannot be written, found before the candidates rather than at the final rename
    (["-r", "afile"], "--repository afile: exists and is not a directory"),
    (["-r", "afile/sub"], "--repository afile/sub: afile is not a directory"),
    (["-r", "/proc/zz"], "--repository /proc/zz: /proc is not writable"),
])
def test_the_cli_exits_2_on_a_usage_error(tmp_path, monkeypatch, capsys, args, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(sys, "argv", ["zoo", "optimize", "resnet8.digits", "--random-init", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "exports").exists()


def test_a_missing_checkpoint_is_refused_once_before_any_candidate(tmp_path, monkeypatch, capsys):
    """Without a checkpoint (and without --random-init) every candidate's export would fail
    alike: one line naming what to run, as `zoo export` gives, not one failed row per candidate."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", "optimize", "resnet8.digits", "--objective", "latency",
                                      "--max-metric-drop", "0.01", "-r", "optA"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("error: no checkpoint for resnet8.digits at checkpoints/resnet8.digits: run "
                               "`zoo train resnet8.digits` first") and "--random-init" in lines[0]
    assert list(tmp_path.iterdir()) == []


STOPPED_IN_AN_EXPORT = """
import os, signal, sys, time
import zoo.optimize
from zoo import cli

def benchmark(spec, backends, batch_sizes, precisions, device, staging, **kwargs):
    (staging / ".resnet8.digits.onnxruntime.fp32.tmp-1").mkdir()  # an export under way
    os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` sends it
    time.sleep(60)

zoo.optimize.benchmark = benchmark
sys.argv = ["zoo", "optimize", "resnet8.digits", "--random-init", "--backends", "onnxruntime", "-r", "x"]
cli.main()
"""


def test_sigterm_removes_the_staging_directory_as_ctrl_c_does(tmp_path):
    """`timeout 8 zoo optimize ...` left x/.optimize-NNN/.MODEL...tmp-XXXX/ behind: SIGTERM
    ended the process before the `finally` that removes the staging directory. Now it is
    Ctrl-C's path, and the exit status a shell reports for SIGTERM (143)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", STOPPED_IN_AN_EXPORT], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 128 + 15, (done.returncode, done.stderr[-2000:])
    assert not (tmp_path / "x").exists()  # made by this run: no staging, and no empty repository


@pytest.mark.parametrize("model", ["resnet*", "all", "resnet8.digits,ppo.cartpole"])
def test_optimize_takes_one_model_and_says_so(tmp_path, monkeypatch, capsys, model):
    """`zoo optimize 'resnet*'` said "unknown model 'resnet*'; did you mean resnet50, resnet18?"."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", "optimize", model, "--random-init"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: zoo optimize takes one model, got {model!r}: name one")


def test_precision_is_an_alias_of_precisions_as_bench_spells_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", "optimize", "resnet8.digits", "--random-init", "--precision", "int4"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2 and "--precisions: unknown int4" in capsys.readouterr().err


def test_the_table_names_the_int8_method_and_a_change_that_rounds_to_zero_is_0(capsys):
    """As `zoo bench` shows "int8 (static)"; "metric change -0.0000" is 0, and a drop of
    nothing is 0.0 in the manifest, not -0.0."""
    import json
    import math

    from rich.console import Console

    from zoo.cli_bench import print_bench
    from zoo.optimize import _drop, print_optimize

    row = {"model": "resnet8.digits", "backend": "onnxruntime", "precision": "int8", "quantization": "static",
           "device": "cpu", "batch": 1, "status": "ok", "p50_ms": 0.1, "p90_ms": 0.1, "p99_ms": 0.1,
           "throughput": 10.0, "max_abs_error": 0.01, "metric_delta": -1e-6, "higher_is_better": True}
    result = {"model": "resnet8.digits", "objective": "latency", "device": "cpu", "batch": 1, "max_metric_drop": None,
              "candidates": [{**row, "decision": "chosen", "reason": "the fastest"}],
              "chosen": {"backend": "onnxruntime", "precision": "int8", "quantization": "static"},
              "figures": {"p50_ms": 0.1}, "path": "exports/resnet8.digits.optimized.latency.cpu"}
    console = Console(record=True, width=250)
    print_optimize(result, console)
    text = console.export_text()
    assert "int8 (static)" in text and "onnxruntime int8 (static), p50 ms" in text, text
    assert "-0.0000" not in text and "│ 0 " in text, text
    print_bench({"models": ["resnet8.digits"], "environment": {"cpu": "x"}, "results": [row]})
    terminal = capsys.readouterr().out
    assert "int8 (static)" in terminal and "-0.0000" not in terminal, terminal
    drop = _drop(zoo.get_model("resnet8.digits"), {"metric_delta": 0.0, "higher_is_better": True})
    assert math.copysign(1, drop) == 1 and json.dumps(drop) == "0.0"
