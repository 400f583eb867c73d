"""Benchmark reports on disk: the full JSON, a flat CSV, a markdown summary and PNG plots
in one directory, and the reader that checks a report before anything compares with it.

Each file is written through a temporary sibling and renamed (zoo.fsutil), so a CI job
killed mid-write never leaves a half-written baseline. Only the report's own files are
replaced, or removed (`clear_report`, once a run into a directory that holds an earlier
report has written its own): the directory may hold other things (`--report-dir .`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ZooError
from ..fsutil import atomic_write_bytes, atomic_write_text
from .stats import row_key

Row = Mapping[str, Any]
IDENTITY = ("model", "backend", "precision", "device", "status")
#: "refused": exported, then refused by verification (parity, test vectors, metric drop)
STATUSES = ("ok", "failed", "unsupported", "refused")
#: CSV columns in this order; fields a row has beyond these follow, sorted, then `error`.
CSV_FIELDS = ("model", "backend", "precision", "device", "batch", "lengths", "status", "p50_ms", "p90_ms", "p99_ms",
              "mean_ms", "std_ms", "throughput", "iterations", "noise", "max_abs_error", "metric_name", "metric",
              "metric_reference", "metric_delta", "higher_is_better", "quantization", "export_seconds",
              "load_seconds", "artifact_bytes", "peak_host_mb", "peak_cuda_mb")


def precision_label(row: Row) -> str:
    """`int8 (dynamic)`: a row's precision with the int8 method it measured, if any."""
    return str(row.get("precision") or "") + (f" ({row['quantization']})" if row.get("quantization") else "")


