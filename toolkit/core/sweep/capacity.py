"""The capacity search: the highest Poisson request rate at which a variant still meets the SLO.

Goodput is the output throughput measured at that rate. Each probe of a rate is a point of the sweep's state
(`Point.request_rate`), measured by the sweep's own loop, so the state file, resume, Ctrl-C, failures and the host
locks are the sweep's; this module only decides, from a variant's finished points, which rate to measure next.
Pure, and a function of the points alone, so a resumed search takes the same path.

Per variant:
1. The start. A tune's candidate starts at the incumbent's capacity (the rate it must sustain to matter, its
   `floor`: missing the SLO there ends its search at once, as SGLang's auto_benchmark skips a candidate that cannot
   beat the best). Otherwise `--rate-start`, else the variant is measured once closed-loop (every request at once,
   the profile's own bench) and the search starts at `start_fraction` of the request rate that run completed (a
   rate the server cannot sustain is no start).
2. Bracket: while every rate met the SLO, go up; while none did, go down; each step the square of the one before
   (x1.25, x1.56, x2.44 ...; from a known start x1.12 first), or further when the binding latency is far from its
   bound (8 x the bound: / 8), so a far capacity is reached in a few rounds. A tune's candidate that met the SLO at
   the incumbent's capacity is measured next at the rate the incumbent missed (`beat`).
3. Narrow: once a met rate lo and a missed rate hi exist (hi > lo), measure where the binding latency,
   interpolated between them in log-log, meets its bound (kept inside the bracket's middle 60 %), until hi / lo - 1
   is inside the tolerance (`tolerance_pct`, at least the tune's noise band): a finer bracket than the noise would
   rank noise.
4. Confirmed: once the bracket is narrow enough (or a held candidate met its rate), the capacity rate is measured
   again (`confirm_runs`, 2): near the edge a p99 swings with the host's pace, and the highest of many searches
   would otherwise be the luckiest.
5. Bounded: at most `max_rounds` distinct rates per variant; the result says it stopped for rounds.

A rate meets the SLO when the median of each bounded percentile over its measurements does (a rate measured again
for the noise band); a rate whose benchmark failed (lost requests, NaN) does not meet it. Rates met above the
first missed one are noise on a monotone curve, reported but not used.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.sweep.run import Progress, RunVariant, run_sweep
from toolkit.core.sweep.slo import SloCheck, check_slo, parse_slo, slo_of_spec
from toolkit.core.sweep.state import (
    DONE,
    FAILED,
    PENDING,
    CapacityOfVariant,
    CapacityRecord,
    Measurement,
    Point,
    SweepState,
    VariantState,
)

CAPACITY_SCHEMA = 1
MAX_JUMP = 8.0  # at most this factor per bracketing step, whatever the latency suggests
TARGET_RATIO = 0.98  # aim just inside the bound: the last met rate is the capacity

# Search statuses.
SEARCHING = "searching"
CONVERGED = "converged"  # the bracket is inside the tolerance
ROUNDS = "rounds"  # max_rounds spent
UNMET = "unmet"  # no rate tried met the SLO (down to min_rate, or below the floor)
BELOW_FLOOR = "below-floor"  # missed the SLO at the floor: cannot beat the incumbent
UNBOUNDED = "unbounded"  # met at every rate tried up to the rounds
FAILED_VARIANT = "failed"  # nothing measured (the server never came up)
HELD = "held"  # met the SLO at the rate it was held to (a tokens-per-joule tune's candidate): no further search


@dataclass(frozen=True)
class CapacityParams:
    slo: dict[str, float]
    rate_start: float | None = None  # req/s; None: from a closed-loop run of each variant
    start_fraction: float = 0.7
    step: float = 1.25
    known_step: float = 1.12
    tolerance_pct: float = 4.0
    max_rounds: int = 10
    min_rate: float = 0.01
    confirm_runs: int = 2  # runs at the capacity rate before it counts: one lucky pass at the edge is not a capacity

    def to_dict(self) -> CapacityRecord:
        return {"schema": CAPACITY_SCHEMA, "slo": dict(self.slo), "rate_start": self.rate_start,
                "start_fraction": self.start_fraction, "step": self.step, "known_step": self.known_step,
                "tolerance_pct": self.tolerance_pct, "max_rounds": self.max_rounds, "min_rate": self.min_rate,
                "confirm_runs": self.confirm_runs, "variants": {}}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> CapacityParams:
        return cls(slo={k: float(v) for k, v in data["slo"].items()},
                   rate_start=None if data.get("rate_start") is None else float(data["rate_start"]),
                   start_fraction=float(data.get("start_fraction", 0.7)), step=float(data.get("step", 1.25)),
                   known_step=float(data.get("known_step", 1.12)),
                   tolerance_pct=float(data.get("tolerance_pct", 4.0)), max_rounds=int(data.get("max_rounds", 10)),
                   min_rate=float(data.get("min_rate", 0.01)), confirm_runs=int(data.get("confirm_runs", 1)))


def _search_of(record: CapacityRecord, v: VariantState) -> CapacityOfVariant:
    """The variant's search as planned (where it starts, its floor, what it must beat); all None when unplanned."""
    return record.get("variants", {}).get(v.id) or {"start": None, "floor": None, "beat": None}


