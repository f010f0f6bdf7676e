"""The steady-state rule: which part of the benchmark window the verdict judges.

bench_serving divides its rates by the whole duration, ramp-up and drain included, and a GPU's power during the
first seconds is still climbing. The verdict therefore judges the plateau, found from the best signal the run
has.

From the server's token counter (a server timeline with `sglang:realtime_tokens_total`, which SGLang adds to on
every forward pass), `find_counter_window`:

1. the output rate between consecutive scrapes of the decode counter, inside [bench_start_s, bench_end_s];
2. smoothed with a centred moving average `smooth_s` wide; peak = the 90th percentile of the smoothed rate (a
   late scrape's catch-up spike does not set it); threshold = `plateau_fraction` x peak;
3. runs of the smoothed rate at or above the threshold, a dip shorter than `smooth_s` kept inside; the window
   is the LONGEST run, its ends trimmed until the raw rate there and at the next scrape inward is at or above the
   threshold too (a late scrape's high half of a split interval is no edge). A drain (the
   rate falling as the last requests finish, never recovering) or a ramp is never inside it, where the GPU
   rule's first-to-last span keeps everything between;
4. peak zero (no tokens) or a window shorter than `min_window_s`: no steady state, the reason given.

GPU utilisation stays at 100 % through a drain when the GPUs spin in communication kernels, so the GPU rule is
only the fallback (no server timeline, or one without the counter), `find_steady_window`:

1. activity(t) per GPU = max(util_gpu_pct / 100, (power_w - idle_power_w) / (power_limit_w - idle_power_w)),
   clipped to [0, 1], then averaged over the GPUs that have a value at that tick. Utilization alone misses
   nothing that runs kernels; power alone would call a spinning (waiting) GPU idle. Taking the larger of the
   two lets both a compute plateau and a busy-but-waiting plateau count as load.
2. Only ticks inside the benchmark's own window [bench_start_s, bench_end_s] are considered.
3. The series is smoothed with a centred moving average `smooth_s` seconds wide.
4. threshold = `plateau_fraction` x the peak of the smoothed series. The steady window runs from the first
   tick at or above the threshold to the last one (ramp-up and drain are cut, short dips inside are kept).
5. If the peak is under 0.05 (nothing ran) or the window is shorter than `min_window_s`, no steady state
   was found: the summary says why and the full benchmark window is used instead.

The three parameters are the profile's `probe.steady_state` (defaults 0.8, 2.0 s, 5.0 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.core.probe import columnar
from toolkit.core.probe.series import Trace

NO_LOAD_ACTIVITY = 0.05


@dataclass(frozen=True)
class SteadyParams:
    plateau_fraction: float = 0.8
    smooth_s: float = 2.0
    min_window_s: float = 5.0

    @classmethod
    def of_record(cls, p: Mapping[str, Any]) -> SteadyParams:
        """The rule a run was judged with: its run.json's `steady_state`, the defaults for what it lacks."""
        return cls(plateau_fraction=float(p.get("plateau_fraction", cls.plateau_fraction)),
                   smooth_s=float(p.get("smooth_s", cls.smooth_s)),
                   min_window_s=float(p.get("min_window_s", cls.min_window_s)))


@dataclass(frozen=True)
class SteadyWindow:
    start_s: float
    end_s: float
    found: bool
    reason: str
    peak_activity: float  # the smoothed signal's peak: GPU activity (0-1), or output tok/s for the counter
    threshold: float
    signal: str = "gpu activity"  # "server token counter" or "gpu activity": what the window was found from

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def _gpu_activity(util: list[float | None], power: list[float | None], limit: list[float | None],
                  idle: float | None) -> list[float | None]:
    lim = next((x for x in limit if x is not None), None)
    use_power = idle is not None and lim is not None and lim > idle
    if use_power and None not in util and None not in power and None not in limit:
        # Fast path (every cell present): comprehension over a one-hour trace stays well under a second.
        assert idle is not None
        return [min(1.0, max(0.0, u / 100.0, (p - idle) / (m - idle) if m > idle else 0.0))  # type: ignore[operator]
                for u, p, m in zip(util, power, limit, strict=True)]
    out: list[float | None] = []
    for u, p, m in zip(util, power, limit, strict=True):
        a: float | None = None if u is None else u / 100.0
        if p is not None and m is not None and idle is not None and m > idle:
            pa = (p - idle) / (m - idle)
            a = pa if a is None else max(a, pa)
        out.append(None if a is None else min(1.0, max(0.0, a)))
    return out


