"""The GPU power limit as a knob (its range in the profile, its steps in the verdict, the engine model's clocks under
it, a tokens-per-joule tune under an SLO, the doctor's read-back) and the noise rule that keeps a gain inside the
intervals from being promoted (the lab tune's ep_size: 8, replayed from its recorded figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.profiles import check
from toolkit.core.doctor import FAIL, PASS, WARN, judge_power_limit
from toolkit.core.probe.gpu_rules import COMPUTE, MEMORY, WAITING
from toolkit.core.probe.knobs import lower_power_limits, propose
from toolkit.core.profile import parse_profile_text, resolve
from toolkit.core.profile.hashing import canonical_spec
from toolkit.core.sweep import capacity
from toolkit.core.sweep.promote import base_spec
from toolkit.core.sweep.recorded import TableRunner
from toolkit.core.sweep.state import new_state
from toolkit.core.tune.loop import new_tune_log, score
from toolkit.lab.engine_runner import EngineModelRunner
from toolkit.lab.standin_server import engine_model as em

from .conftest import REPO, fresh, tune

PL = "gpu.power_limit_w"


def _resolve(profiles: ProfileStore, text: str) -> Any:
    src = parse_profile_text("t", "t.yaml", text)
    return resolve("t", lambda n: src if n == "t" else profiles.source(n))


@pytest.mark.parametrize(("limit", "said"), [(200, "below the board's lowest settable limit 300 W"),
                                             (650, "above the board's 600 W")])
def test_a_limit_outside_the_boards_range_is_an_error_naming_the_field_and_the_fix(
        profiles: ProfileStore, limit: int, said: str) -> None:
    resolved = _resolve(profiles, f"schema_version: 1\nname: t\nextends: glm5-tp8\ngpu:\n  power_limit_w: {limit}\n")
    errors = [p for p in check(resolved) if p.severity == "error"]
    assert [(p.field, p.rule_id) for p in errors] == [(PL, "gpu-power-limit-range")]
    assert said in errors[0].message and errors[0].fix and errors[0].file == "t.yaml"
    ok = _resolve(profiles, "schema_version: 1\nname: t\nextends: glm5-tp8\ngpu:\n  power_limit_w: 450\n")
    assert not [p for p in check(ok) if p.severity == "error"]
    # A profile that sets no limit keeps the spec hash its recorded results carry: no gpu section in it.
    assert "gpu" not in canonical_spec(profiles.resolve("glm5-tp8")) and "gpu" in canonical_spec(ok)


def test_waiting_and_memory_bound_gpus_propose_a_lower_limit_compute_bound_at_the_cap_none_lower() -> None:
    # floor max(300, 600 / 2, 1.2 x 256 = 307.2) -> 310; four rungs evenly down to it, in tens of watts
    assert lower_power_limits(600.0, 256.0, 300.0) == [530.0, 460.0, 380.0, 310.0]
    assert lower_power_limits(600.0, 560.0, 300.0) == []  # drawing near the limit: nothing to take
    power = {"mean_w": 250.0, "limit_w": 600.0, "default_w": 600.0, "min_w": 300.0}
    target = {"knobs": {"server.tp_size": 8}}
    for cls in (WAITING, MEMORY):
        steps = propose(cls, {"server": {}, "held": 0.9}, target, gpus=8, no_p2p=True, variants=[],
                        power_capped=False, power=power)
        step = next(s for s in steps if s.knob == PL)
        assert step.current == 600.0 and all(300.0 <= v < 600.0 for v in step.proposed)
    capped = propose(COMPUTE, {"server": {}, "held": 0.9}, {"knobs": {PL: 450.0}}, gpus=8, no_p2p=True,
                     variants=[], power_capped=True, power={**power, "limit_w": 450.0, "mean_w": 445.0})
    assert [(s.knob, s.proposed) for s in capped] == [(PL, (600.0,))]  # back up, never lower
    at_default = propose(COMPUTE, {"server": {}, "held": 0.9}, {"knobs": {}}, gpus=8, no_p2p=True, variants=[],
                         power_capped=True, power={**power, "mean_w": 590.0})
    assert not [s for s in at_default if s.knob == PL]


def test_a_cap_slows_compute_phases_and_leaves_waiting_ones_as_they_were() -> None:
    hw = em.Hardware(power_limit_w=450.0, default_limit_w=600.0)
    k = em.clock_factor(450.0, hw)
    assert k == pytest.approx(((450 - 87) / (600 - 87)) ** 0.5) and em.clock_factor(600.0, hw) == 1.0
    free, capped = em.Engine(em.EngineConfig(tp_size=8, max_running_requests=1024)), em.Engine(
        em.EngineConfig(tp_size=8, max_running_requests=1024), hw)
    d0, c0 = free.decode_time_s(1024)
    d1, c1 = capped.decode_time_s(1024)
    assert d1 - d0 == pytest.approx(c1 - c0)  # only the compute part grew
    assert c1 / c0 == pytest.approx((1 - em.SM_BOUND_DECODE) + em.SM_BOUND_DECODE / k)
    _p0, pc0 = free.prefill_time_s(8192)
    _p1, pc1 = capped.prefill_time_s(8192)
    assert (pc1 - pc0) / pc0 > (c1 - c0) / c0  # prefill is SM-bound: it slows more than decode
    assert capped.compute_power_w == 450.0 and free.compute_power_w == 600.0


def test_glm5_tp8_tokens_per_joule_tune_under_the_slo_finds_a_limit_that_keeps_goodput(
        profiles: ProfileStore) -> None:
    spec = base_spec(profiles.resolve("glm5-tp8"))
    state = new_state(run_id="glm5-tp8-t", profile="glm5-tp8", base_spec=spec, axes=[], planned=[],
                      concurrency=[1024], created="", runner="test")
    state.tune = new_tune_log(objective="tokens-per-joule", repeats=3, min_gain_pct=1.0, budget_points=None)
    state.capacity = capacity.new_capacity({"ttft_p99_ms": 3000.0, "itl_p99_ms": 300.0})
    from toolkit.core.sweep.promote import profile_validator
    from toolkit.core.tune.loop import run_tune

    runner = EngineModelRunner(base="glm5-tp8", profile_names=profiles.names())
    run_tune(state, spec, runner, validate=profile_validator("glm5-tp8", state.run_id, profiles.source, check),
             save=lambda _s: None, clock=lambda: 0.0)
    log = state.tune
    best = state.variant(int(log["incumbent"]))
    limit = dict(best.knobs).get(PL)
    assert limit is not None and 300.0 <= limit < 600.0
    b, base = score(best, "tokens-per-joule", state), score(state.variant(1), "tokens-per-joule", state)
    assert b is not None and base is not None and b.goodput is not None and base.goodput is not None
    assert b.goodput >= 0.98 * base.goodput  # goodput within 2 %
    assert b.measurement.energy_per_output_token_j < base.measurement.energy_per_output_token_j
    assert b.measurement.power_limit_w == limit and b.measurement.provenance.kind == "engine-model"


def test_the_doctor_reads_the_limit_back_against_the_unit_that_keeps_it() -> None:
    smi = "0, 450.00, 600.00, 300.00, 600.00\n1, 450.00, 600.00, 300.00, 600.00\n"
    unit = "[Service]\nType=oneshot\nExecStart=/usr/bin/nvidia-smi -pl 450\n"
    assert judge_power_limit("pve1", {"power_rc": 0, "power": smi, "power_unit": unit})[0].status == PASS
    lost = judge_power_limit("pve1", {"power_rc": 0, "power": smi.replace("450.00", "600.00"), "power_unit": unit})
    assert lost[0].status == FAIL and "the unit sets 450 W" in lost[0].detail and lost[0].fix
    by_hand = judge_power_limit("pve1", {"power_rc": 0, "power": smi, "power_unit": ""})
    assert by_hand[0].status == WARN and "lost at the next reboot" in by_hand[0].detail
    assert judge_power_limit("pve1", {"power_rc": 0, "power": smi.replace("450.00", "600.00"),
                                      "power_unit": ""})[0].status == PASS


def test_the_lab_tunes_ep_size_8_is_not_promoted_from_its_recorded_figures(profiles: ProfileStore) -> None:
    """docs/tune-lab: two base runs 2.05 % apart, v02 (max_running_requests 1024) +285 %, v04 (ep_size 8, which
    the engine model times as without it) +10.9 % over v02, kept then. Replayed: v02 is kept (its interval lies
    far above the base's); v04's interval overlaps v02's, the base is asked again (the table has no more runs, as
    a host that could not measure), and v04 is not an improvement."""
    recorded = json.loads((REPO / "docs" / "tune-lab" / "state.json").read_text())
    points = []
    for v in recorded["variants"]:
        knobs = {p: val for p, val in v["knobs"]}
        if v["failure"]:
            points.append({"knobs": knobs, "fail": "variant", "reason": v["failure"]})
            continue
        for p in v["points"]:
            m = p["measurement"]
            points.append({"knobs": knobs, "concurrency": p["concurrency"], "repeat": p["repeat"],
                           "steady_output_tok_per_s": m["steady_output_tok_per_s"],
                           "power_w_total": m["power_w_total"], "verdict": m["verdict"],
                           "knob_steps": m["knob_steps"], "verdict_headline": m["verdict_headline"]})
    runner = TableRunner({"points": points}, source="docs/tune-lab/state.json")
    state, spec = fresh(profiles, levels=[768], repeats=2)
    tune(profiles, state, spec, runner)
    log = state.tune
    assert log is not None
    steps = log["steps"]
    assert steps[1]["result"]["decision"] == "improved" and steps[1]["result"]["best"] == "v02"
    ep = next(c for c in steps[2]["candidates"] if "server.ep_size" in c["change"])
    assert ep["value"] == 2924.0 and ep["gain_pct"] == pytest.approx(10.87, abs=0.01)
    assert steps[2]["remeasured"] and steps[2]["result"]["decision"] == "no-gain"
    assert "not significant" in steps[2]["result"]["text"] and log["incumbent"] == 2
    assert dict(state.variant(int(log["incumbent"])).knobs) == {"server.max_running_requests": 1024}


def test_recorded_state_is_the_docs_own(profiles: ProfileStore) -> None:
    """The replay above reads the lab run the docs describe (docs/tune.md, "In the lab")."""
    text = (REPO / "docs" / "tune.md").read_text()
    assert "docs/tune-lab" in text or "tune-lab/" in text
    assert Path(REPO / "docs" / "tune-lab" / "state.json").is_file()


def test_the_doctor_reads_each_gpus_limit_against_its_line_in_the_unit() -> None:
    smi = ("0, 00000000:01:00.0, 450.00, 600.00, 300.00, 600.00\n"
           "1, 00000000:21:00.0, 600.00, 600.00, 300.00, 600.00\n")
    unit = "[Service]\nExecStart=/usr/bin/nvidia-smi -i 0000:01:00.0 -pl 450\n"
    ok = judge_power_limit("pve1", {"power_rc": 0, "power": smi, "power_unit": unit})[0]
    assert ok.status == PASS and ok.detail.startswith("450 W on 1 GPU(s), 1 at their default, kept at boot")
    other = unit.replace("0000:01:00.0", "0000:21:00.0")
    wrong = judge_power_limit("pve1", {"power_rc": 0, "power": smi, "power_unit": other})[0]
    assert wrong.status == FAIL and "GPU 0 (0000:01:00.0) 450 W, 600 W kept" in wrong.detail
