"""`toolkit sweep PROFILE --vary PATH=V1,V2 ... --concurrency 64,256,1024`: measure every variant, rank, promote.

Thin: plan the variants (toolkit.core.sweep, each validated by the profile rules), run them through a
runner (apply + probe by default; `--runner recorded:FILE` replays a table of recorded results in-process,
and says so), save the state after every point (toolkit.adapters.sweep_store), print the rankings and
write the report. `--resume RUN` carries on where an interrupted sweep stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from toolkit.core.errors import EXIT_FAILED, EXIT_OK, ToolkitError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", nargs="?", help="base profile name (profiles/NAME.yaml); not needed with --resume")
    parser.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="PATH=V1,V2",
        help="a knob and its values, e.g. server.max_running_requests=256,512,1024 (repeat for more knobs)",
    )
    parser.add_argument("--concurrency", help="load levels, e.g. 64,256,1024 (default: the profile's bench levels)")
    parser.add_argument("--budget", type=int, help="measure at most N variants (a resume may raise it)")
    parser.add_argument("--resume", metavar="RUN", help="carry on with sweep RUN: what finished is skipped")
    parser.add_argument(
        "--show", metavar="RUN", help="print the rankings of sweep RUN and write its report; measure nothing"
    )
    parser.add_argument(
        "--retry-failed", action="store_true", help="with --resume: measure the failed points again too"
    )
    parser.add_argument("--promote", action="store_true", help="write the best variant as profiles/NAME.yaml")
    parser.add_argument("--promote-by", choices=("throughput", "tokens-per-joule"), default="throughput")
    parser.add_argument("--promote-name", help="name of the promoted profile (default: BASE-RUNSTAMP-vNN)")
    parser.add_argument(
        "--runner",
        default="apply",
        help="apply (default: `toolkit apply profile VARIANT --probe` per point), engine-model (the lab's engine "
        "model in-process: simulated, seconds per grid) or recorded:FILE (replay a table of recorded results "
        "in-process; no host is touched)",
    )
    parser.add_argument("-i", "--inventory", help="Ansible inventory for the apply runner (default: the lab's)")
    lab = parser.add_mutually_exclusive_group()
    lab.add_argument("--lab", dest="lab", action="store_true", default=None, help="passed on to apply")
    lab.add_argument("--no-lab", dest="lab", action="store_false", help="passed on to apply")
    parser.add_argument("--no-wait", action="store_true",
                        help="refuse at once when another toolkit apply or sweep holds a target host "
                        "(default: wait for it, naming the holder)")
    parser.add_argument("--lab-num-prompts", type=int, help="lab only: prompts of each measurement (apply's "
                        "--lab-num-prompts; default apply's 160), and of the engine-model runner (default: the "
                        "profile's)")
    parser.add_argument("--point-timeout-s", type=float, default=1800.0, help="apply + probe of one point (s)")
    parser.add_argument("--profiles-dir", help="directory of profiles (default: TOOLKIT_PROFILES_DIR or ./profiles)")
    parser.add_argument("--sweeps-dir", help="where sweep runs live (default: TOOLKIT_SWEEPS_DIR or ./runs/sweeps)")
    parser.add_argument("--json", action="store_true", help="print the rankings as JSON")
    parser.set_defaults(func=run_sweep_cmd)


def _levels(args: argparse.Namespace, base: Any) -> list[int] | None:
    from toolkit.core.sweep.state import check_concurrency, parse_concurrency

    if args.concurrency:
        return parse_concurrency(args.concurrency)
    bench = base.spec.bench
    if bench.concurrency_levels:
        return check_concurrency(bench.concurrency_levels)
    if bench.max_concurrency:
        return [bench.max_concurrency]
    return None


def run_sweep_cmd(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.adapters.profile_store import ProfileStore, find_profiles_dir
    from toolkit.adapters.sweep_store import SweepStore, sweeps_dir
    from toolkit.core.sweep import report
    from toolkit.core.sweep.promote import base_spec, profile_validator
    from toolkit.core.sweep.state import apply_budget, check_resume, new_state, retry_failed
    from toolkit.core.sweep.variants import parse_axes, plan

    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=200)  # a log or a CI job: keep table rows on one line
    store = SweepStore(sweeps_dir(args.sweeps_dir))
    profiles = ProfileStore(find_profiles_dir(args.profiles_dir))

    existing = args.resume or args.show
    if args.resume and args.show:
        raise ToolkitError.of("--resume and --show both name a run", field="--show", fix="give one of them")
    if existing:
        state = store.load(existing)
        if args.profile and args.profile != state.profile:
            raise ToolkitError.of(
                f"sweep {state.run_id} is of profile {state.profile}, not {args.profile}",
                field="profile",
                fix=f"leave the profile out or give {state.profile}",
            )
        base = profiles.resolve(state.profile)
        spec = base_spec(base)
        axes = parse_axes(args.vary, spec) if args.vary else None
        levels = _levels(args, base) if args.concurrency else None
        check_resume(state, file=str(store.state_path(state.run_id)), base_spec=spec, axes=axes, concurrency=levels)
        if args.budget is not None:
            apply_budget(state, args.budget)
            store.save(state)
        if args.retry_failed and args.resume:
            console.print(f"retrying {retry_failed(state)} failed point(s)")
            store.save(state)
    else:
        if not args.profile:
            raise ToolkitError.of(
                "which profile to sweep?",
                field="profile",
                fix="toolkit sweep PROFILE --vary PATH=V1,V2 (or --resume RUN)",
            )
        base = profiles.resolve(args.profile)
        spec = base_spec(base)
        axes = parse_axes(args.vary, spec)
        levels = _levels(args, base)
        if levels is None:
            raise ToolkitError.of(
                f"no concurrency levels: {base.name} sets neither bench.concurrency_levels nor bench.max_concurrency",
                field="--concurrency",
                fix="add --concurrency 64,256,1024",
            )
        run_id = store.new_run_id(base.name)
        validate_resolved = _validator()
        planned = plan(spec, axes, profile_validator(base.name, run_id, profiles.source, validate_resolved))
        state = new_state(
            run_id=run_id,
            profile=base.name,
            base_spec=spec,
            axes=axes,
            planned=planned,
            concurrency=levels,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            runner=args.runner,
            budget=args.budget,
        )
        store.create(state)

    console.print(f"[bold]sweep {state.run_id}[/] of {state.profile}: {store.run_dir(state.run_id)}")
    for v in state.variants:
        if v.status == "invalid":
            console.print(f"  [yellow]skipped[/] {v.id} {v.label}: invalid, rejected by {', '.join(v.rejected_by())}")
        elif v.status == "over_budget":
            console.print(f"  [dim]over budget[/] {v.id} {v.label}")

    interrupted = False
    if not args.show and state.pending():
        runner = _runner(args, state, store, base, profiles)
        describe = getattr(runner, "describe", lambda: str(args.runner))()
        console.print(f"runner: {describe}")
        if args.resume:
            done = len(state.finished_points())
            console.print(f"resuming: {done} point(s) finished are skipped, {len(state.pending())} to measure")
        try:
            with _host_locks(args, console):
                _measure(console, state, spec, runner, store)
        except KeyboardInterrupt:
            interrupted = True

    plots = _plots(store, state)
    report_path = store.write_text(state.run_id, "report.md", report.markdown(state, plots=plots))
    store.write_text(state.run_id, "ranking.json", json.dumps(report.to_json(state), indent=1) + "\n")
    if args.json:
        print(json.dumps(report.to_json(state), indent=1))
    else:
        _print_rankings(console, state)
    console.print(f"report: {report_path}")
    if interrupted:
        console.print(
            f"[yellow]interrupted[/]: the state is saved; carry on with `toolkit sweep --resume {state.run_id}`"
        )
        return 130
    if args.promote:
        _promote(console, args, state, base, profiles, store)
    measured = any(v.outcome in ("done", "partial") for v in state.planned())
    return EXIT_OK if measured or state.pending() else EXIT_FAILED


def _host_locks(args: argparse.Namespace, console: Any) -> Any:
    """The apply runner deploys to the inventory's GPU containers: the sweep holds their host locks for its
    whole run (no other apply slips in between two variants) and exports its token, so its own child applies
    re-enter the lock instead of waiting for their parent. A recorded runner touches no host and locks nothing."""
    if args.runner != "apply":
        return contextlib.nullcontext()
    from toolkit.adapters.ansible import share_dir, target_hosts
    from toolkit.adapters.host_lock import host_locks
    from toolkit.cli.apply_cmd import LAB_INVENTORY

    inventory = Path(args.inventory) if args.inventory else share_dir() / LAB_INVENTORY
    return host_locks(target_hosts(inventory), purpose="toolkit sweep", wait=not args.no_wait,
                      on_message=lambda m: console.print(f"[yellow]{m}[/]", markup=True, highlight=False),
                      export_token=True)


def _validator() -> Any:
    from toolkit.adapters.profile_store import load_catalogue
    from toolkit.core.profile import validate

    cache: dict[str, Any] = {}

    def check(resolved: Any) -> list[Any]:
        version = str(resolved.spec.engine.sglang_version)
        if version not in cache:
            cache[version] = load_catalogue(version)
        return list(validate(resolved, cache[version]))

    return check


def _runner(args: argparse.Namespace, state: Any, store: Any, base: Any, profiles: Any, *, command: str = "sweep",
            chain: list[Path] | None = None) -> Any:
    """The point runner named by --runner; `chain`: the profile files the apply runner copies beside its variants
    (default the base's extends: chain; a tune copies every profile, so a verdict can name glm5-tp4-pp2)."""
    from toolkit.adapters.sweep_store import ApplyProbeRunner, load_table
    from toolkit.core.sweep.recorded import TableRunner

    if args.runner == "engine-model":
        from toolkit.lab.engine_runner import EngineModelRunner

        return EngineModelRunner(base=base.name, profile_names=profiles.names(),
                                 num_prompts=getattr(args, "lab_num_prompts", None))

    if args.runner.startswith("recorded:"):
        from toolkit.adapters.sweep_store import measurement_from_probe_dir

        path = args.runner.split(":", 1)[1]
        here = Path(path).resolve().parent
        return TableRunner(
            load_table(path),
            source=path,
            sleep=time.sleep,
            load_probe_run=lambda run: measurement_from_probe_dir(here / run),
        )
    if args.runner == "apply":
        chain = chain or [profiles.path(n) for n in base.chain]
        return ApplyProbeRunner(
            store=store,
            run_id=state.run_id,
            base=base.name,
            chain_files=chain,
            inventory=args.inventory,
            lab=args.lab,
            timeout_s=args.point_timeout_s,
            lab_num_prompts=getattr(args, "lab_num_prompts", None),
            command=command,
        )
    raise ToolkitError.of(
        f"unknown runner {args.runner!r}", field="--runner", fix="use apply, engine-model or recorded:FILE"
    )


def _measure(console: Any, state: Any, spec: Any, runner: Any, store: Any, loop: Any = None) -> None:
    """Run the loop with a progress bar and one line per point; `loop(on_progress)` replaces the sweep's own
    (a tune runs its loop, which measures through the sweep's)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from toolkit.core.sweep.run import run_sweep

    def hms(s: float | None) -> str:
        if s is None:
            return "?"
        s = int(s)
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("ETA {task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("sweep", total=None, eta="?")

        def on_progress(p: Any) -> None:
            progress.update(task, total=p.total_points, completed=p.finished_points, eta=hms(p.eta_s))
            if p.kind == "point":
                progress.update(
                    task,
                    description=f"variant {p.position} of {p.planned}: {p.variant.id} {p.variant.label} "
                    f"@ c={p.point.concurrency}",
                )
            elif p.kind in ("done", "failed"):
                m = p.point.measurement
                what = (
                    f"{m.steady_output_tok_per_s:,.1f} tok/s steady, "
                    + (f"{m.tokens_per_j:.3f} tok/J" if m.tokens_per_j is not None else "no energy")
                    + f" ({m.data_source})"
                    if p.kind == "done" and m is not None
                    else f"[red]failed[/]: {p.point.reason}"
                )
                progress.console.print(
                    f"variant {p.position} of {p.planned} {p.variant.id} {p.variant.label} c={p.point.concurrency}: "
                    f"{what}  [{p.finished_points}/{p.total_points}, elapsed {hms(p.elapsed_s)}, ETA {hms(p.eta_s)}]",
                    markup=True,
                    highlight=False,
                )

        if loop is not None:
            loop(on_progress)
        else:
            run_sweep(state, spec, runner, save=store.save, clock=time.monotonic, on_progress=on_progress)


def _plots(store: Any, state: Any) -> list[tuple[str, str]]:
    """The two plots, through the report's plotting adapter when it offers the sweep functions."""
    import importlib

    try:  # matplotlib: only imported here, after the measuring
        plots = importlib.import_module("toolkit.adapters.plots")
    except ImportError:
        return []
    from toolkit.core.sweep import report
    from toolkit.core.sweep.ranking import pareto_front

    out: list[tuple[str, str]] = []
    d = store.run_dir(state.run_id)
    curve_fn = getattr(plots, "sweep_throughput_png", None)
    pareto_fn = getattr(plots, "sweep_pareto_png", None)
    if curve_fn is not None and report.curves(state):
        (d / "throughput.png").write_bytes(curve_fn(report.curves(state), title=f"sweep {state.run_id}"))
        out.append(("steady-state throughput against concurrency, per variant", "throughput.png"))
    if pareto_fn is not None:
        points = [
            (v.id, p.concurrency, p.measurement.steady_output_tok_per_s, p.measurement.energy_per_output_token_j)
            for v in state.planned()
            for p in v.points
            if p.status == "done" and p.measurement and p.measurement.energy_per_output_token_j is not None
        ]
        if points:
            front = [(p.variant_id, p.concurrency) for p in pareto_front(state)]
            (d / "pareto.png").write_bytes(pareto_fn(points, front, title=f"sweep {state.run_id}"))
            out.append(("Pareto front: throughput against energy per token", "pareto.png"))
    return out


def _print_rankings(console: Any, state: Any) -> None:
    from rich.table import Table

    from toolkit.core.sweep import report
    from toolkit.core.sweep.ranking import pareto_front, rank_by_efficiency, rank_by_throughput

    for title, rows in (
        ("ranked by steady-state output throughput", rank_by_throughput(state)),
        ("ranked by output tokens per joule", rank_by_efficiency(state)),
    ):
        table = Table(title=f"sweep {state.run_id}: {title}")
        for col in report.RANK_HEADER:
            table.add_column(col)
        for r in report.ranking_rows(rows):
            table.add_row(*r)
        console.print(table)
    front = pareto_front(state)
    if front:
        console.print(
            "Pareto front (throughput vs energy per token): "
            + ", ".join(f"{p.variant_id}@c{p.concurrency}" for p in front)
        )
    for vid, label, why in report.not_measured(state):
        console.print(f"  not ranked: {vid} {label}: {why}", markup=False, highlight=False)


def _promote(console: Any, args: argparse.Namespace, state: Any, base: Any, profiles: Any, store: Any) -> None:
    from toolkit.core.sweep.promote import promote

    by = "throughput" if args.promote_by == "throughput" else "tokens_per_j"
    run_ref = str(store.run_dir(state.run_id) / "report.md")
    with contextlib.suppress(ValueError):
        run_ref = str(Path(run_ref).relative_to(Path.cwd()))
    name, text, best = promote(state, base, by=by, name=args.promote_name, run_ref=run_ref)
    write_promoted(console, profiles, base, name, text, best)


def write_promoted(console: Any, profiles: Any, base: Any, name: str, text: str, best: Any) -> None:
    """A promoted profile (sweep or tune) into profiles/, validated and rendered first: a promotion that would not
    deploy is refused, and an existing different file is never overwritten."""
    from toolkit.adapters.files import write_atomic
    from toolkit.core.profile import parse_profile_text, resolve
    from toolkit.core.profile.render import render_launch_argv

    path = profiles.path(name)
    if path.exists() and path.read_text(encoding="utf-8") != text:
        raise ToolkitError.of(
            f"{path} exists and differs", file=str(path), field="--promote-name", fix="give another --promote-name"
        )
    source = parse_profile_text(name, str(path), text)
    resolved = resolve(name, lambda n: source if n == name else profiles.source(n))
    errors = [p for p in _validator()(resolved) if p.severity == "error"]
    if errors:
        raise ToolkitError(errors)
    argv = render_launch_argv(resolved)
    write_atomic(path, text)
    console.print(
        f"[green]promoted[/] {best.variant_id} ({best.label}) as {path}; it validates and renders "
        f"({len(argv)} launch arguments). Review with `toolkit profile diff {base.name} {name}`."
    )
