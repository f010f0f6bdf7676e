"""`toolkit doctor HOST`: read-only checks of a Proxmox GPU host and its containers, each failing one with its fix.

Thin: run playbooks/doctor.yml (it only reads) through the ansible-runner adapter, judge the readings
with toolkit.core.doctor, print a rich table (or --json). Exit 0 when nothing fails, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from toolkit.core.errors import EXIT_FAILED, EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", help="inventory name of the Proxmox host")
    parser.add_argument("-i", "--inventory", help="Ansible inventory (default: TOOLKIT_INVENTORY, else the lab's)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console
    from rich.table import Table

    from toolkit.adapters.ansible import run_playbook
    from toolkit.cli.ansible_progress import PlaybookProgress
    from toolkit.cli.host_cmd import host_plan, resolve_inventory
    from toolkit.core.doctor import FAIL, judge

    inventory = resolve_inventory(args.inventory or os.environ.get("TOOLKIT_INVENTORY"))
    host_plan(inventory, args.host)  # refuses a host the inventory lacks
    console = Console(stderr=True)
    with PlaybookProgress(console, f"doctor {args.host}", show_changes=False) as progress:
        result = run_playbook(
            "doctor",
            inventory=inventory,
            extravars={"toolkit_hosts": args.host, "toolkit_proxmox_host": args.host},
            on_event=progress.on_event,
        )
    reports = {h: dict(r.get("doctor") or {}) for h, r in result.results_of("Doctor | report").items()}
    unreachable = {f.host: f.message for f in result.failures if f.unreachable}
    unreachable |= {e.host: e.message for e in result.events if e.kind == "unreachable"}
    checks = judge(args.host, reports, unreachable)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        table = Table(title=f"doctor {args.host} (read-only)")
        for column in ("where", "check", "", "detail", "fix"):
            table.add_column(column)
        marks = {"pass": "[green]ok[/]", "fail": "[red]FAIL[/]", "warn": "[yellow]warn[/]", "skip": "[dim]skip[/]"}
        for c in checks:
            table.add_row(c.subject, c.name, marks.get(c.status, c.status), c.detail, c.fix)
        Console().print(table)
    return EXIT_FAILED if any(c.status == FAIL for c in checks) else EXIT_OK
