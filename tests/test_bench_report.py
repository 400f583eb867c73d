"""Benchmark reports and the regression gate, on reports built from known timings: the
statistics of a run, `compare` against a baseline, and every file `write_report` writes."""

from __future__ import annotations

import copy
import csv
import io
import json

import numpy as np
import pytest
from PIL import Image

from zoo.bench.compare import compare, failed, measured, print_comparison
from zoo.bench.report import load_report, markdown, to_csv, write_report
from zoo.bench.stats import noise, row_key, summarize
from zoo.errors import ZooError

# (model, backend, precision, quantization, ms at batch 1, lengths, metric)
SERIES = [
    ("resnet8.digits", "torch", "fp32", None, 0.50, {}, 0.9694),
    ("resnet8.digits", "onnxruntime", "fp32", None, 0.20, {}, 0.9694),
    ("resnet8.digits", "onnxruntime", "int8", "static", 0.12, {}, 0.9667),
    ("minilm-l6.all-v2", "torch", "fp32", None, 8.0, {"seq": 128}, None),
    ("minilm-l6.all-v2", "openvino", "fp32", None, 4.0, {"seq": 128}, None),
]
BATCHES = (1, 8, 32)
JITTER = 0.02  # lognormal sigma of single calls: a steady machine


def timings(ms: float, batch: int, rng: np.random.Generator, n: int = 200) -> np.ndarray:
    """Seconds per call around a base latency that grows sublinearly with the batch."""
    return ms * batch**0.7 / 1e3 * rng.lognormal(0.0, JITTER, n)


def measured_row(model, backend, precision, quantization, ms, lengths, metric, batch, rng, slowdown=1.0) -> dict:
    row = {"model": model, "backend": backend, "precision": precision, "device": "cpu", "batch": batch,
           "lengths": lengths, "status": "ok", **summarize(timings(ms * slowdown, batch, rng), batch),
           "max_abs_error": 0.0 if backend == "torch" else 2e-7, "metric_name": "accuracy" if metric else None,
           "metric": metric, "metric_reference": 0.9694 if metric else None,
           "metric_delta": None if metric is None else metric - 0.9694, "higher_is_better": True if metric else None,
           "quantization": quantization, "export_seconds": 1.5, "load_seconds": 0.2, "artifact_bytes": 320_000,
           "peak_host_mb": 410.0, "peak_cuda_mb": None}
    return row


