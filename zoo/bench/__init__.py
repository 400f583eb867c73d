"""`zoo bench`: the benchmark suite.

    matrix.py   models x backends x precisions x devices x batch sizes (x lengths), each
                combination in its own process; rows with latency, memory, cold start,
                size, parity and metric change
    stats.py    percentiles, throughput and the measured noise of a run

The names below are imported on first use: `zoo bench --url` and the report readers do
not need the exporter (and PyTorch) that the matrix imports.
"""

import importlib

_LAZY = {"benchmark": "matrix", "benchmark_artifacts": "matrix", "combinations": "matrix", "environment": "env",
         "noise": "stats", "row_key": "stats", "summarize": "stats"}

__all__ = ["benchmark", "combinations", "environment", "noise", "row_key", "summarize"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
