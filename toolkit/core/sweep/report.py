"""The sweep's result as data for tables and as Markdown (pure; the CLI prints it, the store writes it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolkit.core.provenance import KINDS, Provenance, mark, stamp
from toolkit.core.sweep import capacity
from toolkit.core.sweep.ranking import (
    ParetoPoint,
    RankedRow,
    pareto_front,
    rank_by_efficiency,
    rank_by_goodput,
    rank_by_throughput,
)
from toolkit.core.sweep.slo import SLO_DEFINITIONS, slo_definition
from toolkit.core.sweep.state import DONE, INVALID, OVER_BUDGET, SweepState, VariantState
from toolkit.core.sweep.variants import format_value
from toolkit.core.tables import collapse_repeats, markdown_table


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def ranking_rows(rows: Sequence[RankedRow]) -> list[list[str]]:
    return [
        [
            str(r.rank) + (" (=#1)" if r.tied_with_first else ""),
            r.variant_id,
            r.label,
            str(r.concurrency),
            # Each column one kind of figure: no steady state leaves the steady cell empty (ranked by the
            # whole run's rate, in its own column).
            _f(r.steady_output_tok_per_s, ",.1f") if r.throughput_window == "steady" else "- (no steady state)",
            _f(r.full_output_tok_per_s if r.full_output_tok_per_s is not None or r.throughput_window == "steady"
               else r.steady_output_tok_per_s, ",.1f"),
            _f(r.tokens_per_j, ".3f"),
            _f(r.energy_per_output_token_j, ".3f"),
            _f(r.power_w_per_gpu, ",.1f") if r.power_w_per_gpu is not None
            else _f(r.power_w_total, ",.0f") + (" (all GPUs)" if r.power_w_total is not None else ""),
            r.verdict or "-",
            r.outcome,
        ]
        for r in rows
    ]


RANKING_SCHEMA_VERSION = 1  # of ranking.json (and `toolkit sweep --json`)

RANK_HEADER = ["#", "variant", "knobs", "concurrency", "steady tok/s", "full-run tok/s", "tok/J", "J/tok", "W/GPU",
               "verdict", "runs"]


def not_measured(state: SweepState) -> list[tuple[str, str, str]]:
    """(variant, knobs, why not ranked) for invalid, over-budget and failed variants and failed points."""
    out: list[tuple[str, str, str]] = []
    for v in state.variants:
        if v.status == INVALID:
            out.append((v.id, v.label, "invalid: " + ", ".join(v.rejected_by())))
        elif v.status == OVER_BUDGET:
            out.append((v.id, v.label, f"over budget ({state.budget})"))
        else:
            for p in v.points:
                if p.status not in (DONE, "pending"):
                    out.append((v.id, v.label, f"c={p.concurrency} failed: {p.reason}"))
                elif p.status == "pending":
                    out.append((v.id, v.label, f"c={p.concurrency} not measured yet"))
    return out


def curves(state: SweepState) -> list[dict[str, Any]]:
    """Throughput against concurrency per variant: the points of the first plot."""
    out = []
    for v in state.planned():
        pts = [
            (p.concurrency, p.measurement.steady_output_tok_per_s)
            for p in v.points
            if p.status == DONE and p.measurement is not None
        ]
        if pts:
            out.append({"variant": v.id, "label": v.label, "points": sorted(pts)})
    return out


def to_json(state: SweepState) -> dict[str, Any]:
    def row(r: RankedRow) -> dict[str, Any]:
        return {**r.__dict__, "provenance": r.provenance.to_dict()}

    def pp(p: ParetoPoint) -> dict[str, Any]:
        return dict(p.__dict__)

    return {
        "schema_version": RANKING_SCHEMA_VERSION,
        "run_id": state.run_id,
        "profile": state.profile,
        "runner": state.runner,
        "by_throughput": [row(r) for r in rank_by_throughput(state)],
        **({"slo": state.capacity.get("slo"), "by_goodput": [row(r) for r in rank_by_goodput(state)]}
           if state.capacity else {}),
        "by_tokens_per_j": [row(r) for r in rank_by_efficiency(state)],
        "pareto_front": [pp(p) for p in pareto_front(state)],
        "not_measured": [{"variant": a, "knobs": b, "reason": c} for a, b, c in not_measured(state)],
    }


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(markdown_table(header, rows))


GOODPUT_HEADER = ["#", "variant", "knobs", "rate req/s", "goodput tok/s", "full-run tok/s", "tok/J", "J/tok",
                  "W/GPU", "verdict", "runs"]


def _rate_rows(rows: Sequence[RankedRow]) -> list[list[str]]:
    """A ranking under an SLO: the capacity rate in the concurrency's place."""
    out = ranking_rows(rows)
    for r, row in zip(rows, out, strict=True):
        row[3] = _f(r.request_rate, "g")
        row[4] = _f(r.goodput_tok_per_s, ",.1f") + f" ({_f(r.steady_output_tok_per_s, ',.1f')} steady)"
    return out


