"""One clock for a probe that spans hosts: each host's offset to the controller, with its bound, and traces put on
the controller's clock.

How the offset is measured (the adapter does the asking; this module only reasons about the numbers): the
controller reads its own clock (`sent_ns`), asks the host for its clock (`host_ns`), and reads its own clock again
(`received_ns`). The host's reading happened somewhere inside [sent, received] on the controller's clock, so the true
offset (host minus controller) lies inside [host - received, host - sent], whatever the path's asymmetry: NTP's
bound, without its assumption that both directions take as long. Several exchanges in a burst each give such an
interval; the true offset lies in all of them, so their intersection is the estimate, tighter than any one
(Marzullo's intersection, no outliers allowed since every interval is a hard bound). An empty intersection means
the clock stepped or the host's clock ran at another rate inside the burst; then the narrowest interval alone is
used (NTP's clock filter picks the minimum-delay sample for the same reason), and the estimate says so.

Measured at the run's start and end, the two offsets give the drift over the run. A time on the host's clock is
moved to the controller's by the offset interpolated at that time. When the drift over the run exceeds the
sampling interval, samples of different hosts that claim the same tick may be a tick apart: the run says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class ClockExchange:
    """One round trip. `sent_ns` and `received_ns` are the controller's clock, `host_ns` the host's."""

    sent_ns: int
    host_ns: int
    received_ns: int

    def __post_init__(self) -> None:
        if self.received_ns < self.sent_ns:
            raise ValueError(f"an answer received ({self.received_ns}) before it was asked for ({self.sent_ns})")

    @property
    def round_trip_ns(self) -> int:
        return self.received_ns - self.sent_ns

    @property
    def offset_low_ns(self) -> int:
        return self.host_ns - self.received_ns

    @property
    def offset_high_ns(self) -> int:
        return self.host_ns - self.sent_ns


@dataclass(frozen=True)
class ClockOffset:
    """host clock - controller clock = offset_ns, with |error| <= bound_ns, at `at_ns` of the controller's clock."""

    host: str
    offset_ns: int
    bound_ns: int
    at_ns: int
    exchanges: int
    consistent: bool  # False: the burst's intervals did not intersect (a step or a rate change inside it)

    def to_record(self) -> dict[str, object]:
        """run.json's form: seconds with microsecond resolution (a sampling tick is tens of milliseconds)."""
        return {"host": self.host, "offset_s": round(self.offset_ns / NS_PER_S, 6),
                "bound_s": round(self.bound_ns / NS_PER_S, 6), "at_s": round(self.at_ns / NS_PER_S, 6),
                "exchanges": self.exchanges, "consistent": self.consistent}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ClockOffset:
        return cls(host=str(record["host"]), offset_ns=round(float(record["offset_s"]) * NS_PER_S),
                   bound_ns=round(float(record["bound_s"]) * NS_PER_S), at_ns=round(float(record["at_s"]) * NS_PER_S),
                   exchanges=int(record["exchanges"]), consistent=bool(record["consistent"]))


def estimate_offset(host: str, exchanges: Sequence[ClockExchange]) -> ClockOffset:
    """The offset from a burst of exchanges: the intersection of their intervals, or the narrowest one alone."""
    if not exchanges:
        raise ValueError(f"no clock exchange with {host}: its offset cannot be estimated")
    low = max(e.offset_low_ns for e in exchanges)
    high = min(e.offset_high_ns for e in exchanges)
    consistent = low <= high
    if not consistent:
        best = min(exchanges, key=lambda e: e.round_trip_ns)
        low, high = best.offset_low_ns, best.offset_high_ns
    at_ns = sum((e.sent_ns + e.received_ns) // 2 for e in exchanges) // len(exchanges)
    return ClockOffset(host=host, offset_ns=(low + high) // 2, bound_ns=(high - low + 1) // 2, at_ns=at_ns,
                       exchanges=len(exchanges), consistent=consistent)


@dataclass(frozen=True)
class HostClock:
    """A host's clock over a run: its offset at the start and at the end."""

    start: ClockOffset
    end: ClockOffset

    def __post_init__(self) -> None:
        if self.start.host != self.end.host:
            raise ValueError(f"start and end offsets of different hosts: {self.start.host}, {self.end.host}")

    @property
    def host(self) -> str:
        return self.start.host

    @property
    def drift_ns(self) -> int:
        return self.end.offset_ns - self.start.offset_ns

    @property
    def bound_ns(self) -> int:
        """What a time moved to the controller's clock may be off by: the wider of the two ends' bounds (between
        them the interpolation assumes a steady rate, which a clock disciplined by NTP keeps over minutes)."""
        return max(self.start.bound_ns, self.end.bound_ns)

    def offset_at_ns(self, controller_ns: int) -> int:
        span = self.end.at_ns - self.start.at_ns
        if span <= 0:
            return self.start.offset_ns
        frac = min(1.0, max(0.0, (controller_ns - self.start.at_ns) / span))
        return self.start.offset_ns + round(frac * self.drift_ns)

    def to_controller_ns(self, host_ns: int) -> int:
        """A time read on the host's clock, on the controller's. The offset is interpolated at the controller time
        the host time roughly corresponds to (one step is enough: the drift over a run is microseconds to
        milliseconds, far below the span it is interpolated over)."""
        return host_ns - self.offset_at_ns(host_ns - self.start.offset_ns)

    def drift_problem(self, sample_interval_s: float) -> str | None:
        """A sentence when the drift over the run exceeds one sampling interval, else None."""
        drift_s = abs(self.drift_ns) / NS_PER_S
        if drift_s <= sample_interval_s:
            return None
        return (f"{self.host}'s clock drifted {drift_s * 1000:.1f} ms against the controller's over the run, more "
                f"than the {sample_interval_s * 1000:.0f} ms sampling interval: its samples may sit a tick off the "
                f"other hosts' (run NTP or chrony on it, or give a longer interval)")

    def to_record(self) -> dict[str, object]:
        return {"host": self.host, "start": self.start.to_record(), "end": self.end.to_record(),
                "drift_s": round(self.drift_ns / NS_PER_S, 6), "bound_s": round(self.bound_ns / NS_PER_S, 6)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> HostClock:
        """The clock run.json recorded (to the microsecond: far below a sampling tick)."""
        return cls(ClockOffset.from_record(record["start"]), ClockOffset.from_record(record["end"]))


def on_controller_clock_s(clock: HostClock, host_times_s: Iterable[float], origin_ns: int) -> list[float]:
    """Host wall-clock times (s since the epoch, as the host's sampler writes them) as seconds since `origin_ns`
    on the controller's clock: the probe's clock, the plots' x-axis."""
    out = []
    for t_s in host_times_s:
        host_ns = round(t_s * NS_PER_S)
        out.append((clock.to_controller_ns(host_ns) - origin_ns) / NS_PER_S)
    return out
