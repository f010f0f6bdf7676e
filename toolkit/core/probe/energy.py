"""Energy over a window: the NVML counter's delta, with integrated power alongside as a check.

NVML's total-energy counter (mJ since driver load, ~100 ms updates) is the source of truth; integrating
nvmlDeviceGetPowerUsage (a ~1 s moving average on Ampere and newer) lags at every load change, so it is
only reported next to the counter (docs/probe.md, the H200 tables).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass(frozen=True)
class WindowEnergy:
    energy_j: float | None  # counter delta; None where the counter is missing
    integrated_j: float | None  # trapezoid of power_w over the same samples
    integrated_instant_j: float | None  # trapezoid of power_instant_w, where offered
    integrated_sample_j: float | None  # trapezoid of power_sample_w (the driver's 20 ms samples), schema 2
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
    t: list[float], energy_j: list[float | None], power_w: list[float | None], power_instant_w: list[float | None],
    power_sample_w: list[float | None] | None = None,
) -> WindowEnergy:
    """t and the series are the samples inside the window, in time order.

    Between counter reads the best power series integrates: the driver's 20 ms samples where recorded (within
    0.1-0.6 % of the counter on >= 16 s windows on the H200, docs/probe.md, Energy), else
    instant power, else the 1 s averaged power."""
    span = t[-1] - t[0] if len(t) >= 2 else 0.0
    integrated = _trapezoid(t, power_w)
    instant = _trapezoid(t, power_instant_w)
    has_samples = power_sample_w is not None and any(v is not None for v in power_sample_w)
    sampled = _trapezoid(t, power_sample_w) if has_samples and power_sample_w is not None else None
    if None not in energy_j:
        first, last = 0, len(energy_j) - 1
    else:
        # The adapter reads the counter every few seconds (its ~3 ms cost, adapters/nvml.py ENERGY_INTERVAL_S):
        # take the delta between the first and last reads inside the window, and add power over the edges.
        reads = [i for i, e in enumerate(energy_j) if e is not None]
        first, last = (reads[0], reads[-1]) if reads else (0, -1)
    delta: float | None = None
    source = "counter"
    if last > first:
        delta = energy_j[last] - energy_j[first]  # type: ignore[operator]
        if delta < 0:  # the counter reset (driver reload): it cannot be trusted for this window
            delta = None
        elif first > 0 or last < len(t) - 1:
            edge_power = (power_sample_w if has_samples and power_sample_w is not None
                          else power_instant_w if None not in power_instant_w else power_w)
            head = _trapezoid(t[: first + 1], edge_power[: first + 1]) or 0.0
            tail = _trapezoid(t[last:], edge_power[last:]) or 0.0
            delta += head + tail
            source = "counter (+ power over the edges between counter reads)"
    if delta is None:
        if sampled is not None:
            return WindowEnergy(sampled, integrated, instant, sampled, span,
                                "integrated 20 ms power samples (no counter read pair in the window)")
        return WindowEnergy(integrated, integrated, instant, None, span, "integrated power (counter unavailable)")
    return WindowEnergy(delta, integrated, instant, sampled, span, source)
