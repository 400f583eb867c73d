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
