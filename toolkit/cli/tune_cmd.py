"""`toolkit tune PROFILE`: measure, read the verdict, change the knob it names, measure again, keep the best.

Thin: parse, call toolkit.app.tune (whose runners, locks and checks are toolkit.app.measure's, shared with
`toolkit sweep`), render the progress and the path taken. `--resume RUN` carries on after Ctrl-C as a sweep does.
"""

from __future__ import annotations

import argparse

from toolkit.cli.envelope import emit
from toolkit.cli.options import capacity_arguments, measure_fields, measure_options, promote_options
from toolkit.core.errors import EXIT_FAILED, EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    from toolkit.core.tune.loop import (
        DEFAULT_MAX_GOODPUT_LOSS_PCT,
        DEFAULT_MAX_REPEATS,
        DEFAULT_MIN_GAIN_PCT,
        DEFAULT_REPEATS,
    )

    parser.add_argument("profile", nargs="?", help="base profile name (profiles/NAME.yaml); not needed with --resume")
    parser.add_argument("--objective", choices=("throughput", "tokens-per-joule", "goodput"), default="throughput",
                        help="what a change must improve: steady-state output tok/s, output tokens per joule (under "
                        "an SLO: at the capacity rate), or goodput (output tok/s at the highest Poisson request "
                        "rate that meets the SLO)")
    capacity_arguments(parser, who="the base's")  # --slo (default: the profile's bench.slo), --rate-start ...
    parser.add_argument("--max-repeats", type=int, default=DEFAULT_MAX_REPEATS,
                        help="a gain inside the confidence intervals is measured again until the base has this many "
                        f"measurements (default {DEFAULT_MAX_REPEATS})")
    parser.add_argument("--max-goodput-loss-pct", type=float, default=DEFAULT_MAX_GOODPUT_LOSS_PCT,
                        help="tokens-per-joule under an SLO: the most goodput a change may give up (default "
                        f"{DEFAULT_MAX_GOODPUT_LOSS_PCT:g})")
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
    promote_options(parser)
    measure_options(parser)
    parser.add_argument("--tunes-dir", help="where tune runs live (default: TOOLKIT_TUNES_DIR or ./runs/tunes)")
    parser.add_argument("--json", action="store_true", help="print the path and the rankings as JSON")
    parser.set_defaults(func=run_tune_cmd)


def run_tune_cmd(args: argparse.Namespace) -> int:
    from toolkit.app import measure, tune
    from toolkit.app.tune import TuneRequest
    from toolkit.cli.render import MeasureProgress, print_promoted, say, stderr_console
    from toolkit.core.tune import report
    from toolkit.core.tune.log import of_state

    con = stderr_console()
    req = TuneRequest(**measure_fields(args), objective=args.objective, repeats=args.repeats,
                      min_gain_pct=args.min_gain_pct, tunes_dir=args.tunes_dir, max_repeats=args.max_repeats,
                      max_goodput_loss_pct=args.max_goodput_loss_pct)
    session = tune.open_session(req)
    state = session.state
    log = of_state(state.tune)
    con.print(f"[bold]tune {state.run_id}[/] of {state.profile} ({log['objective']}): "
              f"{session.store.run_dir(state.run_id)}")
    for note in session.notes:
        con.print(f"note: {note}", markup=False, highlight=False)
    interrupted = False
    if not args.show and not log.get("stop"):
        runner = tune.runner(session, req)
        con.print(f"runner: {runner.describe()}")
        if args.resume:
            con.print(f"resuming: {len(state.finished_points())} point(s) finished are kept, "
                      f"{len(state.pending())} pending")
        loop = tune.loop(session, runner, on_step=lambda m: con.print(f"[bold]{m}[/]", markup=True, highlight=False))
        with MeasureProgress(con) as progress:
            interrupted = measure.measure(state, session.spec, runner, session.store, runner=req.runner,
                                          inventory=req.inventory, wait=req.wait, purpose="toolkit tune",
                                          on_progress=progress.on_progress, on_message=say(con), loop=loop)
    promoted_name = None
    if args.promote and not interrupted:
        promoted = tune.promote_best(session, args.promote_name)
        if promoted is None:
            con.print(f"nothing to promote: the best is the base {state.profile} itself")
        else:
            print_promoted(con, *promoted, session.base.name)
            promoted_name = promoted[0].path.stem
    report_path = tune.write_report(session, promoted_name)
    if args.json:
        emit("tune", report.to_json(state))
    else:
        for row in report.path_rows(state):
            con.print("  step " + " | ".join(row), markup=False, highlight=False)
        con.print(report.best_line(state), markup=False, highlight=False)
    con.print(f"report: {report_path}")
    if interrupted:
        con.print(f"[yellow]interrupted[/]: the state is saved; carry on with `toolkit tune --resume {state.run_id}`")
        return 130
    stop = log.get("stop")
    if stop:
        con.print(f"stopped: {stop['reason']}", markup=False, highlight=False)
    return EXIT_OK if log.get("incumbent") else EXIT_FAILED