def build_report(seed: int, slow: dict | None = None) -> dict:
    """A run of the matrix; `slow` maps row keys to a planted slowdown factor."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, backend, precision, quant, ms, lengths, metric in SERIES:
        for batch in BATCHES[:2] if lengths else BATCHES:
            row = measured_row(model, backend, precision, quant, ms, lengths, metric, batch, rng)
            factor = (slow or {}).get(row_key(row), 1.0)
            if factor != 1.0:
                row = measured_row(model, backend, precision, quant, ms, lengths, metric, batch, rng, factor)
            rows.append(row)
    rows.append({"model": "resnet8.digits", "backend": "torch", "precision": "int8", "device": "cpu",
                 "status": "unsupported", "error": "backend torch does not support int8 on cpu"})
    rows.append({"model": "resnet8.digits", "backend": "tensorrt", "precision": "fp32", "device": "cpu",
                 "status": "failed", "error": "tensorrt needs an NVIDIA GPU\nand the tensorrt package"})
    return {"models": ["resnet8.digits", "minilm-l6.all-v2"],
            "environment": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.13.0+cpu", "threads": 2,
                            "command": "zoo bench resnet8.digits minilm-l6.all-v2"},
            "options": {"min_time": 1.0}, "results": rows}


def key(model, backend, precision, batch, lengths=None) -> tuple:
    return row_key({"model": model, "backend": backend, "precision": precision, "device": "cpu", "batch": batch,
                    "lengths": lengths or {}})


def keys(entries) -> set[tuple]:
    return {row_key(e) for e in entries}


# --- statistics of one run ---------------------------------------------------------------

def test_summarize_percentiles_and_throughput_of_known_timings():
    times = np.arange(1, 101) / 1e3  # 1..100 ms
    s = summarize(times, batch=4)
    # linear interpolation between order statistics: p = 1 + q * 99 ms
    assert s["p50_ms"] == pytest.approx(50.5)
    assert s["p90_ms"] == pytest.approx(90.1)
    assert s["p99_ms"] == pytest.approx(99.01)
    assert s["mean_ms"] == pytest.approx(50.5)
    assert s["throughput"] == pytest.approx(4 / 0.0505)
    assert s["iterations"] == 100


def test_noise_is_zero_when_steady_and_large_after_a_step():
    assert noise(np.full(100, 0.002)) == 0.0
    step = np.r_[np.full(50, 0.001), np.full(50, 0.002)]  # block medians 1, 1, 1.5, 2, 2 ms
    assert noise(step) == pytest.approx(np.std([1, 1, 1.5, 2, 2], ddof=1) / 1.5)
    jitter = np.random.default_rng(0).lognormal(0, JITTER, 200)
    assert noise(jitter) < JITTER < noise(step)


# --- the regression gate ------------------------------------------------------------------

def test_a_planted_2x_slowdown_is_flagged_on_exactly_its_rows():
    planted = {key("resnet8.digits", "onnxruntime", "fp32", 8): 2.0,
               key("minilm-l6.all-v2", "openvino", "fp32", 1, {"seq": 128}): 2.0}
    result = compare(build_report(seed=1), build_report(seed=2, slow=planted))
    assert keys(result["regressions"]) == set(planted)
    for e in result["regressions"]:
        assert e["ratio"] == pytest.approx(2.0, rel=0.05) and e["reasons"] == ["slower"]
        assert e["threshold"] == pytest.approx(0.05)  # a steady run: the floor, not the noise, decides
    assert not result["improvements"] and not result["missing"] and not result["new"]
    assert not result["environment"]
    assert failed(result)


def test_a_remeasurement_with_noise_sized_jitter_passes():
    result = compare(build_report(seed=1), build_report(seed=2))
    assert not result["regressions"] and not result["improvements"]
    assert len(result["unchanged"]) == len(build_report(seed=1)["results"])
    assert not failed(result)


def test_a_2x_speedup_is_an_improvement_not_a_regression():
    planted = {key("resnet8.digits", "torch", "fp32", 32): 0.5}
    result = compare(build_report(seed=1), build_report(seed=2, slow=planted))
    assert not result["regressions"]
    assert keys(result["improvements"]) == set(planted)


def test_the_threshold_grows_with_the_measured_noise():
    base, cur = build_report(seed=1), build_report(seed=2, slow={key("resnet8.digits", "torch", "fp32", 1): 1.3})
    assert len(compare(base, cur)["regressions"]) == 1
    for row in base["results"] + cur["results"]:
        if row.get("noise") is not None:
            row["noise"] = 0.1  # a run whose block medians moved by 10 %: 30 % is within 3 sigma
    result = compare(base, cur)
    assert not result["regressions"]
    assert result["unchanged"][0]["threshold"] == pytest.approx(3 * np.hypot(0.1, 0.1))


def test_a_change_within_a_noise_too_large_to_judge_is_too_noisy_not_unchanged():
    """The exploratory pass's case: a baseline whose block medians moved by 5743 % made the
    threshold 3 x 57.4, so torch batch 8 going from 1.36 ms to 9.15 ms (6.7x) passed as
    "unchanged", exit 0. Such a row is "too noisy": listed, counted, failing with strict."""
    from rich.console import Console

    base, cur = build_report(seed=1), build_report(seed=2)
    slow = key("resnet8.digits", "torch", "fp32", 8)
    for report, p50, row_noise in ((base, 1.36, 57.4), (cur, 9.15, 0.02)):
        row = next(r for r in report["results"] if r["status"] == "ok" and row_key(r) == slow)
        row.update(p50_ms=p50, noise=row_noise)
    result = compare(base, cur)
    assert keys(result["too_noisy"]) == {slow} and slow not in keys(result["unchanged"])
    entry, = result["too_noisy"]
    assert entry["ratio"] == pytest.approx(9.15 / 1.36) and entry["reasons"] == ["too noisy: 3 x noise 5740% > 100%"]
    assert not result["regressions"] and not failed(result) and failed(result, strict=True)
    console = Console(file=io.StringIO(), width=250)
    print_comparison(result, console)
    text = console.file.getvalue()
    assert f"too noisy: 1, unchanged: {len(base['results']) - 1}," in text
    assert "--strict fails the gate on them" in text

    # the bound is on sigmas x noise: 3 x hypot(0.25, 0.25) = 106 % is over it, 3 x hypot(0.1, 0.1) = 42 % is not
    for row_noise, verdict in ((0.25, "too_noisy"), (0.1, "unchanged")):
        for report in (base, cur):
            next(r for r in report["results"] if r["status"] == "ok" and row_key(r) == slow)["noise"] = row_noise
        for report, p50 in ((base, 1.36), (cur, 1.36 * 1.3)):
            next(r for r in report["results"] if r["status"] == "ok" and row_key(r) == slow)["p50_ms"] = p50
        assert slow in keys(compare(base, cur)[verdict]), (row_noise, verdict)
    # however noisy: a change within the floor is unchanged, and one beyond the threshold is still a regression
    for report, p50 in ((base, 1.36), (cur, 1.36 * 1.03)):
        next(r for r in report["results"] if r["status"] == "ok" and row_key(r) == slow).update(p50_ms=p50, noise=0.5)
    assert slow in keys(compare(base, cur)["unchanged"])
    next(r for r in cur["results"] if r["status"] == "ok" and row_key(r) == slow)["p50_ms"] = 1.36 * 4
    assert keys(compare(base, cur)["regressions"]) == {slow}


def test_a_row_that_fails_now_is_a_regression_and_one_that_works_now_an_improvement():
    base, cur = build_report(seed=1), build_report(seed=2)
    cur["results"] = [r for r in cur["results"] if (r["backend"], r["precision"]) != ("onnxruntime", "int8")]
    cur["results"].append({"model": "resnet8.digits", "backend": "onnxruntime", "precision": "int8",
                           "device": "cpu", "status": "failed", "error": "the benchmark process crashed"})
    result = compare(base, cur)
    assert keys(result["regressions"]) == {key("resnet8.digits", "onnxruntime", "int8", b) for b in BATCHES}
    assert all("crashed" in e["reasons"][0] for e in result["regressions"])
    assert not result["missing"] and not result["new"]
    back = compare(cur, base)
    assert not back["regressions"]
    assert keys(back["improvements"]) == {key("resnet8.digits", "onnxruntime", "int8", b) for b in BATCHES}


def test_rows_in_one_report_only_are_listed_but_pass():
    base, cur = build_report(seed=1), build_report(seed=2)
    dropped = cur["results"].pop(0)
    cur["results"].append({**cur["results"][0], "batch": 64})
    result = compare(base, cur)
    assert keys(result["missing"]) == {row_key(dropped)}
    assert keys(result["new"]) == {row_key(cur["results"][-1])}
    assert not failed(result)


def test_a_worse_task_metric_is_a_regression():
    base, cur = build_report(seed=1), build_report(seed=2)
    for row in cur["results"]:
        if row["precision"] == "int8" and row["status"] == "ok":
            row["metric"] = 0.90  # 7 % below the baseline's 0.9667
    result = compare(base, cur)
    assert keys(result["regressions"]) == {key("resnet8.digits", "onnxruntime", "int8", b) for b in BATCHES}
    assert all(e["reasons"] == ["metric"] for e in result["regressions"])


def test_print_comparison_names_the_regression():
    from rich.console import Console

    planted = {key("resnet8.digits", "onnxruntime", "fp32", 8): 2.0}
    current = build_report(seed=2, slow=planted)
    current["environment"]["threads"] = 16
    result = compare(build_report(seed=1), current)
    assert result["environment"] == {"threads": [2, 16]}
    console = Console(file=io.StringIO(), width=250)
    print_comparison(result, console)
    text = console.file.getvalue()
    assert "regression" in text and "onnxruntime" in text and "2.0" in text and "regressions: 1" in text
    assert "threads differs: baseline 2, now 16" in text


# --- reading and writing reports ----------------------------------------------------------

def test_load_report_round_trips_and_explains_what_is_wrong(tmp_path):
    report = build_report(seed=1)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert load_report(path) == report
    with pytest.raises(ZooError, match="no benchmark report at"):
        load_report(tmp_path / "absent.json")
    path.write_text("{not json")
    with pytest.raises(ZooError, match="is not JSON"):
        load_report(path)
    path.write_text(json.dumps({"model": "x"}))
    with pytest.raises(ZooError, match="no \"results\" list"):
        load_report(path)
    bad = copy.deepcopy(report)
    del bad["results"][3]["backend"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ZooError, match=r"results\[3\] lacks backend"):
        load_report(path)
    bad = copy.deepcopy(report)
    bad["results"][0]["p50_ms"] = None
    path.write_text(json.dumps(bad))
    with pytest.raises(ZooError, match=r"results\[0\] is ok but has no .* p50_ms"):
        load_report(path)


@pytest.mark.parametrize("where, value, message", [
    ("noise", "abc", r"results\[0\] has noise 'abc'"), ("noise", -0.1, "has noise -0.1"),
    ("p50_ms", float("inf"), r"results\[0\] is ok but has no .* p50_ms \(got inf\)"),
    ("metric", "x", "has metric 'x'; expected a number"), ("metric", float("nan"), "has metric nan"),
    ("lengths", {"seq": [1]}, r"has lengths \{'seq': \[1\]\}"), ("batch", "8", "has batch '8'"),
    ("higher_is_better", "yes", "has higher_is_better 'yes'"), ("error", 5, "has error 5"),
    ("libraries", 5, "environment.libraries is 5"), ("environment", [], "environment is \\[\\]"),
    ("duplicate", None, "measures .* twice"), ("empty", None, "has no results"),
])
def test_load_report_checks_every_field_the_gate_reads(tmp_path, where, value, message):
    """A malformed baseline was caught only when compared, after the run, often as a
    TypeError ("internal error"); JSON's Infinity and NaN read as floats."""
    report = build_report(seed=1)
    if where == "libraries":
        report["environment"]["libraries"] = value
    elif where == "environment":
        report["environment"] = value
    elif where == "duplicate":
        report["results"].append(dict(report["results"][0]))
    elif where == "empty":
        report["results"] = []
    else:
        report["results"][0][where] = value
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ZooError, match=message):
        load_report(path)


