"""The tune loop: measure, read the verdict's knob steps, measure the changes they name, keep the best, repeat.

Pure: measuring (`run_variant`), validating a variant (`validate`), saving, the clock and the progress display
are injected, exactly as for the sweep, and the measuring itself IS the sweep's loop (`run_sweep`) over the same
`SweepState`: the tune only adds variants to it, step by step, and keeps its own record in `state.tune` (plain
data, below). So the state file, the store, resume, Ctrl-C, failures, ranking and promotion are the sweep's.

Each round, in an order a resume can replay from the state alone:
1. `run_sweep` measures every pending point (a resume measures the point that was in flight again);
2. the last step, once measured, is concluded: the best candidate beats the incumbent only by more than the noise
   band (the spread of the base's repeated measurements, at least `min_gain_pct`), a candidate that failed has its
   knob directions recorded so no later step proposes them again;
3. no improvement (or no candidate, or the budget spent) stops the tune; else the incumbent's verdict
   (`Measurement.knob_steps`) is turned into the next step's candidates: the incumbent's knobs plus one step's value
   (and the knobs that go with it), each validated like a sweep's variant; bench.* steps are not taken (every
   variant is measured on the same workload). Each knob step is a ladder climbed from its boldest value down,
   one rung at a time, until a rung beats the incumbent (`_climb`).

The record (`state.tune`, schema 1; its types: toolkit.core.tune.log): objective, repeats, min_gain_pct,
budget_points, incumbent (variant index), incumbent_rate (its capacity when it became the incumbent, or was last
seen to move), noise {values, median, spread_pct, band_pct}, steps [{step, from, verdict {variant, class, headline,
artifacts, concurrency}, ladders [{knob, why, together, profiles, values (the rungs not tried yet)}], candidates
[{variant, id, knob, ladder, change {path: [old, new]}, why, profiles, status, value, gain_pct}], skipped [{knob,
value, reason}], result {.., incumbent_moved}}], failed_directions [{knob, direction, reason, variant}], budget_hit
(a rung was left out for the budget), stop {reason, kind}.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from toolkit.core import stats
from toolkit.core.errors import Problem
from toolkit.core.sweep import capacity
from toolkit.core.sweep.noise import Interval, RunToRun, interval, run_to_run, within_run
from toolkit.core.sweep.ranking import best_point
from toolkit.core.sweep.run import Progress, RunVariant
from toolkit.core.sweep.slo import check_slo
from toolkit.core.sweep.state import (
    DONE,
    FAILED,
    INVALID,
    PLANNED,
    Measurement,
    Point,
    SweepState,
    VariantState,
    problem_dict,
)
from toolkit.core.sweep.variants import VARIABLE_SECTIONS, Scalar, Variant, changed_knobs, format_value, get_path
from toolkit.core.tune.edge import edge_verdict
from toolkit.core.tune.log import Candidate, IncumbentMoved, NoiseBand, Step, StepResult, Stop, StopKind, TuneLog

TUNE_SCHEMA_VERSION = 1
OBJECTIVES = {"throughput": "throughput", "tokens-per-joule": "tokens_per_j", "goodput": "goodput"}
DEFAULT_REPEATS = 3
DEFAULT_MIN_GAIN_PCT = 1.0  # below this a knob change is not worth a profile's line, whatever the noise
# A gain inside the intervals is measured again, the base and both sides once more a round, until the base has
# this many measurements; then it is not an improvement.
DEFAULT_MAX_REPEATS = 6
# tokens-per-joule under an SLO: a candidate may give up at most this much goodput for its energy.
DEFAULT_MAX_GOODPUT_LOSS_PCT = 1.5
GUARD_SLACK = 0.005  # the goodput guard's allowance for the throughput measured at a held rate
MAX_STEPS = 25  # a verdict that keeps proposing (it should not) still ends

# Stop kinds.
CONVERGED: Final = "converged"
NOTHING_NEW: Final = "nothing-new"
BUDGET: Final = "budget"
BASE_FAILED: Final = "base-failed"


@dataclass(frozen=True)
class Score:
    variant: int
    concurrency: int
    value: float  # in the objective's unit: output tok/s, or output tok/J
    measurement: Measurement
    request_rate: float | None = None  # the capacity search's rate the value was measured at (None: closed loop)
    bracket: float = 1.0  # the capacity's hi / lo: how far above `value` it may still be
    goodput: float | None = None  # output tok/s at the capacity rate (a tokens-per-joule tune under an SLO)


def new_tune_log(*, objective: str, repeats: int, min_gain_pct: float, budget_points: int | None,
                 max_repeats: int = DEFAULT_MAX_REPEATS,
                 max_goodput_loss_pct: float = DEFAULT_MAX_GOODPUT_LOSS_PCT) -> TuneLog:
    return {
        "schema_version": TUNE_SCHEMA_VERSION,
        "objective": objective,
        "repeats": repeats,
        "max_repeats": max_repeats,
        "max_goodput_loss_pct": max_goodput_loss_pct,
        "min_gain_pct": min_gain_pct,
        "budget_points": budget_points,
        "incumbent": None,
        "noise": None,
        "steps": [],
        "failed_directions": [],
        "stop": None,
    }


def check_log(log: Mapping[str, Any] | None, *, file: str) -> TuneLog:
    from toolkit.core.errors import ToolkitError

    if not isinstance(log, Mapping):
        raise ToolkitError.of("this run is a sweep, not a tune", file=file, fix="resume it with toolkit sweep --resume")
    version = log.get("schema_version")
    if not isinstance(version, int) or version > TUNE_SCHEMA_VERSION:
        raise ToolkitError.of(
            f"tune record schema {version!r}; this toolkit reads up to {TUNE_SCHEMA_VERSION}",
            file=file,
            field="tune.schema_version",
            fix="upgrade the toolkit to resume this tune",
        )
    return cast(TuneLog, dict(log))  # its keys are only ever added: an older record reads as it is


def unit(objective: str) -> str:
    return "output tok/J" if objective == "tokens-per-joule" else "output tok/s"


def score(v: VariantState, objective: str, state: SweepState | None = None) -> Score | None:
    """The variant's value for the objective: its best level, a repeated level by its median measurement; with a
    capacity search (`state.capacity`), the measurement at the highest rate that met the SLO (goodput: its output
    tok/s; tokens-per-joule: its output tok/J)."""
    if state is not None and state.capacity is not None:
        cap = capacity.result(state, v)
        m = cap.at_lo
        if m is None or cap.goodput is None:
            return None
        value = m.tokens_per_j if objective == "tokens-per-joule" else cap.goodput
        if value is None:
            return None
        return Score(v.index, state.concurrency[0], float(value), m, cap.lo, cap.bracket, cap.goodput)
    by = OBJECTIVES[objective]
    found = best_point(v, "tokens_per_j" if by == "tokens_per_j" else "throughput")
    if found is None:
        return None
    c, m = found
    value = m.tokens_per_j or 0.0 if by == "tokens_per_j" else m.steady_output_tok_per_s
    return Score(v.index, c, float(value), m)


def _objective_value(m: Measurement, objective: str, state: SweepState | None = None) -> float | None:
    if objective == "tokens-per-joule":
        return m.tokens_per_j
    if objective == "goodput" and state is not None and state.capacity is not None and m.request_rate is not None:
        return capacity.goodput_tok_per_s(m, m.request_rate, capacity.CapacityParams.of(state.capacity).slo)
    return m.steady_output_tok_per_s


def at_score(v: VariantState, s: Score) -> list[Measurement]:
    """Every measurement of the variant at its scored load (the same level and rate): its repeats."""
    return [p.measurement for p in v.points if p.status == DONE and p.measurement is not None
            and p.concurrency == s.concurrency and p.request_rate == s.request_rate]


def noise_band(state: SweepState, log: TuneLog) -> NoiseBand | None:
    """The spread of the base's repeated measurements at its best level (or its capacity rate), the band a gain
    must clear, and the run-to-run spread a once-measured variant's interval borrows."""
    base = state.variant(1)
    s = score(base, log["objective"], state)
    if s is None:
        return None
    values = [v for m in at_score(base, s) for v in [_objective_value(m, log["objective"], state)] if v is not None]
    median = statistics.median(values)
    spread_pct = (max(values) - min(values)) / median * 100 if median else 0.0
    rr = run_to_run(values)
    ratios = []
    if state.capacity is not None:
        params = capacity.CapacityParams.of(state.capacity)
        ratios = [r for m in at_score(base, s) for r in [capacity.slo_ratio(check_slo(params.slo, m.latency_ms))]
                  if r is not None]
    slo_rr = run_to_run(ratios)
    return {
        "values": [round(v, 4) for v in values],
        "concurrency": s.concurrency,
        "request_rate": s.request_rate,
        "median": round(median, 4),
        "spread_pct": round(spread_pct, 2),
        "band_pct": round(max(spread_pct, float(log["min_gain_pct"])), 2),
        "min_gain_pct": float(log["min_gain_pct"]),
        "run_to_run": None if rr is None else {"cv": round(rr.cv, 6), "df": rr.df},
        # The binding latency over its bound, run to run at the base's capacity: how sure a pass at the edge is.
        "slo_ratio": None if slo_rr is None else {"values": [round(r, 4) for r in ratios], "cv": round(slo_rr.cv, 6),
                                                  "df": slo_rr.df},
    }


