"""Goodput under an SLO: the SLO's parsing, latency percentiles from bench_serving's per-request results, the
capacity search over a server whose capacity is known, the 95 % intervals, the verdict at the SLO's edge, and the
goodput tune over the lab's engine model (simulated). Pure or in-process: milliseconds to seconds."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.bench import latency_percentiles, request_latencies
from toolkit.core.sweep import capacity
from toolkit.core.sweep.noise import interval, run_to_run, t975, within_run
from toolkit.core.sweep.run import PointRequest
from toolkit.core.sweep.slo import check_slo, parse_slo
from toolkit.core.sweep.state import Measurement, SweepState, new_state
from toolkit.core.tune import report
from toolkit.core.tune.edge import edge_verdict
from toolkit.lab.engine_runner import EngineModelRunner

from .conftest import BASE, fresh, tune

SLO = {"ttft_p99_ms": 3000.0, "itl_p99_ms": 300.0}


# -- the SLO ---------------------------------------------------------------------------------------------------------


def test_slo_parses_any_subset_and_refuses_bad_input_naming_the_fix() -> None:
    assert parse_slo("ttft_p99_ms=3000, itl_p99_ms=100") == {"ttft_p99_ms": 3000.0, "itl_p99_ms": 100.0}
    assert parse_slo("e2e_p99_ms=20000") == {"e2e_p99_ms": 20000.0}
    for bad, said in (("ttft_p50_ms=3000", "unknown SLO bound"), ("ttft_p99_ms", "not KEY=MS"),
                      ("itl_p99_ms=fast", "not a number"), ("itl_p99_ms=-1", "positive"),
                      ("itl_p99_ms=1,itl_p99_ms=2", "twice"), ("", "no SLO bound")):
        with pytest.raises(ToolkitError) as err:
            parse_slo(bad)
        assert said in str(err.value) and err.value.problems[0].field == "--slo" and err.value.problems[0].fix


def test_a_bound_not_measured_is_not_met_and_the_furthest_bound_binds() -> None:
    chk = check_slo(SLO, {"ttft": {"p99": 1500.0}, "itl": {"p99": 330.0}})
    assert not chk.met and chk.binding is not None and chk.binding.key == "itl_p99_ms"
    assert check_slo(SLO, {"ttft": {"p99": 2999.0}, "itl": {"p99": 299.0}}).met
    missing = check_slo(SLO, {"ttft": {"p99": 10.0}})
    assert not missing.met and missing.binding is not None and missing.binding.value_ms is None


# -- percentiles from bench_serving's per-request results ------------------------------------------------------------


def _details(rng: np.random.Generator, n: int, failed: set[int]) -> dict[str, Any]:
    """A bench_serving --output-details line as 0.5.9 writes it: per request ttfts (s, 0.0 when it failed), itls
    (its gaps, s), output_lens (0 when failed), errors ("" when it succeeded)."""
    ttfts, itls, outs, errors = [], [], [], []
    for i in range(n):
        if i in failed:
            ttfts.append(0.0)
            itls.append([])
            outs.append(0)
            errors.append("Traceback ... ClientConnectorError")
            continue
        k = int(rng.integers(1, 40))
        ttfts.append(float(rng.gamma(2.0, 0.4)))
        itls.append([float(x) for x in rng.gamma(3.0, 0.02, size=k)])
        outs.append(k + 1)
        errors.append("")
    return {"completed": n - len(failed), "ttfts": ttfts, "itls": itls, "output_lens": outs, "errors": errors,
            "generated_texts": ["x"] * n, "p99_ttft_ms": None}


def test_percentiles_are_numpys_over_the_successful_requests_as_bench_serving_computes_its_own() -> None:
    rng = np.random.default_rng(7)
    raw = _details(rng, 300, failed={3, 50, 299})
    lat = request_latencies(raw)
    assert lat is not None and len(lat) == 297 and lat.failed == 3
    got = latency_percentiles(lat)
    ok = [i for i in range(300) if raw["errors"][i] == ""]
    ttfts = [raw["ttfts"][i] for i in ok]
    itls = [g for i in ok for g in raw["itls"][i]]
    e2e = [raw["ttfts"][i] + sum(raw["itls"][i]) for i in ok]
    # bench_serving 0.5.9's calculate_metrics: np.percentile over the successful requests (ITL: every gap).
    assert got["ttft"]["p99"] == pytest.approx(np.percentile(ttfts, 99) * 1000, abs=1e-3)
    assert got["itl"]["p99"] == pytest.approx(np.percentile(itls, 99) * 1000, abs=1e-3)
    assert got["e2e"]["p50"] == pytest.approx(np.percentile(e2e, 50) * 1000, abs=1e-3)
    assert got["ttft"]["p99"] != pytest.approx(statistics.mean(ttfts) * 1000)  # not a mean
    assert request_latencies({"completed": 3, "p99_ttft_ms": 12.0}) is None  # no details: nothing to invent


# -- the capacity search over a server whose capacity is known -------------------------------------------------------


class KnownCapacity:
    """A server whose p99 TTFT grows as the offered rate nears its capacity C (an M/M/1-like curve): the search must
    bracket C within its tolerance, in a bounded number of rates."""

    def __init__(self, capacity_rps: float) -> None:
        self.c = capacity_rps
        self.rates: list[float | None] = []

    def __call__(self, request: PointRequest) -> Measurement:
        r = request.request_rate
        self.rates.append(r)
        if r is None:  # closed loop: it completes what it can
            return Measurement(steady_output_tok_per_s=self.c * 64, request_per_s=self.c * 1.2, latency_ms={})
        rho = min(r / (self.c * 1.25), 0.999)
        ttft = 300.0 / (1 - rho)
        return Measurement(steady_output_tok_per_s=r * 64, request_rate=r,
                           latency_ms={"ttft": {"p99": ttft}, "itl": {"p99": 40.0}})


def _capacity_state(slo: dict[str, float], **kw: Any) -> SweepState:
    state = new_state(run_id="c", profile="p", base_spec={}, axes=[], planned=[], concurrency=[1024], created="",
                      runner="test")
    state.capacity = capacity.new_capacity(slo, **kw)
    return state


def _search(state: SweepState, server: KnownCapacity) -> capacity.Capacity:
    from toolkit.core.sweep.state import PLANNED, VariantState

    v = VariantState(index=1, knobs=[], status=PLANNED)
    state.variants.append(v)
    capacity.plan(state, v)
    capacity.measure_all(state, {}, server, save=lambda _s: None, clock=lambda: 0.0)
    return capacity.result(state, v)


@pytest.mark.parametrize("true_capacity", [0.8, 7.3, 55.0])
def test_the_search_brackets_the_capacity_within_its_tolerance_in_bounded_rounds(true_capacity: float) -> None:
    # The SLO's TTFT bound 3000 ms is met up to rho = 0.9 of 1.25 C: the true capacity under the SLO is 1.125 C.
    state = _capacity_state({"ttft_p99_ms": 3000.0})
    server = KnownCapacity(true_capacity)
    cap = _search(state, server)
    edge = 1.125 * true_capacity
    assert cap.status == capacity.CONVERGED and cap.lo is not None and cap.hi is not None
    assert cap.lo <= edge < cap.hi and (cap.hi / cap.lo - 1) * 100 <= 4.0
    assert server.rates[0] is None and len(server.rates) <= 1 + 10  # a closed-loop run, then at most max_rounds
    assert cap.goodput == pytest.approx(cap.lo * 64)  # the output tok/s measured at the capacity rate


def test_a_candidate_that_misses_at_the_floor_costs_one_run_and_a_resumed_search_takes_the_same_path() -> None:
    from toolkit.core.sweep.state import PLANNED, VariantState, state_from_dict

    state = _capacity_state({"ttft_p99_ms": 3000.0})
    v = VariantState(index=2, knobs=[("server.x", 1)], status=PLANNED)
    state.variants.append(v)
    capacity.plan(state, v, start=9.0, floor=9.0)  # the incumbent sustained 9 req/s; this one cannot
    server = KnownCapacity(5.0)
    capacity.measure_all(state, {}, server, save=lambda _s: None, clock=lambda: 0.0)
    assert server.rates == [9.0] and capacity.result(state, v).status == capacity.BELOW_FLOOR

    whole = _capacity_state({"ttft_p99_ms": 3000.0}, rate_start=2.0)
    full = _search(whole, KnownCapacity(7.3))
    half = _capacity_state({"ttft_p99_ms": 3000.0}, rate_start=2.0)
    vs = VariantState(index=1, knobs=[], status=PLANNED)
    half.variants.append(vs)
    capacity.plan(half, vs)
    capacity.measure_all(half, {}, KnownCapacity(7.3), save=lambda _s: None, clock=lambda: 0.0, budget=3)
    resumed = state_from_dict(half.to_dict(), file="state.json")
    capacity.measure_all(resumed, {}, KnownCapacity(7.3), save=lambda _s: None, clock=lambda: 0.0)
    again = capacity.result(resumed, resumed.variant(1))
    assert [r.rate for r in again.rates] == [r.rate for r in full.rates] and again.lo == full.lo


# -- intervals -------------------------------------------------------------------------------------------------------


def test_t_quantiles_and_intervals() -> None:
    assert t975(1) == 12.706 and t975(2) == 4.303 and 2.0 < t975(50) < 2.021 and t975(10_000) == 1.96
    # Three runs 1 % apart: the interval is t(0.975, 2) x sd / sqrt(3) either side, not the spread.
    ci = interval([990.0, 1000.0, 1010.0])
    assert ci.high - ci.value == pytest.approx(4.303 * 10.0 / 3 ** 0.5)
    # One run borrows the base's run-to-run spread with the base's degrees of freedom.
    base = run_to_run([990.0, 1010.0])
    assert base is not None and base.df == 1
    one = interval([2000.0], base=base)
    assert one.high - one.value == pytest.approx(12.706 * base.cv * 2000.0)
    # Batch means within a run: correlated intervals grouped into 5 s batches.
    steady = [100.0 + (i % 5) for i in range(60)]
    w = within_run(steady, 1.0)
    assert w is not None and w.batches == 12 and w.se == pytest.approx(0.0)
    assert within_run([1.0, 2.0], 1.0) is None


# -- the verdict at the SLO's edge -----------------------------------------------------------------------------------


def _cap(edge_latency: dict[str, dict[str, float]], server: dict[str, Any], slo: dict[str, float]
         ) -> capacity.Capacity:
    edge = Measurement(steady_output_tok_per_s=1.0, latency_ms=edge_latency, server=server)
    return capacity.Capacity(capacity.CONVERGED, 10.0, 10.4, Measurement(steady_output_tok_per_s=1.0), edge,
                             None, check_slo(slo, edge_latency))


@pytest.mark.parametrize(("latency", "server", "cause", "knob", "proposed"), [
    ({"ttft": {"p99": 4000}, "itl": {"p50": 50, "p99": 80}}, {"running_max": 64, "max_running_requests": 64,
                                                               "queue": 30}, "queueing-at-cap",
     "server.max_running_requests", [128, 256]),
    ({"ttft": {"p99": 4000}, "itl": {"p50": 50, "p99": 80}}, {"running_max": 20, "max_running_requests": 64,
                                                               "queue": 5}, "long-prefills",
     "server.chunked_prefill_size", [16384, 32768]),
    ({"ttft": {"p99": 100}, "itl": {"p50": 60, "p99": 330}}, {"running_max": 133, "max_running_requests": 256,
                                                               "queue": 0}, "prefill-interrupts-decode",
     "server.chunked_prefill_size", [4096, 2048]),
    ({"ttft": {"p99": 100}, "itl": {"p50": 280, "p99": 320}}, {"running_max": 900, "max_running_requests": 1024,
                                                                "queue": 0}, "decode-batch-too-large",
     "server.max_running_requests", [512, 256]),
])
def test_the_edge_names_the_binding_latency_its_cause_and_the_knob_with_its_direction(
        latency: dict[str, dict[str, float]], server: dict[str, Any], cause: str, knob: str,
        proposed: list[int]) -> None:
    knobs = {"server.max_running_requests": server["max_running_requests"], "server.chunked_prefill_size": None}
    v = edge_verdict(_cap(latency, server, SLO), knobs)
    assert v is not None and v.cause == cause
    assert v.binding == ("ttft" if cause in ("queueing-at-cap", "long-prefills") else "itl")
    first = v.knob_steps[0]
    assert first["knob"] == knob and first["proposed"] == proposed and "at 10.4 req/s" in first["why"]
    if cause == "prefill-interrupts-decode":  # fewer, larger prefills too: a cap below what ran
        assert v.knob_steps[1]["knob"] == "server.max_running_requests" and v.knob_steps[1]["proposed"] == [128, 64]


# -- the goodput tune over the engine model --------------------------------------------------------------------------


def test_goodput_tune_raises_the_cap_for_ttft_then_lowers_it_for_itl_and_keeps_no_noise(profiles: ProfileStore) -> None:
    state, spec = fresh(profiles, objective="goodput")
    state.capacity = capacity.new_capacity(SLO)
    runner = EngineModelRunner(base=BASE, profile_names=profiles.names())
    tune(profiles, state, spec, runner)
    log = state.tune
    assert log is not None
    steps = log["steps"]
    # Step 1: at the base's edge TTFT binds from queueing at its 64 slots: the cap goes up and is kept, on runs at
    # the rate the base missed.
    assert steps[1]["edge"]["cause"] == "queueing-at-cap" and steps[1]["result"]["decision"] == "improved"
    # Step 2: now ITL binds, from prefills interrupting decode: a cap below what ran is proposed and kept.
    assert steps[2]["edge"]["binding"] == "itl" and steps[2]["edge"]["cause"] == "prefill-interrupts-decode"
    best = state.variant(int(log["incumbent"]))
    assert dict(best.knobs) == {"server.max_running_requests": 128}
    # ep_size 8 changes nothing the model times: whatever a single pass at the edge said, it is never kept.
    assert all("ep_size" not in dict(v.knobs) or v.index != log["incumbent"] for v in state.variants)
    for step in steps[1:]:
        for cand in step["candidates"]:
            if "server.ep_size" in cand["change"]:
                assert step["result"]["best"] != cand["id"] or step["result"]["decision"] != "improved"
    cap = capacity.result(state, best)
    base = capacity.result(state, state.variant(1))
    assert cap.lo and base.lo and cap.lo > base.hi  # type: ignore[operator]
    md = report.markdown(state)
    assert "## Capacity under the SLO, per variant" in md and "at the SLO's edge" in md
    assert "Data: ENGINE MODEL" in md


@pytest.mark.slow
def test_goodput_tune_and_sweep_as_processes_write_their_reports_and_frontier(tmp_path: Any) -> None:
    import json
    import os
    import shutil
    import subprocess
    import sys

    from .conftest import REPO

    shutil.copytree(REPO / "profiles", tmp_path / "profiles")  # the promotion writes here, not into the checkout

    def toolkit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "toolkit", *args, "--profiles-dir", str(tmp_path / "profiles")],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=300)

    slo = "ttft_p99_ms=3000,itl_p99_ms=300"
    bad = toolkit("tune", "glm5-baseline", "--runner", "engine-model", "--objective", "goodput")
    assert bad.returncode == 2 and "--objective goodput needs an SLO" in bad.stderr and "--slo" in bad.stderr
    tuned = toolkit("tune", "glm5-baseline", "--runner", "engine-model", "--objective", "goodput", "--slo", slo,
                    "--tunes-dir", str(tmp_path / "tunes"), "--json", "--promote", "--promote-name", "gp")
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    out = json.loads(tuned.stdout)["data"]
    assert out["objective"] == "goodput" and out["best"]["request_rate"] > 0
    assert out["capacity"]["slo"] == {"ttft_p99_ms": 3000.0, "itl_p99_ms": 300.0}
    (run,) = (tmp_path / "tunes").iterdir()
    assert (run / "frontier.png").stat().st_size > 10_000
    md = (run / "report.md").read_text()
    assert "![throughput against p99 latency, SLO lines, J/token](frontier.png)" in md
    text = (tmp_path / "profiles" / "gp.yaml").read_text()
    assert "goodput" in text and "req/s, the highest rate that met the SLO" in text
    assert toolkit("profile", "validate", "gp").returncode in (0, 1)  # warnings (the base's own) are not errors

    swept = toolkit("sweep", "glm5-baseline", "--runner", "engine-model", "--vary",
                    "server.max_running_requests=64,128", "--slo", slo, "--concurrency", "1024",
                    "--sweeps-dir", str(tmp_path / "sweeps"), "--json")
    assert swept.returncode == 0, swept.stderr[-2000:]
    ranking = json.loads(swept.stdout)["data"]
    assert [r["label"] for r in ranking["by_goodput"]] == ["max_running_requests=128", "max_running_requests=64"]
    assert ranking["by_goodput"][0]["request_rate"] > ranking["by_goodput"][1]["request_rate"]
    (srun,) = (tmp_path / "sweeps").iterdir()
    assert (srun / "frontier.png").is_file()
    assert "## Ranked by goodput under the SLO" in (srun / "report.md").read_text()


# -- the incumbent's figure is what the candidates were compared with, and the record says where it came from ------


def test_a_rate_met_by_one_run_of_two_is_not_met() -> None:
    from toolkit.core.sweep.state import DONE, Point, VariantState

    def run(itl_p99_ms: float) -> Point:
        return Point(concurrency=1024, request_rate=9.0, status=DONE, measurement=Measurement(
            steady_output_tok_per_s=576.0, request_rate=9.0, latency_ms={"itl": {"p99": itl_p99_ms}}))

    def met(*itl_p99_ms: float) -> list[bool]:
        v = VariantState(index=1, knobs=[], status=DONE, points=[run(x) for x in itl_p99_ms])
        return [r.met for r in capacity.rate_points(v, {"itl_p99_ms": 300.0})]

    assert met(250.0, 340.0) == [False]  # the mean (295 ms) would have called it met on half the evidence
    assert met(250.0, 290.0) == [True]
    assert met(250.0, 340.0, 280.0) == [True]


def test_an_incumbent_whose_capacity_moves_at_its_edge_says_so_and_the_best_line_names_its_data(
        profiles: ProfileStore) -> None:
    """glm5-tp8 at ITL p99 300 ms sits at its edge: measured again there (a candidate's gain inside the noise), its
    capacity moves. Every step's comparison is against the figure it had then, and the record says when it moved."""
    from toolkit.app.profiles import check
    from toolkit.core.sweep.promote import base_spec, profile_validator
    from toolkit.core.tune.loop import new_tune_log, run_tune, score

    spec = base_spec(profiles.resolve("glm5-tp8"))
    state = new_state(run_id="glm5-tp8-t", profile="glm5-tp8", base_spec=spec, axes=[], planned=[],
                      concurrency=[1024], created="", runner="test")
    state.tune = new_tune_log(objective="goodput", repeats=3, min_gain_pct=1.0, budget_points=None)
    state.capacity = capacity.new_capacity(SLO)
    run_tune(state, spec, EngineModelRunner(base="glm5-tp8", profile_names=profiles.names()),
             validate=profile_validator("glm5-tp8", state.run_id, profiles.source, check),
             save=lambda _s: None, clock=lambda: 0.0)
    log = state.tune
    steps = log["steps"]
    rate = steps[0]["result"]["request_rate"]
    moves = 0
    for step in steps[1:]:
        result = step["result"]
        moved = result.get("incumbent_moved")
        if moved:
            moves += 1
            assert moved["from_request_rate"] == rate and moved["to_request_rate"] != rate
            assert f"capacity moved from {rate:g} req/s to {moved['to_request_rate']:g} req/s" in result["text"]
            rate = moved["to_request_rate"]
        if result.get("decision") == "improved":
            rate = next(c["request_rate"] for c in step["candidates"] if c["id"] == result["best"])
    assert moves >= 1, "this profile at this SLO moves at its edge; nothing was exercised"
    inc = score(state.variant(int(log["incumbent"])), "goodput", state)
    assert inc is not None and inc.request_rate == rate == log["incumbent_rate"]
    line = report.best_line(state)
    assert f"at {rate:g} req/s under the SLO" in line
    assert "Data: ENGINE MODEL (in-process" in line


def test_a_met_rate_that_a_repeat_turns_into_a_miss_steps_down_once_not_by_every_miss_before() -> None:
    """The engine model's glm5-baseline at ITL p99 100 ms: the search narrowed to 3.059 met, 3.166 missed; the
    repeat at 3.059 missed too, so no rate had met. The next rate is one step below (3.059 / 1.25), not the square of
    every miss before it (1.25 ** 64: 2e-06 req/s, a benchmark that would never end)."""
    from toolkit.core.sweep.state import DONE, Point, VariantState

    def run(rate: float, itl_p99_ms: float) -> Point:
        return Point(concurrency=1024, request_rate=rate, status=DONE, measurement=Measurement(
            steady_output_tok_per_s=rate * 64, request_rate=rate, latency_ms={"itl": {"p99": itl_p99_ms}}))

    state = _capacity_state({"itl_p99_ms": 100.0})
    missed = [9.55, 4.78, 3.825, 3.436, 3.257, 3.166]
    v = VariantState(index=1, knobs=[], status=DONE,
                     points=[run(r, 115.0) for r in missed] + [run(3.059, 80.0), run(3.059, 116.0)])
    state.variants.append(v)
    assert capacity.result(state, v).lo is None
    assert capacity.next_rate(state, v) == capacity.round_rate(3.059 / 1.25)
    # Bracketing down from the start still squares its steps: 10, 8 (/1.25), then /1.5625.
    fresh_v = VariantState(index=2, knobs=[], status=DONE, points=[run(10.0, 130.0), run(8.0, 120.0)])
    state.variants.append(fresh_v)
    assert capacity.next_rate(state, fresh_v) == capacity.round_rate(8.0 / 1.25 ** 2)


def test_goodput_is_what_the_rate_carries_not_where_a_short_window_fell() -> None:
    """The lab's run at 18.1 req/s found no plateau and fell back to the whole run, drain included (793 tok/s),
    where the rate carries 18.1 x 64.15 output tokens per request = 1,161: under a TTFT bound (the server kept up)
    goodput is the latter; under an ITL bound alone (a queue may be growing unseen) the measured figure bounds it."""
    m = Measurement(steady_output_tok_per_s=793.3, output_tok_per_s=793.3, request_per_s=12.367, request_rate=18.1,
                    throughput_window="full")
    assert capacity.goodput_tok_per_s(m, 18.1, {"ttft_p99_ms": 3000.0, "itl_p99_ms": 300.0}) == pytest.approx(
        18.1 * 793.3 / 12.367)
    assert capacity.goodput_tok_per_s(m, 18.1, {"itl_p99_ms": 300.0}) == 793.3
    # No whole-run figures (a recorded table): what was measured.
    assert capacity.goodput_tok_per_s(Measurement(steady_output_tok_per_s=500.0), 9.0, {"ttft_p99_ms": 1.0}) == 500.0
