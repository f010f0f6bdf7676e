"""`toolkit host provision HOST` and `toolkit host reproduce HOST --profile NAME`.

Thin: check HOST against the inventory (a typo must not become "no hosts matched, nothing done"),
run playbooks/host.yml (and container.yml) through the ansible-runner adapter with live progress,
print the per-host summary, exit 1 naming the failing task. `reproduce` then deploys the profile
with `toolkit apply profile` (issue #7), so a bare host becomes a serving container in one command.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from toolkit.core.errors import EXIT_FAILED, EXIT_OK, ToolkitError

DEFAULT_INVENTORY = Path("inventory/lab.yml")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="host_command", metavar="SUBCOMMAND")
    prov = sub.add_parser(
        "provision",
        help="driver, nvidia_uvm HMM off, device-node unit on a Proxmox host (--containers: and its GPU containers)",
        description="Run playbooks/host.yml against HOST (a host of the inventory's proxmox_hosts group); with "
        "--containers also playbooks/container.yml for the containers whose lxc_gpu_container_proxmox_host is HOST.",
    )
    prov.add_argument("host", help="inventory name of the Proxmox host")
    prov.add_argument("--containers", action="store_true", help="also create/configure its GPU containers")
    _common(prov)
    prov.set_defaults(func=run_provision)

    rep = sub.add_parser(
        "reproduce",
        help="from a bare Proxmox host to a container serving a profile, in one command",
        description="host.yml, container.yml, then `toolkit apply profile PROFILE` for the host's containers.",
    )
    rep.add_argument("host", help="inventory name of the Proxmox host")
    rep.add_argument("--profile", required=True, help="profile to deploy (profiles/NAME.yaml)")
    _common(rep)
    rep.set_defaults(func=run_reproduce)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--inventory", default=os.environ.get("TOOLKIT_INVENTORY"),
                   help=f"Ansible inventory (default: TOOLKIT_INVENTORY, else the lab's {DEFAULT_INVENTORY})")
    p.add_argument("--check", action="store_true", help="Ansible check mode: report what would change, change nothing")
    p.add_argument("--diff", action="store_true", help="show the changes to files")
    p.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE",
                   help="set a role variable (YAML value); repeatable. Secrets: TOOLKIT_SECRET_<VAR>, never -e")
    p.add_argument("--tags", help="only these tags (comma-separated), e.g. proxmox_gpu_host_verify")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_extra_vars(items: list[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ToolkitError.of(f"-e {item!r} is not KEY=VALUE", field="--extra-var",
                                  fix="write it as -e proxmox_gpu_host_expected_gpu_count=8")
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def resolve_inventory(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if DEFAULT_INVENTORY.exists():
        return DEFAULT_INVENTORY
    from toolkit.adapters.ansible import share_dir

    candidate = share_dir() / DEFAULT_INVENTORY
    if candidate.exists():
        return candidate
    raise ToolkitError.of("no inventory given and no lab inventory found", field="--inventory",
                          fix="pass -i INVENTORY (shape: inventory/lab.example.yml), or run `toolkit lab up`")


def host_plan(inventory: Path, host: str) -> tuple[list[str], list[str]]:
    """The containers of `host`, and the inventory's notes for it (`toolkit_notes`: what an inventory, the lab's
    for one, substitutes for the roles; printed before every run). Refuses a host the inventory lacks."""
    from toolkit.adapters.ansible import read_inventory

    hosts = read_inventory(inventory)
    if host not in hosts or "proxmox_hosts" not in hosts[host]["groups"]:
        known = sorted(h for h, v in hosts.items() if "proxmox_hosts" in v["groups"])
        raise ToolkitError.of(
            f"{host!r} is not a host of the group proxmox_hosts in this inventory",
            file=str(inventory), field="HOST",
            fix=f"name one of {known}" if known else "add it under proxmox_hosts (see inventory/lab.example.yml)",
        )
    containers = sorted(
        h for h, v in hosts.items()
        if "gpu_containers" in v["groups"] and v["vars"].get("lxc_gpu_container_proxmox_host", host) == host
    )
    notes = hosts[host]["vars"].get("toolkit_notes") or []
    return containers, [str(n) for n in (notes if isinstance(notes, list) else [notes])]


def _run(book: str, inventory: Path, extravars: dict[str, Any], args: argparse.Namespace, title: str) -> Any:
    from rich.console import Console

    from toolkit.adapters.ansible import run_playbook
    from toolkit.cli.ansible_progress import PlaybookProgress, summary_table

    console = Console(stderr=True)
    with PlaybookProgress(console, title) as progress:
        result = run_playbook(
            book,
            inventory=inventory,
            extravars=extravars,
            check=args.check,
            diff=args.diff,
            tags=[t for t in (args.tags or "").split(",") if t] or None,
            on_event=progress.on_event,
        )
    if not args.json:
        console.print(summary_table(result, f"{title}: {result.status}"))
        for failure in result.failures:
            what = "unreachable" if failure.unreachable else f"task {failure.task!r} failed"
            console.print(f"[red]{failure.host}: {what}[/]\n  {failure.message}")
        console.print(f"[dim]artifacts: {result.artifacts_dir}[/]")
    return result


def _extravars(args: argparse.Namespace, host: str, notes: list[str]) -> dict[str, Any]:
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    for note in notes:
        console.print(f"[yellow]{escape(note)}[/]")
    if notes:
        console.print("[yellow]override any of these with -e VAR=VALUE[/]")
    extravars: dict[str, Any] = parse_extra_vars(args.extra_var)
    extravars["toolkit_hosts"] = host
    extravars["toolkit_proxmox_host"] = host
    return extravars


def provision(args: argparse.Namespace, *, containers: bool) -> tuple[int, dict[str, Any]]:
    inventory = resolve_inventory(args.inventory)
    members, notes = host_plan(inventory, args.host)
    extravars = _extravars(args, args.host, notes)
    report: dict[str, Any] = {"host": args.host, "containers": members if containers else [], "notes": notes,
                              "runs": []}
    from toolkit.cli.ansible_progress import result_json

    books = ["host"] + (["container"] if containers else [])
    for book in books:
        if book == "container" and not members:
            raise ToolkitError.of(f"no container in the inventory has lxc_gpu_container_proxmox_host: {args.host}",
                                  file=str(inventory), field="gpu_containers",
                                  fix="add one under gpu_containers (see inventory/lab.example.yml)")
        start = time.monotonic()
        result = _run(book, inventory, extravars, args, f"{book}.yml on {args.host}")
        run = result_json(result) | {"playbook": f"{book}.yml", "duration_s": round(time.monotonic() - start, 1)}
        report["runs"].append(run)
        if result.rc != 0 or result.failures:
            return EXIT_FAILED, report
    return EXIT_OK, report


def run_provision(args: argparse.Namespace) -> int:
    code, report = provision(args, containers=args.containers)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    return code


def run_reproduce(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.cli.main import main as toolkit_main

    start = time.monotonic()
    code, report = provision(args, containers=True)
    if code == EXIT_OK and not args.check:
        inventory = str(resolve_inventory(args.inventory))
        argv = ["apply", "profile", args.profile, "-i", inventory, "--limit", ",".join(report["containers"])]
        deploy_start = time.monotonic()
        run: dict[str, Any] = {"command": "toolkit " + " ".join(argv)}
        if args.json:
            # One JSON document on stdout: apply's own summary goes inside ours.
            import contextlib
            import io

            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                code = toolkit_main([*argv, "--json"])
            try:
                run["summary"] = json.loads(buf.getvalue())
            except json.JSONDecodeError:
                run["output"] = buf.getvalue()
        else:
            code = toolkit_main(argv)
        run.update(rc=code, duration_s=round(time.monotonic() - deploy_start, 1))
        report["runs"].append(run)
    report["duration_s"] = round(time.monotonic() - start, 1)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        Console(stderr=True).print(f"reproduce {args.host} with {args.profile}: "
                                   f"{'done' if code == EXIT_OK else 'FAILED'} in {report['duration_s']} s")
    return code