def activity_series(trace: Trace, idle_power_w: dict[int, float | None]) -> tuple[list[float], list[float | None]]:
    """(t_s, activity) on the first GPU's ticks; every GPU is sampled on each tick, so rows align by index."""
    if not trace.gpus:
        return [], []
    series = list(trace.gpus.values())
    n = min(len(s) for s in series)
    t = series[0].t_s[:n]
    per_gpu = [_gpu_activity(s.values["util_gpu_pct"][:n], s.values["power_w"][:n], s.values["power_limit_w"][:n],
                             idle_power_w.get(s.gpu)) for s in series]
    if all(None not in a for a in per_gpu):
        k = len(per_gpu)
        return t, [x / k for x in map(sum, zip(*per_gpu, strict=True))]
    out: list[float | None] = []
    for vals in zip(*per_gpu, strict=True):
        present = [x for x in vals if x is not None]
        out.append(sum(present) / len(present) if present else None)
    return t, out


def smooth(t: list[float], v: list[float | None], width_s: float) -> list[float | None]:
    """Centred moving average over a time window (two pointers; O(n))."""
    out: list[float | None] = []
    n = len(t)
    lo = hi = 0
    total = 0.0
    count = 0
    half = width_s / 2.0
    for i in range(n):
        while hi < n and t[hi] <= t[i] + half:
            x = v[hi]
            if x is not None:
                total += x
                count += 1
            hi += 1
        while t[lo] < t[i] - half:
            x = v[lo]
            if x is not None:
                total -= x
                count -= 1
            lo += 1
        out.append(total / count if count else None)
    return out


def find_steady_window(
    trace: Trace,
    bench_start_s: float,
    bench_end_s: float,
    idle_power_w: dict[int, float | None],
    params: SteadyParams,
) -> SteadyWindow:
    full = SteadyWindow(bench_start_s, bench_end_s, False, "", 0.0, 0.0)
    if columnar.available() and trace.gpus:
        # the same rule over numpy columns (columnar.py): one vectorised pass instead of per-tick Python
        status, peak, threshold, start, end = columnar.steady_bounds(
            trace, bench_start_s, bench_end_s, idle_power_w, params.smooth_s, params.plateau_fraction)
        if status == "no-samples":
            return _replace(full, reason="no samples inside the benchmark window")
        if status == "no-values":
            return _replace(full, reason="no utilization or power values inside the benchmark window")
        return _judge_plateau(full, peak, threshold, start, end, params)
    t_all, a_all = activity_series(trace, idle_power_w)
    pairs = [(t, a) for t, a in zip(t_all, a_all, strict=True) if bench_start_s <= t <= bench_end_s]
    if not pairs:
        return _replace(full, reason="no samples inside the benchmark window")
    t = [p[0] for p in pairs]
    sm = smooth(t, [p[1] for p in pairs], params.smooth_s)
    values = [x for x in sm if x is not None]
    if not values:
        return _replace(full, reason="no utilization or power values inside the benchmark window")
    peak = max(values)
    threshold = params.plateau_fraction * peak
    above = [i for i, x in enumerate(sm) if x is not None and x >= threshold]
    return _judge_plateau(full, peak, threshold, t[above[0]], t[above[-1]], params)


def _judge_plateau(full: SteadyWindow, peak: float, threshold: float, start: float, end: float,
                   params: SteadyParams) -> SteadyWindow:
    if peak < NO_LOAD_ACTIVITY:
        return _replace(full, reason=f"no load: peak activity {peak:.3f} < {NO_LOAD_ACTIVITY}", peak=peak,
                        threshold=threshold)
    if end - start < params.min_window_s:
        return _replace(full, reason=f"plateau {end - start:.1f} s is shorter than min_window_s "
                        f"{params.min_window_s} s", peak=peak, threshold=threshold)
    return SteadyWindow(start, end, True, f"activity >= {params.plateau_fraction} x peak {peak:.3f}", peak, threshold)


