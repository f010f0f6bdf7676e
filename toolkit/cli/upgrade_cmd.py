"""`toolkit upgrade PROFILE --sglang-version X`: the new release measured beside the old, kept only on a
significant result, the old one restored otherwise.

Thin: parse, call toolkit.app.upgrade with live playbook progress, print the decision (or --json).
"""

from __future__ import annotations

import argparse
import json
import os


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", metavar="PROFILE", help="the profile serving now (profiles/PROFILE.yaml)")
    parser.add_argument("--sglang-version", required=True, metavar="X", help="the SGLang release to move to")
    parser.add_argument("-i", "--inventory",
                        help="Ansible inventory (default: $TOOLKIT_INVENTORY, else the lab's inventory/lab.yml)")
    parser.add_argument("--limit", help="only these GPU containers (Ansible --limit pattern)")
    parser.add_argument("--objective", choices=["throughput", "tokens-per-joule", "j-per-token"],
                        default="throughput", help="what decides (default throughput: steady output tok/s)")
    parser.add_argument("--slo", metavar="BOUNDS", help="an SLO each run is held to (ttft_p99_ms=3000,itl_p99_ms=100, "
                        "or SGLang's 'ttft:3000 tpot:50'): the new release may not keep it significantly less often")
    parser.add_argument("--repeats", type=int, default=6, metavar="N",
                        help="the budget: at most N (old, new) pairs (default 6; at least 3)")
    parser.add_argument("--effect-pct", type=float, default=5.0, metavar="PCT",
                        help="the smallest change that matters (default 5): a change inside +-PCT is equal")
    parser.add_argument("--accept-equal", action="store_true",
                        help="promote a change inside +-the effect (default: only a significant gain)")
    parser.add_argument("--profiles-dir", help="directory of profiles (default: TOOLKIT_PROFILES_DIR or ./profiles)")
    parser.add_argument("--runs-dir", default=os.environ.get("TOOLKIT_RUNS_DIR", "runs"),
                        help="where the runs and the report go (default: ./runs)")
    parser.add_argument("--num-prompts", type=int, default=None, metavar="N",
                        help="the bench's prompts for every run instead of the profile's")
    parser.add_argument("--json", action="store_true",
                        help="print the decision (promoted, refused, rolled-back), the interval and the runs as JSON")
    parser.set_defaults(func=run_upgrade)


def run_upgrade(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.app.upgrade import UpgradeRequest, upgrade
    from toolkit.cli.render import PlaybookProgress, say

    console = Console(stderr=True)
    req = UpgradeRequest(profile=args.profile, sglang_version=args.sglang_version, inventory=args.inventory,
                         limit=args.limit, objective=args.objective, slo=args.slo, repeats=args.repeats,
                         accept_equal=args.accept_equal, effect_pct=args.effect_pct,
                         profiles_dir=args.profiles_dir, runs_dir=args.runs_dir, num_prompts=args.num_prompts)
    with PlaybookProgress(console, f"upgrade {args.profile} to SGLang {args.sglang_version}") as progress:
        outcome = upgrade(req, on_event=progress.on_event, on_message=say(console))
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2, sort_keys=True))
    else:
        out = Console()
        out.print(f"[bold]{outcome.decision}[/]: {outcome.text}")
        out.print(f"report: {outcome.report}")
    return outcome.exit_code
