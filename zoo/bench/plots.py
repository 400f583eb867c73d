"""PNG plots of a benchmark report: latency against batch size, throughput bars, and
task metric against speed. One subplot per model, one series per backend + precision.

Figures are built with the object API (`matplotlib.figure.Figure`), never pyplot: no
global figure state, no GUI backend, nothing shown; `Figure.savefig` renders through
Agg. This is how matplotlib's docs embed plots in a web server
(https://matplotlib.org/stable/gallery/user_interfaces/web_application_server_sgskip.html).
Only "ok" rows are plotted; a plot with nothing to show is left out.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from .report import precision_label

Row = Mapping[str, Any]
SUBPLOT_INCHES = (6.4, 4.2)


def _ok(report: Mapping[str, Any]) -> list[Row]:
    return [r for r in report["results"] if r.get("status") == "ok" and r.get("p50_ms") is not None]


def _by_model(rows: list[Row]) -> dict[str, list[Row]]:
    models: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        models[r["model"]].append(r)
    return dict(models)


def _lengths(row: Row) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted((row.get("lengths") or {}).items()))


def _point(row: Row) -> tuple:
    """Where a row sits on a batch axis, in numeric order: batch, then its lengths as numbers (seq=8 before seq=64)."""
    return row["batch"], tuple(sorted((row.get("lengths") or {}).items()))


def _series(rows: list[Row], with_lengths: bool = True) -> dict[str, list[Row]]:
    """Rows grouped into labelled series; the device is named only when the report has more than one."""
    devices = {r["device"] for r in rows}
    series: dict[str, list[Row]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["backend"], r["precision"], r["device"], r.get("batch") or 0)):
        parts = [r["backend"], precision_label(r)] + ([r["device"]] if len(devices) > 1 else [])
        label = "/".join(parts) + (f" {_lengths(r)}" if with_lengths and r.get("lengths") else "")
        series[label].append(r)
    return dict(series)


def _grid(n: int) -> tuple[Figure, list]:
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(SUBPLOT_INCHES[0] * cols, SUBPLOT_INCHES[1] * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _log_if_wide(ax, axis: str, values: list[float], spread: float, base: int = 10) -> None:
    """Log scale when the values span more than `spread`x: batch 1..64 or 0.1..100 ms."""
    positive = [v for v in values if v and v > 0]
    if positive and max(positive) / min(positive) >= spread:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
        (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(FormatStrFormatter("%g"))  # 0.1, not 10^-1


def latency(report: Mapping[str, Any]) -> Figure | None:
    """p50 latency against batch size, with a band up to p90."""
    models = _by_model(_ok(report))
    if not models:
        return None
    fig, axes = _grid(len(models))
    for ax, (model, rows) in zip(axes, models.items()):
        for label, series in _series(rows).items():
            x = [r["batch"] for r in series]
            p50 = [r["p50_ms"] for r in series]
            (line,) = ax.plot(x, p50, marker="o", label=label)
            if all(r.get("p90_ms") is not None for r in series):
                ax.fill_between(x, p50, [r["p90_ms"] for r in series], color=line.get_color(), alpha=0.15)
        batches = sorted({r["batch"] for r in rows})
        _log_if_wide(ax, "x", batches, 4, base=2)
        ax.set_xticks(batches, [str(b) for b in batches])  # the measured sizes, not powers of the log base
        ax.set_xticks([], minor=True)
        _log_if_wide(ax, "y", [r["p50_ms"] for r in rows], 10)
        ax.set(title=model, xlabel="batch size", ylabel="latency ms (p50, band to p90)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def throughput(report: Mapping[str, Any]) -> Figure | None:
    """Samples/s as grouped bars: one group per batch size (and lengths), one bar per series."""
    models = _by_model([r for r in _ok(report) if r.get("throughput")])
    if not models:
        return None
    fig, axes = _grid(len(models))
    for ax, (model, rows) in zip(axes, models.items()):
        groups = sorted({_point(r) for r in rows})
        series = _series(rows, with_lengths=False)
        width = 0.8 / len(series)
        for i, (label, srows) in enumerate(series.items()):
            at = {_point(r): r["throughput"] for r in srows}
            xs = [g + (i - (len(series) - 1) / 2) * width for g, key in enumerate(groups) if key in at]
            ax.bar(xs, [at[key] for key in groups if key in at], width, label=label)
        ax.set_xticks(range(len(groups)), [f"batch {b}" + (f"\n{_lengths({'lengths': dict(ls)})}" if ls else "")
                                           for b, ls in groups])
        _log_if_wide(ax, "y", [r["throughput"] for r in rows], 30)
        ax.set(title=model, ylabel="samples/s (at p50)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def accuracy(report: Mapping[str, Any]) -> Figure | None:
    """Task metric against p50 latency at each series' smallest batch (and lengths)."""
    models = _by_model([r for r in _ok(report) if r.get("metric") is not None])
    if not models:
        return None
    fig, axes = _grid(len(models))
    for ax, (model, rows) in zip(axes, models.items()):
        points = [min(s, key=lambda r: (r["batch"], sorted((r.get("lengths") or {}).items())))
                  for s in _series(rows, with_lengths=False).values()]
        for r in points:
            label = f"{r['backend']}/{precision_label(r)}"
            ax.scatter(r["p50_ms"], r["metric"])
            ax.annotate(label, (r["p50_ms"], r["metric"]), textcoords="offset points", xytext=(4, 4), fontsize="small")
        reference = next((r["metric_reference"] for r in rows if r.get("metric_reference") is not None), None)
        if reference is not None:
            ax.axhline(reference, linestyle="--", color="grey", label="PyTorch fp32 reference")
            ax.legend(fontsize="small")
        higher = rows[0].get("higher_is_better")
        direction = "" if higher is None else (" (higher is better)" if higher else " (lower is better)")
        batches = sorted({r["batch"] for r in points})
        _log_if_wide(ax, "x", [r["p50_ms"] for r in points], 10)
        ax.set(title=model, ylabel=(rows[0].get("metric_name") or "metric") + direction,
               xlabel=f"p50 latency ms at batch {', '.join(map(str, batches))}")
        ax.margins(x=0.2, y=0.15)  # room for the labels of the outermost points
        ax.grid(True, alpha=0.3)
    return fig


#: kind -> (file name, figure builder); the report writer saves each that has data.
PLOTS: dict[str, tuple[str, Callable[[Mapping[str, Any]], Figure | None]]] = {
    "latency_plot": ("latency_vs_batch.png", latency),
    "throughput_plot": ("throughput.png", throughput),
    "accuracy_plot": ("accuracy_vs_speed.png", accuracy),
}


def render(report: Mapping[str, Any], dpi: int = 100) -> dict[str, tuple[str, bytes]]:
    """kind -> (file name, PNG bytes) for every plot the report has data for."""
    out = {}
    for kind, (name, build) in PLOTS.items():
        fig = build(report)
        if fig is not None:
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi)
            out[kind] = (name, buf.getvalue())
    return out