def signed(value: float | None, decimals: int = 4) -> str:
    """A change with its sign (`+0.0123`, `-0.0400`), "0" where it rounds to zero ("-0.0000"
    read as a loss), "" for none."""
    if value is None:
        return ""
    return "0" if round(value, decimals) == 0 else f"{value:+.{decimals}f}"


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a `zoo bench` JSON report and check every field the regression gate reads
    (zoo.bench.compare), so that a bad baseline fails with its reason before a long run."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ZooError(f"no benchmark report at {path}: write one with `zoo bench ... --report-dir DIR` "
                       "and pass DIR/report.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ZooError(f"cannot read the benchmark report {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ZooError(f"{path} is not JSON ({exc}); pass the report.json that `zoo bench` wrote") from None
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise ZooError(f"{path} is not a benchmark report: it has no \"results\" list")
    if not report["results"]:
        raise ZooError(f"{path} has no results: a baseline needs measured rows to compare with")
    env = report.get("environment")
    if env is not None and not isinstance(env, dict):
        raise ZooError(f"{path}: environment is {env!r}; expected an object")
    libraries = (env or {}).get("libraries")
    if libraries is not None and not (isinstance(libraries, list) and all(isinstance(x, str) for x in libraries)):
        raise ZooError(f"{path}: environment.libraries is {libraries!r}; expected a list of library names")
    for i, row in enumerate(report["results"]):
        _check_row(f"{path}: results[{i}]", row)
    seen: set[tuple] = set()
    for row in report["results"]:
        if row_key(row) in seen:
            raise ZooError(f"{path} measures {row_key(row)} twice; compare reports of one run each")
        seen.add(row_key(row))
    return report


def _number(value: Any) -> bool:
    """A finite JSON number (JSON readers accept Infinity and NaN; no comparison can use them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_row(where: str, row: Any) -> None:
    if not isinstance(row, dict):
        raise ZooError(f"{where} is not an object")
    missing = [k for k in IDENTITY if not isinstance(row.get(k), str)]
    if missing:
        raise ZooError(f"{where} lacks {', '.join(missing)}; it is not a `zoo bench` row")
    if row["status"] not in STATUSES:
        raise ZooError(f"{where} has status {row['status']!r}, not one of {', '.join(STATUSES)}")
    batch = row.get("batch")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ZooError(f"{where} has batch {batch!r}; expected a positive integer")
    if row["status"] == "ok" and not (batch is not None and _number(row.get("p50_ms")) and row["p50_ms"] > 0):
        raise ZooError(f"{where} is ok but has no batch size or positive p50_ms (got {row.get('p50_ms')!r})")
    lengths = row.get("lengths") or {}
    if not (isinstance(lengths, dict) and all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in lengths.values())):
        raise ZooError(f"{where} has lengths {row['lengths']!r}; expected e.g. {{\"seq\": 128}}")
    noise = row.get("noise")
    if noise is not None and not (_number(noise) and noise >= 0):
        raise ZooError(f"{where} has noise {noise!r}; expected a non-negative number")
    if row.get("metric") is not None and not _number(row["metric"]):
        raise ZooError(f"{where} has metric {row['metric']!r}; expected a number")
    if row.get("higher_is_better") is not None and not isinstance(row["higher_is_better"], bool):
        raise ZooError(f"{where} has higher_is_better {row['higher_is_better']!r}; expected true or false")
    if row.get("error") is not None and not isinstance(row["error"], str):
        raise ZooError(f"{where} has error {row['error']!r}; expected a message")


#: what `zoo bench --scenario` keeps LoadGen's logs in, inside the report directory
LOADGEN_DIR = "loadgen"


def report_files() -> list[str]:
    """The names `write_report` may write, in its order (each plot's, whether drawn or not)."""
    from .plots import PLOTS

    return ["report.json", "results.csv", "report.md", *(name for name, _ in PLOTS.values())]


def report_snapshot(directory: str | Path) -> dict[str, tuple[int, int]]:
    """The report files in `directory` now, each by identity (inode, mtime): what a write
    that replaces a file (through a renamed temporary, zoo.fsutil) changes."""
    snapshot = {}
    for name in report_files():
        with contextlib.suppress(OSError):
            st = (Path(directory) / name).lstat()
            snapshot[name] = (st.st_ino, st.st_mtime_ns)
    return snapshot


def unreplaced(directory: str | Path, before: Mapping[str, tuple[int, int]]) -> list[str]:
    """The names in `before` (a `report_snapshot`) that are still the same files: an earlier
    report's that the write since has not replaced."""
    now = report_snapshot(directory)
    return [name for name, identity in before.items() if now.get(name) == identity]


def clear_report(directory: str | Path, names: list[str] | None = None, loadgen: bool = True) -> None:
    """Remove an earlier report from `directory`: the files `write_report` writes (or those of
    them in `names`) and, with `loadgen`, `loadgen/`; nothing else. Called once the new report
    is written (an interrupted or failed run leaves the earlier report whole; a --scenario run
    moves the earlier loadgen/ aside while LoadGen writes its own, `cli_bench._loadgen_aside`): a run into a
    reused directory would otherwise leave the plots (or LoadGen logs) of the earlier run that
    this one does not make beside its own."""
    import shutil

    directory = Path(directory)
    try:
        for name in report_files() if names is None else names:  # files only: a directory of that name is not
            if (directory / name).is_file() or (directory / name).is_symlink():  # a report's (writing says so)
                (directory / name).unlink()
        if not loadgen:
            return
        if (directory / LOADGEN_DIR).is_symlink():
            (directory / LOADGEN_DIR).unlink()
        elif (directory / LOADGEN_DIR).is_dir():
            shutil.rmtree(directory / LOADGEN_DIR)
    except OSError as exc:
        raise ZooError(f"cannot remove the earlier report in {directory}: {exc.strerror or exc}") from None


def write_report(report: Mapping[str, Any], directory: str | Path) -> dict[str, Path]:
    """Write report.json, results.csv, report.md and the PNG plots into `directory`;
    return {kind: path} for every file written (a plot with no data is left out)."""
    try:
        from . import plots
    except ImportError as exc:  # matplotlib is what draws the plots
        raise ZooError(f"the PNG plots need matplotlib ({exc}); install it with `pip install matplotlib`") from None
    directory = Path(directory)
    texts = {"json": ("report.json", json.dumps(report, indent=2, default=_json_default) + "\n"),
             "csv": ("results.csv", to_csv(report)), "markdown": ("report.md", markdown(report))}
    written = {}
    try:
        for kind, (name, text) in texts.items():
            atomic_write_text(directory / name, text)
            written[kind] = directory / name
        for kind, (name, png) in plots.render(report).items():
            atomic_write_bytes(directory / name, png)
            written[kind] = directory / name
    except OSError as exc:
        raise ZooError(f"cannot write the benchmark report into {directory}: {exc.strerror or exc}") from None
    return written


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"a benchmark report holds a {type(value).__name__}, which JSON cannot represent")


def _lengths(lengths: Mapping[str, Any] | None) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted((lengths or {}).items()))


