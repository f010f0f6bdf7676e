"""`toolkit sweep PROFILE --vary PATH=V1,V2 ... --concurrency 64,256,1024`: measure every variant, rank, promote.

Thin: parse, call toolkit.app.sweep (plan, measure through a runner, report, promote), render the progress and
the rankings. `--resume RUN` carries on where an interrupted sweep stopped.
"""

from __future__ import annotations

import argparse
from typing import Any

from toolkit.cli.envelope import emit
from toolkit.cli.options import capacity_arguments, measure_fields, measure_options, promote_options
from toolkit.core.errors import EXIT_FAILED, EXIT_OK


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
    promote_options(parser)
    parser.add_argument("--promote-by", choices=("throughput", "tokens-per-joule", "goodput"), default="throughput",
                        help="which ranking --promote takes the best of (default: throughput; goodput needs --slo)")
    # --slo: each variant's capacity (adds the goodput ranking; tokens per joule is then at that rate)
    capacity_arguments(parser, who="each variant's")
    measure_options(parser)
    parser.add_argument("--sweeps-dir", help="where sweep runs live (default: TOOLKIT_SWEEPS_DIR or ./runs/sweeps)")
    parser.add_argument("--json", action="store_true", help="print the rankings as JSON")
    parser.set_defaults(func=run_sweep_cmd)


def _request(args: argparse.Namespace) -> Any:
    from toolkit.app.sweep import SweepRequest

    return SweepRequest(**measure_fields(args), vary=args.vary, retry_failed=args.retry_failed,
                        sweeps_dir=args.sweeps_dir)


def run_sweep_cmd(args: argparse.Namespace) -> int:
    from toolkit.app import measure, sweep
    from toolkit.cli.render import MeasureProgress, print_promoted, say, stderr_console
    from toolkit.core.sweep import report

    con = stderr_console()
    req = _request(args)
    session = sweep.open_session(req)
    state = session.state
    for note in session.notes:
        con.print(note)
    con.print(f"[bold]sweep {state.run_id}[/] of {state.profile}: {session.store.run_dir(state.run_id)}")
    for v in state.variants:
        if v.status == "invalid":
            con.print(f"  [yellow]skipped[/] {v.id} {v.label}: invalid, rejected by {', '.join(v.rejected_by())}")
        elif v.status == "over_budget":
            con.print(f"  [dim]over budget[/] {v.id} {v.label}")
    interrupted = False
    if not args.show and (state.pending() or (state.capacity and not interrupted)):
        runner = sweep.runner(session, req)
        con.print(f"runner: {runner.describe()}")
        if args.resume:
            con.print(f"resuming: {len(state.finished_points())} point(s) finished are skipped, "
                      f"{len(state.pending())} to measure")
        with MeasureProgress(con) as progress:
            interrupted = measure.measure(state, session.spec, runner, session.store, runner=req.runner,
                                          inventory=req.inventory, wait=req.wait, purpose="toolkit sweep",
                                          on_progress=progress.on_progress, on_message=say(con),
                                          loop=sweep.loop(session, runner) if state.capacity else None)
    report_path = sweep.write_report(session)
    if args.json:
        emit("sweep", report.to_json(state))
    else:
        _print_rankings(con, state)
    con.print(f"report: {report_path}")
    if interrupted:
        con.print(f"[yellow]interrupted[/]: the state is saved; carry on with `toolkit sweep --resume {state.run_id}`")
        return 130
    if args.promote:
        by = {"throughput": "throughput", "goodput": "goodput"}.get(args.promote_by, "tokens_per_j")
        promoted, best = sweep.promote_best(session, by=by, name=args.promote_name)
        print_promoted(con, promoted, best, session.base.name)
    return EXIT_OK if sweep.measured(session) or state.pending() else EXIT_FAILED


def _print_rankings(console: Any, state: Any) -> None:
    from rich.table import Table

    from toolkit.core.sweep import report
    from toolkit.core.sweep.ranking import pareto_front, rank_by_efficiency, rank_by_goodput, rank_by_throughput

    for title, rows in (
        ("ranked by steady-state output throughput", rank_by_throughput(state)),
        *((("ranked by goodput under the SLO", rank_by_goodput(state)),) if state.capacity else ()),
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