def test_a_comparison_that_paired_no_row_fails():
    """Every baseline row missing now (a typo'd device, an empty matrix) compared nothing:
    the gate must not pass it."""
    base, cur = build_report(seed=1), build_report(seed=2)
    for row in cur["results"]:
        row["device"] = "cuda"
    result = compare(base, cur)
    assert not result["regressions"] and len(result["missing"]) == len(base["results"])
    assert failed(result)
    assert failed(compare(base, {"results": []}))


def test_a_comparison_whose_pairs_were_measured_in_neither_run_fails():
    """Rows that pair but are unsupported (or failed) on both sides are "unchanged" with no
    timing held against a timing: only such pairs compared nothing, and fail the gate;
    one row ok in both runs is a comparison."""
    base, cur = build_report(seed=1), build_report(seed=2)
    for report in (base, cur):
        for row in report["results"]:
            row |= {"status": "unsupported", "error": "not installed", "p50_ms": None}
    result = compare(base, cur)
    assert len(result["unchanged"]) == len(base["results"]) and not result["regressions"]
    assert measured(result) == 0 and failed(result)
    base["results"][0], cur["results"][0] = build_report(seed=1)["results"][0], build_report(seed=2)["results"][0]
    assert measured(compare(base, cur)) == 1 and not failed(compare(base, cur))


