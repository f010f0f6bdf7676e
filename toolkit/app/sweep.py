"""Sweep a profile: expand the knobs into variants (each validated first: an invalid one is skipped with the rule
that rejected it), measure each at each concurrency level (toolkit.app.measure), save the state after every
point, rank, plot, report, and promote the best. A sweep interrupted or killed carries on with `resume`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.adapters.profile_store import ProfileStore
from toolkit.adapters.sweep_store import SweepStore, sweeps_dir
from toolkit.app.measure import Promoted, RunnerContext, make_runner
from toolkit.app.measure import write_promoted as _write_promoted
from toolkit.app.profiles import check, open_store
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.sweep import capacity, report
from toolkit.core.sweep.promote import base_spec, profile_validator, promote
from toolkit.core.sweep.ranking import pareto_front
from toolkit.core.sweep.state import (
    SweepState,
    apply_budget,
    check_concurrency,
    check_resume,
    new_state,
    parse_concurrency,
    retry_failed,
    spec_hash,
)
from toolkit.core.sweep.variants import parse_axes, plan


@dataclass
class MeasureRequest:
    """What a sweep and a tune are both asked: the base, the load, the budget, how each point is measured (the
    runner, its hosts and limits) and the capacity search."""

    profile: str | None = None
    concurrency: str | None = None
    budget: int | None = None
    resume: str | None = None
    show: str | None = None
    runner: str = "apply"
    inventory: str | None = None
    wait: bool = True
    num_prompts: int | None = None
    point_timeout_s: float = 1800.0
    profiles_dir: str | None = None
    slo: str | None = None  # a capacity search per variant (a tune's default: the profile's bench.slo)
    rate_start: float | None = None  # the first Poisson rate (else found from a closed-loop run)
    rate_tolerance_pct: float = 4.0
    max_rounds: int = 10


@dataclass
class SweepRequest(MeasureRequest):
    vary: list[str] = field(default_factory=list)
    retry_failed: bool = False
    sweeps_dir: str | None = None


@dataclass
class SweepSession:
    store: SweepStore
    profiles: ProfileStore
    base: ResolvedProfile
    spec: dict[str, Any]
    state: SweepState
    notes: list[str] = field(default_factory=list)  # what opening it did (failed points to retry)


def levels(concurrency: str | None, base: ResolvedProfile) -> list[int] | None:
    """--concurrency, else the profile's bench.concurrency_levels, else its max_concurrency."""
    if concurrency:
        return parse_concurrency(concurrency)
    bench = base.spec.bench
    if bench.concurrency_levels:
        return check_concurrency(bench.concurrency_levels)
    if bench.max_concurrency:
        return [bench.max_concurrency]
    return None


def existing_run(store: SweepStore, profiles: ProfileStore, *, resume: str | None, show: str | None,
                 profile: str | None) -> SweepSession | None:
    """The run `resume` or `show` names (a sweep's or a tune's), with its base profile; None when neither does."""
    if resume and show:
        raise ToolkitError.of("--resume and --show both name a run", field="--show", fix="give one of them")
    run_id = resume or show
    if not run_id:
        return None
    state = store.load(run_id)
    if profile and profile != state.profile:
        raise ToolkitError.of(f"{store.kind} {state.run_id} is of profile {state.profile}, not {profile}",
                              field="profile", fix=f"leave the profile out or give {state.profile}")
    moved = show is not None and state.run_id != run_id
    if moved:
        # A run kept under another name (docs/tune-lab-goodput): its files are in the directory it was named by.
        state.run_id = run_id
    base = profiles.resolve(state.profile)
    session = SweepSession(store, profiles, base, base_spec(base), state)
    if moved:
        session.notes.append(f"{store.kind} {run_id} was saved as another run id; its report is written here")
    if show and spec_hash(session.spec) != state.base_spec_hash:
        # Showing a past run reads only what it measured: a profile changed since does not stop it (resuming does).
        session.notes.append(f"profile {state.profile} changed since this {store.kind} (its spec hash is now "
                             f"{spec_hash(session.spec)[:12]}, the {store.kind} measured {state.base_spec_hash[:12]}): "
                             "the figures are the run's own; knobs named as today's profile has them")
    return session


def open_session(req: SweepRequest) -> SweepSession:
    """A new sweep (its variants planned and validated, its state created), or the one `resume`/`show` names."""
    store = SweepStore(sweeps_dir(req.sweeps_dir))
    profiles = open_store(req.profiles_dir)
    session = existing_run(store, profiles, resume=req.resume, show=req.show, profile=req.profile)
    if session is not None:
        state, base, spec = session.state, session.base, session.spec
        axes = parse_axes(req.vary, spec) if req.vary else None
        lv = levels(req.concurrency, base) if req.concurrency else None
        if not req.show:
            check_resume(state, file=str(store.state_path(state.run_id)), base_spec=spec, axes=axes, concurrency=lv)
        if req.budget is not None:
            apply_budget(state, req.budget)
            store.save(state)
        if req.retry_failed and req.resume:
            session.notes.append(f"retrying {retry_failed(state)} failed point(s)")
            store.save(state)
        return session
    if not req.profile:
        raise ToolkitError.of("which profile to sweep?", field="profile",
                              fix="toolkit sweep PROFILE --vary PATH=V1,V2 (or --resume RUN)")
    base = profiles.resolve(req.profile)
    spec = base_spec(base)
    axes = parse_axes(req.vary, spec)
    lv = levels(req.concurrency, base)
    if lv is None:
        raise ToolkitError.of(
            f"no concurrency levels: {base.name} sets neither bench.concurrency_levels nor bench.max_concurrency",
            field="--concurrency", fix="add --concurrency 64,256,1024")
    cap = capacity.capacity_record("goodput", req.slo, spec, profile=base.name, rate_start=req.rate_start,
                                   tolerance_pct=req.rate_tolerance_pct, max_rounds=req.max_rounds) if req.slo else None
    if cap is not None and len(lv) > 1:
        raise ToolkitError.of(f"a capacity search offers Poisson rates at one concurrency cap, not {len(lv)} levels",
                              field="--concurrency", fix=f"give one level (e.g. --concurrency {max(lv)})")
    run_id = store.new_run_id(base.name)
    planned = plan(spec, axes, profile_validator(base.name, run_id, profiles.source, check))
    state = new_state(run_id=run_id, profile=base.name, base_spec=spec, axes=axes, planned=planned, concurrency=lv,
                      created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), runner=req.runner,
                      budget=req.budget)
    if cap is not None:
        # Every variant's capacity under the SLO: its first point (closed loop, or --rate-start) now, the rest as
        # the search goes (toolkit.core.sweep.capacity).
        state.capacity = cap
        for v in state.planned():
            capacity.plan(state, v)
    store.create(state)
    return SweepSession(store, profiles, base, spec, state)


