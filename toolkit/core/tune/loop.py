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

The record (`state.tune`, schema 1): objective, repeats, min_gain_pct, budget_points, incumbent (variant index),
noise {values, median, spread_pct, band_pct}, steps [{step, from, verdict {variant, class, headline, artifacts,
concurrency}, ladders [{knob, why, together, profiles, values (the rungs not tried yet)}], candidates [{variant,
id, knob, ladder, change {path: [old, new]}, why, profiles, status, value, gain_pct}], skipped [{knob, value,
reason}], result {..}}], failed_directions [{knob, direction, reason, variant}], budget_hit (a rung was left out
for the budget), stop {reason, kind}.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.core.errors import Problem
from toolkit.core.sweep.ranking import best_point
from toolkit.core.sweep.run import Progress, RunVariant, run_sweep
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

TUNE_SCHEMA_VERSION = 1
OBJECTIVES = {"throughput": "throughput", "tokens-per-joule": "tokens_per_j"}
DEFAULT_REPEATS = 3
DEFAULT_MIN_GAIN_PCT = 1.0  # below this a knob change is not worth a profile's line, whatever the noise
MAX_STEPS = 25  # a verdict that keeps proposing (it should not) still ends

# Stop kinds.
CONVERGED = "converged"
NOTHING_NEW = "nothing-new"
BUDGET = "budget"
BASE_FAILED = "base-failed"


@dataclass(frozen=True)
class Score:
    variant: int
    concurrency: int
    value: float  # in the objective's unit: output tok/s, or output tok/J
    measurement: Measurement


def new_tune_log(*, objective: str, repeats: int, min_gain_pct: float, budget_points: int | None) -> dict[str, Any]:
    return {
        "schema_version": TUNE_SCHEMA_VERSION,
        "objective": objective,
        "repeats": repeats,
        "min_gain_pct": min_gain_pct,
        "budget_points": budget_points,
        "incumbent": None,
        "noise": None,
        "steps": [],
        "failed_directions": [],
        "stop": None,
    }


def check_log(log: Mapping[str, Any] | None, *, file: str) -> dict[str, Any]:
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
    return dict(log)


def unit(objective: str) -> str:
    return "output tok/s" if objective == "throughput" else "output tok/J"


def score(v: VariantState, objective: str) -> Score | None:
    """The variant's value for the objective: its best level, a repeated level by its median measurement."""
    by = OBJECTIVES[objective]
    found = best_point(v, by)
    if found is None:
        return None
    c, m = found
    value = m.steady_output_tok_per_s if by == "throughput" else (m.tokens_per_j or 0.0)
    return Score(v.index, c, float(value), m)


def _objective_value(m: Measurement, objective: str) -> float | None:
    return m.steady_output_tok_per_s if objective == "throughput" else m.tokens_per_j


def noise_band(state: SweepState, log: Mapping[str, Any]) -> dict[str, Any] | None:
    """The spread of the base's repeated measurements at its best level, and the band a gain must clear."""
    base = state.variant(1)
    s = score(base, log["objective"])
    if s is None:
        return None
    values = [
        v
        for p in base.points
        if p.concurrency == s.concurrency and p.status == DONE and p.measurement is not None
        for v in [_objective_value(p.measurement, log["objective"])]
        if v is not None
    ]
    median = statistics.median(values)
    spread_pct = (max(values) - min(values)) / median * 100 if median else 0.0
    return {
        "values": [round(v, 4) for v in values],
        "concurrency": s.concurrency,
        "median": round(median, 4),
        "spread_pct": round(spread_pct, 2),
        "band_pct": round(max(spread_pct, float(log["min_gain_pct"])), 2),
        "min_gain_pct": float(log["min_gain_pct"]),
    }


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


