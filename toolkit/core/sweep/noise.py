"""How sure a measured figure is: 95 % confidence intervals from a run's own steady window and from repeated runs.

Two sources of noise, both measured:
- within a run: the steady window's throughput, interval by interval (`Measurement.interval_tok_per_s`). Adjacent
  intervals are correlated (a batch spans them), so they are grouped into batches of about BATCH_S seconds and the
  standard error is that of the batch means (the batch-means method), with a t quantile for the batches' count;
- between runs: the same variant measured again (a tune measures its base `--repeats` times). With n values, a
  t-interval: mean +- t(0.975, n - 1) x sd / sqrt(n). A variant measured once borrows the base's run-to-run spread,
  relative to its value (the same host, the same workload), with the base's degrees of freedom.

Why t-intervals, not a bootstrap: the repeats are 2 to 6 values; a bootstrap of 3 values can only produce a
handful of distinct means and understates the spread, where t(0.975, 2) = 4.30 widens the interval as honestly as
so few values allow. The per-interval series is longer, but correlated: a plain bootstrap would treat its intervals
as independent; batch means with a t quantile handle that with less machinery than a block bootstrap.

A figure's interval is the wider of the two (between runs already contains the within-run noise of each run; the
within-run part matters when the repeats agree by luck). A gain counts only when the candidate's interval lies
wholly above the incumbent's. Pure, standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.core.stats import t975

BATCH_S = 5.0  # seconds per batch of intervals: longer than a decode batch's life, so the batch means decorrelate
MIN_BATCHES = 3

@dataclass(frozen=True)
class WithinRun:
    """A run's steady-window throughput from its batch means."""

    mean: float
    se: float  # standard error of the mean
    batches: int

    @property
    def half_width(self) -> float:
        return t975(self.batches - 1) * self.se


def within_run(intervals: Sequence[float], interval_s: float | None, batch_s: float = BATCH_S) -> WithinRun | None:
    """Batch means over the per-interval series; None when it holds fewer than MIN_BATCHES batches."""
    if not intervals or not interval_s or interval_s <= 0:
        return None
    per = max(1, round(batch_s / interval_s))
    n = len(intervals) // per
    if n < MIN_BATCHES:
        per = max(1, len(intervals) // MIN_BATCHES)
        n = len(intervals) // per
        if n < MIN_BATCHES:
            return None
    means = [statistics.fmean(intervals[i * per:(i + 1) * per]) for i in range(n)]
    return WithinRun(statistics.fmean(means), statistics.stdev(means) / math.sqrt(n), n)


@dataclass(frozen=True)
class Interval:
    """A figure with its 95 % interval [low, high] and how the interval was made."""

    value: float
    low: float
    high: float
    method: str

    @property
    def half_width_pct(self) -> float:
        return (self.high - self.low) / 2 / self.value * 100 if self.value else math.inf

    def above(self, other: Interval) -> bool:
        """Wholly above `other`: the only gain that counts."""
        return self.low > other.high

    def to_dict(self) -> dict[str, float | str]:
        return {"value": round(self.value, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "half_width_pct": round(self.half_width_pct, 2), "method": self.method}

    def text(self, fmt: str = ",.4g") -> str:
        return f"{format(self.value, fmt)} [{format(self.low, fmt)}, {format(self.high, fmt)}]"


@dataclass(frozen=True)
class RunToRun:
    """The base's run-to-run spread, relative to its mean, and its degrees of freedom."""

    cv: float
    df: int


def run_to_run(values: Sequence[float]) -> RunToRun | None:
    """From two or more measurements of the same variant at the same load."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return RunToRun(statistics.stdev(values) / mean if mean else 0.0, len(values) - 1)


def interval(values: Sequence[float], within: Sequence[WithinRun | None] = (), *, base: RunToRun | None = None,
             value: float | None = None) -> Interval:
    """The interval of a variant's figure from its measurements `values` (their runs' `within`), centred on `value`
    (default: their mean). One value borrows `base`'s run-to-run spread."""
    center = statistics.fmean(values) if value is None else value
    parts: list[tuple[float, str]] = []
    if len(values) >= 2:
        sd = statistics.stdev(values)
        parts.append((t975(len(values) - 1) * sd / math.sqrt(len(values)), f"t-interval of {len(values)} runs"))
    elif base is not None:
        parts.append((t975(base.df) * base.cv * center,
                      f"1 run, the base's run-to-run spread ({base.cv * 100:.2f} %, {base.df + 1} runs)"))
    ws = [w for w in within if w is not None]
    if ws:
        se = math.sqrt(sum(w.se ** 2 for w in ws)) / len(ws)
        df = min(w.batches for w in ws) - 1
        parts.append((t975(df) * se, f"within-run batch means ({min(w.batches for w in ws)} batches)"))
    if not parts:
        return Interval(center, center, center, "no spread measured")
    hw, method = max(parts, key=lambda p: p[0])
    return Interval(center, center - hw, center + hw, method)
