"""Statistics for the decisions the toolkit takes on measured runs: keep a knob, rank variants, promote a release.

Each test is on what is being decided:
- an SLO kept or not is a pass per run, so its attainment is a pass rate with a Wilson score interval, and two pass
  rates are compared by Newcombe's hybrid score interval of their difference (method 10 of Newcombe 1998, the one
  built from the two Wilson intervals). A rate at 6 of 6 against 4 of 8 is then a difference whose interval lies
  above zero, where a t-test on latency means, swung by one slow run near the edge, could not tell;
- a throughput or J/token change between two things measured in alternation is a paired comparison: each pair
  (old, new) measured back to back shares the host's drift, so the interval is that of the pairs' relative change.
  A percentile bootstrap over the pairs (seeded: the same runs give the same interval) gives it without assuming a
  shape; with a handful of pairs a bootstrap understates the spread (three pairs have ten distinct resamples), so
  the interval is the wider of the bootstrap's and the t-interval of the per-pair log ratios, and nothing is
  decided on fewer than MIN_PAIRS pairs.
The decision: a significant gain (the interval wholly above zero) promotes; a significant loss refuses; an
interval inside +-the effect that matters is "equal" (promoted only when the caller accepts an equal result);
anything else needs more runs. Pure, standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959964  # two-sided 95 %
MIN_PAIRS = 3  # fewer paired runs decide nothing: a bootstrap of two pairs has three distinct resamples
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260  # fixed: the same runs always give the same interval (a report re-rendered says the same)

GAIN, LOSS, EQUAL, UNDECIDED = "gain", "loss", "equal", "undecided"

# t(0.975, df): two-sided 95 %.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


# t(0.995, df): two-sided 99 %, for a promotion decided while runs are still being added (see `decide`).
_T995 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169,
         11: 3.106, 12: 3.055, 13: 3.012, 14: 2.977, 15: 2.947, 16: 2.921, 17: 2.898, 18: 2.878, 19: 2.861,
         20: 2.845, 25: 2.787, 30: 2.750, 40: 2.704, 60: 2.660, 120: 2.617}
_TABLES = {0.95: (_T975, 1.960), 0.99: (_T995, 2.576)}


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (two-sided 95 %)."""
    return t_quantile(df, 0.95)


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Student's t quantile for a two-sided `confidence` interval (0.95 or 0.99) with `df` degrees of freedom."""
    table, limit = _TABLES[confidence]
    if df < 1:
        return math.inf
    if df in table:
        return table[df]
    known = sorted(table)
    if df > known[-1]:
        return limit
    hi = next(k for k in known if k > df)
    lo = max(k for k in known if k < df)
    # Linear in 1/df between tabulated values (the quantile is close to linear in 1/df).
    w = (1 / df - 1 / hi) / (1 / lo - 1 / hi)
    return table[hi] + w * (table[lo] - table[hi])


@dataclass(frozen=True)
class PassRate:
    """Runs that met the SLO out of the runs made, with the 95 % Wilson score interval of the rate."""

    passed: int
    runs: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    def text(self) -> str:
        return f"{self.passed}/{self.runs} [{self.low * 100:.0f} %, {self.high * 100:.0f} %]"

    def to_dict(self) -> dict[str, float | int]:
        return {"passed": self.passed, "runs": self.runs, "low": round(self.low, 4), "high": round(self.high, 4)}


def wilson(passed: int, runs: int, z: float = Z95) -> PassRate:
    """The Wilson score interval of passed/runs (Wilson 1927): unlike the normal one it stays inside [0, 1] and
    says something at 6 of 6. No runs: [0, 1]."""
    if passed < 0 or runs < 0 or passed > runs:
        raise ValueError(f"{passed} passed of {runs} runs")
    if runs == 0:
        return PassRate(0, 0, 0.0, 1.0)
    p = passed / runs
    denom = 1 + z * z / runs
    centre = (p + z * z / (2 * runs)) / denom
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / denom
    # At 0 or all passed the bound is exactly 0 or 1; rounding would put it a hair off.
    return PassRate(passed, runs, 0.0 if passed == 0 else max(0.0, centre - half),
                    1.0 if passed == runs else min(1.0, centre + half))


