"""Markdown tables from `zoo bench` JSON reports, with speed-ups against eager PyTorch
fp32 measured in the same run (zoo.bench.report.markdown).

    .venv/bin/python tools/bench_table.py reports/cpu/*.json > table.md
"""

from __future__ import annotations

import sys

from zoo.bench.report import load_report, markdown
from zoo.errors import ZooError

if __name__ == "__main__":
    try:
        for name in sys.argv[1:]:
            print(markdown(load_report(name)))
    except ZooError as exc:
        sys.exit(f"error: {exc}")
