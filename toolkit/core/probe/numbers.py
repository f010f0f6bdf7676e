"""Rounding and percentiles shared by the list path (summary.py), the numpy path (columnar.py) and the benchmark's
per-request latencies (bench.py)."""

from __future__ import annotations

import math


def rounded(v: float | None, nd: int = 2) -> float | None:
    """`v` rounded to `nd` places; None for a missing or NaN value (written as null, never as NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(v, nd)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, and so bench_serving's own), q in [0, 100]."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)
