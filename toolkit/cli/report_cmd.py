"""`toolkit report NAME`: a profile's latest results as Markdown and a standalone HTML file with plots.

Thin: load the profile's results (results_store), the run's artifacts (probe_store), build the report
data (toolkit.core.report), draw (toolkit.adapters.plots), write atomically.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.core.errors import ToolkitError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the profile")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a standalone HTML report (plots embedded)")
    parser.add_argument("--markdown", type=Path, metavar="FILE",
                        help="write the Markdown report to FILE, its plots as PNG files beside it "
                        "(default without --html: Markdown on stdout, no plots)")
    parser.add_argument("--run", type=Path, metavar="DIR",
                        help="take the plots from this probe run directory (default: the latest entry's artifacts)")
    parser.add_argument("--profiles-dir", metavar="DIR",
                        help="where profiles live (default: $TOOLKIT_PROFILES_DIR, else profiles/ of the repository)")
    parser.set_defaults(func=cmd_report)


def _run_dir(args: argparse.Namespace, artifacts: str | None, profiles_dir: Path) -> Path | None:
    if args.run is not None:
        if not args.run.is_dir():
            raise ToolkitError.of("not a directory", file=str(args.run), field="--run",
                                  fix="give the --out directory of `toolkit probe run`")
        return args.run
    if not artifacts:
        return None
    p = Path(artifacts)
    return p if p.is_absolute() else profiles_dir.resolve().parent / p


def cmd_report(args: argparse.Namespace) -> int:
    from toolkit.adapters.files import write_atomic
    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.adapters.results_store import load_profile_results
    from toolkit.core.profile.diff import diff_profiles
    from toolkit.core.report import ReportData, plot_data, render_html, render_markdown
    from toolkit.core.results.compare import is_stale, latest

    for out in (args.html, args.markdown):
        if out is not None and not out.parent.is_dir():
            raise ToolkitError.of("its directory does not exist", file=str(out), field="--html/--markdown",
                                  fix="create the directory first, or write elsewhere")
    pr = load_profile_results(args.name, args.profiles_dir)
    store = ProfileStore(pr.file.parent)
    entry = latest(pr.block, pr.spec_hash)
    if args.run is not None:
        # The figures and the plots must describe the same run: prefer the entry recorded from --run.
        named = [e for e in pr.block.entries if e.run_id == args.run.resolve().name]
        entry = named[-1] if named else entry
    parent = pr.resolved.spec.extends
    changes = [c.render() for c in diff_profiles(store.resolve(parent), pr.resolved).changes] if parent else []
    report = ReportData(
        profile=args.name, file=str(pr.file), parent=parent, knob_changes=changes, entry=entry,
        stale=bool(entry and is_stale(entry, pr.spec_hash)),
        history=[(e, is_stale(e, pr.spec_hash)) for e in pr.block.entries],
    )
    run_dir = _run_dir(args, entry.artifacts if entry else None, pr.file.parent)
    if args.run is not None and (entry is None or entry.run_id != args.run.resolve().name):
        report.notes.append(f"the plots are from {args.run}, which is not recorded in this profile; the figures "
                            f"are from {entry.run_id if entry else 'no entry'}")
    want_plots = args.html is not None or args.markdown is not None
    if run_dir is not None and run_dir.is_dir():
        from toolkit.adapters.probe_store import load_run

        run = load_run(run_dir)
        if run.verdict:
            report.next_steps = [s for s in run.verdict.get("next_steps") or [] if isinstance(s, str)]
        if run.summary is None:
            report.notes.append(f"{run_dir} has no summary.json: no plots (toolkit probe replay {run_dir} --write)")
        elif want_plots:
            from toolkit.adapters.plots import report_plots

            report.plots = report_plots(plot_data(run.trace, run.summary, run.manifest, run.bench_raw,
                                                  server=run.server, host=run.host))
    elif entry is not None and entry.source == "manual":
        report.notes.append("the latest entry is manual (imported figures): there is no trace to plot")
    elif run_dir is not None:
        report.notes.append(f"the entry's artifacts {run_dir} are not on this machine: no plots")
    if args.markdown is not None:
        paths = {}
        for p in report.plots:
            png = args.markdown.with_name(f"{args.markdown.stem}-{p.key}.png")
            write_atomic(png, p.png)
            paths[p.key] = png.name
        write_atomic(args.markdown, render_markdown(report, paths))
    if args.html is not None:
        write_atomic(args.html, render_html(report))
    if not want_plots:
        sys.stdout.write(render_markdown(report))
        return 0
    _summary(report, [p for p in (args.markdown, args.html) if p is not None])
    return 0


def _summary(report: object, written: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    from toolkit.core.report import ReportData, headline_rows

    assert isinstance(report, ReportData)
    con = Console()
    e = report.entry
    if e is None:
        con.print(f"[bold]{report.profile}[/]: no results recorded yet")
    else:
        table = Table(title=f"{report.profile}: {e.run_id}" + (" [red](STALE)[/]" if report.stale else ""))
        table.add_column("figure")
        table.add_column("value", justify="right")
        for a, b in headline_rows(e):
            table.add_row(a, b)
        con.print(table)
        if e.lab:
            con.print(f"[yellow]lab data ({e.lab.kind}): {e.lab.note}[/]")
    for note in report.notes:
        con.print(f"note: {note}")
    con.print(f"{len(report.plots)} plot(s); wrote " + ", ".join(str(p) for p in written))
