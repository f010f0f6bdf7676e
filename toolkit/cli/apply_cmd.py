"""`toolkit apply profile NAME`: deploy a profile as a service, then (--probe) measure it and (--record) record it.

Thin: parse, call toolkit.app.apply with live playbook progress, print the per-host summary.
"""

from __future__ import annotations

import argparse
import os

from toolkit.cli.options import inventory_option, profiles_dir_option


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="apply_command", metavar="SUBCOMMAND")
    p = sub.add_parser(
        "profile",
        help="deploy a profile to the GPU containers of an inventory (the lab's by default)",
        description="Resolve and validate the profile, deploy it as a systemd service through Ansible, "
        "optionally probe (benchmark + GPU power) and record the result into the profile.",
    )
    p.add_argument("name", help="profile name (profiles/NAME.yaml)")
    inventory_option(p)
    p.add_argument("--limit", help="only these hosts (Ansible --limit pattern); a profile's power limit still "
                   "runs on their Proxmox hosts, which join the limit")
    p.add_argument("--check", action="store_true", help="Ansible check mode: report what would change")
    p.add_argument("--probe", action="store_true", help="after the deploy, run the probe with the profile's bench")
    p.add_argument("--record", action="store_true", help="record the probe's results into the profile (needs --probe)")
    profiles_dir_option(p)
    p.add_argument("--runs-dir", default=os.environ.get("TOOLKIT_RUNS_DIR", "runs"),
                   help="where fetched run artifacts go on this machine (default: ./runs)")
    p.add_argument("--num-prompts", type=int, default=None, metavar="N",
                   help="the bench's prompts instead of the profile's (a quick check); the results entry records "
                   "what ran. The lab's inventory makes it 160 unless given: its engine model runs in real time")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="the bench's requests in flight instead of the profile's (a closed loop: a new request as "
                   "one finishes, so the run holds a steady load); the results entry records what ran")
    p.add_argument("--no-wait", action="store_true",
                   help="refuse at once when another toolkit apply or sweep holds a target host "
                   "(default: wait for it, naming the holder)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run_apply_profile)


def run_apply_profile(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.app.apply import ApplyRequest, apply
    from toolkit.cli.render import PlaybookProgress, print_apply_summary, say

    console = Console(stderr=True)
    req = ApplyRequest(profile=args.name, inventory=args.inventory, limit=args.limit, check=args.check,
                       probe=args.probe, record=args.record, profiles_dir=args.profiles_dir, runs_dir=args.runs_dir,
                       num_prompts=args.num_prompts, max_concurrency=args.max_concurrency,
                       wait=not args.no_wait)
    with PlaybookProgress(console, f"apply {args.name}") as progress:
        outcome = apply(req, on_event=progress.on_event, on_message=say(console),
                        on_status=lambda m: console.print(f"[dim]{m}[/]"))
    print_apply_summary(console, outcome, as_json=args.json)
    return outcome.exit_code
