"""The steady-state rule: which part of the benchmark window the verdict judges.

bench_serving divides its rates by the whole duration, ramp-up and drain included (DOMAIN.md section 2), and
a GPU's power during the first seconds is still climbing. The verdict therefore judges the plateau:

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
    def of_manifest(cls, manifest: dict[str, Any]) -> SteadyParams:
        """The rule a run was judged with: its run.json's `steady_state`, the defaults for what it lacks."""
        p = manifest.get("steady_state") or {}
        return cls(plateau_fraction=float(p.get("plateau_fraction", cls.plateau_fraction)),
                   smooth_s=float(p.get("smooth_s", cls.smooth_s)),
                   min_window_s=float(p.get("min_window_s", cls.min_window_s)))


@dataclass(frozen=True)
class SteadyWindow:
    start_s: float
    end_s: float
    found: bool
    reason: str
    peak_activity: float
    threshold: float

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
    return SteadyWindow(w.start_s, w.end_s, False, reason + "; using the full benchmark window", peak, threshold)