def variant_interval(state: SweepState, log: TuneLog, v: VariantState) -> Interval | None:
    """The variant's figure with its 95 % interval (toolkit.core.sweep.noise): its repeats at the scored load, their
    runs' own steady windows, the base's run-to-run spread when measured once."""
    objective = log["objective"]
    s = score(v, objective, state)
    if s is None:
        return None
    ms = at_score(v, s)
    if objective == "goodput" and state.capacity is not None:
        # A goodput is what its capacity rate carries: known to the search's bracket, not to a throughput's
        # spread (every run at that rate carries the same requests). It may lie up to hi / lo above.
        cap = capacity.result(state, v)
        if cap.hi is None or cap.lo is None:
            return Interval(s.value, s.value, s.value, "no rate above it missed the SLO")
        return Interval(s.value, s.value, s.value * cap.hi / cap.lo,
                        f"the capacity search's bracket: met at {cap.lo:g}, missed at {cap.hi:g} req/s")
    values = [x for m in ms for x in [_objective_value(m, objective)] if x is not None]
    within = []
    for m in ms:
        # Under Poisson arrivals the per-interval throughput follows the arrivals, which are the same for every
        # variant (bench_serving's seed): common to both sides of a comparison, not noise between them.
        w = within_run(m.interval_tok_per_s, m.interval_s) if m.request_rate is None else None
        if w is not None and objective == "tokens-per-joule" and m.steady_output_tok_per_s:
            k = (m.tokens_per_j or 0.0) / m.steady_output_tok_per_s  # the same relative spread, in tok/J
            w = type(w)(w.mean * k, w.se * k, w.batches)
        within.append(w)
    noise = log["noise"]
    rr = noise["run_to_run"] if noise is not None else None
    base = RunToRun(float(rr["cv"]), int(rr["df"])) if rr else None
    return interval(values or [s.value], within, base=base, value=s.value)