def new_capacity(slo: Mapping[str, float], *, rate_start: float | None = None, tolerance_pct: float = 4.0,
                 max_rounds: int = 10, confirm_runs: int = 2) -> CapacityRecord:
    """The state's `capacity` record for a run whose objective needs the search."""
    if rate_start is not None and not rate_start > 0:
        raise ToolkitError.of(f"--rate-start {rate_start} is not a positive rate", field="--rate-start",
                              fix="give requests per second, e.g. 8")
    return CapacityParams(dict(slo), rate_start, tolerance_pct=tolerance_pct, max_rounds=max_rounds,
                          confirm_runs=confirm_runs).to_dict()


def capacity_record(objective: str, slo_text: str | None, spec: dict[str, Any], *, profile: str,
                    rate_start: float | None, tolerance_pct: float, max_rounds: int) -> CapacityRecord | None:
    """The capacity search a run needs: goodput always (an SLO required), tokens per joule when an SLO is given (on
    the command line or in the profile), throughput never."""
    slo = parse_slo(slo_text) if slo_text else slo_of_spec(spec)
    if objective == "throughput":
        if slo_text:
            raise ToolkitError.of("--slo bounds a capacity search, which --objective throughput does not run",
                                  field="--slo", fix="add --objective goodput (or tokens-per-joule)")
        return None
    if slo is None:
        if objective == "goodput":
            raise ToolkitError.of(f"--objective goodput needs an SLO: {profile} has no bench.slo", field="--slo",
                                  fix="add --slo ttft_p99_ms=3000,itl_p99_ms=100 (or bench.slo in the profile)")
        return None
    return new_capacity(slo, rate_start=rate_start, tolerance_pct=tolerance_pct, max_rounds=max_rounds)


def round_rate(r: float) -> float:
    """Four significant digits: a rate a person can read and a bench command can carry."""
    if r <= 0:
        return r
    return round(r, 3 - math.floor(math.log10(r)))


@dataclass(frozen=True)
class RatePoint:
    rate: float
    met: bool
    check: SloCheck | None
    measurement: Measurement | None  # the median-throughput one at this rate
    runs: int
    failed: int


@dataclass(frozen=True)
class Capacity:
    status: str
    lo: float | None  # the highest rate that met the SLO, req/s
    hi: float | None  # the lowest rate above it that did not
    at_lo: Measurement | None
    edge: Measurement | None  # at hi: the first rate past the edge (its verdict says which latency binds and why)
    check_lo: SloCheck | None
    check_edge: SloCheck | None
    rates: tuple[RatePoint, ...] = ()
    closed_loop: Measurement | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    goodput: float | None = None  # output tok/s: goodput_tok_per_s(at_lo, lo, slo)

    @property
    def bracket(self) -> float:
        """hi / lo: how much above lo the capacity may still be (1 when unknown or unbounded)."""
        return self.hi / self.lo if self.lo and self.hi else 1.0

    def text(self) -> str:
        if self.status == FAILED_VARIANT:
            return "not measured"
        if self.lo is None:
            return f"the SLO was missed at every rate tried ({', '.join(f'{r.rate:g}' for r in self.rates)} req/s)"
        g = self.goodput or 0.0
        hi = f", missed at {self.hi:g} req/s" if self.hi else ""
        return f"{g:,.4g} output tok/s at {self.lo:g} req/s (SLO met{hi}; {self.status})"


