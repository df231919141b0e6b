"""Small statistics helpers (no numpy in the runtime dependencies)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(xs[lo])
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def ratio(a: float, b: float) -> float:
    if not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max of durations given in seconds, in milliseconds."""
    ms = [s * 1000.0 for s in samples_s]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else math.nan,
    }
