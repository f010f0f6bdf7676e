"""The tune loop itself (toolkit.core.tune.loop) over real runners: the lab's engine model in-process
(toolkit.lab.engine_runner: its scheduler, its power model, the probe's knob_steps code) and recorded tables (the
sweep's TableRunner) where a test needs a spread or a failure the model does not give."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.profiles import check
from toolkit.core.profile import parse_profile_text, resolve
from toolkit.core.profile.render import render_launch_argv
from toolkit.core.sweep.promote import promote
from toolkit.core.sweep.recorded import TableRunner
from toolkit.core.sweep.run import PointRequest
from toolkit.core.sweep.state import Measurement
from toolkit.core.tune import report
from toolkit.core.tune.loop import BUDGET, CONVERGED, NOTHING_NEW, raise_budget, score
from toolkit.lab.engine_runner import EngineModelRunner

from .conftest import BASE, Saves, fresh, tune

MRR = "server.max_running_requests"


def engine(profiles: ProfileStore) -> EngineModelRunner:
    return EngineModelRunner(base=BASE, profile_names=profiles.names())


def test_glm5_baseline_finds_the_running_cap_then_the_communication_limit(profiles: ProfileStore) -> None:
    state, spec = fresh(profiles)
    runner = engine(profiles)
    tune(profiles, state, spec, runner)
    log = state.tune
    assert log is not None
    steps = log["steps"]

    # Step 1: the base is scheduler-capped at its 64 slots; the first candidate is the boldest value its verdict
    # named, and as it beat the base the smaller ones are not measured.
    base_m = score(state.variant(1), "throughput")
    assert base_m is not None and base_m.measurement.verdict == "scheduler-capped"
    proposed = next(s for s in base_m.measurement.knob_steps if s["knob"] == MRR)["proposed"]
    assert len(proposed) >= 2 and proposed == sorted(proposed)
    assert steps[1]["verdict"]["class"] == "scheduler-capped"
    assert [c["change"][MRR] for c in steps[1]["candidates"]] == [[64, proposed[-1]]]
    assert [s["value"] for s in steps[1]["skipped"]] == proposed[-2::-1]
    assert all("already beat v01" in s["reason"] for s in steps[1]["skipped"])
    assert steps[1]["result"]["decision"] == "improved"
    best = state.variant(int(log["incumbent"]))
    assert dict(best.knobs)[MRR] >= 512

    # Step 2: at the new cap the GPUs wait on the allreduce: the verdict proposes the story's next layouts.
    assert steps[2]["from"] == best.id and steps[2]["verdict"]["class"] == "busy-but-waiting"
    changes = {c["knob"]: c for c in steps[2]["candidates"]}
    assert changes["server.tp_size"]["change"] == {"server.tp_size": [8, 4], "server.pp_size": [1, 2]}
    assert changes["server.tp_size"]["profiles"] == ["glm5-tp4-pp2"]
    assert changes["server.ep_size"]["change"] == {"server.ep_size": [1, 8]}
    assert changes["server.ep_size"]["profiles"] == ["glm5-ep8"]
    # The engine model has no pipeline stages: 392 GiB of weights over 4 GPUs do not fit; recorded with its reason.
    assert changes["server.tp_size"]["status"] == "failed"
    assert "server never up: Not enough memory" in changes["server.tp_size"]["reason"]
    assert {(f["knob"], f["direction"]) for f in log["failed_directions"]} == {
        ("server.tp_size", "down"), ("server.pp_size", "up")}
    # ep 8 changes nothing the model times: inside the noise band, not an improvement; the tune stops there.
    assert changes["server.ep_size"]["status"] == "measured"
    assert abs(changes["server.ep_size"]["gain_pct"]) <= steps[2]["result"]["band_pct"]
    assert steps[2]["result"]["decision"] == "no-gain" and "not an improvement" in steps[2]["result"]["text"]
    assert log["stop"]["kind"] == CONVERGED

    # Every measurement is a point of the sweep's state, each asked of the runner once; the base three times.
    assert len(runner.calls) == len(state.finished_points()) == 3 + 1 + 2
    assert [c for c in runner.calls if c[0] == "v01"] == [("v01", 1024, 0), ("v01", 1024, 1), ("v01", 1024, 2)]
    noise = log["noise"]
    assert len(noise["values"]) == 3 and noise["spread_pct"] > 0
    assert noise["band_pct"] == max(noise["spread_pct"], 1.0)

    md = report.markdown(state)
    assert "## The path taken" in md and "inside the noise band" in md and "not proposed again" in md
    assert "glm5-tp4-pp2" in md and "glm5-ep8" in md

    # The promoted profile: the tune's incumbent, its why citing the verdict and the step; it validates and renders.
    name, text, row = promote(state, profiles.resolve(BASE), run_ref="tunes/x/report.md", pick=best.index,
                              knob_reasons=report.knob_reasons(state, "tunes/x/report.md"), tool="tune",
                              name="glm5-tuned")
    assert row.variant_id == best.id
    assert "step 1: the verdict of v01" in text and "scheduler-capped" in text and "noise band" in text
    source = parse_profile_text(name, "glm5-tuned.yaml", text)
    resolved = resolve(name, lambda n: source if n == name else profiles.source(n))
    assert not [p for p in check(resolved) if p.severity == "error"]
    argv = render_launch_argv(resolved)
    assert argv[argv.index("--max-running-requests") + 1] == str(dict(best.knobs)[MRR])


def _steps(knob: str, values: list[Any], **extra: Any) -> list[dict[str, Any]]:
    return [{"knob": knob, "proposed": values, "why": f"test: try {knob}", "together": {}, "profiles": [], **extra}]


def _table(points: list[dict[str, Any]]) -> TableRunner:
    return TableRunner({"about": "tune test", "points": points}, source="tune-test-table")


def _pt(knobs: dict[str, Any], tput: float, *, steps: list[dict[str, Any]] | None = None, repeat: int | None = None,
        verdict: str = "scheduler-capped") -> dict[str, Any]:
    p: dict[str, Any] = {"knobs": knobs, "concurrency": 1024, "steady_output_tok_per_s": tput, "power_w_total": 2000,
                         "verdict": verdict, "knob_steps": steps or []}
    if repeat is not None:
        p["repeat"] = repeat
    return p


BASE_STEPS = _steps(MRR, [128, 256])


def _base(values: list[float]) -> list[dict[str, Any]]:
    return [_pt({}, v, steps=BASE_STEPS, repeat=i) for i, v in enumerate(values)]


@pytest.mark.parametrize(("best_tput", "kept"), [(1050.0, False), (1100.0, True)])
def test_a_gain_inside_the_base_spread_is_not_an_improvement(profiles: ProfileStore, best_tput: float,
                                                             kept: bool) -> None:
    base = [1000.0, 1040.0, 980.0]  # spread 60 of a median of 1000: 6 %
    runner = _table([*_base(base), _pt({MRR: 128}, 1030.0), _pt({MRR: 256}, best_tput)])
    state, spec = fresh(profiles)
    tune(profiles, state, spec, runner)
    log = state.tune
    assert log is not None
    assert log["noise"]["median"] == 1000.0 and log["noise"]["spread_pct"] == pytest.approx(6.0)
    result = log["steps"][1]["result"]
    assert result["best"] == "v02" and result["gain_pct"] == pytest.approx((best_tput / 1000 - 1) * 100)
    if kept:
        assert result["decision"] == "improved" and log["incumbent"] == 2
        assert [c["id"] for c in log["steps"][1]["candidates"]] == ["v02"]  # 256 paid: 128 is not measured
        assert log["stop"]["kind"] == NOTHING_NEW  # v02's verdict proposes nothing
    else:
        # 256 did not clear the band, so the ladder's next rung (128) was measured; neither counts.
        assert [(c["id"], c["change"][MRR][1]) for c in log["steps"][1]["candidates"]] == [("v02", 256), ("v03", 128)]
        assert result["decision"] == "no-gain" and log["incumbent"] == 1
        assert "inside the noise band (6.00 %)" in result["text"] and log["stop"]["kind"] == CONVERGED
        assert "inside the noise band" in report.markdown(state)


def test_a_failed_direction_is_not_proposed_again(profiles: ProfileStore) -> None:
    layout = _steps("server.tp_size", [4], together={"server.pp_size": 2})
    runner = _table([
        *[_pt({}, v, steps=layout + _steps(MRR, [128]), repeat=i) for i, v in enumerate([1000.0, 1010.0, 990.0])],
        {"knobs": {"server.tp_size": 4, "server.pp_size": 2}, "fail": "variant", "reason": "server did not come up"},
        _pt({MRR: 128}, 1500.0, steps=layout + _steps("server.ep_size", [8])),
        _pt({MRR: 128, "server.ep_size": 8}, 1490.0),
    ])
    state, spec = fresh(profiles)
    tune(profiles, state, spec, runner)
    log = state.tune
    assert log is not None
    first = log["steps"][1]
    assert [c["status"] for c in first["candidates"]] == ["failed", "measured"]
    assert first["candidates"][0]["reason"] == "server did not come up"
    second = log["steps"][2]
    assert [c["knob"] for c in second["candidates"]] == ["server.ep_size"]
    skipped = second["skipped"][0]
    assert skipped["knob"] == "server.tp_size" and "failed before (v02: server did not come up)" in skipped["reason"]
    # The runner was never asked for the failed layout again.
    assert [c for c in runner.calls if c[0] == "v02"] == [("v02", 1024)]


def test_the_budget_trims_a_step_and_a_resume_raises_it(profiles: ProfileStore) -> None:
    whole, spec = fresh(profiles)
    tune(profiles, whole, spec, engine(profiles))

    state, spec = fresh(profiles, budget=5)
    saves = Saves()
    tune(profiles, state, spec, engine(profiles), saves)
    log = state.tune
    assert log is not None
    assert len(state.finished_points()) == 5 and log["stop"]["kind"] == BUDGET
    # (a lower power limit, also proposed for the waiting GPUs, is not taken for throughput, whatever the budget)
    assert [s["reason"] for s in log["steps"][-1]["skipped"] if s["knob"] != "gpu.power_limit_w"] == [
        "over the budget (5 probe runs)"]

    resumed = saves.last()
    assert resumed.tune is not None
    raise_budget(resumed.tune, None)
    runner = engine(profiles)
    tune(profiles, resumed, spec, runner)
    assert resumed.tune["stop"]["kind"] == CONVERGED
    assert whole.tune is not None
    assert resumed.variant(int(resumed.tune["incumbent"])).knobs == whole.variant(int(whole.tune["incumbent"])).knobs
    assert ("v01", 1024, 0) not in runner.calls  # what was measured is kept


class Interrupting:
    """The engine model, with a Ctrl-C landing while the n-th point is measured (as a SIGINT does mid-step)."""

    def __init__(self, inner: EngineModelRunner, at_call: int) -> None:
        self.inner, self.at_call, self.n = inner, at_call, 0

    def __call__(self, request: PointRequest) -> Measurement:
        self.n += 1
        if self.n == self.at_call:
            raise KeyboardInterrupt
        return self.inner(request)


def test_interrupted_mid_step_then_resumed_takes_the_same_path(profiles: ProfileStore) -> None:
    whole, spec = fresh(profiles)
    tune(profiles, whole, spec, engine(profiles))

    state, spec = fresh(profiles)
    saves = Saves()
    with pytest.raises(KeyboardInterrupt):
        tune(profiles, state, spec, Interrupting(engine(profiles), at_call=6), saves)  # v04, inside step 2
    on_disk = saves.last()
    assert on_disk.tune is not None and on_disk.tune["steps"][2]["result"] is None
    assert on_disk.variant(3).points[0].status == "failed"  # step 2's first candidate was already recorded
    assert [p.attempts for p in on_disk.variant(4).points] == [1] and on_disk.variant(4).points[0].status == "pending"

    tune(profiles, on_disk, spec, engine(profiles))
    assert on_disk.tune == whole.tune
    assert on_disk.variant(4).points[0].attempts == 2  # measured again, and said so
    assert [(v.id, v.knobs) for v in on_disk.variants] == [(v.id, v.knobs) for v in whole.variants]


def test_a_bold_value_that_fails_climbs_down_its_ladder(profiles: ProfileStore) -> None:
    runner = _table([
        *_base([1000.0, 1005.0, 995.0]),
        {"knobs": {MRR: 256}, "fail": "variant", "reason": "server never up: out of memory"},
        _pt({MRR: 128}, 1400.0),
    ])
    state, spec = fresh(profiles)
    tune(profiles, state, spec, runner)
    log = state.tune
    assert log is not None
    step = log["steps"][1]
    assert [(c["id"], c["change"][MRR][1], c["status"]) for c in step["candidates"]] == [
        ("v02", 256, "failed"), ("v03", 128, "measured")]
    assert step["result"]["decision"] == "improved" and log["incumbent"] == 3
    # Kept for the later steps: no later verdict's proposal to raise the cap again is measured.
    assert log["failed_directions"] == [{"knob": MRR, "direction": "up", "reason": "server never up: out of memory",
                                         "variant": "v02"}]


def test_a_tune_record_from_before_its_later_keys_loads_reports_and_resumes(profiles: ProfileStore) -> None:
    """The record's types (toolkit.core.tune.log) change nothing on disk: a state written before the keys added
    later (max_repeats, max_goodput_loss_pct, incumbent_rate) loads as it is, reports, and resumes to the end."""
    import json

    from toolkit.core.sweep.state import state_from_dict
    from toolkit.core.tune.loop import check_log

    whole, spec = fresh(profiles)
    tune(profiles, whole, spec, engine(profiles))
    state, spec = fresh(profiles, budget=5)
    tune(profiles, state, spec, engine(profiles))
    data = json.loads(json.dumps(state.to_dict()))
    for key in ("max_repeats", "max_goodput_loss_pct", "incumbent_rate"):
        data["tune"].pop(key, None)
    old = state_from_dict(data, file="state.json")
    old.tune = dict(check_log(old.tune, file="state.json"))
    assert "max_repeats" not in old.tune and report.to_json(old)["steps"] == data["tune"]["steps"]
    assert report.markdown(old).startswith(f"# Tune {old.run_id}")
    raise_budget(old.tune, None)
    tune(profiles, old, spec, engine(profiles))
    assert old.tune["stop"]["kind"] == CONVERGED
    assert old.variant(old.tune["incumbent"]).knobs == whole.variant(whole.tune["incumbent"]).knobs
