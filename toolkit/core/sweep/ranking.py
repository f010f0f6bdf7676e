"""Ranking a sweep's variants and the Pareto front of throughput against energy per token.

Pure functions of a SweepState's recorded measurements. A variant's row is its best point: the
concurrency level with the highest steady-state output throughput (for the throughput ranking) or the
most output tokens per joule (for the efficiency ranking); ties go to the lower variant number, so the
order is stable across runs. A throughput row carries its figure's 95 % interval (its repeats' and its steady
window's, toolkit.core.sweep.noise) and is marked tied with #1 when the two intervals overlap: a gap inside the
noise is not an order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolkit.core.provenance import Provenance
from toolkit.core.stats import ties_with_first
from toolkit.core.sweep.noise import interval, within_run
from toolkit.core.sweep.state import DONE, Measurement, SweepState, VariantState


@dataclass(frozen=True)
class RankedRow:
    rank: int
    variant_index: int
    variant_id: str
    label: str
    concurrency: int
    steady_output_tok_per_s: float
    tokens_per_j: float | None
    energy_per_output_token_j: float | None
    power_w_total: float | None
    verdict: str | None
    outcome: str  # done or partial
    provenance: Provenance
    throughput_window: str = "steady"
    request_rate: float | None = None  # under an SLO: the capacity rate the figures were measured at
    goodput_tok_per_s: float | None = None  # under an SLO: the output tok/s that rate carries (capacity.py)
    full_output_tok_per_s: float | None = None  # over the whole run, ramp and drain included
    gpu_count: int | None = None  # GPUs power_w_total is summed over
    # The ranked figure's 95 % interval (None: no spread measured) and whether it overlaps #1's.
    interval_low: float | None = None
    interval_high: float | None = None
    tied_with_first: bool = False

    @property
    def power_w_per_gpu(self) -> float | None:
        """Mean power per GPU, as every other table says it (None where the count was not recorded)."""
        if self.power_w_total is None or not self.gpu_count:
            return None
        return self.power_w_total / self.gpu_count


@dataclass(frozen=True)
class ParetoPoint:
    variant_index: int
    variant_id: str
    label: str
    concurrency: int
    steady_output_tok_per_s: float
    energy_per_output_token_j: float


def _done(v: VariantState) -> list[tuple[int, Measurement]]:
    """(concurrency, measurement) of each measured level. A level measured more than once (a tune's base,
    `Point.repeat`) counts once, by its median-throughput measurement: the best of repeats would rank luck."""
    by_level: dict[int, list[Measurement]] = {}
    for p in v.points:
        if p.status == DONE and p.measurement is not None:
            by_level.setdefault(p.concurrency, []).append(p.measurement)
    out = []
    for c, ms in by_level.items():
        ms = sorted(ms, key=lambda m: m.steady_output_tok_per_s)
        out.append((c, ms[(len(ms) - 1) // 2]))
    return out


def best_point(v: VariantState, by: str = "throughput") -> tuple[int, Measurement] | None:
    """A variant's best measured level: (concurrency, measurement) by throughput (ties: the lower concurrency, the
    same rate with less queueing) or by tokens per joule (`by="tokens_per_j"`); None when nothing was measured."""
    if by == "throughput":
        points = _done(v)
        return max(points, key=lambda cm: (cm[1].steady_output_tok_per_s, -cm[0])) if points else None
    points = [(c, m) for c, m in _done(v) if m.tokens_per_j is not None]
    return max(points, key=lambda cm: (cm[1].tokens_per_j or 0.0, cm[1].steady_output_tok_per_s)) if points else None


def _row(rank: int, v: VariantState, concurrency: int, m: Measurement, rate: float | None = None,
         goodput: float | None = None) -> RankedRow:
    return RankedRow(
        rank=rank,
        variant_index=v.index,
        variant_id=v.id,
        label=v.label,
        concurrency=concurrency,
        steady_output_tok_per_s=m.steady_output_tok_per_s,
        tokens_per_j=m.tokens_per_j,
        energy_per_output_token_j=m.energy_per_output_token_j,
        power_w_total=m.power_w_total,
        verdict=m.verdict,
        outcome=v.outcome,
        provenance=m.provenance,
        throughput_window=m.throughput_window,
        request_rate=rate,
        goodput_tok_per_s=goodput,
        full_output_tok_per_s=m.output_tok_per_s,
        gpu_count=m.gpu_count,
    )


def rank_by_throughput(state: SweepState) -> list[RankedRow]:
    """Variants by their best steady-state output throughput, highest first."""
    best: list[tuple[VariantState, int, Measurement]] = []
    for v in state.planned():
        found = best_point(v, "throughput")
        if found:
            best.append((v, *found))
    best.sort(key=lambda b: (-b[2].steady_output_tok_per_s, b[0].index))
    rows = [_row(i, v, c, m) for i, (v, c, m) in enumerate(best, start=1)]
    spans = [_throughput_interval(v, c, m) for v, c, m in best]
    return [replace(r, interval_low=s[0] if s else None, interval_high=s[1] if s else None, tied_with_first=tied)
            for r, s, tied in zip(rows, spans, ties_with_first(spans), strict=True)]


def _throughput_interval(v: VariantState, concurrency: int, m: Measurement) -> tuple[float, float] | None:
    """The 95 % interval of the ranked throughput: the level's repeats (centred on the median the row shows) or
    its one run's steady window; None when neither measured a spread."""
    ms = [p.measurement for p in v.points
          if p.status == DONE and p.measurement is not None and p.concurrency == concurrency]
    ci = interval([x.steady_output_tok_per_s for x in ms],
                  [within_run(x.interval_tok_per_s, x.interval_s) for x in ms], value=m.steady_output_tok_per_s)
    return None if ci.low == ci.high else (ci.low, ci.high)