@dataclass(frozen=True)
class Difference:
    """A difference (or relative change) with its 95 % interval and how it was made."""

    value: float
    low: float
    high: float
    method: str

    def significant_above(self) -> bool:
        return self.low > 0

    def significant_below(self) -> bool:
        return self.high < 0

    def to_dict(self) -> dict[str, float | str]:
        return {"value": round(self.value, 6), "low": round(self.low, 6), "high": round(self.high, 6),
                "method": self.method}

    def pct_text(self) -> str:
        return f"{self.value * 100:+.1f} % {self.span_text()}"

    def span_text(self) -> str:
        return f"[{self.low * 100:+.1f} %, {self.high * 100:+.1f} %]"


def pass_rate_difference(a: PassRate, b: PassRate) -> Difference:
    """a's rate minus b's, with Newcombe's hybrid score interval (from both Wilson intervals)."""
    d = a.rate - b.rate
    low = d - math.sqrt((a.rate - a.low) ** 2 + (b.high - b.rate) ** 2)
    high = d + math.sqrt((a.high - a.rate) ** 2 + (b.rate - b.low) ** 2)
    return Difference(d, max(-1.0, low), min(1.0, high), f"Newcombe score interval ({a.runs} and {b.runs} runs)")


def paired_relative_change(old: Sequence[float], new: Sequence[float], *, seed: int = BOOTSTRAP_SEED,
                           resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = 0.95) -> Difference | None:
    """new over old, less 1, over paired runs (old[i] and new[i] measured back to back): the ratio of the means,
    its `confidence` (0.95, 0.99) interval the wider of a seeded percentile bootstrap over the pairs and the
    t-interval of the per-pair log ratios. None with fewer than two usable pairs (a pair with a non-positive or NaN
    value is a failure, not a figure: the caller decides on failures)."""
    return paired_relative_changes(old, new, seed=seed, resamples=resamples, confidences=(confidence,))[0]


def paired_relative_changes(old: Sequence[float], new: Sequence[float], *, seed: int = BOOTSTRAP_SEED,
                            resamples: int = BOOTSTRAP_RESAMPLES,
                            confidences: Sequence[float] = (0.95, 0.99)) -> list[Difference | None]:
    """`paired_relative_change` at each of `confidences`, from one bootstrap."""
    pairs = [(o, n) for o, n in zip(old, new, strict=True) if _positive(o) and _positive(n)]
    if len(pairs) < 2:
        return [None for _ in confidences]
    k = len(pairs)
    ratio = statistics.fmean(n for _, n in pairs) / statistics.fmean(o for o, _ in pairs)
    rng = random.Random(seed)
    boot = []
    for _ in range(resamples):
        pick = [pairs[rng.randrange(k)] for _ in range(k)]
        boot.append(sum(n for _, n in pick) / sum(o for o, _ in pick))
    boot.sort()
    logs = [math.log(n / o) for o, n in pairs]
    sd = statistics.stdev(logs)
    out: list[Difference | None] = []
    for confidence in confidences:
        tail = (1 - confidence) / 2
        b_low, b_high = boot[int(tail * (resamples - 1))], boot[math.ceil((1 - tail) * (resamples - 1))]
        hw = t_quantile(k - 1, confidence) * sd / math.sqrt(k)
        t_low, t_high = math.exp(math.log(ratio) - hw), math.exp(math.log(ratio) + hw)
        pct = f"{confidence * 100:g} %"
        if t_high - t_low >= b_high - b_low:
            low, high, how = t_low, t_high, f"{pct} t-interval of {k} pairs' log ratios (wider than the bootstrap's)"
        else:
            low, high, how = b_low, b_high, f"{pct} paired bootstrap of {k} pairs ({resamples} resamples, seed {seed})"
        out.append(Difference(ratio - 1, low - 1, high - 1, how))
    return out


def unpaired_relative_change(old: Sequence[float], new: Sequence[float]) -> Difference | None:
    """new over old, less 1, for runs not measured in pairs (a profile's recorded history): the ratio of the
    geometric means with the t-interval of the difference of mean log values, the spread pooled over the sides
    with two or more runs (a side of one run borrows the other's: the same host, the same workload). None when no
    side has two runs: no spread was measured."""
    a, b = [math.log(x) for x in old if _positive(x)], [math.log(x) for x in new if _positive(x)]
    if not a or not b:
        return None
    groups = [g for g in (a, b) if len(g) >= 2]
    df = sum(len(g) - 1 for g in groups)
    if df < 1:
        return None
    pooled = math.sqrt(sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups) / df)
    d = statistics.fmean(b) - statistics.fmean(a)
    hw = t975(df) * pooled * math.sqrt(1 / len(a) + 1 / len(b))
    return Difference(math.exp(d) - 1, math.exp(d - hw) - 1, math.exp(d + hw) - 1,
                      f"t-interval of log values, {len(a)} against {len(b)} runs (pooled spread, {df} df)")


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


