"""A sweep answered by recorded probe runs: the H200 recordings read through the probe's own
summary and verdict code and the results entry builder, then ranked (fixtures/sweep_3x2_probe_runs.yaml).

Expected figures come from each run's summary.json (the probe's own output), not from this code.
"""

from __future__ import annotations

import json

import yaml

from toolkit.app.measure import measurement_from_probe_dir
from toolkit.core.sweep.ranking import pareto_front, rank_by_efficiency, rank_by_throughput
from toolkit.core.sweep.recorded import TableRunner
from toolkit.core.sweep.run import run_sweep
from toolkit.core.sweep.state import DONE, FAILED, SweepState, new_state
from toolkit.core.sweep.variants import parse_axes, plan

from .conftest import FIXTURES, VARY, base_spec, no_problems

TABLE = FIXTURES / "sweep_3x2_probe_runs.yaml"


def steady_rate(run: str) -> float:
    summary = json.loads((FIXTURES / run / "summary.json").read_text())
    return float(summary["steady"]["throughput"]["output_tok_per_s"])


def test_ranking_from_recorded_probe_runs() -> None:
    base = base_spec()
    axes = parse_axes(VARY, base)
    state: SweepState = new_state(
        run_id="r",
        profile="glm5-tp8",
        base_spec=base,
        axes=axes,
        planned=plan(base, axes, no_problems),
        concurrency=[64],
        created="",
        runner="t",
    )
    runner = TableRunner(
        yaml.safe_load(TABLE.read_text()),
        source=str(TABLE),
        load_probe_run=lambda run: measurement_from_probe_dir(FIXTURES / run),
    )
    t = iter(range(1000))
    run_sweep(state, base, runner, save=lambda s: None, clock=lambda: float(next(t)))

    runs = {
        "v01": "../../fixtures/probe/h200-compute",
        "v02": "../../fixtures/probe/h200-memory",
        "v03": "../../fixtures/probe/h200-spin",
        "v04": "../../fixtures/probe/h200-launch",
    }
    expected = sorted(runs, key=lambda vid: -steady_rate(runs[vid]))
    rows = rank_by_throughput(state)
    assert [r.variant_id for r in rows] == expected == ["v04", "v02", "v01", "v03"]
    for r in rows:
        assert r.steady_output_tok_per_s == round(steady_rate(runs[r.variant_id]), 1)
        assert r.provenance.kind == "replayed" and (r.provenance.detail or "").startswith("probe run h200-")
    assert {r.variant_id: r.verdict for r in rows} == {
        "v01": "compute-bound",
        "v02": "memory-bandwidth-bound",
        "v03": "busy-but-waiting",
        "v04": "launch-bound",
    }
    assert [r.variant_id for r in rank_by_efficiency(state)] == ["v04", "v02", "v01", "v03"]
    # The launch-bound loop has both the most steps per second and the least energy per step.
    assert [(p.variant_id, p.concurrency) for p in pareto_front(state)] == [("v04", 64)]

    v05, v06 = state.variant(5).points[0], state.variant(6).points[0]
    assert v05.status == FAILED and v05.reason is not None and v05.reason.startswith("benchmark failed (exit 3)")
    assert v06.status == FAILED and v06.reason == "no output tokens in the steady window"
    assert sum(1 for v in state.planned() for p in v.points if p.status == DONE) == 4
