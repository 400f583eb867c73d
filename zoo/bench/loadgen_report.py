"""What LoadGen said about a run, as a result dict and a table.

LoadGen writes a human summary (mlperf_log_summary.txt, kept with the report) and a
detail log whose `:::MLLOG {json}` lines are structured records (`result_validity`,
`result_99.00_percentile_latency_ns`, `early_stopping_met` ...): the numbers and the
verdict are read from those records rather than from the summary's wording.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ZooError
from .report import precision_label


def read_detail(path: Path) -> dict[str, Any]:
    """The `:::MLLOG {json}` records of a LoadGen detail log, key -> value (last wins)."""
    records: dict[str, Any] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise ZooError(f"LoadGen wrote no detail log at {path}: {exc}") from None
    for line in lines:
        if line.startswith(":::MLLOG "):
            try:
                entry = json.loads(line[len(":::MLLOG "):])
            except ValueError:
                continue
            records[entry.get("key")] = entry.get("value")
    return records


def result(scenario: str, s: Mapping[str, Any], d: Mapping[str, Any], errors: Sequence[str], failed: int,
           batch: int, concurrency: int, log_dir: Path) -> dict[str, Any]:
    """One run's result from its settings `s` and detail-log records `d`, with the SUT's
    failures (`errors`, and how many samples `failed`); fields in `run_scenario`.

    A run in which samples failed gives no samples/s (None) and says how many failed
    (`failed_samples`): LoadGen counts a sample answered with a failure as completed, so
    its rate (Server: "Completed samples per second") would count samples never served."""

    def ms(key: str) -> float | None:
        value = d.get(key)
        return round(value / 1e6, 4) if isinstance(value, (int, float)) else None

    rate_key = {"SingleStream": "result_qps_with_loadgen_overhead", "Offline": "result_samples_per_second",
                "Server": "result_completed_samples_per_sec"}[scenario]
    unmet = [name for name, key in (("latency", "result_perf_constraints_met"),
                                    ("min_duration", "result_min_duration_met"),
                                    ("min_queries", "result_min_queries_met"), ("early_stopping", "early_stopping_met"))
             if d.get(key) is False]
    p99 = ms("result_99.00_percentile_latency_ns")
    why = {"latency": f"p99 latency {p99:.2f} ms is over the {s['latency_bound_ms']:g} ms bound: lower the target QPS"
                      if p99 is not None else "the latency bound was not met",
           "min_duration": f"ran shorter than {s['duration_s']:g} s: {str(d.get('result_invalid_reason', '')).strip()}",
           "min_queries": f"fewer than {d.get('effective_min_query_count')} queries were issued",
           "early_stopping": _early_stopping(str(d.get("early_stopping_result", "")))}
    reasons = [f"{failed} samples failed: " + "; ".join(errors)] if errors else []  # the cause first
    reasons += [why[u] for u in unmet]
    if d.get("result_validity") not in ("VALID", "INVALID"):
        reasons.append("LoadGen recorded no result (see the detail log)")
    rate = None if failed or errors else d.get(rate_key)
    server = scenario == "Server"
    return {"valid": d.get("result_validity") == "VALID" and not errors, "reasons": reasons,
            "p50_ms": ms("result_50.00_percentile_latency_ns"), "p90_ms": ms("result_90.00_percentile_latency_ns"),
            "p99_ms": p99, "mean_ms": ms("result_mean_latency_ns"), "max_ms": ms("result_max_latency_ns"),
            "early_stopping_p90_ms": ms("early_stopping_latency_ss") if scenario == "SingleStream" else None,
            "samples_per_second": round(rate, 3) if isinstance(rate, (int, float)) else None,
            "target_qps": s["target_qps"] if server else None,
            "scheduled_qps": d.get("result_scheduled_samples_per_sec") if server else None,
            "latency_bound_ms": s["latency_bound_ms"] if server else None, "queries": d.get("result_query_count"),
            "batch": batch, "concurrency": concurrency, "duration_s": s["duration_s"], "errors": list(errors),
            "failed_samples": failed,
            "summary": str(log_dir / "mlperf_log_summary.txt"), "detail": str(log_dir / "mlperf_log_detail.txt"),
            "_unmet": unmet}  # for the caller's retry, removed before the result is returned


def _early_stopping(text: str) -> str:
    """LoadGen's early-stopping verdict in one line ("would need to run at least N more
    queries" is the useful part: more queries, or more headroom under the bound)."""
    more = re.search(r"at least (\d+) more queries", text)
    if more:
        return f"early stopping not satisfied: LoadGen needs at least {more.group(1)} more queries under the bound"
    return "early stopping not satisfied: " + " ".join(text.replace("*", "").split())


