"""`toolkit doctor HOST`: read-only checks of a Proxmox GPU host and its containers, each failing one with its fix.

Thin: call toolkit.app.host.doctor (playbooks/doctor.yml only reads; toolkit.core.doctor judges), print a rich
table (or --json). Exit 0 when nothing fails, 1 otherwise.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from toolkit.cli.envelope import emit
from toolkit.cli.options import inventory_option
from toolkit.core.errors import EXIT_FAILED, EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", help="inventory name of the Proxmox host")
    inventory_option(parser)
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from toolkit.app.host import doctor
    from toolkit.cli.render import PlaybookProgress
    from toolkit.core.doctor import FAIL

    console = Console(stderr=True)
    with PlaybookProgress(console, f"doctor {args.host}", show_changes=False) as progress:
        checks = doctor(args.host, args.inventory, on_event=progress.on_event)
    if args.json:
        emit("doctor", [asdict(c) for c in checks])
    else:
        table = Table(title=f"doctor {args.host} (read-only)")
        for column in ("where", "check", "", "detail", "fix"):
            table.add_column(column)
        marks = {"pass": "[green]ok[/]", "fail": "[red]FAIL[/]", "warn": "[yellow]warn[/]", "skip": "[dim]skip[/]"}
        for c in checks:
            table.add_row(c.subject, c.name, marks.get(c.status, c.status), c.detail, c.fix)
        Console().print(table)
    return EXIT_FAILED if any(c.status == FAIL for c in checks) else EXIT_OK
