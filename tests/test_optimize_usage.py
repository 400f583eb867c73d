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
])
def test_the_cli_exits_2_on_a_usage_error(tmp_path, monkeypatch, capsys, args, match):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", "optimize", "resnet8.digits", "--random-init", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "exports").exists()