def _tie_note(rows: Sequence[RankedRow]) -> list[str]:
    """Under a ranking whose rows tie with #1: which, and why their order is not one."""
    tied = [r.variant_id for r in rows if r.tied_with_first]
    if not tied or not rows:
        return []
    top = rows[0]
    return ["", f"(=#1): {', '.join(tied)} within the 95 % interval of #1 {top.variant_id} "
                f"({_f(top.interval_low, ',.1f')} to {_f(top.interval_high, ',.1f')} tok/s): their order is "
                "noise, not a result."]


def ranking_sections(state: SweepState, throughput_title: str) -> list[str]:
    """The rankings of every measured variant (the sweep's report and the tune's both end with them): throughput,
    goodput under the SLO when the run searched capacities, tokens per joule (at each capacity rate then); without
    an SLO, when both orders are the same, one table says so instead of two identical ones."""
    by_tp, by_tpj = rank_by_throughput(state), rank_by_efficiency(state)
    if state.capacity is not None:
        slo = ", ".join(f"{k} {v:g}" for k, v in state.capacity["slo"].items())
        return [f"## {throughput_title}", "", _md_table(RANK_HEADER, ranking_rows(by_tp)), *_tie_note(by_tp),
                "", f"## Ranked by goodput under the SLO ({slo})", "",
                "Goodput: the output tok/s carried by the highest Poisson request rate whose p99 latencies met "
                "every bound (the rate x the workload's output tokens per request); beside it, the steady window's "
                f"throughput measured there. SLO definition: "
                f"{SLO_DEFINITIONS[slo_definition(state.capacity['slo'])]}.", "",
                _md_table(GOODPUT_HEADER, _rate_rows(rank_by_goodput(state))),
                "", "## Ranked by output tokens per joule at each capacity rate", "",
                _md_table(GOODPUT_HEADER, _rate_rows(by_tpj))]
    if [(r.variant_id, r.concurrency) for r in by_tp] == [(r.variant_id, r.concurrency) for r in by_tpj]:
        return [f"## {throughput_title}", "", "Ranked by output tokens per joule, the order is the same.", "",
                _md_table(RANK_HEADER, ranking_rows(by_tp)), *_tie_note(by_tp)]
    return [
        f"## {throughput_title}",
        "",
        _md_table(RANK_HEADER, ranking_rows(by_tp)),
        *_tie_note(by_tp),
        "",
        "## Ranked by output tokens per joule",
        "",
        _md_table(RANK_HEADER, ranking_rows(by_tpj)),
    ]


def not_measured_rows(state: SweepState) -> list[list[str]]:
    """`not_measured` for a table: one line per reason (the same failure at every concurrency is one row naming
    the concurrencies), the reason on one line."""
    rows = [[v, k, " ".join(why.split())] for v, k, why in not_measured(state)]
    # "c=64 failed: X", "c=256 failed: X" -> one row "c=64, c=256 failed: X"
    split = []
    for v, k, why in rows:
        head, sep, rest = why.partition(" ")
        if head.startswith("c=") and sep:
            split.append([v, k, head, rest])
        else:
            split.append([v, k, "", why])
    out = []
    for row in collapse_repeats(split, 2):
        v, k, cs, why = row
        out.append([v, k, f"{cs} {why}".strip()])
    return out


def provenances(state: SweepState) -> list[Provenance]:
    """Where the finished points' figures came from, each kind and detail once, measured first."""
    found = {p.measurement.provenance for _v, p in state.finished_points() if p.measurement}
    return sorted(found, key=lambda p: (KINDS.index(p.kind), p.detail or ""))


def data_text(state: SweepState) -> str:
    return ", ".join(mark(p, detail=True) for p in provenances(state)) or "none yet"


def data_watermark(state: SweepState) -> str | None:
    """The stamp of a sweep's or tune's images: the marks of every source that was not measured, else None."""
    return stamp(provenances(state))


