"""Markdown tables from `zoo bench --output REPORT.json` reports, with speed-ups against
eager PyTorch fp32 measured in the same run.

    .venv/bin/python tools/bench_table.py reports/cpu/*.json > table.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(report: dict) -> str:
    rows = report["results"]
    base = {r["batch"]: r["p50_ms"] for r in rows
            if r["status"] == "ok" and r["backend"] == "torch" and r["precision"] == "fp32"}
    lines = [f"**{report['model']}** ({report['environment']['cpu']}, {report['environment']['threads']} threads)", "",
             "| backend | precision | batch | p50 ms | p90 ms | vs eager fp32 | metric | change vs fp32 | export s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            if r["status"] == "failed":
                lines.append(f"| {r['backend']} | {r['precision']} | - | failed: {r['error'][:90]} | | | | | |")
            continue
        speed = f"{base[r['batch']] / r['p50_ms']:.2f}x" if r["batch"] in base else "-"
        metric = "" if r.get("metric") is None else f"{r['metric']:.4f}"
        delta = "" if r.get("metric_delta") is None else f"{r['metric_delta']:+.4f}"
        method = f" ({r['quantization']})" if r.get("quantization") else ""
        lines.append(f"| {r['backend']} | {r['precision']}{method} | {r['batch']} | {r['p50_ms']:.3f} | "
                     f"{r['p90_ms']:.3f} | {speed} | {metric} | {delta} | {r.get('export_seconds', 0):.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(table(json.loads(Path(name).read_text())))
