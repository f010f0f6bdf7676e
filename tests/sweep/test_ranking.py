"""Ranking and the Pareto front, from the recorded 3 x 2 table (sweep_3x2_results.json).

The expected orders below were worked out by hand from the table (tokens per joule = steady output
tok/s / total power W), and the front is checked again against the definition, point by point.
"""

from __future__ import annotations

from typing import Any

from toolkit.core.sweep.ranking import best_variant, pareto_front, rank_by_efficiency, rank_by_throughput
from toolkit.core.sweep.recorded import TableRunner
from toolkit.core.sweep.run import run_sweep
from toolkit.core.sweep.state import DONE, SweepState

from .conftest import base_spec


def measured(state: SweepState, table: dict[str, Any]) -> SweepState:
    t = iter(range(10_000))
    run_sweep(state, base_spec(), TableRunner(table, source="f"), save=lambda s: None, clock=lambda: float(next(t)))
    return state


def test_throughput_ranking(fresh_state: SweepState, table: dict[str, Any]) -> None:
    rows = rank_by_throughput(measured(fresh_state, table))
    # v05 never came up and is not ranked; v03 is ranked on its two good levels (1024 gave NaN).
    assert [(r.variant_id, r.concurrency, r.steady_output_tok_per_s) for r in rows] == [
        ("v06", 1024, 3740.0),
        ("v04", 1024, 2650.0),
        ("v03", 256, 1910.0),
        ("v01", 1024, 1530.0),
        ("v02", 1024, 1440.0),
    ]
    assert [r.rank for r in rows] == [1, 2, 3, 4, 5]
    assert rows[2].outcome == "partial"
    assert rows[0].label == "max_running_requests=1024 cuda_graph=off"
    best = best_variant(fresh_state)
    assert best is not None and best.variant_id == "v06"


def test_efficiency_ranking_differs(fresh_state: SweepState, table: dict[str, Any]) -> None:
    rows = rank_by_efficiency(measured(fresh_state, table))
    got = [(r.variant_id, r.concurrency, round(r.tokens_per_j or 0, 3)) for r in rows]
    assert got == [
        ("v02", 256, round(1390 / 760, 3)),  # 1.829
        ("v01", 1024, round(1530 / 900, 3)),  # 1.700
        ("v06", 1024, round(3740 / 2400, 3)),  # 1.558
        ("v04", 1024, round(2650 / 1880, 3)),  # 1.410
        ("v03", 256, round(1910 / 1700, 3)),  # 1.124
    ]
    best = best_variant(fresh_state, by="tokens_per_j")
    assert best is not None and best.variant_id == "v02"


def test_pareto_front(fresh_state: SweepState, table: dict[str, Any]) -> None:
    state = measured(fresh_state, table)
    front = pareto_front(state)
    assert [(p.variant_id, p.concurrency) for p in front] == [("v02", 256), ("v01", 1024), ("v06", 1024)]
    # Along the front, more throughput costs more energy per token.
    assert [p.steady_output_tok_per_s for p in front] == sorted(p.steady_output_tok_per_s for p in front)
    assert [p.energy_per_output_token_j for p in front] == sorted(p.energy_per_output_token_j for p in front)

    # The definition, checked on every measured point: on the front iff no other point dominates it.
    points = [
        (v.id, p.concurrency, p.measurement.steady_output_tok_per_s, p.measurement.energy_per_output_token_j)
        for v in state.planned()
        for p in v.points
        if p.status == DONE and p.measurement and p.measurement.energy_per_output_token_j is not None
    ]
    assert len(points) == 14  # 5 variants x 3 levels, less the NaN point
    on_front = {(p.variant_id, p.concurrency) for p in front}
    for vid, c, tput, energy in points:
        dominated = any(
            t2 >= tput and e2 <= energy and (t2 > tput or e2 < energy)
            for _v, _c, t2, e2 in points
            if (_v, _c) != (vid, c)
        )
        assert ((vid, c) in on_front) == (not dominated), (vid, c)


def test_nothing_measured_ranks_nothing(fresh_state: SweepState) -> None:
    assert rank_by_throughput(fresh_state) == []
    assert pareto_front(fresh_state) == []
    assert best_variant(fresh_state) is None


def test_the_tables_steady_column_holds_only_steady_figures_and_power_is_per_gpu() -> None:
    from toolkit.core.provenance import MEASURED
    from toolkit.core.sweep.ranking import RankedRow
    from toolkit.core.sweep.report import RANK_HEADER, ranking_rows

    common = dict(variant_index=0, label="k=1", concurrency=128, tokens_per_j=1.0, energy_per_output_token_j=1.0,
                  verdict="x", outcome="done", provenance=MEASURED)
    steady = RankedRow(rank=1, variant_id="v01", steady_output_tok_per_s=1400.0, power_w_total=1332.0, gpu_count=8,
                       full_output_tok_per_s=1300.0, **common)  # type: ignore[arg-type]
    whole = RankedRow(rank=2, variant_id="v02", steady_output_tok_per_s=1324.6, power_w_total=1500.0,
                      throughput_window="full", **common)  # type: ignore[arg-type]
    rows = [dict(zip(RANK_HEADER, r, strict=True)) for r in ranking_rows([steady, whole])]
    assert (rows[0]["steady tok/s"], rows[0]["full-run tok/s"], rows[0]["W/GPU"]) == ("1,400.0", "1,300.0", "166.5")
    # No steady state: nothing in the steady column; the whole run's rate in its own; a total without its count
    # says so.
    assert (rows[1]["steady tok/s"], rows[1]["full-run tok/s"]) == ("- (no steady state)", "1,324.6")
    assert rows[1]["W/GPU"] == "1,500 (all GPUs)"


def test_a_gap_inside_the_noise_is_marked_tied_with_first_and_the_report_says_so() -> None:
    """Two variants 0.6 % apart, each steady window swinging +-3 % interval by interval, are tied; one 10 % below
    is not. The table's rank cell and the note under it say which."""
    import random

    from toolkit.core.sweep.report import ranking_sections
    from toolkit.core.sweep.state import PLANNED, Measurement, Point, VariantState, new_state

    def variant(index: int, tok_per_s: float) -> VariantState:
        rng = random.Random(index)
        series = [tok_per_s * (1 + rng.gauss(0, 0.03)) for _ in range(60)]
        m = Measurement(steady_output_tok_per_s=tok_per_s, interval_tok_per_s=series, interval_s=1.0)
        return VariantState(index=index, knobs=[("server.max_running_requests", 2 ** (5 + index))], status=PLANNED,
                            points=[Point(concurrency=64, status=DONE, measurement=m)])

    state = new_state(run_id="r", profile="p", base_spec={}, axes=[], planned=[], concurrency=[64], created="",
                      runner="test")
    state.variants += [variant(1, 1000.0), variant(2, 1006.0), variant(3, 900.0)]
    rows = rank_by_throughput(state)
    assert [(r.variant_id, r.tied_with_first) for r in rows] == [("v02", False), ("v01", True), ("v03", False)]
    top = rows[0]
    assert top.interval_low is not None and top.interval_high is not None
    assert top.interval_low < 1006.0 < top.interval_high and (top.interval_high - top.interval_low) / 1006.0 < 0.05
    md = "\n".join(ranking_sections(state, "Ranked"))
    assert "| 2 (=#1) | v01 |" in md and "(=#1): v01 within the 95 % interval of #1 v02" in md
