"""`toolkit report NAME`: a profile's latest results as Markdown and a standalone HTML file with plots.

Thin: parse, call toolkit.app.report, print (a document on stdout, or a summary of what was written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.cli.options import profiles_dir_option
from toolkit.core.errors import ToolkitError

STDOUT = "-"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the profile")
    parser.add_argument("--html", metavar="FILE",
                        help="write a standalone HTML report (plots embedded; `-`: to standard output)")
    parser.add_argument("--markdown", metavar="FILE",
                        help="write the Markdown report to FILE, its plots as PNG files beside it (`-`: to "
                        "standard output, without plots; the default without --html)")
    parser.add_argument("--run", type=Path, metavar="DIR",
                        help="take the plots from this probe run directory (default: the latest entry's artifacts)")
    profiles_dir_option(parser)
    parser.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from toolkit.app.report import ReportRequest, report

    if args.html == STDOUT and args.markdown == STDOUT:
        raise ToolkitError.of("--html - and --markdown - would both go to standard output", field="--html/--markdown",
                              fix="send one of them to a file")
    stdout = "html" if args.html == STDOUT else "markdown" if args.markdown == STDOUT or (
        args.html is None and args.markdown is None) else None
    outcome = report(ReportRequest(
        profile=args.name, html=None if args.html in (None, STDOUT) else Path(args.html),
        markdown=None if args.markdown in (None, STDOUT) else Path(args.markdown), run=args.run,
        profiles_dir=args.profiles_dir, stdout=stdout))  # type: ignore[arg-type]
    if outcome.text is not None:
        sys.stdout.write(outcome.text)
    if outcome.written:
        _summary(outcome.data, outcome.written)
    return 0


def _summary(report: object, written: list[Path]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from toolkit.cli.render import figure_column, print_wide, text_column
    from toolkit.core.results.report import ReportData, headline_rows, verdict_line, what_ran

    assert isinstance(report, ReportData)
    out: list[object] = []
    e = report.entry
    if e is None:
        out.append(f"{escape(report.profile)}: no results recorded yet")
    else:
        # The verdict first: it is what the run was for (the Markdown and HTML lead with it too).
        out.append("[bold]verdict:[/bold] " + escape(verdict_line(e).replace("**", "")))
        out += [f"  next: {escape(step)}" for step in report.next_steps[:3]]
        table = Table(title=f"{escape(report.profile)}: {escape(e.run_id)}" + (" [red](STALE)[/]" if report.stale
                                                                               else ""), show_header=False)
        text_column(table, "what")
        text_column(table, "value")
        for a, b in what_ran(report)[1:]:
            table.add_row(escape(a), escape(b))
        out.append(table)
        figures = Table()
        text_column(figures, "figure")
        rows = headline_rows(e)
        figure_column(figures, "value", [b for _, b in rows])
        for a, b in rows:
            figures.add_row(escape(a), escape(b))
        out.append(figures)
    out += [f"note: {escape(n)}" for n in report.notes]
    out.append(f"{len(report.plots)} plot(s); wrote " + ", ".join(escape(str(p)) for p in written))
    # On stderr: standard output may carry the document itself (`--html -`).
    print_wide(out, stderr=True)