def test_size_is_in_mb_of_a_million_bytes_in_the_terminal_and_the_markdown(capsys):
    from zoo.cli_bench import print_bench

    report = build_report(seed=1)
    for row in report["results"]:
        row["artifact_bytes"] = 3_500_000  # 3.34 MiB
    print_bench(report)
    terminal = capsys.readouterr().out
    assert "size MB (10^6 B)" in terminal and " 3.50 " in terminal and "3.34" not in terminal
    assert "| 3.50 |" in markdown(report)


def test_write_report_writes_every_format(tmp_path):
    report = build_report(seed=1)
    report["loadgen"] = [{"scenario": "SingleStream", "valid": True, "p90_ms": 0.61, "samples_per_s": 1650.2},
                         {"scenario": "Offline", "valid": False, "samples_per_s": 9000.0}]
    out = write_report(report, tmp_path / "bench")
    assert set(out) == {"json", "csv", "markdown", "latency_plot", "throughput_plot", "accuracy_plot"}
    assert load_report(out["json"]) == report
    assert sorted(p.name for p in (tmp_path / "bench").iterdir()) == sorted(p.name for p in out.values())

    rows = list(csv.DictReader(io.StringIO(out["csv"].read_text())))
    assert len(out["csv"].read_text().splitlines()) == len(report["results"]) + 1
    assert [(r["model"], r["backend"], r["precision"], r["batch"]) for r in rows] == [
        (r["model"], r["backend"], r["precision"], str(r.get("batch", ""))) for r in report["results"]]
    assert {r["lengths"] for r in rows if r["model"] == "minilm-l6.all-v2"} == {"seq=128"}
    assert float(rows[0]["p50_ms"]) == pytest.approx(report["results"][0]["p50_ms"])

    md = out["markdown"].read_text()
    for backend in {r["backend"] for r in report["results"]}:
        assert backend in md
    assert "AMD EPYC" in md and "seq=128" in md and "SingleStream" in md and "Offline" in md
    assert "**failed**: tensorrt needs an NVIDIA GPU and the tensorrt package" in md
    assert "**unsupported**" in md

    for kind in ("latency_plot", "throughput_plot", "accuracy_plot"):
        with Image.open(out[kind]) as image:
            image.verify()
        with Image.open(out[kind]) as image:
            assert image.format == "PNG" and 400 <= image.width <= 3000 and 300 <= image.height <= 3000


