"""Rounding shared by the list path (summary.py) and the numpy path (columnar.py)."""

from __future__ import annotations

import math


def rounded(v: float | None, nd: int = 2) -> float | None:
    """`v` rounded to `nd` places; None for a missing or NaN value (written as null, never as NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(v, nd)
