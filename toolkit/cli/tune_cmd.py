"""`toolkit tune PROFILE`: measure, read the verdict, change the knob it names, measure again, keep the best.

Thin: the loop is toolkit.core.tune.loop (over the sweep's state and its measuring loop); the runners, the store,
the progress display, the host locks, the validator and the promotion checks are `toolkit sweep`'s own
(toolkit.cli.sweep_cmd). A tune lives in runs/tunes/RUN/ beside the sweeps' layout (state.json, variants/,
report.md, step-N.png, tune.json); `--resume RUN` carries on after Ctrl-C as a sweep does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from toolkit.core.errors import EXIT_FAILED, EXIT_OK, ToolkitError

TUNES_ENV = "TOOLKIT_TUNES_DIR"
DEFAULT_TUNES_DIR = "runs/tunes"


def configure(parser: argparse.ArgumentParser) -> None:
    from toolkit.core.tune.loop import DEFAULT_MIN_GAIN_PCT, DEFAULT_REPEATS

    parser.add_argument("profile", nargs="?", help="base profile name (profiles/NAME.yaml); not needed with --resume")
    parser.add_argument("--objective", choices=("throughput", "tokens-per-joule"), default="throughput",
                        help="what a change must improve: steady-state output tok/s, or output tokens per joule")
    parser.add_argument("--budget", type=int, help="at most N probe runs in all, the base's repeats included "
                        "(a resume may raise it)")
    parser.add_argument("--concurrency", help="load levels, e.g. 1024 (default: the profile's bench levels, its "
                        "max_concurrency, else its num_prompts: every request in flight)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"measurements of the base, for the noise band (default {DEFAULT_REPEATS}, at least 2)")
    parser.add_argument("--min-gain-pct", type=float, default=DEFAULT_MIN_GAIN_PCT,
                        help=f"the smallest gain that counts even when the base's spread is smaller "
                        f"(default {DEFAULT_MIN_GAIN_PCT})")
    parser.add_argument("--resume", metavar="RUN", help="carry on with tune RUN: what finished is kept")
    parser.add_argument("--show", metavar="RUN", help="print tune RUN's path and write its report; measure nothing")
    parser.add_argument("--promote", action="store_true", help="write the best variant as profiles/NAME.yaml")
    parser.add_argument("--promote-name", help="name of the promoted profile (default: BASE-RUNSTAMP-vNN)")
    parser.add_argument("--runner", default="apply", help="apply (default: `toolkit apply profile VARIANT --probe` "
                        "per point), engine-model (the lab's engine model in-process, simulated) or recorded:FILE")
    parser.add_argument("-i", "--inventory", help="Ansible inventory for the apply runner (default: the lab's)")
    lab = parser.add_mutually_exclusive_group()
    lab.add_argument("--lab", dest="lab", action="store_true", default=None, help="passed on to apply")
    lab.add_argument("--no-lab", dest="lab", action="store_false", help="passed on to apply")
    parser.add_argument("--lab-num-prompts", type=int, help="lab only: prompts of each measurement (apply's "
                        "--lab-num-prompts; default apply's 160, which keeps the demand near 150 requests)")
    parser.add_argument("--no-wait", action="store_true", help="refuse at once when another apply, sweep or tune "
                        "holds a target host")
    parser.add_argument("--point-timeout-s", type=float, default=1800.0, help="apply + probe of one point (s)")
    parser.add_argument("--profiles-dir", help="directory of profiles (default: TOOLKIT_PROFILES_DIR or ./profiles)")
    parser.add_argument("--tunes-dir", help=f"where tune runs live (default: {TUNES_ENV} or ./{DEFAULT_TUNES_DIR})")
    parser.add_argument("--json", action="store_true", help="print the path and the rankings as JSON")
    parser.set_defaults(func=run_tune_cmd)


def tunes_dir(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get(TUNES_ENV) or DEFAULT_TUNES_DIR).expanduser().resolve()


def _levels(args: argparse.Namespace, base: Any) -> list[int]:
    from toolkit.cli.sweep_cmd import _levels as sweep_levels
    from toolkit.core.sweep.state import check_concurrency

    levels = sweep_levels(args, base)
    if levels:
        return levels
    # A closed benchmark with every request at t0 (the seed's `--request-rate inf`): all of them in flight.
    return check_concurrency([args.lab_num_prompts or base.spec.bench.num_prompts])


def run_tune_cmd(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.adapters.profile_store import ProfileStore, find_profiles_dir
    from toolkit.adapters.sweep_store import SweepStore
    from toolkit.cli.sweep_cmd import _host_locks, _measure, _runner, _validator
    from toolkit.core.sweep.promote import base_spec, profile_validator
    from toolkit.core.sweep.state import check_resume, new_state
    from toolkit.core.tune import report
    from toolkit.core.tune.loop import check_log, new_tune_log, raise_budget, run_tune

    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=200)
    store = SweepStore(tunes_dir(args.tunes_dir), kind="tune", dir_flag="--tunes-dir")
    profiles = ProfileStore(find_profiles_dir(args.profiles_dir))
    if args.resume and args.show:
        raise ToolkitError.of("--resume and --show both name a run", field="--show", fix="give one of them")
    existing = args.resume or args.show
    if existing:
        state = store.load(existing)
        state.tune = check_log(state.tune, file=str(store.state_path(state.run_id)))
        if args.profile and args.profile != state.profile:
            raise ToolkitError.of(f"tune {state.run_id} is of profile {state.profile}, not {args.profile}",
                                  field="profile", fix=f"leave the profile out or give {state.profile}")
        base = profiles.resolve(state.profile)
        spec = base_spec(base)
        levels = _levels(args, base) if args.concurrency else None
        check_resume(state, file=str(store.state_path(state.run_id)), base_spec=spec, axes=None, concurrency=levels)
        if args.budget is not None and args.resume:
            raise_budget(state.tune, args.budget)
            store.save(state)
    else:
        if not args.profile:
            raise ToolkitError.of("which profile to tune?", field="profile",
                                  fix="toolkit tune PROFILE (or --resume RUN)")
        if args.repeats < 2:
            raise ToolkitError.of(f"--repeats {args.repeats} gives no spread", field="--repeats",
                                  fix="measure the base at least twice (default 3)")
        if args.budget is not None and args.budget < args.repeats:
            raise ToolkitError.of(f"budget {args.budget} does not cover the base's {args.repeats} measurements",
                                  field="--budget", fix=f"give at least {args.repeats + 1}")
        base = profiles.resolve(args.profile)
        spec = base_spec(base)
        levels = _levels(args, base)
        run_id = store.new_run_id(base.name)
        state = new_state(run_id=run_id, profile=base.name, base_spec=spec, axes=[], planned=[], concurrency=levels,
                          created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), runner=args.runner)
        state.tune = new_tune_log(objective=args.objective, repeats=args.repeats, min_gain_pct=args.min_gain_pct,
                                  budget_points=args.budget)
        store.create(state)

    console.print(f"[bold]tune {state.run_id}[/] of {state.profile} ({state.tune['objective']}): "
                  f"{store.run_dir(state.run_id)}")
    validate = profile_validator(base.name, state.run_id, profiles.source, _validator())
    interrupted = False
    if not args.show and not state.tune.get("stop"):
        args.runner = state.runner if args.resume else args.runner
        chain = [profiles.path(n) for n in profiles.names()]
        runner = _runner(args, state, store, base, profiles, command="tune", chain=chain)
        console.print(f"runner: {getattr(runner, 'describe', lambda: str(args.runner))()}")
        if args.resume:
            console.print(f"resuming: {len(state.finished_points())} point(s) finished are kept, "
                          f"{len(state.pending())} pending")

        def loop(on_progress: Any) -> None:
            run_tune(state, spec, runner, validate=validate, save=store.save, clock=time.monotonic,
                     on_progress=on_progress,
                     on_step=lambda m: console.print(f"[bold]{m}[/]", markup=True, highlight=False))

        try:
            with _host_locks(args, console):
                _measure(console, state, spec, runner, store, loop=loop)
        except KeyboardInterrupt:
            interrupted = True

    promoted = None
    if args.promote and not interrupted:
        promoted = _promote(console, args, state, base, profiles, store)
    plots = _plots(store, state)
    report_path = store.write_text(state.run_id, "report.md", report.markdown(state, plots=plots, promoted=promoted))
    store.write_text(state.run_id, "tune.json", json.dumps(report.to_json(state), indent=1) + "\n")
    if args.json:
        print(json.dumps(report.to_json(state), indent=1))
    else:
        for row in report.path_rows(state):
            console.print("  step " + " | ".join(row), markup=False, highlight=False)
        console.print(report.best_line(state), markup=False, highlight=False)
    console.print(f"report: {report_path}")
    if interrupted:
        console.print("[yellow]interrupted[/]: the state is saved; carry on with "
                      f"`toolkit tune --resume {state.run_id}`")
        return 130
    stop = state.tune.get("stop")
    if stop:
        console.print(f"stopped: {stop['reason']}", markup=False, highlight=False)
    return EXIT_OK if state.tune.get("incumbent") else EXIT_FAILED


def _plots(store: Any, state: Any) -> list[tuple[int, str]]:
    import importlib

    try:
        plots = importlib.import_module("toolkit.adapters.plots")
    except ImportError:
        return []
    from toolkit.core.tune import report

    out: list[tuple[int, str]] = []
    d = store.run_dir(state.run_id)
    for step in (state.tune or {}).get("steps", []):
        bars = report.step_bars(state, step)
        if bars is None or not bars["bars"]:
            continue
        name = f"step-{step['step']}.png"
        (d / name).write_bytes(plots.tune_step_png(bars["bars"], band_pct=bars["band_pct"], title=bars["title"],
                                                   unit=bars["unit"]))
        out.append((int(step["step"]), name))
    return out


def _promote(console: Any, args: argparse.Namespace, state: Any, base: Any, profiles: Any, store: Any) -> str | None:
    """The best that beat the noise band, as a profile whose whys cite the steps' verdicts; validated and rendered
    first (the sweep's checks)."""
    from toolkit.cli.sweep_cmd import write_promoted
    from toolkit.core.sweep.promote import promote
    from toolkit.core.tune import report

    incumbent = (state.tune or {}).get("incumbent")
    if not incumbent or int(incumbent) == 1:
        console.print(f"nothing to promote: the best is the base {state.profile} itself")
        return None
    run_ref = str(store.run_dir(state.run_id) / "report.md")
    with contextlib.suppress(ValueError):
        run_ref = str(Path(run_ref).relative_to(Path.cwd()))
    by = "throughput" if state.tune["objective"] == "throughput" else "tokens_per_j"
    name, text, best = promote(state, base, by=by, name=args.promote_name, run_ref=run_ref, pick=int(incumbent),
                               knob_reasons=report.knob_reasons(state, run_ref), tool="tune")
    write_promoted(console, profiles, base, name, text, best)
    return name