def _csv_cell(key: str, value: Any) -> Any:
    if key == "lengths":
        return _lengths(value)
    if value is None:
        return ""
    if key == "reasons" and isinstance(value, list):
        return "; ".join(" ".join(str(v).split()) for v in value)  # as the tables print them
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str):
        return " ".join(value.split())  # one line per row, even for multi-line errors
    return value


def to_csv(report: Mapping[str, Any]) -> str:
    """One line per row, every field, in a stable column order; in a LoadGen report
    (`zoo bench --scenario`, whose rows are LoadGen runs), one line per run, each point
    of a `--find-qps` search included (`peak` marks the one found)."""
    flag = {"interrupted": True} if report.get("interrupted") else {}  # on every line: no CSV passes for a whole run
    rows = [{**r, **flag} for r in report["results"]]
    if not rows and report.get("loadgen"):
        from .loadgen_report import FIELDS, runs

        rows = [{**r, **flag} for r in runs(report["loadgen"])]
        columns = [*FIELDS, *sorted({k for r in rows for k in r} - set(FIELDS))]
    else:
        present = {k for r in rows for k in r}
        columns = [*CSV_FIELDS, *sorted(present - set(CSV_FIELDS) - {"error"}), "error"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _csv_cell(k, r.get(k)) for k in columns})
    return buf.getvalue()


