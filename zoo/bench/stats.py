"""Statistics of timed runs: percentiles, throughput, and the noise of the run itself.

Noise is what the regression gate (`zoo bench --compare`) holds a change against. It is
measured, not assumed: the timed runs are cut into `BLOCKS` consecutive blocks and the
noise is the relative standard deviation of the blocks' medians. Medians of blocks move
with what disturbs a shared machine (another process, frequency changes, a cold cache),
which the spread of single calls, dominated by their long tail, does not show.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

BLOCKS = 5


def noise(times: np.ndarray, blocks: int = BLOCKS) -> float:
    """Relative standard deviation of the medians of `blocks` consecutive blocks of runs
    (0.03: the median moved by about 3 % within this one measurement)."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) < 2 * blocks:  # too few runs to split: fall back on the run-to-run spread
        return float(times.std() / np.median(times)) if len(times) > 1 else 0.0
    medians = np.array([np.median(b) for b in np.array_split(times, blocks)])
    return float(medians.std(ddof=1) / np.median(times))


def summarize(times: np.ndarray, batch: int) -> dict[str, float]:
    """Seconds per call -> latency percentiles in milliseconds, samples/s at the median, noise."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) == 0:
        raise ValueError("no timed runs to summarize")
    ms = times * 1e3
    return {"p50_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean()), "std_ms": float(ms.std()),
            "throughput": float(batch / np.median(times)), "iterations": len(times),
            "noise": round(noise(times), 5)}


def row_key(row: Mapping[str, Any]) -> tuple:
    """What makes two report rows the same measurement: model, backend, precision, device,
    batch, and the lengths of the other dynamic axes (sequence, atoms)."""
    lengths = tuple(sorted((row.get("lengths") or {}).items()))
    return (row["model"], row["backend"], row["precision"], row["device"], row.get("batch"), lengths)