# ---------------------------------------------------------------- display

#: CSV columns of LoadGen runs (`zoo bench --scenario`'s results.csv), in this order;
#: fields a run has beyond these follow, sorted
FIELDS = ("model", "backend", "precision", "quantization", "device", "scenario", "target", "status", "valid",
          "search", "peak", "target_qps", "scheduled_qps", "samples_per_second", "p50_ms", "p90_ms", "p99_ms",
          "mean_ms", "max_ms", "early_stopping_p90_ms", "latency_bound_ms", "queries", "batch", "concurrency",
          "duration_s", "estimated_samples_per_second", "reasons", "summary", "detail")


def runs(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per LoadGen run: a scenario's result as it is, and each point a
    `--find-qps` search tried, with its combination's fields, `search` ("peak QPS") and
    `peak` (true on the point the search found: the highest VALID target QPS)."""
    flat = []
    for r in results:
        if "tried" not in r:
            flat.append(dict(r))
            continue
        label = {k: v for k, v in r.items() if k not in ("tried", "best", "peak_qps", "valid")}
        for point in r["tried"]:
            peak = bool(point.get("valid")) and point.get("target_qps") == r.get("peak_qps")
            flat.append({**label, **point, "search": "peak QPS", "peak": peak})
    return flat


def scenario_label(run: Mapping[str, Any]) -> str:
    """"server (peak)" for the point a search found, "server (search)" for its others."""
    if run.get("search"):
        return f"{run['scenario']} ({'peak' if run.get('peak') else 'search'})"
    return str(run.get("scenario") or "")


def verdict(run: Mapping[str, Any]) -> str:
    """VALID or INVALID (LoadGen's judgement), or why nothing was judged (unsupported, failed, refused)."""
    if run.get("status") in ("unsupported", "failed", "refused"):
        return run["status"]
    return "VALID" if run.get("valid") else "INVALID"


def peak_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per `--find-qps` search: the peak it found, or that none was VALID."""
    lines = []
    for r in results:
        if "tried" in r:
            who = " ".join(str(v) for v in (r.get("model"), r.get("backend"), precision_label(r), r.get("device"))
                           if v)
            found = ("none of the tried points was VALID" if r.get("peak_qps") is None
                     else f"{r['peak_qps']:.1f}")
            if r.get("at_schedule_limit"):
                found += " (the most LoadGen can schedule over the duration: the peak may be higher)"
            lines.append(f"{who + ': ' if who else ''}peak server QPS with p99 <= {r['latency_bound_ms']:g} ms: "
                         f"{found} ({len(r['tried'])} runs)")
    return lines


def print_loadgen(results: Sequence[Mapping[str, Any]], console, title: str = "MLPerf LoadGen scenarios") -> None:
    """A table of scenario results; a peak-QPS search shows each point it tried."""
    from rich.markup import escape
    from rich.table import Table

    table = Table("scenario", "target", "result", "target QPS", "samples/s", "p50 ms", "p90 ms", "p99 ms",
                  "bound ms", "queries", "why not valid", title=title)

    def f(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    def row(r: Mapping[str, Any]) -> None:
        # a combination of the matrix (zoo.bench.scenarios labels each result), else the target
        who = " ".join(str(v) for v in (r.get("model"), r.get("backend"), precision_label(r), r.get("device"))
                       if v) or r.get("target")
        table.add_row(scenario_label(r), escape(str(who or "")), verdict(r),
                      f(r.get("target_qps"), ".1f"), f(r.get("samples_per_second"), ".1f"), f(r.get("p50_ms")),
                      f(r.get("p90_ms")), f(r.get("p99_ms")), f(r.get("latency_bound_ms"), "g"),
                      str(r.get("queries") or "-"), escape("; ".join(r.get("reasons") or [])))

    for r in runs(results):
        row(r)
    table.caption = escape("\n".join(peak_lines(results))) or None
    console.print(table)
