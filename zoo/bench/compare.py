"""The regression gate of `zoo bench --compare BASELINE.json`: which rows got slower (or
worse at their task) by more than the runs' own noise, for use in CI.

A latency change counts only when it is larger than both a floor (`min_change`, 5 %:
what moves between two runs on the same machine even when each run looks steady) and
`sigmas` standard deviations of the noise the two runs measured themselves (stats.py:
the relative spread of block medians). The two noises are independent, so they add in
quadrature. Changes are judged on the ratio's log scale, so "2x slower" and "2x faster"
are equally far from "unchanged": a row is an improvement when baseline / current
exceeds 1 + threshold, just as it is a regression when current / baseline does.

The noise bound has a limit: where `sigmas` x noise exceeds `max_threshold` (100 %: the
gate could not tell a 2x slowdown from noise, as after a burst of another process in one
block of calls), a row that moved by more than the floor but within that threshold is
"too noisy" to judge, not "unchanged": it is listed and counted, and fails the gate with
`--strict`. A change beyond even that threshold is still a regression or an improvement,
and a change within the floor is unchanged, however noisy the runs were.

A row that was "ok" in the baseline and is not now is a regression. The task metric of
an artifact is computed on a fixed split, so it should not move at all between runs of
the same code; a metric worse than the baseline's by more than `metric_tolerance`
(relative) is a regression too. Rows present in only one report are listed as
"missing" or "new" and do not fail the gate: the two runs measured different matrices;
but when no row at all was paired, or none of the pairs was ok in both runs (both
unsupported, say), the gate fails, since it compared no measurement.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..errors import ZooError
from .stats import row_key

KEY_FIELDS = ("model", "backend", "precision", "device", "batch", "lengths")
#: environment fields that make two runs' timings incomparable when they differ, besides
#: the versions of every backend's libraries (`libraries` in the environment)
ENVIRONMENT = ("cpu", "cores", "gpu", "threads", "python", "numpy", "torch", "zoo")
#: the largest noise threshold (`sigmas` x noise) the gate judges a row by: above it a
#: 2x slowdown would pass as noise, so the row is "too noisy" instead of "unchanged"
MAX_THRESHOLD = 1.0
#: verdicts of paired rows, in the order they are printed
VERDICTS = ("regressions", "improvements", "too_noisy", "unchanged")


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any], sigmas: float = 3.0, min_change: float = 0.05,
            metric_tolerance: float = 0.01, max_threshold: float = MAX_THRESHOLD) -> dict[str, Any]:
    """Pair the rows of two reports by `row_key` and sort each pair into regressions,
    improvements, too_noisy (moved beyond the floor, but the runs' noise times `sigmas`
    exceeds `max_threshold`, so the gate cannot judge it) or unchanged; rows in one
    report only go to "missing" or "new".

    Every entry has the key fields, both statuses, both p50s, ratio (current / baseline
    p50), threshold, the measured noises and `reasons` ("slower", "failed now: ...",
    "metric", "faster", "ok now", "too noisy: ..."). `threshold` in the result records the gate's settings;
    `environment` names what differs between the two machines (numbers from different
    machines or thread counts are not comparable, and the reader should know).
    """
    if sigmas < 0 or min_change < 0 or metric_tolerance < 0 or not max_threshold > 0:
        raise ZooError("sigmas, min_change and metric_tolerance must not be negative, max_threshold must be positive")
    result: dict[str, Any] = {**{k: [] for k in VERDICTS}, "missing": [], "new": [],
                              "threshold": {"sigmas": sigmas, "min_change": min_change,
                                            "metric_tolerance": metric_tolerance, "max_threshold": max_threshold}}
    pairs, missing, new = _pair(baseline["results"], current["results"])
    for base, cur in pairs:
        entry = _judge(base, cur, sigmas, min_change, metric_tolerance, max_threshold)
        verdict = entry.pop("verdict")
        result[verdict].append(entry)
    result["missing"] = [_identity(r) | {"baseline_status": r.get("status")} for r in missing]
    result["new"] = [_identity(r) | {"current_status": r.get("status")} for r in new]
    envs = baseline.get("environment") or {}, current.get("environment") or {}
    libraries = sorted(set(envs[0].get("libraries") or ()) | set(envs[1].get("libraries") or ()))
    result["environment"] = {k: [envs[0].get(k), envs[1].get(k)] for k in (*ENVIRONMENT, *libraries)
                             if envs[0].get(k) != envs[1].get(k)}
    return result


def _coarse(row: Mapping[str, Any]) -> tuple:
    return (row["model"], row["backend"], row["precision"], row["device"])


def _pair(base_rows: list, cur_rows: list) -> tuple[list[tuple[dict, dict]], list[dict], list[dict]]:
    """Match rows by their full key. A row that is not ok may carry no batch (the backend
    failed before any batch was measured); it then stands for every batch of its
    model/backend/precision/device on the other side."""
    for name, rows in (("baseline", base_rows), ("current", cur_rows)):
        dup = next((k for k, n in Counter(map(row_key, rows)).items() if n > 1), None)
        if dup is not None:
            raise ZooError(f"the {name} report measures {dup} twice; compare reports of one run each")
    cur_by_key = {row_key(r): r for r in cur_rows}
    pairs, left_base = [], []
    for b in base_rows:
        c = cur_by_key.pop(row_key(b), None)
        if c is None:
            left_base.append(b)
        else:
            pairs.append((b, c))
    left_cur = list(cur_by_key.values())
    for rows, others, is_base in ((left_base, left_cur, True), (left_cur, left_base, False)):
        for wild in [r for r in rows if r.get("batch") is None and r.get("status") != "ok"]:
            matches = [r for r in others if r.get("batch") is not None and _coarse(r) == _coarse(wild)]
            if matches:
                rows.remove(wild)
            for m in matches:
                others.remove(m)
                pairs.append((wild, m) if is_base else (m, wild))
    return pairs, left_base, left_cur


def _identity(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in KEY_FIELDS}


def _judge(base: Mapping[str, Any], cur: Mapping[str, Any], sigmas: float, min_change: float,
           metric_tolerance: float, max_threshold: float = MAX_THRESHOLD) -> dict[str, Any]:
    ok_base, ok_cur = base.get("status") == "ok", cur.get("status") == "ok"
    entry = _identity(base if base.get("batch") is not None else cur) | {
        "baseline_status": base.get("status"), "current_status": cur.get("status"),
        "baseline_p50_ms": base.get("p50_ms"), "current_p50_ms": cur.get("p50_ms"), "ratio": None, "threshold": None,
        "baseline_noise": base.get("noise"), "current_noise": cur.get("noise"), "reasons": []}
    if not ok_base:  # nothing to hold the current row against
        entry["verdict"] = "improvements" if ok_cur else "unchanged"
        if ok_cur:
            entry["reasons"].append("ok now")
        return entry
    if not ok_cur:
        entry["reasons"].append(f"{cur.get('status')} now: {cur.get('error') or 'no reason given'}")
        entry["verdict"] = "regressions"
        return entry
    noise = math.hypot(base.get("noise") or 0.0, cur.get("noise") or 0.0)
    threshold = max(min_change, sigmas * noise)
    ratio = cur["p50_ms"] / base["p50_ms"]
    entry |= {"ratio": ratio, "threshold": threshold}
    if ratio > 1 + threshold:
        entry["reasons"].append("slower")
    metric = _metric_change(base, cur)
    if metric is not None:
        entry |= {"baseline_metric": base["metric"], "current_metric": cur["metric"]}
        if metric < -metric_tolerance:
            entry["reasons"].append("metric")
    if entry["reasons"]:
        entry["verdict"] = "regressions"
    elif 1 / ratio > 1 + threshold:
        entry["reasons"].append("faster")
        entry["verdict"] = "improvements"
    elif sigmas * noise > max_threshold and max(ratio, 1 / ratio) > 1 + min_change:
        # moved beyond the floor, within a threshold so wide that a 2x slowdown would pass
        entry["reasons"].append(f"too noisy: {sigmas:g} x noise {noise:.0%} > {max_threshold:.0%}")
        entry["verdict"] = "too_noisy"
    else:
        entry["verdict"] = "unchanged"
    return entry


def _metric_change(base: Mapping[str, Any], cur: Mapping[str, Any]) -> float | None:
    """Relative change of the task metric, positive when better; None when either side
    has no metric or the direction is unknown."""
    b, c = base.get("metric"), cur.get("metric")
    higher = next((r["higher_is_better"] for r in (cur, base) if r.get("higher_is_better") is not None), None)
    if b is None or c is None or higher is None:
        return None
    change = (c - b) / max(abs(b), 1e-12)
    return change if higher else -change


def compared(result: Mapping[str, Any]) -> int:
    """How many baseline rows were paired with a current row: none means the two runs
    measured different matrices, and a gate that compared nothing has passed nothing."""
    return sum(len(result.get(k, ())) for k in VERDICTS)


def measured(result: Mapping[str, Any]) -> int:
    """How many paired rows were ok in both runs, so that a timing was held against a timing:
    a pair unsupported (or failed) on both sides is "unchanged" with nothing measured, and a
    gate that saw only such pairs has passed nothing."""
    return sum(1 for k in VERDICTS for e in result.get(k, ())
               if e.get("baseline_status") == "ok" and e.get("current_status") == "ok")


def failed(result: Mapping[str, Any], strict: bool = False) -> bool:
    """Whether the gate fails: any regression, or no row measured in both runs (nothing
    compared; the CLI exits non-zero); with `strict`, also any row too noisy to judge."""
    return bool(result["regressions"]) or not measured(result) or (strict and bool(result.get("too_noisy")))


def print_comparison(result: Mapping[str, Any], console) -> None:
    """A rich table of every row that changed (regressions first), and a summary line."""
    from rich.markup import escape
    from rich.table import Table

    kinds = ("regressions", "improvements", "too_noisy", "unchanged", "missing", "new")
    counts = {k: len(result.get(k, ())) for k in kinds}
    t = result["threshold"]
    table = Table("verdict", "model", "backend", "precision", "device", "batch", "lengths", "baseline p50 ms",
                  "current p50 ms", "ratio", "threshold", "why",
                  title=f"against the baseline (change > max({t['min_change']:.0%}, {t['sigmas']:g} x noise))")
    styles = {"regressions": "red", "improvements": "green", "too_noisy": "magenta", "missing": "yellow",
              "new": "cyan"}
    for kind, style in styles.items():
        for e in result.get(kind, ()):
            threshold = "" if e.get("threshold") is None else f"±{e['threshold']:.1%}"
            cells = [_verdict(kind), e["model"], e["backend"], e["precision"], e["device"], e.get("batch"),
                     _lengths(e.get("lengths")), _ms(e.get("baseline_p50_ms")), _ms(e.get("current_p50_ms")),
                     "" if e.get("ratio") is None else f"{e['ratio']:.2f}x", threshold, "; ".join(e.get("reasons", []))]
            table.add_row(*(f"[{style}]{escape(str(cells[0]))}[/]",
                            *("" if v is None else escape(str(v)) for v in cells[1:])))
    if table.row_count:
        console.print(table)
    differs = result.get("environment") or {}
    if differs:
        console.print(f"[yellow]warning:[/] the baseline ran in another environment ({escape(', '.join(differs))}): "
                      "its timings may not be comparable with these", highlight=False)
    for key, (base, cur) in differs.items():
        console.print(f"[yellow]note:[/] {escape(key)} differs: baseline {escape(_recorded(base))}, "
                      f"now {escape(_recorded(cur))}", highlight=False)
    if counts["too_noisy"]:
        bound = t.get("max_threshold", MAX_THRESHOLD)
        console.print(f"[magenta]note:[/] {counts['too_noisy']} row(s) moved by more than {t['min_change']:.0%} "
                      f"but were too noisy to judge ({t['sigmas']:g} x noise over {bound:.0%}: a "
                      f"{1 + bound:g}x slowdown would pass as noise); they are not counted as unchanged. Rerun on "
                      "an idle machine, or with a longer --min-time; --strict fails the gate on them.")
    console.print(", ".join(f"{k.replace('_', ' ')}: {n}" for k, n in counts.items()))


def _recorded(value: Any) -> str:
    return "not recorded" if value is None else str(value)  # a report from before the field was kept


def _verdict(kind: str) -> str:
    return "too noisy" if kind == "too_noisy" else kind.rstrip("s")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _lengths(lengths: Mapping[str, int] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted((lengths or {}).items()))
