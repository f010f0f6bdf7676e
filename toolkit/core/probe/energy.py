"""Energy over a window: the NVML counter's delta, with integrated power alongside as a check.

NVML's total-energy counter (mJ since driver load, ~100 ms updates) is the source of truth; integrating
nvmlDeviceGetPowerUsage (a ~1 s moving average on Ampere and newer) lags at every load change, so it is
only reported next to the counter (DOMAIN.md section 3).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass(frozen=True)
class WindowEnergy:
    energy_j: float | None  # counter delta; None where the counter is missing
    integrated_j: float | None  # trapezoid of power_w over the same samples
    integrated_instant_j: float | None  # trapezoid of power_instant_w, where offered
    span_s: float  # time between the first and last sample used
    source: str  # "counter" or "integrated power (counter unavailable)"


def _trapezoid(t: list[float], v: list[float | None]) -> float | None:
    if None in v:
        pairs = [(a, b) for a, b in zip(t, v, strict=True) if b is not None]
        t, v = [p[0] for p in pairs], [p[1] for p in pairs]
    vv: list[float] = v  # type: ignore[assignment]  # no None left
    if len(t) < 2:
        return None
    # C-level maps: this runs over every sample of a one-hour trace (benchmarks/bench_probe.py).
    dt = map(operator.sub, t[1:], t[:-1])
    return sum(map(operator.mul, dt, map(operator.add, vv[1:], vv[:-1]))) / 2.0


def window_energy(
    t: list[float], energy_j: list[float | None], power_w: list[float | None], power_instant_w: list[float | None]
) -> WindowEnergy:
    """t and the series are the samples inside the window, in time order."""
    span = t[-1] - t[0] if len(t) >= 2 else 0.0
    integrated = _trapezoid(t, power_w)
    instant = _trapezoid(t, power_instant_w)
    counter = [e for e in energy_j if e is not None] if None in energy_j else energy_j
    delta: float | None = None
    if len(counter) >= 2:
        delta = counter[-1] - counter[0]  # type: ignore[operator]
        if delta < 0:  # the counter reset (driver reload): it cannot be trusted for this window
            delta = None
    if delta is None:
        return WindowEnergy(integrated, integrated, instant, span, "integrated power (counter unavailable)")
    return WindowEnergy(delta, integrated, instant, span, "counter")
