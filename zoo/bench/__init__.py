"""`zoo bench`: the benchmark suite.

    matrix.py   models x backends x precisions x devices x batch sizes (x lengths), each
                combination in its own process; rows with latency, memory, cold start,
                size, parity and metric change
    stats.py    percentiles, throughput and the measured noise of a run
"""

from .env import environment
from .matrix import benchmark, benchmark_artifacts, combinations
from .stats import noise, row_key, summarize

__all__ = ["benchmark", "combinations", "environment", "noise", "row_key", "summarize"]