def _at_capacity(state: SweepState) -> list[tuple[VariantState, int, Measurement, float, float]]:
    """Each variant's measurement at the highest rate that met the SLO (a run with a capacity search), that rate
    and the goodput it carries."""
    from toolkit.core.sweep import capacity

    out = []
    for v in state.planned():
        cap = capacity.result(state, v)
        if cap.at_lo is not None and cap.lo is not None and cap.goodput is not None:
            out.append((v, state.concurrency[0], cap.at_lo, cap.lo, cap.goodput))
    return out


def rank_by_goodput(state: SweepState) -> list[RankedRow]:
    """Variants by their goodput: the output tok/s the highest Poisson rate that met the SLO carries, highest first
    (ties: the lower variant); variants whose search found no such rate are not ranked."""
    if state.capacity is None:
        return []
    best = sorted(_at_capacity(state), key=lambda b: (-b[4], b[0].index))
    return [_row(i, v, c, m, rate, good) for i, (v, c, m, rate, good) in enumerate(best, start=1)]


def rank_by_efficiency(state: SweepState) -> list[RankedRow]:
    """Variants by their best output tokens per joule, highest first; variants without energy data last. Under an
    SLO, each variant's tokens per joule at its capacity rate (its energy at the highest load it serves within it)."""
    if state.capacity is not None:
        rows = [b for b in _at_capacity(state) if b[2].tokens_per_j is not None]
        rows.sort(key=lambda b: (-(b[2].tokens_per_j or 0.0), b[0].index))
        return [_row(i, v, c, m, rate, good) for i, (v, c, m, rate, good) in enumerate(rows, start=1)]
    best: list[tuple[VariantState, int, Measurement]] = []
    for v in state.planned():
        found = best_point(v, "tokens_per_j")
        if found:
            best.append((v, *found))
    best.sort(key=lambda b: (-(b[2].tokens_per_j or 0.0), b[0].index))
    return [_row(i, v, c, m) for i, (v, c, m) in enumerate(best, start=1)]


def pareto_front(state: SweepState) -> list[ParetoPoint]:
    """The measured points no other point beats on both throughput (higher) and energy per token (lower).

    Every (variant, concurrency) point takes part: a variant may be on the front at one load and not at
    another. Sorted by throughput, lowest first, which is also energy per token rising along the front.
    """
    points = [
        ParetoPoint(v.index, v.id, v.label, c, m.steady_output_tok_per_s, m.energy_per_output_token_j)
        for v in state.planned()
        for c, m in _done(v)
        if m.energy_per_output_token_j is not None
    ]
    # Highest throughput first; among equal throughput the least energy first, so the first of a tie wins.
    points.sort(key=lambda p: (-p.steady_output_tok_per_s, p.energy_per_output_token_j, p.variant_index, p.concurrency))
    front: list[ParetoPoint] = []
    best_energy = float("inf")
    for p in points:
        if p.energy_per_output_token_j < best_energy:
            front.append(p)
            best_energy = p.energy_per_output_token_j
    return sorted(front, key=lambda p: (p.steady_output_tok_per_s, p.variant_index))


def ranking(state: SweepState, by: str) -> list[RankedRow]:
    """The ranking `by` names: throughput, goodput or tokens_per_j."""
    return {"throughput": rank_by_throughput, "goodput": rank_by_goodput}.get(by, rank_by_efficiency)(state)


def best_variant(state: SweepState, by: str = "throughput") -> RankedRow | None:
    rows = ranking(state, by)
    return rows[0] if rows else None
