"""The tune's report: the path taken (profile -> verdict -> change -> result, step by step), then the sweep's own
rankings of every measured variant. Pure: Markdown and plot data out; the CLI writes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from toolkit.core.provenance import mark
from toolkit.core.sweep import capacity
from toolkit.core.sweep.report import (
    _md_table,
    capacity_section,
    data_text,
    data_watermark,
    not_ranked_section,
    ranking_sections,
)
from toolkit.core.sweep.state import SweepState
from toolkit.core.tune.log import of_state
from toolkit.core.tune.loop import at_score, change_text, score, unit, variant_interval

TUNE_REPORT_SCHEMA_VERSION = 1  # of tune.json


def path_rows(state: SweepState) -> list[list[str]]:
    """One row per candidate of each step: step, from, the verdict it read, the change and its why, the result."""
    log = of_state(state.tune)
    rows: list[list[str]] = []
    for step in log.get("steps", []):
        verdict = step.get("verdict")
        read = "-" if not verdict else str(verdict.get("headline") or verdict.get("class"))
        for cand in step.get("candidates", []):
            change = change_text(cand.get("change") or {}) or "(the base)"
            why = cand.get("why") or ""
            if cand.get("profiles"):
                why += f" (as {' / '.join(cand['profiles'])})"
            status = cand.get("status")
            if status == "measured":
                ci = cand.get("interval")
                where = f" at {cand['request_rate']:g} req/s" if cand.get("request_rate") is not None else ""
                res = (f"{cand['value']:,.4g} {unit(log['objective'])}{where}"
                       + (f" [{ci['low']:,.4g}, {ci['high']:,.4g}]" if ci else "")
                       + f" ({cand['gain_pct']:+.1f} %), {cand.get('verdict')}"
                       + (f"; {cand['reason']}" if cand.get("reason") else ""))
            elif step["step"] == 0 and (result := step.get("result")):
                res = result["text"]
            else:
                res = f"{status}: {cand.get('reason', '')}".rstrip(": ")
            rows.append([str(step["step"]), step.get("from") or "-", read, f"`{change}`: {why}", cand["id"], res])
    return rows


def step_bars(state: SweepState, step: Mapping[str, Any]) -> dict[str, Any] | None:
    """The plot of one step: the incumbent and each measured candidate, with the noise band around the incumbent."""
    log = of_state(state.tune)
    if step["step"] == 0 or not step.get("result"):
        return None
    inc_id = step["result"].get("incumbent")
    inc = next((v for v in state.variants if v.id == inc_id), None)
    inc_score = score(inc, log["objective"], state) if inc else None
    if inc_score is None:
        return None
    # The incumbent as the step compared with it (measured again later, its figure may have moved since).
    recorded = step["result"].get("incumbent_value")
    bars = [(inc_id, float(recorded) if recorded is not None else inc_score.value, "incumbent")]
    inc_ci = step["result"].get("incumbent_interval")
    intervals: list[tuple[float, float] | None] = [(inc_ci["low"], inc_ci["high"]) if inc_ci else None]
    for cand in step.get("candidates", []):
        if cand.get("status") == "measured":
            kept = step["result"].get("decision") == "improved" and step["result"].get("best") == cand["id"]
            bars.append((cand["id"], float(cand["value"]), "kept" if kept else "not kept"))
            ci = cand.get("interval")
            intervals.append((ci["low"], ci["high"]) if ci else None)
        elif cand.get("status") in ("failed", "invalid", "below"):
            bars.append((cand["id"], 0.0, "missed the SLO" if cand["status"] == "below" else str(cand["status"])))
            intervals.append(None)
    return {
        "intervals": intervals,
        "title": f"tune {state.run_id} step {step['step']}: from {step.get('from')} "
        f"({(step.get('verdict') or {}).get('class')})",
        "unit": unit(log["objective"]),
        "bars": bars,
        "band_pct": float(step["result"].get("band_pct") or 0.0),
    }


def best_line(state: SweepState) -> str:
    log = of_state(state.tune)
    index = log.get("incumbent")
    if not index:
        return "Best: none measured."
    v = state.variant(index)
    s = score(v, log["objective"], state)
    base = score(state.variant(1), log["objective"], state)
    if s is None:
        return "Best: none measured."
    gain = ""
    if base and base.value and v.index != 1:
        gain = f" ({(s.value / base.value - 1) * 100:+.1f} % over the base v01)"
    where = f"at {s.request_rate:g} req/s under the SLO" if s.request_rate is not None else \
        f"at concurrency {s.concurrency}"
    runs = len(at_score(v, s))
    if runs > 1:
        where += f" (the median of {runs} runs there)"
    good = f", goodput {s.goodput:,.4g} output tok/s" if s.goodput is not None and log["objective"] != "goodput" else ""
    # Trust at a glance: the line people copy says where its figure came from, as every step row does.
    provenance = mark(s.measurement.provenance, detail=True)
    return (f"Best: {v.id} ({v.label or 'the base'}): {s.value:,.4g} {unit(log['objective'])} {where}{good}{gain}. "
            f"Data: {provenance}.")


def markdown(state: SweepState, *, plots: Sequence[tuple[int, str]] = (), promoted: str | None = None,
             plots_frontier: str | None = None) -> str:
    log = of_state(state.tune)
    noise = log.get("noise")
    measured = sum(1 for _v, p in state.finished_points() if p.status == "done")
    tried = len(state.finished_points())
    parts = [
        f"# Tune {state.run_id}",
        "",
        f"Base profile `{state.profile}` (spec hash {state.base_spec_hash}); objective {log.get('objective')}; "
        f"concurrency {', '.join(map(str, state.concurrency))}; budget "
        f"{log.get('budget_points') or 'none'} probe runs; {tried} run ({measured} measured).",
        f"Runner: {state.runner}. Data: {data_text(state)}.",
    ]
    if noise:
        parts += [
            "",
            f"Noise: the base measured {len(noise['values'])} times "
            + (f"at {noise['request_rate']:g} req/s (its capacity)" if noise.get("request_rate") is not None
               else f"at concurrency {noise['concurrency']}") + ": "
            f"{', '.join(f'{v:,.4g}' for v in noise['values'])} {unit(log['objective'])}, spread "
            f"{noise['spread_pct']:.2f} % of the median; a change counts only above {noise['band_pct']:.2f} % "
            f"(the spread, at least {noise['min_gain_pct']:.2f} %). A difference inside it is not an improvement.",
        ]
        if rr := noise.get("run_to_run"):
            parts[-1] += (f" Run to run the base varies by {rr['cv'] * 100:.2f} % ({rr['df'] + 1} runs): a variant "
                          "measured once borrows that spread for its 95 % interval (a t-interval); a gain counts "
                          "only when the candidate's interval lies wholly above the incumbent's, and a gain inside "
                          "them is measured again (the base, the incumbent and the candidate once more a round).")
    if state.capacity is not None:
        cap = state.capacity
        parts += ["", f"SLO: {', '.join(f'{k} {v:g}' for k, v in cap['slo'].items())} (p99 over each run's requests, "
                  "from bench_serving's per-request results). Each variant's capacity is the highest Poisson "
                  "request rate that met it (bracketed, then narrowed to "
                  f"{cap['tolerance_pct']:g} % or the noise band, at most {cap['max_rounds']} rates); goodput is "
                  "the output tok/s that rate carries (the rate x the workload's output tokens per request), known "
                  "to the search's bracket: its interval runs from the rate met to the rate missed."]
    stop = log.get("stop")
    parts += ["", best_line(state), "", f"Stopped: {stop['reason']}." if stop else "Not finished (resume it)."]
    if promoted:
        parts += ["", f"Promoted: `{promoted}`."]
    parts += [
        "",
        "## The path taken",
        "",
        _md_table(["step", "from", "its verdict", "change (why)", "variant", "result"], path_rows(state)),
    ]
    plot_of = dict(plots)
    stamp = data_watermark(state)
    if plots and stamp:
        parts += ["", f"The plots are marked **{stamp}**: not a measurement."]
    for step in log.get("steps", []):
        lines = [f"### Step {step['step']}" + (f": from {step['from']}" if step.get("from") else ": the base"), ""]
        verdict = step.get("verdict")
        if verdict and verdict.get("artifacts"):
            lines.append(f"Verdict read from `{verdict['artifacts']}` (its probe run: plots and verdict.json).")
        if step.get("edge"):
            lines.append(f"- at the SLO's edge: {step['edge']['text']}")
        for again in step.get("remeasured", []):
            lines.append(f"- measured again ({', '.join(again['variants'])}): {again['why']}")
        for s in step.get("skipped", []):
            lines.append(f"- not tried: `{s['knob']}` -> {s['value']}: {s['reason']}")
        if result := step.get("result"):
            lines.append(f"- result: {result['text']}")
        if step["step"] in plot_of:
            lines += ["", f"![step {step['step']}]({plot_of[step['step']]})"]
        parts += ["", *lines]
    if log.get("failed_directions"):
        parts += ["", "## Directions not proposed again (a variant failed)", ""]
        parts += [f"- `{f['knob']}` {f['direction']} ({f['variant']}): {f['reason']}" for f in log["failed_directions"]]
    parts += capacity_section(state, interval_of=lambda v: variant_interval(state, log, v)
                              if log.get("objective") == "goodput" else None)
    if state.capacity is not None and plots_frontier:
        parts += ["", f"![throughput against p99 latency, SLO lines, J/token]({plots_frontier})"]
    parts += ["", *ranking_sections(state, "Every measured variant, ranked by steady-state output throughput")]
    parts += not_ranked_section(state)
    return "\n".join(parts) + "\n"


def to_json(state: SweepState) -> dict[str, Any]:
    from toolkit.core.sweep import report

    log = of_state(state.tune)
    index = log.get("incumbent")
    best = score(state.variant(index), log["objective"], state) if index else None
    return {
        "schema_version": TUNE_REPORT_SCHEMA_VERSION,
        "run_id": state.run_id,
        "profile": state.profile,
        "runner": state.runner,
        "objective": log.get("objective"),
        "best": None if best is None else {"variant": state.variant(best.variant).id,
                                           "knobs": dict(state.variant(best.variant).knobs),
                                           "value": best.value, "concurrency": best.concurrency,
                                           "request_rate": best.request_rate, "goodput": best.goodput},
        "points_run": len(state.finished_points()),
        "noise": log.get("noise"),
        "capacity": None if state.capacity is None else {
            "slo": state.capacity["slo"],
            "variants": {v.id: {"status": c.status, "lo": c.lo, "hi": c.hi, "goodput": c.goodput,
                                "rates": [[r.rate, r.met] for r in c.rates]}
                         for v in state.planned() for c in [capacity.result(state, v)]}},
        "stop": log.get("stop"),
        "steps": log.get("steps", []),
        "failed_directions": log.get("failed_directions", []),
        "ranking": report.to_json(state),
    }


def knob_reasons(state: SweepState, run_ref: str) -> dict[str, str]:
    """Per knob of the best variant: which step's verdict proposed it and what that step measured (for `why`)."""
    log = of_state(state.tune)
    out: dict[str, str] = {}
    for step in log.get("steps", []):
        res = step.get("result")
        if res is None or res.get("decision") != "improved":
            continue
        cand = next((c for c in step["candidates"] if c["id"] == res.get("best")), None)
        if cand is None:
            continue
        verdict = step.get("verdict")
        for path, (old, new) in (cand.get("change") or {}).items():
            where = f" (point {verdict['artifacts']} of {run_ref})" if verdict and verdict.get("artifacts") else ""
            said = verdict and (verdict.get("headline") or verdict.get("class"))
            read_of = verdict and verdict.get("variant")
            out[path] = (
                f"tune {state.run_id} step {step['step']}: the verdict of {read_of}{where} was "
                f"{said}, and proposed {change_text({path: [old, new]})}"
                f" ({cand.get('why')}); {cand['id']} measured {res['value']:,.4g} {unit(log['objective'])}, "
                f"{res['gain_pct']:+.1f} % over {res['incumbent']} (noise band {res['band_pct']:.2f} %). "
            )
    return out