def test_markdown_speedups_are_against_torch_fp32_at_the_same_batch():
    report = build_report(seed=1)
    table = {(r["backend"], r["precision"], r["batch"]): r for r in report["results"]
             if r["status"] == "ok" and r["model"] == "resnet8.digits"}
    md = markdown(report)
    line = next(l for l in md.splitlines() if l.startswith("| onnxruntime | fp32 | cpu | 8 |"))
    expected = table[("torch", "fp32", 8)]["p50_ms"] / table[("onnxruntime", "fp32", 8)]["p50_ms"]
    assert f"| {expected:.2f}x |" in line
    assert "| 1.00x |" in next(l for l in md.splitlines() if l.startswith("| torch | fp32 | cpu | 1 |"))
    assert "int8 (static)" in md


def test_small_and_odd_reports_still_write(tmp_path):
    one = build_report(seed=1)
    one["results"] = one["results"][3:4]
    one["results"][0] |= {"metric": None, "metric_name": None}
    out = write_report(one, tmp_path / "one")
    assert {"latency_plot", "throughput_plot"} <= set(out) and "accuracy_plot" not in out  # no metric to plot
    none_ok = build_report(seed=1)
    none_ok["results"] = [r for r in none_ok["results"] if r["status"] != "ok"]
    out = write_report(none_ok, tmp_path / "none")
    assert set(out) == {"json", "csv", "markdown"}
    assert "tensorrt" in to_csv(none_ok)


def test_the_throughput_plot_orders_lengths_as_numbers():
    """seq=8 before seq=16 before seq=64 (sorted as text, seq=16 and seq=64 came before seq=8)."""
    from zoo.bench.plots import throughput

    report = build_report(seed=1)
    rng = np.random.default_rng(0)
    report["results"] = [measured_row("minilm-l6.all-v2", "onnxruntime", "fp32", None, 4.0, {"seq": n}, None, batch,
                                      rng) for batch in (1, 8) for n in (64, 8, 16)]
    ax = throughput(report).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == [f"batch {b}\nseq={n}" for b in (1, 8) for n in (8, 16, 64)]


def test_every_backend_library_version_is_compared(tmp_path):
    """A third-party backend's library is named in the environment, and its upgrade between
    two runs is reported as making them incomparable, as ONNX Runtime's is."""
    from zoo.bench.env import environment

    env = environment()
    assert {"onnxruntime", "openvino"} <= set(env["libraries"]) and all(k in env for k in env["libraries"])
    baseline, current = build_report(seed=1), build_report(seed=1)
    for report, version in ((baseline, "1.0"), (current, "2.0")):
        report["environment"].update(libraries=["npu-runtime"], **{"npu-runtime": version})
    assert compare(baseline, current)["environment"] == {"npu-runtime": ["1.0", "2.0"]}


@pytest.mark.parametrize(("field", "before", "after"), [("python", "3.11.7", "3.12.4"), ("numpy", "1.26.4", "2.1.0"),
                                                       ("zoo", "0.1.0", "0.2.0")])
def test_a_baseline_from_another_python_numpy_or_zoo_is_named(field, before, after):
    """The interpreter, numpy and zoo itself change timings as a backend's library does: a
    baseline recorded under another one is named in the comparison and in its warning."""
    from rich.console import Console

    from zoo.bench.env import environment

    assert {"python", "numpy", "zoo"} <= set(environment())
    baseline, current = build_report(seed=1), build_report(seed=1)
    baseline["environment"][field], current["environment"][field] = before, after
    result = compare(baseline, current)
    assert result["environment"] == {field: [before, after]}
    console = Console(file=io.StringIO(), width=250)
    print_comparison(result, console)
    text = console.file.getvalue()
    assert f"another environment ({field})" in text and f"{field} differs: baseline {before}, now {after}" in text


