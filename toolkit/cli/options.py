"""Options several commands share, declared once so each has one spelling and one help text: `-i/--inventory`,
`--profiles-dir`, and what a sweep and a tune both take (how a point is measured, the capacity search)."""

from __future__ import annotations

from argparse import ArgumentParser, Namespace
from typing import Any


def inventory_option(parser: ArgumentParser) -> None:
    """-i/--inventory: the Ansible inventory a command runs against (toolkit.adapters.ansible.find_inventory)."""
    parser.add_argument("-i", "--inventory", metavar="INVENTORY",
                        help="Ansible inventory (default: $TOOLKIT_INVENTORY, else the lab's inventory/lab.yml)")


def profiles_dir_option(parser: ArgumentParser) -> None:
    """--profiles-dir: where the profiles are read and written (toolkit.app.profiles.open_store)."""
    parser.add_argument("--profiles-dir", metavar="DIR",
                        help="where profiles live (default: $TOOLKIT_PROFILES_DIR, else profiles/ of the git "
                        "repository here)")


def capacity_arguments(parser: ArgumentParser, *, who: str) -> None:
    """--slo, --rate-start, --rate-tolerance-pct, --max-rounds: the capacity search's options (docs/tune.md, "The
    capacity search"); `who` says whose first rate --rate-start gives ("the base's" or "each variant's")."""
    parser.add_argument("--slo", help="the latency bounds, p99 in ms, any of ttft_p99_ms, itl_p99_ms, e2e_p99_ms, "
                        "e.g. ttft_p99_ms=3000,itl_p99_ms=100: search the highest Poisson request rate that meets them")
    parser.add_argument("--rate-start", type=float, help=f"{who} first request rate (req/s) of the capacity search "
                        "(default: 0.7 x the rate a closed-loop run completes)")
    parser.add_argument("--rate-tolerance-pct", type=float, default=4.0, help="a capacity search stops when its "
                        "bracket is this narrow (or the noise band, if wider); default 4")
    parser.add_argument("--max-rounds", type=int, default=10, help="rates per variant's capacity search (default 10)")


def measure_options(parser: ArgumentParser) -> None:
    """How a sweep's and a tune's points are measured: --runner, -i, --no-wait, --num-prompts, --point-timeout-s
    and --profiles-dir (toolkit.app.sweep.MeasureRequest)."""
    parser.add_argument("--runner", default="apply", help="apply (default: each point deployed and probed as "
                        "`toolkit apply profile VARIANT --probe` does, in this process), recorded:FILE (replay a "
                        "table of recorded results in-process; no host is touched), or a runner an installed "
                        "package provides (the lab's engine-model: its engine model in-process, simulated, seconds "
                        "per point)")
    inventory_option(parser)
    parser.add_argument("--no-wait", action="store_true", help="refuse at once when another apply, sweep or tune "
                        "holds a target host (default: wait for it, naming the holder)")
    parser.add_argument("--num-prompts", type=int, help="prompts of each measurement instead of the profile's "
                        "(apply's --num-prompts; the lab's inventory makes it 160 by default, which keeps the demand "
                        "near 150 requests)")
    parser.add_argument("--point-timeout-s", type=float, default=1800.0, help="apply + probe of one point (s)")
    profiles_dir_option(parser)


def promote_options(parser: ArgumentParser) -> None:
    """--promote and --promote-name: a sweep's or a tune's best written as a profile of its own."""
    parser.add_argument("--promote", action="store_true", help="write the best variant as profiles/NAME.yaml")
    parser.add_argument("--promote-name", help="name of the promoted profile (default: BASE-RUNSTAMP-vNN)")


def measure_fields(args: Namespace) -> dict[str, Any]:
    """The MeasureRequest fields of a sweep's or a tune's command line (measure_options, capacity_arguments and
    the profile, --concurrency, --budget, --resume and --show each declares with its own help)."""
    return {"profile": args.profile, "concurrency": args.concurrency, "budget": args.budget, "resume": args.resume,
            "show": args.show, "runner": args.runner, "inventory": args.inventory, "wait": not args.no_wait,
            "num_prompts": args.num_prompts, "point_timeout_s": args.point_timeout_s,
            "profiles_dir": args.profiles_dir, "slo": args.slo, "rate_start": args.rate_start,
            "rate_tolerance_pct": args.rate_tolerance_pct, "max_rounds": args.max_rounds}
