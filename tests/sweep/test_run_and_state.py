"""The sweep loop over a real in-process runner: failures recorded and skipped past, interruption, resume."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.sweep.recorded import TableRunner
from toolkit.core.sweep.run import PointRequest, Progress, eta_s, run_sweep
from toolkit.core.sweep.state import (
    DONE,
    FAILED,
    INVALID,
    OVER_BUDGET,
    STATE_SCHEMA_VERSION,
    Measurement,
    SweepState,
    apply_budget,
    check_resume,
    new_state,
    parse_concurrency,
    retry_failed,
    state_from_dict,
)
from toolkit.core.sweep.variants import Variant, parse_axes, plan, variant_spec

from .conftest import LEVELS, VARY, base_spec


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.5  # every reading advances: each point "takes" a few readings
        return self.t


def saved_copies() -> tuple[list[str], Any]:
    copies: list[str] = []

    def save(state: SweepState) -> None:
        copies.append(json.dumps(state.to_dict(), sort_keys=True))

    return copies, save


def test_full_sweep_records_failures_and_goes_on(fresh_state: SweepState, table: dict[str, Any]) -> None:
    runner = TableRunner(table, source="fixtures/sweep_3x2_results.json")
    copies, save = saved_copies()
    events: list[Progress] = []
    run_sweep(fresh_state, base_spec(), runner, save=save, clock=Clock(), on_progress=events.append)

    outcomes = {v.id: v.outcome for v in fresh_state.variants}
    assert outcomes == {"v01": DONE, "v02": DONE, "v03": "partial", "v04": DONE, "v05": FAILED, "v06": DONE}
    v03 = fresh_state.variant(3)
    nan_point = next(p for p in v03.points if p.concurrency == 1024)
    assert nan_point.status == FAILED and nan_point.reason is not None
    assert nan_point.reason.startswith("NaN in outputs: steady_output_tok_per_s=nan")
    v05 = fresh_state.variant(5)
    assert v05.failure is not None and "server did not come up" in v05.failure
    # The server never came up: the runner was asked once for v05, its other levels were not tried.
    assert [c for vid, c in runner.calls if vid == "v05"] == [64]
    assert all(p.reason and p.reason.startswith("not tried: server did not come up") for p in v05.points[1:])
    # Every point was asked for exactly once, the state saved before and after each.
    assert len(runner.calls) == 6 * 3 - 2
    assert len(copies) >= 2 * len(runner.calls)
    # Progress: variant i of n and an ETA once a point has a duration.
    point_events = [e for e in events if e.kind == "point"]
    assert [(e.position, e.planned) for e in point_events][:4] == [(1, 6), (1, 6), (1, 6), (2, 6)]
    assert point_events[0].eta_s is None and point_events[1].eta_s is not None
    assert events[-1].kind == "end" and events[-1].finished_points == 18


def test_interrupt_then_resume_measures_only_what_is_left(fresh_state: SweepState, table: dict[str, Any]) -> None:
    inner = TableRunner(table, source="fixture")
    copies, save = saved_copies()
    calls = 0

    def flaky(request: PointRequest) -> Measurement:
        nonlocal calls
        calls += 1
        if calls == 5:  # Ctrl-C while the 5th point is being measured
            raise KeyboardInterrupt
        return inner(request)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(fresh_state, base_spec(), flaky, save=save, clock=Clock())

    # What a restarted process sees: the last saved file.
    resumed = state_from_dict(json.loads(copies[-1]), file="state.json")
    check_resume(resumed, file="state.json", base_spec=base_spec(), axes=None, concurrency=None)
    finished = [(v.id, p.concurrency) for v, p in resumed.finished_points()]
    assert finished == [("v01", 64), ("v01", 256), ("v01", 1024), ("v02", 64)]
    interrupted = resumed.variant(2).points[1]
    assert interrupted.status == "pending" and interrupted.attempts == 1

    again = TableRunner(table, source="fixture")
    run_sweep(resumed, base_spec(), again, save=save, clock=Clock())
    assert ("v01", 64) not in again.calls and again.calls[0] == ("v02", 256)
    assert len(again.calls) == 16 - 4
    assert resumed.variant(2).points[1].attempts == 2
    assert not resumed.pending()


def test_state_round_trip_is_stable(fresh_state: SweepState, table: dict[str, Any]) -> None:
    run_sweep(fresh_state, base_spec(), TableRunner(table, source="f"), save=lambda s: None, clock=Clock())
    once = json.dumps(fresh_state.to_dict(), sort_keys=True)
    twice = json.dumps(state_from_dict(json.loads(once), file="s").to_dict(), sort_keys=True)
    assert once == twice


def test_newer_and_malformed_state_are_refused(fresh_state: SweepState) -> None:
    data = fresh_state.to_dict()
    data["schema_version"] = STATE_SCHEMA_VERSION + 1
    with pytest.raises(ToolkitError, match="newer toolkit"):
        state_from_dict(data, file="runs/sweeps/x/state.json")
    with pytest.raises(ToolkitError, match="malformed"):
        state_from_dict({"schema_version": 1, "run_id": "x"}, file="s.json")
    with pytest.raises(ToolkitError, match="JSON object"):
        state_from_dict([1, 2], file="s.json")


def test_an_old_state_s_data_source_sentence_loads_as_the_typed_provenance(fresh_state: SweepState,
                                                                           table: dict[str, Any]) -> None:
    run_sweep(fresh_state, base_spec(), TableRunner(table, source="f"), save=lambda s: None, clock=Clock())
    data = json.loads(json.dumps(fresh_state.to_dict()))
    done = [p for v in data["variants"] for p in v["points"] if p["measurement"]]
    assert done and all(p["measurement"]["provenance"] == {"kind": "replayed", "detail": "recorded run"} for p in done)
    for p in done:  # as a state of before the typed provenance wrote it
        del p["measurement"]["provenance"]
        p["measurement"]["data_source"] = "lab data (stand-in): simulated GPUs: the lab's engine model"
    old = state_from_dict(data, file="state.json")
    assert {m.provenance.kind for _v, pt in old.finished_points() if (m := pt.measurement)} == {"stand-in"}
    assert "data_source" not in json.dumps(old.to_dict())  # written back typed
    done[0]["measurement"]["provenance"] = {"kind": "simulated"}
    with pytest.raises(ToolkitError, match=r"runs/s/state\.json: provenance\.kind"):
        state_from_dict(data, file="runs/s/state.json")


def test_resume_refuses_a_changed_definition(fresh_state: SweepState) -> None:
    changed = base_spec()
    changed["server"]["tp"] = 4
    with pytest.raises(ToolkitError, match="changed since this sweep started"):
        check_resume(fresh_state, file="s", base_spec=changed, axes=None, concurrency=None)
    other_axes = parse_axes(["server.max_running_requests=256,512"], base_spec())
    with pytest.raises(ToolkitError, match="--vary differs") as err:
        check_resume(fresh_state, file="s", base_spec=base_spec(), axes=other_axes, concurrency=None)
    assert "server.cuda_graph=on,off" in str(err.value)
    with pytest.raises(ToolkitError, match="--concurrency differs"):
        check_resume(fresh_state, file="s", base_spec=base_spec(), axes=None, concurrency=[64])


def test_invalid_variants_are_skipped_with_their_rule() -> None:
    base = base_spec()
    axes = parse_axes(VARY, base)

    def validate(variant: Variant) -> list[Problem]:
        spec = variant_spec(base, variant)
        if spec["server"]["cuda_graph"] and spec["server"]["max_running_requests"] >= 1024:
            return [Problem("graphs at 1024", rule_id="sm120-graph-capture-hang")]
        return []

    state = new_state(
        run_id="r",
        profile="glm5-tp8",
        base_spec=base,
        axes=axes,
        planned=plan(base, axes, validate),
        concurrency=LEVELS,
        created="",
        runner="t",
    )
    v05 = state.variant(5)
    assert v05.status == INVALID and v05.points == [] and v05.rejected_by() == ["sm120-graph-capture-hang"]
    assert len(state.planned()) == 5


def test_budget_plans_the_first_n_and_a_resume_can_raise_it(fresh_state: SweepState, table: dict[str, Any]) -> None:
    apply_budget(fresh_state, 2)
    assert [v.status for v in fresh_state.variants] == ["planned"] * 2 + [OVER_BUDGET] * 4
    run_sweep(fresh_state, base_spec(), TableRunner(table, source="f"), save=lambda s: None, clock=Clock())
    assert len(fresh_state.finished_points()) == 6
    apply_budget(fresh_state, 4)
    assert [v.status for v in fresh_state.variants][:4] == ["planned"] * 4
    assert fresh_state.variant(1).outcome == DONE  # kept
    assert len(fresh_state.pending()) == 6


def test_retry_failed_measures_the_failures_again(fresh_state: SweepState, table: dict[str, Any]) -> None:
    run_sweep(fresh_state, base_spec(), TableRunner(table, source="f"), save=lambda s: None, clock=Clock())
    assert retry_failed(fresh_state) == 4  # v03 at 1024 (NaN) and v05's three levels
    assert fresh_state.variant(5).failure is None
    again = TableRunner(table, source="f")
    run_sweep(fresh_state, base_spec(), again, save=lambda s: None, clock=Clock())
    # The same recorded failures come back; only the failed points were asked for, v05 once.
    assert again.calls == [("v03", 1024), ("v05", 64)]
    assert fresh_state.variant(5).outcome == FAILED


def test_concurrency_and_eta() -> None:
    assert parse_concurrency("64,256,1024") == [64, 256, 1024]
    for bad in ("64,x", "0,64", "64,64", ""):
        with pytest.raises(ToolkitError):
            parse_concurrency(bad)
    assert eta_s([], 5) is None
    assert eta_s([10.0, 30.0, 11.0], 4) == 44.0