def _direction(old: Any, new: Scalar) -> str:
    if isinstance(new, int | float) and not isinstance(new, bool) and isinstance(old, int | float) and not isinstance(
        old, bool
    ):
        return "up" if new > old else "down"
    return f"={format_value(new)}"


def _effective(base_spec: Mapping[str, Any], knobs: Mapping[str, Scalar], path: str) -> Any:
    if path in knobs:
        return knobs[path]
    value = get_path(base_spec, path)
    return None if not isinstance(value, bool | int | float | str) else value


def _next_index(state: SweepState) -> int:
    return max((v.index for v in state.variants), default=0) + 1


def _planned_points(state: SweepState) -> int:
    return sum(len(v.points) for v in state.planned())


def _band(log: TuneLog) -> float:
    """The gain a change must clear: the noise band, or the least gain worth a line before the base is measured."""
    noise = log["noise"]
    return float(noise["band_pct"] if noise is not None else log["min_gain_pct"])


def _incumbent(state: SweepState, log: TuneLog) -> VariantState:
    index = log["incumbent"]
    assert index is not None, "the base is measured before any step names an incumbent"
    return state.variant(index)


def _conclude(state: SweepState, log: TuneLog, step: Step) -> StepResult | None:
    """The measured step's result (also set as step["result"]): the best candidate against the incumbent, and the
    failed directions; None when a gain inside the intervals is measured again first (the points are planned)."""
    result = _result(state, log, step)
    if result is None:
        return None
    step["result"] = result
    return result.copy()


def _base_result(state: SweepState, log: TuneLog) -> StepResult:
    objective = log["objective"]
    base = state.variant(1)
    s = score(base, objective, state)
    if s is None:
        reasons = sorted({p.reason or "failed" for p in base.points if p.status == FAILED})
        if state.capacity is not None and not reasons:
            reasons = [capacity.result(state, base).text()]
        text = "the base could not be measured: " + "; ".join(reasons)
        log["stop"] = {"kind": BASE_FAILED, "reason": text}
        return {"decision": "failed", "text": text}
    log["noise"] = noise_band(state, log)
    log["incumbent"] = 1
    log["incumbent_rate"] = s.request_rate
    n = log["noise"]
    assert n is not None  # the base was scored: its noise band exists
    where = (f"at {n['request_rate']:g} req/s (its capacity under the SLO)" if n["request_rate"] is not None
             else f"at concurrency {n['concurrency']}")
    ci = variant_interval(state, log, base)
    return {
        "decision": "base",
        "value": round(s.value, 4),
        "concurrency": s.concurrency,
        "request_rate": s.request_rate,
        "goodput": None if s.goodput is None else round(s.goodput, 4),
        "interval": ci.to_dict() if ci else None,
        "text": (
            f"measured {len(n['values'])} times {where}: "
            f"{', '.join(f'{v:,.4g}' for v in n['values'])} {unit(objective)} (median {n['median']:,.4g}, "
            f"spread {n['spread_pct']:.2f} %); a change must gain more than {n['band_pct']:.2f} % and "
            + ("meet the SLO where the incumbent missed it, its binding latency below the incumbent's by more than "
               "their runs there allow, to count" if objective == "goodput" and state.capacity is not None else
               "lie wholly above the incumbent's 95 % interval to count")
            + (f" (the base's: {ci.text()}, {ci.method})" if ci else "")
        ),
    }


def _measured_candidates(state: SweepState, log: TuneLog, step: Step) -> list[tuple[Score, Candidate]]:
    """Each candidate's score; a failed one gets its reason and (once) its knob directions recorded."""
    objective = log["objective"]
    rows = []
    for cand in step["candidates"]:
        if cand.get("status") in (INVALID, "failed"):
            continue
        v = state.variant(int(cand["variant"]))
        s = score(v, objective, state)
        if s is None:
            reasons = sorted({p.reason or "failed" for p in v.points if p.status == FAILED})
            if state.capacity is not None:
                cap = capacity.result(state, v)
                if cap.status == capacity.BELOW_FLOOR:
                    # Missed the SLO at the incumbent's capacity: it cannot beat it. Not a failure of the knob's
                    # direction (a smaller step might pass), so no direction is barred.
                    cand["status"] = "below"
                    cand["reason"] = (f"missed the SLO at {cap.hi:g} req/s, the incumbent's capacity: "
                                      + (cap.check_edge.text() if cap.check_edge else "benchmark failed"))
                    continue
                if not reasons:
                    reasons = [cap.text()]
            cand["status"] = "failed"
            cand["reason"] = "; ".join(reasons)
            for path, (old, new) in cand["change"].items():
                log["failed_directions"].append(
                    {"knob": path, "direction": _direction(old, new), "reason": cand["reason"], "variant": v.id}
                )
            continue
        rows.append((s, cand))
    return rows