def goodput_tok_per_s(m: Measurement, rate: float, slo: Mapping[str, float]) -> float:
    """The output tok/s a rate that met the SLO carries: the rate x the workload's output tokens per request
    (bench_serving's output over completed requests, the same requests for every variant: its seed).

    Not the steady window's throughput at that rate: a Poisson run of a few hundred requests has no long plateau
    (in the lab two runs at 17.29 req/s found one, at 1,096 and 1,185 tok/s; runs at 18.1 to 18.57 found none and
    fell back to the whole run, drain included, at 789 to 803, where the rates carry 1,109 and 1,161 to 1,191),
    which would rank variants by where a short window fell. Meeting a TTFT or end-to-end bound
    means the server kept up with the arrivals (a growing queue would break it), so what it served is what was
    offered. An SLO on ITL alone says nothing of a queue: then the served figure bounds it (the smaller)."""
    offered = carried_tok_per_s(m, rate)
    if offered is None:
        return m.steady_output_tok_per_s  # no whole-run figures (a recorded table): what was measured
    if any(key.startswith(("ttft", "e2e")) for key in slo):
        return offered
    return min(offered, m.steady_output_tok_per_s)


def carried_tok_per_s(m: Measurement, rate: float) -> float | None:
    """The output tok/s a Poisson rate offers: the rate x the run's output tokens per completed request (None
    without bench_serving's whole-run figures)."""
    if not m.output_tok_per_s or not m.request_per_s:
        return None
    return rate * m.output_tok_per_s / m.request_per_s


def _median_latency(ms: list[Measurement]) -> dict[str, dict[str, float]]:
    """Each percentile's median over the measurements of one rate; of an even count, the higher middle one (the
    mean of a run that met the SLO and one that missed it would call the rate met on half the evidence)."""
    out: dict[str, dict[str, float]] = {}
    keys = sorted({(n, q) for m in ms for n, qs in (m.latency_ms or {}).items() for q in qs})
    for n, q in keys:
        vals = [m.latency_ms[n][q] for m in ms if q in (m.latency_ms or {}).get(n, {})]
        out.setdefault(n, {})[q] = statistics.median_high(vals)
    return out


