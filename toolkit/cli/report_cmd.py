"""`toolkit report NAME`: a profile's latest results as Markdown and a standalone HTML file with plots.

Thin: parse, call toolkit.app.report, print (Markdown on stdout, or a summary of what was written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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


def cmd_report(args: argparse.Namespace) -> int:
    from toolkit.app.report import ReportRequest, report
    from toolkit.core.results.report import render_markdown

    data = report(ReportRequest(profile=args.name, html=args.html, markdown=args.markdown, run=args.run,
                                profiles_dir=args.profiles_dir))
    written = [p for p in (args.markdown, args.html) if p is not None]
    if not written:
        sys.stdout.write(render_markdown(data))
        return 0
    _summary(data, written)
    return 0


def _summary(report: object, written: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    from toolkit.core.results.report import ReportData, headline_rows

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