def _remeasure(state: SweepState, log: TuneLog, variants: Sequence[VariantState]) -> list[str]:
    """One more measurement of each at its scored load (a capacity rate, a level); the ids measured again."""
    out = []
    for v in variants:
        s = score(v, log["objective"], state)
        if s is None:
            continue
        n = len([p for p in v.points if p.concurrency == s.concurrency and p.request_rate == s.request_rate])
        v.points.append(Point(concurrency=s.concurrency, repeat=n, request_rate=s.request_rate))
        out.append(v.id)
    return out


def _result(state: SweepState, log: TuneLog, step: Step) -> StepResult | None:
    objective = log["objective"]
    if step["step"] == 0:
        return _base_result(state, log)
    incumbent = _incumbent(state, log)
    inc = score(incumbent, objective, state)
    # The base measured again (a gain inside the intervals) sharpens the run-to-run spread: read it anew.
    log["noise"] = noise_band(state, log) or log.get("noise")
    band = _band(log)
    rows = []
    for s, cand in _measured_candidates(state, log, step):
        gain = (s.value / inc.value - 1) * 100 if inc and inc.value else 0.0
        cand["status"] = "measured"
        cand["value"] = round(s.value, 4)
        cand["concurrency"] = s.concurrency
        cand["request_rate"] = s.request_rate
        cand["gain_pct"] = round(gain, 2)
        cand["verdict"] = s.measurement.verdict
        ci = variant_interval(state, log, state.variant(s.variant))
        cand["interval"] = ci.to_dict() if ci else None
        if s.goodput is not None:
            cand["goodput"] = round(s.goodput, 2)
        rows.append((s, gain, cand, ci))
    inc_ci = variant_interval(state, log, incumbent)
    # decision and text are set below, by what the step concluded
    result: StepResult = {"decision": "no-gain", "text": "", "incumbent": incumbent.id,
                          "incumbent_value": round(inc.value, 4) if inc else None, "band_pct": band,
                          "incumbent_interval": inc_ci.to_dict() if inc_ci else None}
    moved = _incumbent_moved(state, log, incumbent, inc)
    if moved:
        result["incumbent_moved"] = moved
    guard = _goodput_guard(log, inc)
    eligible = [r for r in rows if guard is None or (r[0].goodput or 0.0) >= guard]
    for r in rows:
        if r not in eligible:
            r[2]["reason"] = (f"gives up goodput: {r[0].goodput or 0:,.4g} output tok/s at its capacity against the "
                              f"incumbent's {inc.goodput if inc else 0:,.4g} (at most "
                              f"{log['max_goodput_loss_pct']:g} % less)")
    best = max(eligible, key=lambda r: (r[0].value, -r[0].variant), default=None)
    sig: bool | None = False
    why_not = ""
    if best is not None and best[1] > band:
        sig, why_not = _significance(state, log, best[0], best[3], incumbent, inc_ci)
    if sig is None:
        # A gain above the band that the measurements cannot yet tell from noise: measure again, while allowed.
        cand_v = state.variant(best[0].variant)  # type: ignore[index]
        edge = capacity.result(state, incumbent).hi if state.capacity is not None else None
        if objective == "goodput" and edge is not None:
            # Under an SLO the question is the edge: the incumbent and the candidate again where the incumbent
            # missed it, so their latencies there are compared on several runs each.
            again = []
            for v in ({incumbent.index: incumbent, cand_v.index: cand_v}).values():
                capacity.measure_again(state, v, edge)
                again.append(v.id)
        else:
            # The base again (the run-to-run spread a once-measured variant borrows), the incumbent, the candidate.
            again = _remeasure(state, log, [state.variant(1), *([incumbent] if incumbent.index != 1 else []),
                                            cand_v])
        step.setdefault("remeasured", []).append({"variants": again, "why": f"{cand_v.id}'s {best[1]:+.1f} % "  # type: ignore[index]
                                                  f"is not yet told from noise ({why_not})"})
        return None
    if best is not None and sig:
        s, gain, cand, ci = best
        log["incumbent"] = s.variant
        edge = capacity.result(state, incumbent).hi if state.capacity is not None else None
        if objective == "goodput" and edge is not None:
            how = f"the SLO met where {incumbent.id} missed it: {why_not}"
        else:
            how = (f"its 95 % interval {ci.text() if ci else '-'} wholly above {incumbent.id}'s "
                   f"{inc_ci.text() if inc_ci else '-'}")
            if state.capacity is not None and s.request_rate is not None:
                how += f", both at {s.request_rate:g} req/s under the SLO"
        result.update(StepResult(decision="improved", best=state.variant(s.variant).id, value=round(s.value, 4),
                      gain_pct=round(gain, 2),
                      text=f"{state.variant(s.variant).id} {s.value:,.4g} {unit(objective)} against {incumbent.id}'s "
                      f"{inc.value if inc else 0:,.4g}: {gain:+.1f} %, above the noise band ({band:.2f} %) and "
                      f"{how}: kept"))
    elif best is not None:
        s, gain, cand, ci = best
        why = ("inside the noise band" if abs(gain) <= band else
               "not above the noise band" if gain <= band else f"not significant: {why_not}")
        result.update(StepResult(decision="no-gain", best=state.variant(s.variant).id, value=round(s.value, 4),
                      gain_pct=round(gain, 2),
                      text=f"best candidate {state.variant(s.variant).id} {s.value:,.4g} {unit(objective)} against "
                      f"{incumbent.id}'s {inc.value if inc else 0:,.4g}: {gain:+.1f} %, {why}"
                      + (f" ({band:.2f} %)" if "band" in why else "") + f": not an improvement, {incumbent.id} stays"))
    else:
        what = "no candidate could be measured" if not rows else "every candidate gives up goodput"
        result.update(StepResult(decision="no-gain", text=f"{what}; {incumbent.id} stays"))
    if moved:
        result["text"] += f" ({moved['text']})"
    if result.get("decision") == "improved" and best is not None:
        log["incumbent_rate"] = best[0].request_rate  # the new incumbent's capacity
    elif moved and inc is not None:
        log["incumbent_rate"] = inc.request_rate
    return result