def _replace(w: SteadyWindow, *, reason: str, peak: float = 0.0, threshold: float = 0.0) -> SteadyWindow:
    return SteadyWindow(w.start_s, w.end_s, False, reason + "; using the full benchmark window", peak, threshold,
                        w.signal)


COUNTER_SIGNAL = "server token counter"
# Fewer scrape pairs than this inside the benchmark window: too few to find a plateau in (the GPU rule decides).
MIN_COUNTER_PAIRS = 4
PEAK_PERCENTILE = 90


def find_counter_window(t_s: list[float], rate: list[float], bench_start_s: float, bench_end_s: float,
                        params: SteadyParams) -> SteadyWindow | None:
    """The steady window from the server's output-token counter: (t_s, rate) are its per-second rates between
    consecutive scrapes, at their midpoints (server_trace.counter_series). None when there are too few inside the
    benchmark window to judge (the caller falls back to the GPU rule)."""
    pairs = [(t, r) for t, r in zip(t_s, rate, strict=True) if bench_start_s <= t <= bench_end_s]
    if len(pairs) < MIN_COUNTER_PAIRS:
        return None
    t = [p[0] for p in pairs]
    raw = [p[1] for p in pairs]
    sm = [x if x is not None else 0.0 for x in smooth(t, list(raw), params.smooth_s)]
    full = SteadyWindow(bench_start_s, bench_end_s, False, "", 0.0, 0.0, COUNTER_SIGNAL)
    # The peak is a high percentile, not the maximum: a scrape that came late sees the tokens of two intervals
    # at once, and one such spike must not set the bar the plateau is held to.
    ordered = sorted(sm)
    peak = ordered[min(len(ordered) - 1, round(PEAK_PERCENTILE / 100 * (len(ordered) - 1)))]
    if peak <= 0:
        return _replace(full, reason="no output tokens counted by the server inside the benchmark window")
    threshold = params.plateau_fraction * peak
    runs: list[list[int]] = []
    for i, x in enumerate(sm):
        if x < threshold:
            continue
        # The same run, or after a dip (its samples below the bar) no longer than the smoothing width: kept inside.
        if runs and (runs[-1][1] == i - 1 or t[i - 1] - t[runs[-1][1] + 1] <= params.smooth_s + 1e-6):
            runs[-1][1] = i
        else:
            runs.append([i, i])
    best: tuple[int, int] | None = None
    for lo, hi in runs:
        # An edge is where the raw rate reaches the bar and holds it: this sample and the next one inward. A lone
        # sample at the bar is no edge: a scrape that read the counter late splits two intervals' tokens into a
        # low rate and a high one, and on a ramp the high one crosses the bar before the rate has got there.
        while lo < hi and (raw[lo] < threshold or raw[lo + 1] < threshold):
            lo += 1
        while hi > lo and (raw[hi] < threshold or raw[hi - 1] < threshold):
            hi -= 1
        if best is None or t[hi] - t[lo] > t[best[1]] - t[best[0]]:
            best = (lo, hi)
    assert best is not None  # the peak itself is at or above the threshold
    start, end = t[best[0]], t[best[1]]
    if end - start < params.min_window_s:
        return _replace(full, reason=f"the server's output rate held >= {params.plateau_fraction} x its peak "
                        f"({peak:,.0f} tok/s) for {end - start:.1f} s, shorter than min_window_s "
                        f"{params.min_window_s} s: the run is too short for a steady state", peak=peak,
                        threshold=threshold)
    return SteadyWindow(start, end, True, f"server output rate >= {params.plateau_fraction} x peak {peak:,.0f} "
                        "tok/s (the longest span without a sustained fall)", peak, threshold, COUNTER_SIGNAL)