def runner(session: SweepSession, req: SweepRequest, *, kind: str = "sweep",
           chain: list[Path] | None = None, power_limits: bool = False) -> Any:
    """The point runner `req.runner` names; `chain`: the profile files the apply runner copies beside its
    variants (default the base's extends: chain); `power_limits`: the run may set gpu.power_limit_w (every variant
    then says its own)."""
    varies = any(a.path == "gpu.power_limit_w" for a in session.state.axes)
    sets = (session.spec.get("gpu") or {}).get("power_limit_w") is not None
    ctx = RunnerContext(kind=kind, store=session.store, run_id=session.state.run_id, base=session.base,
                        profiles=session.profiles,
                        chain_files=chain or [session.profiles.path(n) for n in session.base.chain],
                        inventory=req.inventory, num_prompts=req.num_prompts, timeout_s=req.point_timeout_s,
                        power_limits=power_limits or varies or sets)
    return make_runner(req.runner, ctx)


def plots(session: SweepSession) -> list[tuple[str, str]]:
    """The throughput curves and the Pareto front as PNGs in the run's directory: (caption, file name)."""
    from toolkit.adapters import plots as plotting

    state = session.state
    out: list[tuple[str, str]] = []
    d = session.store.run_dir(state.run_id)
    mark = report.data_watermark(state)
    curves = report.curves(state)
    if curves:
        (d / "throughput.png").write_bytes(plotting.sweep_throughput_png(curves, title=f"sweep {state.run_id}",
                                                                         mark=mark))
        out.append(("steady-state throughput against concurrency, per variant", "throughput.png"))
    points = [
        (v.id, p.concurrency, p.measurement.steady_output_tok_per_s, p.measurement.energy_per_output_token_j)
        for v in state.planned()
        for p in v.points
        if p.status == "done" and p.measurement and p.measurement.energy_per_output_token_j is not None
    ]
    if points:
        front = [(p.variant_id, p.concurrency) for p in pareto_front(state)]
        (d / "pareto.png").write_bytes(plotting.sweep_pareto_png(points, front, title=f"sweep {state.run_id}",
                                                                 mark=mark))
        out.append(("Pareto front: throughput against energy per token", "pareto.png"))
    series = report.frontier_series(state) if state.capacity else []
    if series:
        slo = dict(state.capacity["slo"]) if state.capacity else {}
        (d / "frontier.png").write_bytes(plotting.frontier_png(series, slo=slo,
                                                               title=f"sweep {state.run_id}: the SLO's frontier",
                                                               mark=mark))
        out.append(("throughput against p99 TTFT and ITL per variant, the SLO's bounds, J/token at each capacity",
                    "frontier.png"))
    return out


def write_report(session: SweepSession) -> Path:
    """report.md (rankings, plots) and ranking.json in the run's directory, rewritten at each invocation."""
    state = session.state
    path = session.store.write_text(state.run_id, "report.md", report.markdown(state, plots=plots(session)))
    session.store.write_text(state.run_id, "ranking.json", json.dumps(report.to_json(state), indent=1) + "\n")
    return path


def run_ref(session: SweepSession) -> str:
    """The run's report as a promoted profile cites it: relative to here when it is below."""
    ref = str(session.store.run_dir(session.state.run_id) / "report.md")
    try:
        return str(Path(ref).relative_to(Path.cwd()))
    except ValueError:
        return ref


def loop(session: SweepSession, point_runner: Any) -> Any:
    """The measuring loop for toolkit.app.measure.measure: the sweep's, with each variant's capacity search."""
    import time as _time

    def run(on_progress: Any) -> None:
        capacity.measure_all(session.state, session.spec, point_runner, save=session.store.save,
                             clock=_time.monotonic, on_progress=on_progress)

    return run


def promote_best(session: SweepSession, *, by: str, name: str | None) -> tuple[Promoted, Any]:
    """The best variant (by "throughput", "goodput" or "tokens_per_j") as a profile that extends the base."""
    new_name, text, best = promote(session.state, session.base, by=by, name=name, run_ref=run_ref(session))
    return _write_promoted(session.profiles, new_name, text), best


def measured(session: SweepSession) -> bool:
    return any(v.outcome in ("done", "partial") for v in session.state.planned())
