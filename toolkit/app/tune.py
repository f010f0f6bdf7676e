"""Tune a profile: measure the base (several times: the noise band), turn its verdict's knob steps into variants,
measure them, keep the best if it clears the band, repeat from it; promote the best with whys that cite the
verdicts. The loop is toolkit.core.tune.loop over the sweep's state; a tune lives in runs/tunes/RUN/ in the
sweeps' layout (state.json, variants/, report.md, step-N.png, tune.json) and resumes as a sweep does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.adapters.sweep_store import SweepStore, tunes_dir
from toolkit.app import sweep
from toolkit.app.measure import Promoted, write_promoted
from toolkit.app.profiles import check, open_store
from toolkit.core.errors import ToolkitError
from toolkit.core.sweep import report as sweep_report
from toolkit.core.sweep.capacity import capacity_record
from toolkit.core.sweep.promote import base_spec, profile_validator, promote
from toolkit.core.sweep.report import data_text, data_watermark
from toolkit.core.sweep.run import Progress
from toolkit.core.sweep.state import check_concurrency, check_resume, new_state
from toolkit.core.tune import report
from toolkit.core.tune.log import as_state, of_state
from toolkit.core.tune.loop import (
    DEFAULT_MAX_GOODPUT_LOSS_PCT,
    DEFAULT_MAX_REPEATS,
    DEFAULT_MIN_GAIN_PCT,
    DEFAULT_REPEATS,
    check_log,
    new_tune_log,
    raise_budget,
    run_tune,
)


@dataclass
class TuneRequest(sweep.MeasureRequest):
    objective: str = "throughput"
    repeats: int = DEFAULT_REPEATS
    min_gain_pct: float = DEFAULT_MIN_GAIN_PCT
    tunes_dir: str | None = None
    max_repeats: int = DEFAULT_MAX_REPEATS
    max_goodput_loss_pct: float = DEFAULT_MAX_GOODPUT_LOSS_PCT


TuneSession = sweep.SweepSession  # the sweep's session: a tune is a sweep whose variants its loop plans


def _levels(req: TuneRequest, base: Any) -> list[int]:
    lv = sweep.levels(req.concurrency, base)
    if lv:
        return lv
    # A closed benchmark with every request at t0 (the story's `--request-rate inf`): all of them in flight.
    return check_concurrency([req.num_prompts or base.spec.bench.num_prompts])


def open_session(req: TuneRequest) -> TuneSession:
    """A new tune (its log started, the base to be measured first), or the one `resume`/`show` names."""
    store = SweepStore(tunes_dir(req.tunes_dir), kind="tune", dir_flag="--tunes-dir")
    profiles = open_store(req.profiles_dir)
    session = sweep.existing_run(store, profiles, resume=req.resume, show=req.show, profile=req.profile)
    if session is not None:
        state, base, spec = session.state, session.base, session.spec
        state.tune = as_state(check_log(state.tune, file=str(store.state_path(state.run_id))))
        lv = _levels(req, base) if req.concurrency else None
        if not req.show:  # showing a past tune reads only what it measured (sweep.existing_run says what changed)
            check_resume(state, file=str(store.state_path(state.run_id)), base_spec=spec, axes=None, concurrency=lv)
        if req.budget is not None and req.resume:
            raise_budget(of_state(state.tune), req.budget)
            store.save(state)
        if req.resume:
            req.runner = state.runner  # a resumed tune measures on as it began
        return session
    if not req.profile:
        raise ToolkitError.of("which profile to tune?", field="profile", fix="toolkit tune PROFILE (or --resume RUN)")
    if req.repeats < 2:
        raise ToolkitError.of(f"--repeats {req.repeats} gives no spread", field="--repeats",
                              fix="measure the base at least twice (default 3)")
    if req.budget is not None and req.budget < req.repeats:
        raise ToolkitError.of(f"budget {req.budget} does not cover the base's {req.repeats} measurements",
                              field="--budget", fix=f"give at least {req.repeats + 1}")
    base = profiles.resolve(req.profile)
    spec = base_spec(base)
    lv = _levels(req, base)
    cap = capacity_record(req.objective, req.slo, spec, profile=base.name, rate_start=req.rate_start,
                          tolerance_pct=req.rate_tolerance_pct, max_rounds=req.max_rounds)
    if cap is not None and len(lv) > 1:
        raise ToolkitError.of(f"a capacity search offers Poisson rates at one concurrency cap, not {len(lv)} levels",
                              field="--concurrency", fix=f"give one level (e.g. --concurrency {max(lv)}) or none")
    if req.max_repeats < req.repeats:
        raise ToolkitError.of(f"--max-repeats {req.max_repeats} is below --repeats {req.repeats}",
                              field="--max-repeats", fix=f"give at least {req.repeats}")
    run_id = store.new_run_id(base.name)
    state = new_state(run_id=run_id, profile=base.name, base_spec=spec, axes=[], planned=[], concurrency=lv,
                      created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), runner=req.runner)
    state.capacity = cap
    state.tune = as_state(new_tune_log(objective=req.objective, repeats=req.repeats, min_gain_pct=req.min_gain_pct,
                                       budget_points=req.budget, max_repeats=req.max_repeats,
                                       max_goodput_loss_pct=req.max_goodput_loss_pct))
    store.create(state)
    return TuneSession(store, profiles, base, spec, state)


def runner(session: TuneSession, req: TuneRequest) -> Any:
    """The point runner; the apply runner copies every profile beside its variants, so a verdict can name
    glm5-tp4-pp2."""
    chain = [session.profiles.path(n) for n in session.profiles.names()]
    energy = (session.state.tune or {}).get("objective") == "tokens-per-joule"  # it may propose a power limit
    return sweep.runner(session, sweep.SweepRequest(runner=req.runner, inventory=req.inventory,
                                                    num_prompts=req.num_prompts, point_timeout_s=req.point_timeout_s),
                        kind="tune", chain=chain, power_limits=energy)


def loop(session: TuneSession, point_runner: Any, on_step: Callable[[str], None]
         ) -> Callable[[Callable[[Progress], None]], None]:
    """The tune's loop, for toolkit.app.measure.measure: it measures through the sweep's."""
    validate = profile_validator(session.base.name, session.state.run_id, session.profiles.source, check)

    def run(on_progress: Callable[[Progress], None]) -> None:
        run_tune(session.state, session.spec, point_runner, validate=validate, save=session.store.save,
                 clock=time.monotonic, on_progress=on_progress, on_step=on_step)

    return run


def plots(session: TuneSession) -> list[tuple[int, str]]:
    """One bar chart per step (the candidates against the incumbent and the noise band): (step, file name)."""
    from toolkit.adapters import plots as plotting

    out: list[tuple[int, str]] = []
    d = session.store.run_dir(session.state.run_id)
    mark = data_watermark(session.state)
    for step in (session.state.tune or {}).get("steps", []):
        bars = report.step_bars(session.state, step)
        if bars is None or not bars["bars"]:
            continue
        name = f"step-{step['step']}.png"
        (d / name).write_bytes(plotting.tune_step_png(bars["bars"], band_pct=bars["band_pct"], title=bars["title"],
                                                      unit=bars["unit"], intervals=bars["intervals"], mark=mark))
        out.append((int(step["step"]), name))
    return out


def frontier_plot(session: TuneSession) -> str | None:
    """frontier.png (a run with a capacity search): throughput against p99 TTFT and ITL per variant, the SLO's
    lines, J/token at each capacity with its power limit; its file name, None when there is nothing to plot."""
    from toolkit.adapters import plots as plotting

    state = session.state
    series = sweep_report.frontier_series(state) if state.capacity else []
    if not series:
        return None
    title = f"{state.run_id}: the SLO's frontier ({data_text(state)})"
    session.store.run_dir(state.run_id).joinpath("frontier.png").write_bytes(
        plotting.frontier_png(series, slo=dict(state.capacity["slo"]) if state.capacity else {}, title=title,
                              mark=data_watermark(state)))
    return "frontier.png"


def write_report(session: TuneSession, promoted: str | None) -> Path:
    state = session.state
    path = session.store.write_text(state.run_id, "report.md",
                                    report.markdown(state, plots=plots(session), promoted=promoted,
                                                    plots_frontier=frontier_plot(session)))
    session.store.write_text(state.run_id, "tune.json", json.dumps(report.to_json(state), indent=1) + "\n")
    return path


def promote_best(session: TuneSession, name: str | None) -> tuple[Promoted, Any] | None:
    """The best that beat the noise band, as a profile whose whys cite the steps' verdicts; None when the best is
    the base itself."""
    state = session.state
    log = of_state(state.tune)
    incumbent = log.get("incumbent")
    if not incumbent or int(incumbent) == 1:
        return None
    ref = sweep.run_ref(session)
    by = {"throughput": "throughput", "goodput": "goodput"}.get(log["objective"], "tokens_per_j")
    new_name, text, best = promote(state, session.base, by=by, name=name, run_ref=ref, pick=int(incumbent),
                                   knob_reasons=report.knob_reasons(state, ref), tool="tune")
    return write_promoted(session.profiles, new_name, text), best