def _point(qps: float, valid: bool, p99: float) -> dict:
    return {"scenario": "server", "target": "in-process", "valid": valid, "reasons": [] if valid else ["over"],
            "p50_ms": p99 / 4, "p90_ms": p99 / 2, "p99_ms": p99, "samples_per_second": qps * 0.99,
            "target_qps": qps, "latency_bound_ms": 20.0, "queries": round(qps), "summary": f"qps-{qps}/s.txt"}


def loadgen_report() -> dict:
    """`zoo bench --scenario offline,server --find-qps` on two combinations: one searched
    to a peak of 800 QPS, one whose every point was INVALID; and one unsupported."""
    label = {"model": "resnet8.digits", "precision": "fp32", "quantization": None, "device": "cpu"}
    tried = [_point(1000.0, False, 90.0), _point(500.0, True, 5.0), _point(800.0, True, 15.0)]
    runs = [{**label, "backend": "onnxruntime", "scenario": "offline", "target": "in-process", "valid": True,
             "reasons": [], "p50_ms": 40.0, "p99_ms": 60.0, "samples_per_second": 2500.0, "queries": 1},
            {**label, "backend": "onnxruntime", "scenario": "server", "peak_qps": 800.0, "latency_bound_ms": 20.0,
             "best": tried[2], "tried": tried, "valid": True},
            {**label, "backend": "openvino", "scenario": "server", "peak_qps": None, "latency_bound_ms": 20.0,
             "best": None, "tried": [_point(300.0, False, 50.0)], "valid": False},
            {**label, "backend": "tensorrt", "scenario": "offline", "status": "unsupported", "valid": False,
             "reasons": ["tensorrt needs an NVIDIA GPU"]}]
    return {"models": ["resnet8.digits"], "environment": {"cpu": "x"}, "options": {}, "results": [],
            "loadgen": runs}


def test_a_loadgen_reports_csv_has_a_line_per_run_and_marks_the_peak():
    lines = list(csv.DictReader(io.StringIO(to_csv(loadgen_report()))))
    assert [(r["backend"], r["scenario"], r["target_qps"], r["peak"]) for r in lines] == [
        ("onnxruntime", "offline", "", ""), ("onnxruntime", "server", "1000.0", "False"),
        ("onnxruntime", "server", "500.0", "False"), ("onnxruntime", "server", "800.0", "True"),
        ("openvino", "server", "300.0", "False"), ("tensorrt", "offline", "", "")]
    assert lines[0]["samples_per_second"] == "2500.0" and lines[3]["p99_ms"] == "15.0"
    assert lines[5]["status"] == "unsupported" and lines[5]["reasons"] == "tensorrt needs an NVIDIA GPU"


def test_a_loadgen_reports_markdown_shows_each_searchs_peak():
    md = markdown(loadgen_report())
    assert "## resnet8.digits" not in md  # no empty latency section: the runs are LoadGen's
    peak = next(line for line in md.splitlines() if "server (peak)" in line)
    assert "| onnxruntime |" in peak and "| **VALID** | 800 |" in peak and "| 15.0 |" in peak
    assert md.count("server (search)") == 3 and "{" not in md.split("## LoadGen")[1]  # no JSON in a cell
    assert "- resnet8.digits onnxruntime fp32 cpu: peak server QPS with p99 <= 20 ms: 800.0 (3 runs)" in md
    assert "openvino fp32 cpu: peak server QPS with p99 <= 20 ms: none of the tried points was VALID" in md


def test_speedups_are_against_the_runs_first_backend():
    """`zoo bench --backends npu,onnxruntime`: a third-party backend named first is the
    baseline, with the column saying so; without torch in the run, speed-ups still show."""
    report = build_report(seed=1)
    report["options"]["backends"] = ["onnxruntime", "torch"]
    md = markdown(report)
    assert "| vs onnxruntime fp32 |" in md and "vs torch fp32" not in md
    assert "| 1.00x |" in next(l for l in md.splitlines() if l.startswith("| onnxruntime | fp32 | cpu | 8 |"))
    report["results"] = [r for r in report["results"] if r["backend"] != "torch"]
    report["options"]["backends"] = ["torch", "onnxruntime"]  # torch asked for, none of it measured
    assert "| vs onnxruntime fp32 |" in markdown(report)