def rate_points(v: VariantState, slo: Mapping[str, float]) -> list[RatePoint]:
    """Each rate tried (finished points only), ascending, with whether it met the SLO."""
    by_rate: dict[float, list[Point]] = {}
    for p in v.points:
        if p.request_rate is not None and p.status != PENDING:
            by_rate.setdefault(p.request_rate, []).append(p)
    out = []
    for rate, pts in sorted(by_rate.items()):
        done = [p.measurement for p in pts if p.status == DONE and p.measurement is not None]
        failed = sum(1 for p in pts if p.status == FAILED)
        if done and len(done) >= failed:
            chk = check_slo(slo, _median_latency(done))
            mid = sorted(done, key=lambda m: m.steady_output_tok_per_s)[(len(done) - 1) // 2]
            out.append(RatePoint(rate, chk.met, chk, mid, len(pts), failed))
        else:
            out.append(RatePoint(rate, False, None, done[0] if done else None, len(pts), failed))
    return out


def closed_loop(v: VariantState) -> Measurement | None:
    ms = [p.measurement for p in v.points if p.request_rate is None and p.status == DONE and p.measurement]
    return ms[0] if ms else None


def result(state: SweepState, v: VariantState) -> Capacity:
    """Where the variant's search stands (a pure function of its finished points)."""
    assert state.capacity is not None
    params = CapacityParams.of(state.capacity)
    info = _search_of(state.capacity, v)
    rps = rate_points(v, params.slo)
    cl = closed_loop(v)
    notes: list[str] = []
    missed = [r for r in rps if not r.met]
    hi_rp = missed[0] if missed else None
    below = [r for r in rps if r.met and (hi_rp is None or r.rate < hi_rp.rate)]
    lo_rp = below[-1] if below else None
    ignored = [r for r in rps if r.met and hi_rp is not None and r.rate > hi_rp.rate]
    if ignored:
        notes.append("met again above the first missed rate (noise at the edge): "
                     + ", ".join(f"{r.rate:g}" for r in ignored) + " req/s not used")
    lo, hi = (lo_rp.rate if lo_rp else None), (hi_rp.rate if hi_rp else None)
    pending = any(p.status == PENDING for p in v.points)
    failed_all = bool(v.points) and all(p.status == FAILED for p in v.points) and v.failure is not None
    floor = info.get("floor")
    if failed_all or (not rps and cl is None and not pending and v.points):
        status = FAILED_VARIANT
    elif pending or not rps:
        status = SEARCHING
    elif lo is None and floor is not None and hi is not None and hi <= float(floor) * (1 + 1e-9):
        status = BELOW_FLOOR
    elif info.get("hold") and lo is not None:
        status = HELD if _confirmed(lo_rp, params) else SEARCHING
    elif lo is None and hi is not None and hi / params.step < params.min_rate:
        status = UNMET
    elif _narrow(lo, hi, _tolerance(state, params)):
        status = CONVERGED if _confirmed(lo_rp, params) else SEARCHING
    elif len(rps) >= params.max_rounds:
        status = ROUNDS if hi is not None else (UNBOUNDED if lo is not None else UNMET)
    else:
        status = SEARCHING
    at_lo = lo_rp.measurement if lo_rp else None
    # Every run sends the profile's workload (its bench.seed): goodputs compare as their rates do.
    good = None if at_lo is None or lo is None else goodput_tok_per_s(at_lo, lo, params.slo)
    return Capacity(status, lo, hi, at_lo, hi_rp.measurement if hi_rp else None,
                    lo_rp.check if lo_rp else None, hi_rp.check if hi_rp else None, tuple(rps), cl, tuple(notes), good)


def _narrow(lo: float | None, hi: float | None, tolerance_pct: float) -> bool:
    """The bracket is inside the tolerance, or rates as they are written cannot split it any further."""
    if lo is None or hi is None:
        return False
    return (hi / lo - 1) * 100 <= tolerance_pct or round_rate(math.sqrt(lo * hi)) in (lo, hi)


def _confirmed(lo_rp: RatePoint | None, params: CapacityParams) -> bool:
    return lo_rp is not None and lo_rp.runs - lo_rp.failed >= params.confirm_runs


def _tolerance(state: SweepState, params: CapacityParams) -> float:
    band = float(((state.tune or {}).get("noise") or {}).get("band_pct") or 0.0)
    return max(params.tolerance_pct, band)


def next_rate(state: SweepState, v: VariantState) -> float | None:
    """The rate to measure next, or None when the search is over (or waits for a pending point)."""
    assert state.capacity is not None
    params = CapacityParams.of(state.capacity)
    info = _search_of(state.capacity, v)
    cap = result(state, v)
    if cap.status != SEARCHING or any(p.status == PENDING for p in v.points):
        return None
    rps = cap.rates
    if cap.lo is not None and (info.get("hold") or _narrow(cap.lo, cap.hi, _tolerance(state, params))):
        return cap.lo  # the capacity measured again before it counts (a repeat: advance numbers it)
    if not rps:
        start = info.get("start")
        if start is None and cap.closed_loop is not None and cap.closed_loop.request_per_s:
            start = params.start_fraction * float(cap.closed_loop.request_per_s)
        return round_rate(float(start)) if start else None
    known = info.get("floor") is not None
    first = params.known_step if known else params.step
    beat = info.get("beat")
    if beat is not None and cap.lo is not None and cap.hi is None and not any(r.rate >= beat for r in rps):
        # A tune's candidate that met the SLO at the incumbent's capacity is measured next where the incumbent
        # missed it: the same rate for both, so the two are compared on equal load.
        return round_rate(float(beat))
    if cap.lo is not None and cap.hi is not None:
        return round_rate(_inside(cap))
    # Bracketing: the k-th step in one direction is first ** (2 ** k), or as far as the binding latency's distance
    # from its bound suggests when that is further (a latency 8 x its bound is not 25 % away), at most x8.
    if cap.hi is None:
        top = max(rps, key=lambda r: r.rate)
        ups = _strides([r.rate for r in rps if r.met][::-1], first)
        ratio = slo_ratio(top.check)
        hint = min(1.0 / ratio, MAX_JUMP) if ratio else 1.0
        return round_rate(top.rate * max(first ** (2 ** (ups - 1)), hint))
    bottom = min(rps, key=lambda r: r.rate)
    downs = _strides([r.rate for r in rps if not r.met], first)
    ratio = slo_ratio(bottom.check)
    hint = min(ratio, MAX_JUMP) if ratio else 1.0
    return max(round_rate(bottom.rate / max(first ** (2 ** (downs - 1)), hint)), params.min_rate)


def _strides(rates: list[float], first: float) -> int:
    """How many bracketing steps led to the outermost rate: the run of rates from it (given outermost first) each a
    full step (at least `first`) from the next. Rates a narrowing tried close together are not strides: a met rate
    that a repeat turned into a miss must not make the next step the square of every miss before it (it took the
    search of 1.25 ** 64 down to 2e-06 req/s)."""
    n = 1
    for a, b in itertools.pairwise(rates):
        if max(a, b) / min(a, b) < first * 0.99:
            break
        n += 1
    return n


def _inside(cap: Capacity) -> float:
    """The next rate inside the bracket [lo, hi): where the binding latency, interpolated between the two in
    log-log, meets its bound (a latency curve is smooth there), kept within the bracket's middle 60 % so a curve
    that bends (queueing near saturation) still halves the bracket often enough; the geometric middle when either
    end has no latency (a failed benchmark)."""
    assert cap.lo is not None and cap.hi is not None
    r_lo, r_hi = slo_ratio(cap.check_lo), slo_ratio(cap.check_edge)
    mid = math.sqrt(cap.lo * cap.hi)
    if not r_lo or not r_hi or r_hi <= r_lo:
        return mid
    x0, x1 = math.log(cap.lo), math.log(cap.hi)
    y0, y1 = math.log(r_lo), math.log(r_hi)
    x = x0 + (math.log(TARGET_RATIO) - y0) * (x1 - x0) / (y1 - y0)
    return math.exp(min(max(x, x0 + 0.2 * (x1 - x0)), x0 + 0.8 * (x1 - x0)))


def plan(state: SweepState, v: VariantState, *, start: float | None = None, floor: float | None = None,
         beat: float | None = None, hold: bool = False) -> None:
    """Give a newly planned variant its first point: at `start` (a tune's candidate: the incumbent's capacity, also
    its floor; `beat`: the rate the incumbent missed, measured next; `hold`: no search past the floor, the
    candidate is compared at the incumbent's load), at --rate-start, else closed-loop to find one."""
    assert state.capacity is not None
    params = CapacityParams.of(state.capacity)
    start = start if start is not None else params.rate_start
    search: CapacityOfVariant = {"start": start, "floor": floor, "beat": beat}
    if hold:
        search["hold"] = True
    state.capacity.setdefault("variants", {})[v.id] = search
    level = state.concurrency[0]
    v.points = [Point(concurrency=level, request_rate=None if start is None else round_rate(start))]


def advance(state: SweepState) -> bool:
    """Add the next rate of every planned variant whose search goes on; True when something was added."""
    added = False
    level = state.concurrency[0]
    for v in state.planned():
        if v.failure is not None:
            continue
        r = next_rate(state, v)
        if r is None:
            continue
        v.points.append(Point(concurrency=level, request_rate=r,
                              repeat=sum(1 for p in v.points if p.request_rate == r)))
        added = True
    return added


def measure_again(state: SweepState, v: VariantState, rate: float | None = None) -> Point | None:
    """One more measurement of the variant at `rate` (default its capacity: the noise band's repeats); None when it
    has no capacity yet."""
    rate = rate if rate is not None else result(state, v).lo
    if rate is None:
        return None
    n = sum(1 for p in v.points if p.request_rate == rate)
    point = Point(concurrency=state.concurrency[0], request_rate=rate, repeat=n)
    v.points.append(point)
    return point


def slo_ratio(check: SloCheck | None) -> float | None:
    """The binding bound's latency over its limit (above 1: missed); None when not measured."""
    b = check.binding if check is not None else None
    return None if b is None else b.ratio


def measure_all(state: SweepState, base_spec: Mapping[str, Any], run_variant: RunVariant, *,
                save: Callable[[SweepState], None], clock: Callable[[], float],
                on_progress: Callable[[Progress], None] = lambda _p: None, budget: int | None = None) -> bool:
    """The sweep's loop over every pending point; with a capacity search (`state.capacity`), again after each round
    of rates the searches add, until every search has ended or `budget` points are planned. A sweep and a tune
    measure through this one function. True when the budget stopped a search that would have gone on."""
    while True:
        run_sweep(state, base_spec, run_variant, save=save, clock=clock, on_progress=on_progress)
        if state.capacity is None:
            return False
        if budget is not None and sum(len(v.points) for v in state.planned()) >= int(budget):
            return any(next_rate(state, v) is not None for v in state.planned())
        if not advance(state):
            return False
        save(state)