def _incumbent_moved(state: SweepState, log: TuneLog, incumbent: VariantState,
                     inc: Score | None) -> IncumbentMoved | None:
    """The incumbent's capacity since it became the incumbent, when measuring it again at its edge moved it (the
    runs there met the SLO on their median latencies after all, or a repeat missed it): the figure every candidate
    of this step was compared with is the new one, and the record says so. None when it stayed."""
    if state.capacity is None or inc is None or "incumbent_rate" not in log:
        return None
    before = log.get("incumbent_rate")
    if before == inc.request_rate:
        return None
    runs = len(at_score(incumbent, inc))
    was = "none" if before is None else f"{before:g} req/s"
    return {"from_request_rate": before, "to_request_rate": inc.request_rate, "runs": runs,
            "text": f"{incumbent.id}'s capacity moved from {was} to {inc.request_rate:g} req/s, measured again at "
                    f"its edge: the SLO judged on the median latency of {runs} run(s) there, its figure "
                    f"{inc.value:,.4g} {unit(log['objective'])} their median"}


def _significance(state: SweepState, log: TuneLog, cand: Score, ci: Interval | None,
                  incumbent: VariantState, inc_ci: Interval | None) -> tuple[bool | None, str]:
    """Whether a gain above the band is real: True, False (decided: no), None (measure again first), and why.

    Goodput under an SLO: at the rate the incumbent missed, the candidate met it and its binding latency lies below
    the incumbent's by more than their runs' own spread there (toolkit.core.tune.loop._edge_test). Otherwise: the
    candidate's 95 % interval lies wholly above the incumbent's, the base measured again while it has fewer than
    max_repeats measurements."""
    max_runs = int(log.get("max_repeats", DEFAULT_MAX_REPEATS))
    if state.capacity is not None and log["objective"] == "goodput":
        return _edge_test(state, log, state.variant(cand.variant), incumbent, max_runs)
    if ci is not None and inc_ci is not None and ci.above(inc_ci):
        return True, ""
    base = state.variant(1)
    base_s = score(base, log["objective"], state)
    # Every attempt counts (one that failed too), so a host that cannot measure again ends the round.
    base_runs = len([p for p in base.points if base_s and p.concurrency == base_s.concurrency
                     and p.request_rate == base_s.request_rate]) if base_s else max_runs
    text = (f"its interval {ci.text() if ci else '-'} overlaps {incumbent.id}'s {inc_ci.text() if inc_ci else '-'}"
            f" ({base_runs} measurements of the base)")
    return (None if base_runs < max_runs else False), text


def _ratios_at(state: SweepState, v: VariantState, rate: float) -> list[float]:
    """Each run's binding latency over its bound at one rate (a failed benchmark: 2, past any bound)."""
    assert state.capacity is not None
    slo = capacity.CapacityParams.of(state.capacity).slo
    out = []
    for p in v.points:
        if p.request_rate != rate or p.status == "pending":
            continue
        r = capacity.slo_ratio(check_slo(slo, p.measurement.latency_ms)) if p.measurement else None
        out.append(2.0 if p.status == FAILED or r is None else r)
    return out


def _edge_test(state: SweepState, log: TuneLog, cand: VariantState, incumbent: VariantState,
               max_runs: int) -> tuple[bool | None, str]:
    """At the rate the incumbent missed the SLO: the candidate meets it significantly more often than the incumbent
    (each run a pass or a miss; the interval of the difference of their pass rates wholly above zero,
    toolkit.core.stats.pass_rate_gain). Near the edge a latency swings with the host's pace, so one pass proves
    nothing and a mean of latency ratios is swung by one slow run; how often the SLO is kept is what is decided."""
    edge = capacity.result(state, incumbent).hi
    if edge is None:
        return False, f"{incumbent.id} met the SLO at every rate tried"
    mine, theirs = _ratios_at(state, cand, edge), _ratios_at(state, incumbent, edge)
    tried = min(sum(1 for p in v.points if p.request_rate == edge) for v in (cand, incumbent))
    if not mine:
        return None, f"{cand.id} not measured at {edge:g} req/s, where {incumbent.id} missed the SLO"
    if statistics.median(mine) > 1.0:
        return False, f"at {edge:g} req/s, where {incumbent.id} missed the SLO, {cand.id} missed it too"
    text = (f"at {edge:g} req/s the binding latency over its bound: {cand.id} "
            f"{', '.join(f'{r:.3f}' for r in mine)} against {incumbent.id} {', '.join(f'{r:.3f}' for r in theirs)}")
    decision = stats.pass_rate_gain(stats.wilson(sum(r <= 1.0 for r in mine), len(mine)),
                                    stats.wilson(sum(r <= 1.0 for r in theirs), len(theirs)))
    text += f"; {cand.id} {decision.text}"
    if decision.promote:
        return True, text
    return (None if tried < max_runs else False), text