@dataclass(frozen=True)
class Decision:
    """What the interval of a change says: gain, loss, equal (inside +-the effect that matters) or undecided."""

    outcome: str
    promote: bool
    text: str

    def to_dict(self) -> dict[str, str | bool]:
        return {"outcome": self.outcome, "promote": self.promote, "text": self.text}


def decide(change: Difference | None, *, effect: float, accept_equal: bool = False, pairs: int | None = None,
           min_pairs: int = MIN_PAIRS, promote_change: Difference | None = None) -> Decision:
    """Decide on `change` (its 95 % interval), signed so that above zero is better by the objective (J/token: pass
    old/new, not new/old). `effect`: the smallest change that matters (0.05 for 5 %). A significant gain promotes;
    a significant loss refuses; an interval inside +-effect is equal (promoted only with `accept_equal`); else
    undecided. Fewer than `min_pairs` pairs decide nothing.

    `promote_change`: the same change at a stricter confidence (99 %), for a caller that looks again after every
    pair: each look is another chance for noise to clear a 95 % bar, so a gain must clear the stricter one, while a
    loss (keeping what runs) needs only the 95 % one. benchmarks/bench_upgrade_gate.py measures what this buys."""
    if change is None or (pairs is not None and pairs < min_pairs):
        have = "no interval" if change is None else f"{pairs} pair(s)"
        return Decision(UNDECIDED, False, f"{have}: at least {min_pairs} paired runs decide")
    at = change.pct_text()
    gain_bar = promote_change or change
    if gain_bar.significant_above():
        return Decision(GAIN, True, f"{at}: a significant gain"
                        + (f" (99 % {gain_bar.span_text()} above zero too)"
                           if promote_change else ""))
    if change.significant_above():
        return Decision(UNDECIDED, False, f"{at}: above zero at 95 % but not at the 99 % a repeated look needs "
                        f"({gain_bar.span_text()}); more runs decide")
    if change.significant_below():
        return Decision(LOSS, False, f"{at}: a significant loss")
    if change.low > -effect and change.high < effect:
        return Decision(EQUAL, accept_equal, f"{at}: inside +-{effect * 100:g} %, equal"
                        + ("; accepted as equal" if accept_equal else "; not a gain"))
    return Decision(UNDECIDED, False, f"{at}: wider than +-{effect * 100:g} % and across zero; more runs decide")


def pass_rate_gain(candidate: PassRate, incumbent: PassRate) -> Decision:
    """The candidate's SLO attainment against the incumbent's: a gain only when the interval of the difference
    lies above zero."""
    d = pass_rate_difference(candidate, incumbent)
    at = (f"met the SLO in {candidate.passed} of {candidate.runs} runs against {incumbent.passed} of "
          f"{incumbent.runs} (difference {d.value * 100:+.0f} points, 95 % [{d.low * 100:+.0f}, {d.high * 100:+.0f}])")
    if d.significant_above():
        return Decision(GAIN, True, f"{at}: significantly more often")
    if d.significant_below():
        return Decision(LOSS, False, f"{at}: significantly less often")
    return Decision(UNDECIDED, False, f"{at}: not told apart")


def overlaps(a_low: float, a_high: float, b_low: float, b_high: float) -> bool:
    return a_low <= b_high and b_low <= a_high


def ties_with_first(intervals: Sequence[tuple[float, float] | None]) -> list[bool]:
    """For a ranking (best first) and each row's 95 % interval: whether the row is tied with #1 (their intervals
    overlap). A row without an interval is not marked (nothing says it is within noise)."""
    if not intervals or intervals[0] is None:
        return [False] * len(intervals)
    top = intervals[0]
    return [i > 0 and iv is not None and overlaps(iv[0], iv[1], top[0], top[1]) for i, iv in enumerate(intervals)]