def markdown(state: SweepState, *, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The sweep report: both rankings, the Pareto front, what was not measured and why, the plots."""
    axes = ", ".join(f"`{a.path}` in [{', '.join(format_value(x) for x in a.values)}]" for a in state.axes)
    parts = [
        f"# Sweep {state.run_id}",
        "",
        f"Base profile `{state.profile}` (spec hash {state.base_spec_hash}); varied {axes}; "
        f"concurrency {', '.join(map(str, state.concurrency))}.",
        f"Runner: {state.runner}. Data: {data_text(state)}.",
        "",
        *ranking_sections(state, "Ranked by steady-state output throughput"),
        "",
        "## Pareto front: throughput against energy per token",
        "",
        "No other measured point has both more throughput and less energy per token than these.",
        "",
        _md_table(
            ["variant", "knobs", "concurrency", "steady tok/s", "J/tok"],
            [
                [
                    p.variant_id,
                    p.label,
                    str(p.concurrency),
                    f"{p.steady_output_tok_per_s:,.1f}",
                    f"{p.energy_per_output_token_j:.3f}",
                ]
                for p in pareto_front(state)
            ],
        ),
    ]
    parts += capacity_section(state)
    parts += not_ranked_section(state)
    stamp = data_watermark(state)
    if plots and stamp:
        parts += ["", f"The plots are marked **{stamp}**: not a measurement."]
    for title, file in plots:
        parts += ["", f"![{title}]({file})"]
    return "\n".join(parts) + "\n"


def capacity_section(state: SweepState, interval_of: Callable[[VariantState], Any] | None = None) -> list[str]:
    """The report's "Capacity under the SLO" section, a sweep's and a tune's alike (none without a capacity
    search); with `interval_of`, goodput with its interval."""
    if state.capacity is None:
        return []
    goodput = "goodput tok/s [to the rate missed]" if interval_of is not None else "goodput tok/s"
    return ["", "## Capacity under the SLO, per variant", "",
            _md_table(["variant", "knobs", "power limit W", "rates tried (req/s; + met, - missed)", "capacity req/s",
                       goodput, "tok/J", "J/tok", "search"], capacity_rows(state, interval_of=interval_of))]


def not_ranked_section(state: SweepState) -> list[str]:
    """The report's "Not ranked" section: each variant or point with no figure to rank, and why (none when every
    one has)."""
    missing = not_measured_rows(state)
    return ["", "## Not ranked", "", _md_table(["variant", "knobs", "why"], missing)] if missing else []


def capacity_rows(state: SweepState, interval_of: Callable[[VariantState], Any] | None = None) -> list[list[str]]:
    """Per variant with a capacity search: the rates tried and what they gave, its capacity, goodput (with its
    interval, when `interval_of` gives one), energy there, and how the search ended."""
    rows = []
    for v in state.planned():
        cap = capacity.result(state, v)
        m = cap.at_lo
        limit = next((p.measurement.power_limit_w for p in v.points if p.measurement and p.measurement.power_limit_w),
                     None)
        tried = " ".join(f"{r.rate:g}{'+' if r.met else '-'}" for r in cap.rates) or "-"
        ci = interval_of(v) if interval_of else None
        good = "-" if cap.goodput is None else f"{cap.goodput:,.1f}" + (
            f" [{ci.low:,.1f}, {ci.high:,.1f}]" if ci else "")
        bracket = "-" if cap.lo is None else f"{cap.lo:g}" + (f" (missed at {cap.hi:g})" if cap.hi else "")
        rows.append([v.id, v.label or "(the base)", "-" if limit is None else f"{limit:g}", tried, bracket, good,
                     "-" if m is None or m.tokens_per_j is None else f"{m.tokens_per_j:.4g}",
                     "-" if m is None or m.energy_per_output_token_j is None else f"{m.energy_per_output_token_j:.4g}",
                     cap.status])
    return rows


def frontier_series(state: SweepState) -> list[dict[str, Any]]:
    """The frontier plot's data: per variant, each measured rate's output tok/s and p99 TTFT and ITL, whether the
    SLO held there, its J/token at its capacity rate and its power limit."""
    out = []
    for v in state.planned():
        cap = capacity.result(state, v)
        pts = []
        for r in cap.rates:
            m = r.measurement
            if m is None:
                continue
            # What the rate carries (as goodput is read), not the short run's steady window, which jumps.
            carried = capacity.carried_tok_per_s(m, r.rate)
            tok_s = m.steady_output_tok_per_s if carried is None else carried
            pts.append({"tok_s": tok_s, "ttft_ms": (m.latency_ms.get("ttft") or {}).get("p99"),
                        "itl_ms": (m.latency_ms.get("itl") or {}).get("p99"), "met": r.met, "rate": r.rate})
        if not pts:
            continue
        limit = next((p.measurement.power_limit_w for p in v.points if p.status == DONE and p.measurement
                      and p.measurement.power_limit_w), None)
        out.append({"label": f"{v.id} {v.label}".strip(), "points": pts, "power_limit_w": limit,
                    "j_per_tok": cap.at_lo.energy_per_output_token_j if cap.at_lo else None})
    return out