def _goodput_guard(log: TuneLog, inc: Score | None) -> float | None:
    """tokens-per-joule under an SLO: the least goodput a candidate may have (None: no guard). A candidate is held
    at the incumbent's capacity less max_goodput_loss_pct (its goodput is what that load gives), so the guard
    allows a hair more for the measurement's own noise."""
    if log["objective"] != "tokens-per-joule" or inc is None or inc.goodput is None:
        return None
    loss = float(log.get("max_goodput_loss_pct", DEFAULT_MAX_GOODPUT_LOSS_PCT))
    base = state_base_goodput(log)
    return (base if base is not None else inc.goodput) * (1 - loss / 100) * (1 - GUARD_SLACK)


def state_base_goodput(log: TuneLog) -> float | None:
    """The base's goodput, as its step 0 recorded it (the guard is against the base, not a later incumbent)."""
    steps = log.get("steps") or []
    res = steps[0]["result"] if steps else None
    return res.get("goodput") if res is not None else None


def _propose(
    state: SweepState,
    log: TuneLog,
    base_spec: Mapping[str, Any],
    validate: Callable[[Variant], Sequence[Problem]],
) -> Step | None:
    """The next step from the incumbent's verdict, its first variants added to the state; None when nothing is new.

    Each knob step is a ladder: its values are tried one at a time from the boldest (the last the verdict
    proposes: 64 -> 1024 before 512 and 256, as the story's operator went), the next only when the one before did
    not beat the incumbent (`_climb`). A verdict's range ends at what it saw wanted (the peak demand), so its
    boldest value is the likeliest; the smaller ones are measured when it fails or does not pay."""
    incumbent = _incumbent(state, log)
    inc = score(incumbent, log["objective"], state)
    if inc is None:
        return None
    m = inc.measurement
    point = next((p for p in incumbent.points if p.measurement is m), None)
    step: Step = {
        "step": len(log["steps"]),
        "from": incumbent.id,
        "verdict": {
            "variant": incumbent.id,
            "class": m.verdict,
            "headline": m.verdict_headline,
            "artifacts": point.artifacts if point else None,
            "concurrency": inc.concurrency,
            "request_rate": inc.request_rate,
        },
        "candidates": [],
        "skipped": [],
        "ladders": [],
        "result": None,
    }
    knob_steps = list(m.knob_steps)
    if state.capacity is not None:
        # The SLO's edge first: the latency that bounds the capacity names its knob; then the bottleneck the
        # verdict at the capacity rate reads, for knobs the edge did not name.
        knobs = {p: _effective(base_spec, dict(incumbent.knobs), p)
                 for p in ("server.max_running_requests", "server.chunked_prefill_size")}
        edge = edge_verdict(capacity.result(state, incumbent), knobs)
        if edge is not None:
            step["edge"] = edge.to_dict()
            named = {ks["knob"] for ks in edge.knob_steps}
            knob_steps = [*edge.knob_steps, *(ks for ks in knob_steps if ks.get("knob") not in named)]
    for ks in knob_steps:
        path = str(ks.get("knob"))
        values = list(ks.get("proposed") or [])
        if path.split(".", 1)[0] not in VARIABLE_SECTIONS:
            for value in values:
                step["skipped"].append({"knob": path, "value": value, "reason": "a bench knob: the tune measures every "
                                        "variant on the same workload (give --concurrency levels instead)"})
            continue
        if path == "gpu.power_limit_w" and log["objective"] != "tokens-per-joule":
            current = ks.get("current")
            lower = [v for v in values
                     if isinstance(v, int | float) and isinstance(current, int | float) and v < current]
            for value in lower:
                step["skipped"].append({"knob": path, "value": value, "reason": "a lower power limit saves energy "
                                        "but cannot raise throughput (tune --objective tokens-per-joule)"})
            values = [v for v in values if v not in lower]
            if not values:
                continue
        step["ladders"].append({"knob": path, "why": ks.get("why"), "together": dict(ks.get("together") or {}),
                                "profiles": list(ks.get("profiles") or []), "values": values[::-1]})
    log["steps"].append(step)
    _climb(state, log, step, base_spec, validate)
    if not any(c["status"] == "planned" for c in step["candidates"]):
        # Keep what was considered (invalid or skipped) in the record; nothing to measure.
        step["result"] = {"decision": "nothing-new", "text": "the verdict proposes nothing new to measure"}
        return None
    return step


