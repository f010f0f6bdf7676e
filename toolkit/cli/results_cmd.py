"""`toolkit results ...`: record a probe run into a profile, compare profiles' results.

Thin: parse, call toolkit.app.record / toolkit.core.results, render (rich or --json).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from toolkit.cli.envelope import emit
from toolkit.cli.options import profiles_dir_option
from toolkit.core.errors import ToolkitError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="results_command", metavar="SUBCOMMAND")

    rec = sub.add_parser("record", help="write a probe run's results entry into a profile (atomic; a re-record "
                         "of the same run changes nothing)",
                         description="Write the results entry of a probe run directory into a profile's "
                         "toolkit-written block. Only the block changes.")
    rec.add_argument("dir", type=Path, help="the probe run directory (toolkit probe run --out)")
    rec.add_argument("--profile", required=True, metavar="NAME", help="the profile the run measured")
    rec.add_argument("--keep-last", type=int, default=None, metavar="N",
                     help="keep the newest N toolkit entries (default: the block's keep_last, 10)")
    profiles_dir_option(rec)
    rec.add_argument("--json", action="store_true", help="machine-readable output")
    rec.set_defaults(func=cmd_record)

    cmp_ = sub.add_parser("compare", help="rank profiles' results, like with like: the same provenance and workload",
                          description="Each profile's latest results entry of each provenance (measured, "
                          "imported, lab, replayed) and workload, in one table per group of comparable entries, "
                          "ranked by output throughput (steady-state where every entry of the group has a steady "
                          "window, else full-run) and by output tokens per joule. Groups are never ranked against "
                          "each other; each says how it differs from the first. Stale entries (an older spec) "
                          "are marked.")
    cmp_.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile names, or `all`")
    cmp_.add_argument("--all", action="store_true", help="every entry of each profile, not only the latest of each "
                      "provenance and workload")
    profiles_dir_option(cmp_)
    cmp_.add_argument("--json", action="store_true", help="machine-readable output")
    cmp_.set_defaults(func=cmd_compare)

    chk = sub.add_parser("check", help="the newest entry against a reference: exit 1 on a significant regression",
                         description="The newest results entry's configuration (spec and SGLang release) against "
                         "the reference's, each side every comparable entry of its configuration, under the rules "
                         "an upgrade decides by: the 95 % interval of the change by the objective; a significant "
                         "loss exits 1, anything else 0. For a CI pipeline after each apply.")
    chk.add_argument("profile", metavar="PROFILE", help="the profile whose results are checked")
    chk.add_argument("--against", metavar="RUN|last-promoted", default=None,
                     help="a run id, or last-promoted (the release the last upgrade promoted); default: the newest "
                     "other configuration (else the runs before the newest)")
    chk.add_argument("--objective", choices=["throughput", "tokens-per-joule"], default="throughput",
                     help="the figure compared, higher better (default throughput: output tok/s)")
    chk.add_argument("--effect-pct", type=float, default=5.0, metavar="PCT",
                     help="the smallest change that matters (default 5): a change inside +-PCT is equal")
    profiles_dir_option(chk)
    chk.add_argument("--json", action="store_true", help="machine-readable output")
    chk.set_defaults(func=cmd_check)

    mig = sub.add_parser("migrate", help="rewrite profiles' results blocks in the current schema (only the block)",
                         description="Older results blocks are migrated on every read; this writes the migrated "
                         "block back (atomically; the author's text is untouched).")
    mig.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile names, or `all`")
    profiles_dir_option(mig)
    mig.set_defaults(func=cmd_migrate)


def cmd_check(args: argparse.Namespace) -> int:
    from toolkit.app.record import check_results

    if not 0 < args.effect_pct < 100:
        raise ToolkitError.of(f"--effect-pct {args.effect_pct:g} is outside (0, 100)", field="--effect-pct",
                              fix="e.g. --effect-pct 5")
    result = check_results(args.profile, args.profiles_dir, against=args.against, objective=args.objective,
                           effect=args.effect_pct / 100)
    if args.json:
        emit("results.check", {"profile": args.profile, **result.to_dict()})
    else:
        print(("REGRESSION " if result.regression else "") + result.text())
    return 1 if result.regression else 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from toolkit.app.profiles import open_store
    from toolkit.app.record import migrate

    names = open_store(args.profiles_dir).names() if args.profiles == ["all"] else args.profiles
    for name in names:
        changed = migrate(name, args.profiles_dir)
        print(f"{name}: {'results block rewritten in the current schema' if changed else 'already current'}")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    from toolkit.app.record import record_run

    if args.keep_last is not None and args.keep_last < 1:
        raise ToolkitError.of("--keep-last must be at least 1", field="--keep-last", fix="e.g. --keep-last 10")
    outcome = record_run(args.dir, args.profile, args.profiles_dir, keep_last=args.keep_last)
    e = outcome.entry
    if args.json:
        emit("results.record", {"profile": outcome.profile, "file": str(outcome.file), "action": outcome.action,
                                "run_id": e.run_id, "dropped": outcome.dropped,
                                "entry": e.model_dump(mode="json", by_alias=True, exclude_none=True)})
        return 0
    from rich.console import Console

    con = Console()
    verb = {"added": "recorded", "replaced": "re-recorded (figures changed)", "unchanged": "already recorded, "
            "file unchanged"}[outcome.action]
    con.print(f"[bold]{outcome.profile}[/]: {verb}: {e.run_id} -> {outcome.file}")
    from rich.markup import escape

    from toolkit.core.results.comparable import workload
    from toolkit.core.results.compare import figures_line

    p = e.provenance()
    con.print(f"  [yellow]{p.label}[/]" + (f": {escape(p.detail)}" if p.detail else "") if p.kind != "measured"
              else f"  {p.label}" + (f": {escape(p.detail)}" if p.detail else ""))
    con.print(f"  {escape(workload(e).text())}: {escape(figures_line(e))}")
    if outcome.dropped:
        con.print(f"  dropped by keep_last {outcome.block.keep_last}: {', '.join(outcome.dropped)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from toolkit.app.record import load_results
    from toolkit.core.results.compare import latest_per_class, rank_groups

    names = args.profiles
    if names == ["all"]:
        from toolkit.app.profiles import open_store

        names = open_store(args.profiles_dir).names()
    rows: list[tuple[str, Any, str | None]] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):  # each profile once, in the order given
        pr = load_results(name, args.profiles_dir)
        entries = pr.block.entries if args.all else latest_per_class(pr.block, pr.spec_hash)
        if not entries:
            missing.append(name)
        rows += [(name, e, pr.spec_hash) for e in entries]
    groups = rank_groups(rows)
    if args.json:
        from toolkit.core.results.comparable import workload

        emit("results.compare", {
            "groups": [{
                "provenance": g.provenance.kind, "workload": workload(g.rows[0].entry).__dict__,
                "throughput_kind": g.throughput_kind, "apart": g.apart,
                "ranked": [{
                    "profile": r.profile, "run_id": r.entry.run_id, "source": r.entry.source, "stale": r.stale,
                    "provenance": g.provenance.kind, "output_tok_per_s": r.output_tok_per_s,
                    "throughput_kind": r.throughput_kind, "output_tok_per_j": r.output_tok_per_j,
                    "rank_throughput": r.rank_throughput, "rank_tok_per_j": r.rank_tok_per_j,
                    "verdict": r.entry.verdict_class(),
                } for r in g.rows],
            } for g in groups],
            "no_results": missing,
        })
        return 0
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from toolkit.cli.render import figure_column, print_wide, text_column
    from toolkit.core.provenance import mark
    from toolkit.core.tables import figure

    out: list[Any] = []
    for i, g in enumerate(groups):
        table = Table(title=f"{i + 1}. {escape(g.title)}", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("#", justify="right", no_wrap=True)
        text_column(table, "profile, entry")
        table.add_column("provenance", no_wrap=True)
        cells = [[figure(r.output_tok_per_s), figure(r.output_tok_per_j) + (f" ({r.rank_tok_per_j})"
                  if r.rank_tok_per_j else ""), figure(r.entry.power.mean_w if r.entry.power else None)]
                 for r in g.rows]
        figure_column(table, "tok/s", [c[0] for c in cells])
        figure_column(table, "tok/J (#)", [c[1] for c in cells])
        figure_column(table, "W/GPU", [c[2] for c in cells])
        text_column(table, "verdict")
        for r, c in zip(g.rows, cells, strict=True):
            e = r.entry
            what = f"{escape(r.profile)} {escape(e.run_id)}" + (f" {e.date[:10]}" if e.date else "")
            if r.stale:
                what += " [red]STALE[/] (older spec)"
            table.add_row(str(r.rank_throughput or "-"), what, _mark(mark(g.provenance)), *c,
                          escape(e.verdict_class() or "-"))
        out.append(table)
        if g.apart:
            out.append(f"not ranked with group 1: {escape(g.apart)}")
    if not groups:
        out.append("no results to compare")
    if missing:
        out.append(f"no results yet: {', '.join(missing)} (record one: toolkit results record DIR --profile NAME)")
    print_wide(out)
    return 0


def _mark(mark: str) -> str:
    return mark if mark in ("measured", "imported") else f"[yellow]{mark}[/]"
