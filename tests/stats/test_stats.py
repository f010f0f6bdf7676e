"""The statistics every decision uses (toolkit.core.stats): pass-rate intervals, paired intervals of a change, the
decision on them, and the tune's test at the SLO's edge on what it decides. Pure: milliseconds."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from toolkit.core import stats
from toolkit.core.sweep import capacity
from toolkit.core.sweep.state import DONE, Measurement, Point, VariantState, new_state
from toolkit.core.tune.loop import _edge_test


def test_wilson_matches_the_closed_form_and_stays_inside_0_1() -> None:
    # Reference values: Wilson 1927 / Newcombe 1998 table I (95 %): 81/263 -> [0.2553, 0.3662], 0/10 -> [0, 0.2775]
    r = stats.wilson(81, 263)
    assert (round(r.low, 4), round(r.high, 4)) == (0.2553, 0.3662)
    z = stats.wilson(0, 10)
    assert z.low == 0.0 and round(z.high, 4) == 0.2775
    full = stats.wilson(6, 6)
    assert full.high == 1.0 and 0.6 < full.low < 0.62
    assert stats.wilson(0, 0).to_dict() == {"passed": 0, "runs": 0, "low": 0.0, "high": 1.0}
    with pytest.raises(ValueError):
        stats.wilson(3, 2)


def test_newcombes_difference_matches_his_worked_example() -> None:
    # Newcombe 1998 (Stat Med 17:873), example (a): 56/70 - 48/80, method 10: [0.0524, 0.3339]
    d = stats.pass_rate_difference(stats.wilson(56, 70), stats.wilson(48, 80))
    assert (round(d.low, 4), round(d.high, 4)) == (0.0524, 0.3339)


def test_six_of_six_against_four_of_eight_is_a_significant_gain_and_three_of_six_is_not() -> None:
    kept = stats.pass_rate_gain(stats.wilson(6, 6), stats.wilson(4, 8))
    assert kept.promote and kept.outcome == stats.GAIN and "6 of 6 runs against 4 of 8" in kept.text
    assert not stats.pass_rate_gain(stats.wilson(3, 6), stats.wilson(4, 8)).promote
    assert stats.pass_rate_gain(stats.wilson(0, 6), stats.wilson(8, 8)).outcome == stats.LOSS


def _run(rate: float, itl_p99_ms: float) -> Point:
    return Point(concurrency=1024, request_rate=rate, status=DONE, measurement=Measurement(
        steady_output_tok_per_s=rate * 64, request_rate=rate, latency_ms={"itl": {"p99": itl_p99_ms}}))


def _edge_case(candidate_itl_ms: list[float]) -> tuple[bool | None, str, float, float]:
    state = new_state(run_id="c", profile="p", base_spec={}, axes=[], planned=[], concurrency=[1024], created="",
                      runner="test")
    state.capacity = capacity.new_capacity({"itl_p99_ms": 300.0})
    # The base at 9 req/s: 4 of 8 runs met ITL p99 300 ms; one run far past it (a slow host moment) swings the mean.
    base_itl = [100.0, 200.0, 290.0, 299.0, 310.0, 320.0, 330.0, 2000.0]
    base = VariantState(index=1, knobs=[], status=DONE, points=[_run(8.0, 200.0), *(_run(9.0, x) for x in base_itl)])
    cap = VariantState(index=2, knobs=[], status=DONE, points=[_run(9.0, x) for x in candidate_itl_ms])
    state.variants += [base, cap]
    sig, text = _edge_test(state, {}, cap, base, max_runs=8)
    # What the former test (Welch's t on the mean latency ratios) made of the same runs: its half-width and gap.
    mine, theirs = [x / 300.0 for x in candidate_itl_ms], [x / 300.0 for x in base_itl]
    va, vb = statistics.variance(theirs) / len(theirs), statistics.variance(mine) / len(mine)
    df = (va + vb) ** 2 / (va ** 2 / (len(theirs) - 1) + vb ** 2 / (len(mine) - 1))
    return sig, text, statistics.fmean(theirs) - statistics.fmean(mine), stats.t975(math.floor(df)) * math.sqrt(va + vb)


def test_the_tune_keeps_a_cap_that_met_the_slo_6_of_6_where_the_base_met_it_4_of_8() -> None:
    sig, text, welch_gap, welch_hw = _edge_case([280.0, 285.0, 290.0, 292.0, 295.0, 298.0])
    assert welch_gap < welch_hw  # Welch's t could not keep it: one 2 s run widened the base's interval
    assert sig is True and "met the SLO in 6 of 6 runs against 4 of 8" in text
    # Four of six passing is no better than the base: measured again (runs left), not kept.
    sig, text, _, _ = _edge_case([280.0, 290.0, 295.0, 299.0, 320.0, 330.0])
    assert sig is None and "not told apart" in text


def _pairs(effect: float, n: int, seed: int, cv: float = 0.03) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    old = [1000.0 * (1 + rng.gauss(0, cv)) for _ in range(n)]
    new = [1000.0 * (1 + effect) * (1 + rng.gauss(0, cv)) for _ in range(n)]
    return old, new


def test_paired_change_is_deterministic_and_covers_the_true_effect() -> None:
    old, new = _pairs(0.10, 6, seed=1)
    a, b = stats.paired_relative_change(old, new), stats.paired_relative_change(old, new)
    assert a is not None and a == b and a.low < 0.10 < a.high and a.low > 0
    assert stats.paired_relative_change([1.0], [2.0]) is None
    # A failed run (NaN, zero) is not a figure: its pair drops out.
    c = stats.paired_relative_change([*old, float("nan")], [*new, 5.0])
    assert c == a


def test_the_decision_promotes_a_gain_refuses_a_loss_and_calls_noise_equal_only_when_narrow() -> None:
    def d(low: float, high: float, accept: bool = False) -> stats.Decision:
        return stats.decide(stats.Difference((low + high) / 2, low, high, "t"), effect=0.05, accept_equal=accept,
                            pairs=4)

    assert (d(0.02, 0.12).outcome, d(0.02, 0.12).promote) == (stats.GAIN, True)
    assert (d(-0.2, -0.1).outcome, d(-0.2, -0.1).promote) == (stats.LOSS, False)
    assert (d(-0.02, 0.03).outcome, d(-0.02, 0.03).promote) == (stats.EQUAL, False)
    assert d(-0.02, 0.03, accept=True).promote
    assert d(-0.08, 0.1).outcome == stats.UNDECIDED
    few = stats.decide(stats.Difference(0.5, 0.4, 0.6, "t"), effect=0.05, pairs=2)
    assert few.outcome == stats.UNDECIDED and "at least 3 paired runs" in few.text


def test_ties_with_first_marks_overlapping_intervals() -> None:
    assert stats.ties_with_first([(99.0, 103.0), (98.0, 101.0), (90.0, 95.0), None]) == [False, True, False, False]
    assert stats.ties_with_first([None, (1.0, 2.0)]) == [False, False]


def test_sglangs_goodput_spelling_is_accepted_as_its_own_definition_with_tpot_a_per_request_mean() -> None:
    from toolkit.core.errors import ToolkitError
    from toolkit.core.probe.bench import RequestLatencies, latency_percentiles
    from toolkit.core.sweep.slo import SLO_DEFINITIONS, check_slo, parse_slo, slo_definition, slo_text

    slo = parse_slo("ttft:3000 tpot:50")
    assert slo == {"ttft_ms": 3000.0, "tpot_ms": 50.0} and parse_slo("ttft:3000,tpot:50") == slo
    assert slo_definition(slo) == "sglang-goodput" and "tpot a request's mean" in SLO_DEFINITIONS["sglang-goodput"]
    assert parse_slo(slo_text(slo)) == slo
    toolkit_slo = parse_slo("ttft_p99_ms=3000,itl_p99_ms=50")
    assert slo_definition(toolkit_slo) == "toolkit-p99" and parse_slo(slo_text(toolkit_slo)) == toolkit_slo
    with pytest.raises(ToolkitError) as bad:
        parse_slo("ttft:3000 itl:50")
    assert "unknown SGLang --goodput bound 'itl'" in str(bad.value) and "ttft, tpot, e2el" in str(bad.value)
    # 90 requests decode at 40 ms a gap; 10 have one 1 s stall among 99 fast gaps: their own mean is 49.6 ms.
    gaps = [[0.040] * 100 for _ in range(90)] + [[0.040] * 99 + [1.0] for _ in range(10)]
    lat = latency_percentiles(RequestLatencies([0.5] * 100, gaps, 0))
    assert lat["tpot"]["p99"] == pytest.approx(49.6, abs=0.1)  # per-request means: the stall is averaged in
    assert lat["itl"]["p99"] == pytest.approx(40.0)  # every gap: 10 stalls in 10,000 are under the 99th
    assert check_slo(slo, lat).met and not check_slo({"tpot_ms": 45.0}, lat).met