def _climb(
    state: SweepState,
    log: TuneLog,
    step: Step,
    base_spec: Mapping[str, Any],
    validate: Callable[[Variant], Sequence[Problem]],
) -> bool:
    """Plan the next rung of every ladder whose last rung is measured and did not beat the incumbent (or of a
    ladder not started); True when something new was planned. A rung that beat it ends its ladder."""
    incumbent = _incumbent(state, log)
    inc = score(incumbent, log["objective"], state)
    band = _band(log)
    guard = _goodput_guard(log, inc)
    knobs = dict(incumbent.knobs)
    seen = {_key(base_spec, dict(v.knobs)): v.id for v in state.variants}
    failed = {(f["knob"], f["direction"]): f for f in log["failed_directions"]}
    budget = log.get("budget_points")
    levels = list(state.concurrency)
    planned_any = False
    for li, ladder in enumerate(step.get("ladders", [])):
        mine = [c for c in step["candidates"] if c.get("ladder") == li]
        last = mine[-1] if mine else None
        if last is not None and last["status"] == "planned":
            v = state.variant(int(last["variant"]))
            if any(p.status == "pending" for p in v.points):
                continue  # still being measured
            s = score(v, log["objective"], state)
            if (s is not None and inc is not None and inc.value and (s.value / inc.value - 1) * 100 > band
                    and (guard is None or (s.goodput or 0.0) >= guard)):
                for value in ladder["values"]:
                    step["skipped"].append({"knob": ladder["knob"], "value": value,
                                            "reason": f"{v.id} already beat {incumbent.id}: the smaller values of "
                                            "this step are not measured"})
                ladder["values"] = []
                continue
        while ladder["values"]:
            value = ladder["values"].pop(0)
            change = {ladder["knob"]: value, **ladder["together"]}
            olds = {p: _effective(base_spec, knobs, p) for p in change}
            moved = {p: [olds[p], v] for p, v in change.items() if olds[p] != v or type(olds[p]) is not type(v)}
            skip = None
            if not moved:
                skip = f"already {format_value(value)} in {incumbent.id}"
            else:
                for p, (old, new) in moved.items():
                    f = failed.get((p, _direction(old, new)))
                    if f:
                        skip = f"{p} {_direction(old, new)} failed before ({f['variant']}: {f['reason']})"
                        break
            new_knobs = {**knobs, **{p: v for p, (_o, v) in moved.items()}}
            key = _key(base_spec, new_knobs)
            if skip is None and key in seen:
                skip = f"measured already as {seen[key]}"
            first = 1 if state.capacity is not None else len(levels)
            if skip is None and budget is not None and _planned_points(state) + first > int(budget):
                skip = f"over the budget ({budget} probe runs)"
                log["budget_hit"] = True
            if skip:
                step["skipped"].append({"knob": ladder["knob"], "value": value, "reason": skip})
                continue
            variant = Variant(index=_next_index(state), knobs=tuple(new_knobs.items()))
            problems = list(validate(variant))
            valid = not any(p.severity == "error" for p in problems)
            vs = VariantState(
                index=variant.index,
                knobs=list(variant.knobs),
                status=PLANNED if valid else INVALID,
                points=[Point(concurrency=c) for c in levels] if valid and state.capacity is None else [],
                problems=[problem_dict(p) for p in problems],
            )
            if valid and state.capacity is not None:
                # Its search starts at the incumbent's capacity: missing the SLO there, it cannot beat it; meeting
                # it, it is measured next where the incumbent missed the SLO.
                # tokens per joule: held at the incumbent's capacity, so both carry the same load and the candidate
                # gives up no goodput; goodput: searched on upwards.
                rate = inc.request_rate if inc is not None else None
                energy = log["objective"] == "tokens-per-joule"
                base_rate = capacity.result(state, state.variant(1)).lo
                if energy and base_rate is not None:
                    # It may give up at most max_goodput_loss_pct of the base's capacity, over all steps together:
                    # every candidate is held there.
                    rate = capacity.round_rate(base_rate * (1 - float(log.get("max_goodput_loss_pct",
                                                                             DEFAULT_MAX_GOODPUT_LOSS_PCT)) / 100))
                capacity.plan(state, vs, start=rate, floor=rate,
                              beat=None if energy else capacity.result(state, incumbent).hi, hold=energy)
            state.variants.append(vs)
            seen[key] = vs.id
            cand: Candidate = {
                "variant": vs.index,
                "id": vs.id,
                "knob": ladder["knob"],
                "ladder": li,
                "change": moved,
                "why": ladder["why"],
                "profiles": ladder["profiles"],
                "status": "planned" if valid else INVALID,
            }
            step["candidates"].append(cand)
            if valid:
                planned_any = True
                break
            cand["reason"] = "invalid, rejected by " + ", ".join(vs.rejected_by())  # free: try the next value
    return planned_any


def change_text(change: Mapping[str, Sequence[Any]]) -> str:
    """`max_running_requests 64 -> 1024, pp_size 1 -> 2` (the last path segment only)."""
    return ", ".join(
        f"{p.rsplit('.', 1)[-1]} {'unset' if o is None else format_value(o)} -> {format_value(n)}"
        for p, (o, n) in change.items()
    )