def _num(value: Any, digits: int = 3) -> str:
    """`digits` significant figures, never in exponent form: 0.0123, 4.56, 789, 12345."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value == 0 or isinstance(value, int):
        return str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def _err(value: float | None) -> str:
    return "" if value is None else f"{value:.2g}"  # 1.9e-07: the exponent is what matters


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else _num(value)
    return " ".join(text.split()).replace("|", "\\|")


def _md_table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]


def _models(report: Mapping[str, Any]) -> list[str]:
    names = list(report.get("models") or ([report["model"]] if report.get("model") else []))
    return names + [m for m in dict.fromkeys(r["model"] for r in report["results"]) if m not in names]


def baseline_backend(report: Mapping[str, Any]) -> str | None:
    """What speed-ups are against: the first backend of the run (`--backends`, whose default
    starts with eager PyTorch) that measured fp32; any backend plugin can be it."""
    rows = [r for r in report["results"] if r["status"] == "ok" and r["precision"] == "fp32"]
    order = list((report.get("options") or {}).get("backends") or ()) + [r["backend"] for r in rows]
    return next((b for b in order if any(r["backend"] == b for r in rows)), None)


def _speedups(rows: list[Row], baseline: str | None) -> dict[tuple, float]:
    """p50 of the baseline backend at fp32 at each device, batch and lengths."""
    return {(r["device"], r.get("batch"), _lengths(r.get("lengths"))): r["p50_ms"] for r in rows
            if r["status"] == "ok" and r["backend"] == baseline and r["precision"] == "fp32"}


def _model_section(model: str, rows: list[Row], baseline: str | None) -> list[str]:
    ok = [r for r in rows if r["status"] == "ok"]
    lines = [f"## {model}", ""]
    if ok:
        base = _speedups(ok, baseline)
        show_lengths = any(r.get("lengths") for r in ok)
        show_cuda = any(r.get("peak_cuda_mb") is not None for r in ok)
        metric = next((r["metric_name"] for r in ok if r.get("metric_name")), "metric")
        columns = ["backend", "precision", "device", "batch", *(["lengths"] if show_lengths else []),
                   "p50 ms", "p90 ms", "p99 ms", "samples/s", f"vs {baseline} fp32", "host MB",
                   *(["GPU MB"] if show_cuda else []), "export s", "load s", "size MB", "max \\|err\\|",
                   metric, "change"]
        table = []
        for r in ok:
            ref = base.get((r["device"], r.get("batch"), _lengths(r.get("lengths"))))
            size = None if r.get("artifact_bytes") is None else r["artifact_bytes"] / 1e6
            delta = r.get("metric_delta")
            table.append([r["backend"], precision_label(r), r["device"], r["batch"],
                          *([_lengths(r.get("lengths")).replace(";", " ")] if show_lengths else []),
                          r["p50_ms"], r.get("p90_ms"), r.get("p99_ms"), r.get("throughput"),
                          "" if ref is None else f"{ref / r['p50_ms']:.2f}x", r.get("peak_host_mb"),
                          *([r.get("peak_cuda_mb")] if show_cuda else []), r.get("export_seconds"),
                          r.get("load_seconds"), size, _err(r.get("max_abs_error")), _num(r.get("metric"), 4),
                          signed(delta)])
        lines += _md_table(columns, table) + [""]
    for r in rows:
        if r["status"] != "ok":
            where = " ".join(str(v) for v in (r["backend"], precision_label(r), r["device"]))
            batch = "" if r.get("batch") is None else f" batch {r['batch']}"
            lines.append(f"- {where}{batch}: **{r['status']}**: {' '.join(str(r.get('error', '')).split())}")
    if any(r["status"] != "ok" for r in rows):
        lines.append("")
    return lines


def _loadgen_section(results: list[Row]) -> list[str]:
    """MLPerf LoadGen results: one row per run (each point of a `--find-qps` search, the
    peak it found marked), as the terminal shows them, and the peak each search found."""
    from .loadgen_report import peak_lines, runs, scenario_label, verdict

    columns = ["model", "backend", "precision", "device", "scenario", "result", "target QPS", "samples/s", "p50 ms",
               "p90 ms", "p99 ms", "bound ms", "queries", "why not valid"]
    cells = [[r.get("model") or r.get("target"), r.get("backend"), precision_label(r), r.get("device"),
              scenario_label(r), f"**{verdict(r)}**" if r.get("peak") else verdict(r), r.get("target_qps"),
              r.get("samples_per_second"), r.get("p50_ms"), r.get("p90_ms"), r.get("p99_ms"),
              r.get("latency_bound_ms"), r.get("queries"), "; ".join(r.get("reasons") or [])]
             for r in runs(results)]
    peaks = [f"- {line}" for line in peak_lines(results)]
    return ["## LoadGen scenarios", "", *_md_table(columns, cells), "", *peaks, *([""] if peaks else [])]


def markdown(report: Mapping[str, Any]) -> str:
    """The environment, one table per model (speed-ups against the run's first backend at
    fp32, eager PyTorch by default, in the same run), the rows that were not measured with
    their reasons, and LoadGen results; first, for an interrupted run, that it was."""
    lines = ["# Benchmark report", ""]
    if report.get("interrupted"):
        lines += ["**Interrupted: this run was stopped (Ctrl-C) before it finished.** Only the combinations that "
                  "finished before it are here.", ""]
    lines += ["## Environment", ""]
    for key, value in (report.get("environment") or {}).items():
        if key == "nodes" and isinstance(value, dict):  # a Ray sweep's: each node's environment, a line each
            lines += ["- nodes (Ray):", *(f"  - {name}: {json.dumps(facts)}" for name, facts in value.items())]
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else value
        lines.append(f"- {key}: `{text}`" if key == "command" else f"- {key}: {text}")
    if report.get("options"):
        lines += ["", "Options: " + ", ".join(f"{k}={v}" for k, v in report["options"].items())]
    lines.append("")
    baseline = baseline_backend(report)
    for model in _models(report):
        rows = [r for r in report["results"] if r["model"] == model]
        if rows:  # a LoadGen report's models have LoadGen runs only, in their own section
            lines += _model_section(model, rows, baseline)
    if report.get("loadgen"):
        lines += _loadgen_section(report["loadgen"])
    if report.get("comparison"):
        lines += _comparison_section(report["comparison"])
    return "\n".join(lines)


def _comparison_section(result: Mapping[str, Any]) -> list[str]:
    """The --compare gate's verdict, as the terminal printed it: the counts, then every row
    that did not stay unchanged, so that the report directory says why a gate failed."""
    kinds = ("regressions", "improvements", "too_noisy", "unchanged", "missing", "new")
    counts = ", ".join(f"{k.replace('_', ' ')}: {len(result.get(k, ()))}" for k in kinds)
    columns = ["verdict", "model", "backend", "precision", "device", "batch", "lengths", "baseline p50 ms",
               "current p50 ms", "ratio", "threshold", "why"]
    cells = [[k.replace("_", " "), e.get("model"), e.get("backend"), e.get("precision"), e.get("device"),
              e.get("batch"), _lengths(e.get("lengths")), e.get("baseline_p50_ms"), e.get("current_p50_ms"),
              "" if e.get("ratio") is None else f"{e['ratio']:.2f}x",
              "" if e.get("threshold") is None else f"±{e['threshold']:.1%}", "; ".join(e.get("reasons") or [])]
             for k in kinds if k != "unchanged" for e in result.get(k, ())]
    lines = ["## Against the baseline", "", f"Baseline: {result.get('baseline', 'not recorded')}. {counts}.", ""]
    return lines + ([*_md_table(columns, cells), ""] if cells else [])