def _conclude(state: SweepState, log: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """The measured step's result (also set as step["result"]): the best candidate against the incumbent, and the
    failed directions."""
    step["result"] = _result(state, log, step)
    return dict(step["result"])


def _result(state: SweepState, log: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    objective = log["objective"]
    if step["step"] == 0:
        base = state.variant(1)
        s = score(base, objective)
        if s is None:
            reasons = sorted({p.reason or "failed" for p in base.points if p.status == FAILED})
            text = "the base could not be measured: " + "; ".join(reasons)
            log["stop"] = {"kind": BASE_FAILED, "reason": text}
            return {"decision": "failed", "text": text}
        log["noise"] = noise_band(state, log)
        log["incumbent"] = 1
        n = log["noise"]
        return {
            "decision": "base",
            "value": round(s.value, 4),
            "concurrency": s.concurrency,
            "text": (
                f"measured {len(n['values'])} times at concurrency {n['concurrency']}: "
                f"{', '.join(f'{v:,.4g}' for v in n['values'])} {unit(objective)} (median {n['median']:,.4g}, "
                f"spread {n['spread_pct']:.2f} %); a change must gain more than {n['band_pct']:.2f} % to count"
            ),
        }
    incumbent = state.variant(int(log["incumbent"]))
    inc = score(incumbent, objective)
    band = float((log.get("noise") or {}).get("band_pct", log["min_gain_pct"]))
    rows = []
    for cand in step["candidates"]:
        if cand.get("status") == INVALID:
            continue
        v = state.variant(int(cand["variant"]))
        s = score(v, objective)
        if s is None:
            reasons = sorted({p.reason or "failed" for p in v.points if p.status == FAILED})
            cand["status"] = "failed"
            cand["reason"] = "; ".join(reasons)
            for path, (old, new) in cand["change"].items():
                log["failed_directions"].append(
                    {"knob": path, "direction": _direction(old, new), "reason": cand["reason"], "variant": v.id}
                )
            continue
        gain = (s.value / inc.value - 1) * 100 if inc and inc.value else 0.0
        cand["status"] = "measured"
        cand["value"] = round(s.value, 4)
        cand["concurrency"] = s.concurrency
        cand["gain_pct"] = round(gain, 2)
        cand["verdict"] = s.measurement.verdict
        rows.append((s, gain, cand))
    best = max(rows, key=lambda r: (r[0].value, -r[0].variant), default=None)
    result: dict[str, Any] = {"incumbent": incumbent.id, "incumbent_value": round(inc.value, 4) if inc else None,
                              "band_pct": band}
    if best is not None and best[1] > band:
        s, gain, cand = best
        log["incumbent"] = s.variant
        result.update(decision="improved", best=state.variant(s.variant).id, value=round(s.value, 4),
                      gain_pct=round(gain, 2),
                      text=f"{state.variant(s.variant).id} {s.value:,.4g} {unit(objective)} against {incumbent.id}'s "
                      f"{inc.value if inc else 0:,.4g}: {gain:+.1f} %, above the noise band ({band:.2f} %): kept")
    elif best is not None:
        s, gain, cand = best
        result.update(decision="no-gain", best=state.variant(s.variant).id, value=round(s.value, 4),
                      gain_pct=round(gain, 2),
                      text=f"best candidate {state.variant(s.variant).id} {s.value:,.4g} {unit(objective)} against "
                      f"{incumbent.id}'s {inc.value if inc else 0:,.4g}: {gain:+.1f} %, "
                      + ("inside the noise band" if abs(gain) <= band else "not above the noise band")
                      + f" ({band:.2f} %): not an improvement, {incumbent.id} stays")
    else:
        result.update(decision="no-gain", text=f"no candidate could be measured; {incumbent.id} stays")
    return result


def _propose(
    state: SweepState,
    log: dict[str, Any],
    base_spec: Mapping[str, Any],
    validate: Callable[[Variant], Sequence[Problem]],
) -> dict[str, Any] | None:
    """The next step from the incumbent's verdict, its first variants added to the state; None when nothing is new.

    Each knob step is a ladder: its values are tried one at a time from the boldest (the last the verdict
    proposes: 64 -> 1024 before 512 and 256, as the story's operator went), the next only when the one before did
    not beat the incumbent (`_climb`). A verdict's range ends at what it saw wanted (the peak demand), so its
    boldest value is the likeliest; the smaller ones are measured when it fails or does not pay."""
    incumbent = state.variant(int(log["incumbent"]))
    inc = score(incumbent, log["objective"])
    if inc is None:
        return None
    m = inc.measurement
    point = next((p for p in incumbent.points if p.measurement is m), None)
    step: dict[str, Any] = {
        "step": len(log["steps"]),
        "from": incumbent.id,
        "verdict": {
            "variant": incumbent.id,
            "class": m.verdict,
            "headline": m.verdict_headline,
            "artifacts": point.artifacts if point else None,
            "concurrency": inc.concurrency,
        },
        "candidates": [],
        "skipped": [],
        "ladders": [],
        "result": None,
    }
    for ks in m.knob_steps:
        path = str(ks.get("knob"))
        values = list(ks.get("proposed") or [])
        if path.split(".", 1)[0] not in VARIABLE_SECTIONS:
            for value in values:
                step["skipped"].append({"knob": path, "value": value, "reason": "a bench knob: the tune measures every "
                                        "variant on the same workload (give --concurrency levels instead)"})
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
    log: dict[str, Any],
    step: dict[str, Any],
    base_spec: Mapping[str, Any],
    validate: Callable[[Variant], Sequence[Problem]],
) -> bool:
    """Plan the next rung of every ladder whose last rung is measured and did not beat the incumbent (or of a
    ladder not started); True when something new was planned. A rung that beat it ends its ladder."""
    incumbent = state.variant(int(log["incumbent"]))
    inc = score(incumbent, log["objective"])
    band = float((log.get("noise") or {}).get("band_pct", log["min_gain_pct"]))
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
            s = score(v, log["objective"])
            if s is not None and inc is not None and inc.value and (s.value / inc.value - 1) * 100 > band:
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
            if skip is None and budget is not None and _planned_points(state) + len(levels) > int(budget):
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
                points=[Point(concurrency=c) for c in levels] if valid else [],
                problems=[problem_dict(p) for p in problems],
            )
            state.variants.append(vs)
            seen[key] = vs.id
            cand: dict[str, Any] = {
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
    log = state.tune
    assert log is not None, "run_tune needs a state made by new_tune_state"
    while True:
        run_sweep(state, base_spec, run_variant, save=save, clock=clock, on_progress=on_progress)
        if log.get("stop"):
            break
        steps: list[dict[str, Any]] = log["steps"]
        if not steps:
            levels = list(state.concurrency)
            state.variants.append(
                VariantState(
                    index=1,
                    knobs=[],
                    status=PLANNED,
                    points=[Point(concurrency=c, repeat=r) for c in levels for r in range(int(log["repeats"]))],
                )
            )
            steps.append({"step": 0, "from": None, "verdict": None, "candidates": [{"variant": 1, "id": "v01",
                          "knob": None, "change": {}, "why": "the base profile, measured "
                          f"{log['repeats']} times for the noise band", "profiles": [], "status": "planned"}],
                          "skipped": [], "result": None})
            save(state)
            on_step(f"step 0: the base {state.profile}, measured {log['repeats']} times at each level")
            continue
        last = steps[-1]
        if last["result"] is None and last["step"] > 0 and _climb(state, log, last, base_spec, validate):
            save(state)  # the next rung of a ladder whose last one did not pay
            rung = last["candidates"][-1]
            on_step(f"step {last['step']}: next value: {rung['id']} ({change_text(rung['change'])})")
            continue
        if last["result"] is None:
            result = _conclude(state, log, last)
            save(state)
            on_step(f"step {last['step']}: {result['text']}")
            if log.get("stop"):
                break
            if last["step"] > 0 and result["decision"] != "improved":
                kind = BUDGET if log.pop("budget_hit", False) else CONVERGED
                reason = ("the budget ended" if kind == BUDGET else
                          "no candidate beat the incumbent by more than the noise band")
                log["stop"] = {"kind": kind, "reason": f"{reason}; best {state.variant(int(log['incumbent'])).id}"}
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
            log["stop"] = {"kind": kind, "reason": f"{reason}; best {state.variant(int(log['incumbent'])).id}"}
            save(state)
            on_step(f"stop: {log['stop']['reason']}")
            break
        if hit:
            log["budget_hit"] = True  # the step is trimmed: after it, the tune stops for the budget
        save(state)
        names = ", ".join(
            f"{c['id']} ({change_text(c['change'])})" + ("" if c["status"] == "planned" else f" {c['reason']}")
            for c in step["candidates"]
        )
        on_step(f"step {step['step']}: {step['verdict']['variant']} is {step['verdict']['class']}: trying {names}")
    return state


def raise_budget(log: dict[str, Any], budget_points: int | None) -> None:
    """A resume may give a new budget: a tune stopped by its budget goes on (its last step is concluded again)."""
    log["budget_points"] = budget_points
    stop = log.get("stop")
    if stop and stop.get("kind") == BUDGET:
        log["stop"] = None
        log.pop("budget_hit", None)