def _key(base_spec: Mapping[str, Any], knobs: Mapping[str, Scalar]) -> str:
    """Variants are the same when they differ from the base in the same knobs and values."""
    changed = changed_knobs(base_spec, Variant(index=0, knobs=tuple(knobs.items())))
    return repr(sorted((p, format_value(v)) for p, v in changed.items()))


def run_tune(
    state: SweepState,
    base_spec: Mapping[str, Any],
    run_variant: RunVariant,
    *,
    validate: Callable[[Variant], Sequence[Problem]],
    save: Callable[[SweepState], None],
    clock: Callable[[], float],
    on_progress: Callable[[Progress], None] = lambda _p: None,
    on_step: Callable[[str], None] = lambda _m: None,
) -> SweepState:
    """Measure, conclude, propose, until the tune stops; the state (with `state.tune`) is saved after each change."""
    assert state.tune is not None, "run_tune needs a state made by new_tune_state"
    log = cast(TuneLog, state.tune)  # the state's own record, changed in place and saved with it
    while True:
        if capacity.measure_all(state, base_spec, run_variant, save=save, clock=clock, on_progress=on_progress,
                                budget=log.get("budget_points")):
            log["budget_hit"] = True
        if log.get("stop"):
            break
        steps = log["steps"]
        if not steps:
            levels = list(state.concurrency)
            base = VariantState(index=1, knobs=[], status=PLANNED,
                                points=[Point(concurrency=c, repeat=r) for c in levels
                                        for r in range(int(log["repeats"]))])
            if state.capacity is not None:
                capacity.plan(state, base)
            state.variants.append(base)
            how = ("its capacity under the SLO searched, then measured there "
                   f"{log['repeats']} times in all" if state.capacity is not None
                   else f"measured {log['repeats']} times at each level")
            steps.append({"step": 0, "from": None, "verdict": None, "candidates": [{"variant": 1, "id": "v01",
                          "knob": None, "change": {}, "why": f"the base profile, {how} for the noise band",
                          "profiles": [], "status": "planned"}], "skipped": [], "result": None})
            save(state)
            on_step(f"step 0: the base {state.profile}, {how}")
            continue
        last = steps[-1]
        if last["result"] is None and last["step"] > 0 and _climb(state, log, last, base_spec, validate):
            save(state)  # the next rung of a ladder whose last one did not pay
            rung = last["candidates"][-1]
            on_step(f"step {last['step']}: next value: {rung['id']} ({change_text(rung['change'])})")
            continue
        if last["result"] is None and last["step"] == 0 and state.capacity is not None and not log.get("repeated"):
            # The base's capacity is found: measure it there again for the noise band.
            log["repeated"] = True
            base = state.variant(1)
            lo = capacity.result(state, base).lo
            runs = sum(1 for p in base.points if lo is not None and p.request_rate == lo)
            for _ in range(int(log["repeats"]) - runs):
                capacity.measure_again(state, base)
            save(state)
            cap = capacity.result(state, base)
            on_step(f"step 0: the base's capacity {cap.text()}; measuring it there again")
            continue
        if last["result"] is None:
            result = _conclude(state, log, last)
            save(state)
            if result is None:
                again = last["remeasured"][-1]
                on_step(f"step {last['step']}: {again['why']}: measuring {', '.join(again['variants'])} again")
                continue
            on_step(f"step {last['step']}: {result['text']}")
            if log.get("stop"):
                break
            if last["step"] > 0 and result["decision"] != "improved":
                kind: StopKind = BUDGET if log.pop("budget_hit", False) else CONVERGED
                reason = ("the budget ended" if kind == BUDGET else
                          "no candidate beat the incumbent by more than the noise band")
                log["stop"] = {"kind": kind, "reason": f"{reason}; best {_incumbent(state, log).id}"}
                save(state)
                break
        if len(steps) > MAX_STEPS:
            log["stop"] = {"kind": BUDGET, "reason": f"{MAX_STEPS} steps"}
            save(state)
            break
        step = _propose(state, log, base_spec, validate)
        hit = log.pop("budget_hit", False)
        if step is None:
            kind = BUDGET if hit else NOTHING_NEW
            reason = (f"the budget ({log.get('budget_points')} probe runs) leaves no room for the next candidate"
                      if hit else "the incumbent's verdict proposes nothing new to measure")
            stop: Stop = {"kind": kind, "reason": f"{reason}; best {_incumbent(state, log).id}"}
            log["stop"] = stop
            save(state)
            on_step(f"stop: {stop['reason']}")
            break
        if hit:
            log["budget_hit"] = True  # the step is trimmed: after it, the tune stops for the budget
        save(state)
        names = ", ".join(
            f"{c['id']} ({change_text(c['change'])})" + ("" if c["status"] == "planned" else f" {c['reason']}")
            for c in step["candidates"]
        )
        said = step["verdict"]
        assert said is not None  # a proposed step reads its incumbent's verdict
        on_step(f"step {step['step']}: {said['variant']} is {said['class']}: trying {names}")
    return state


def raise_budget(log: TuneLog, budget_points: int | None) -> None:
    """A resume may give a new budget: a tune stopped by its budget goes on (its last step is concluded again)."""
    log["budget_points"] = budget_points
    stop = log.get("stop")
    if stop and stop.get("kind") == BUDGET:
        log["stop"] = None
        log.pop("budget_hit", None)
