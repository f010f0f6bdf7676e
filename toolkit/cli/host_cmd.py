"""`toolkit host facts|plan|provision|reproduce HOST`.

Thin: parse, call toolkit.app.host with live playbook progress, print the result. `facts` and `plan` only read
the host; `provision` and `reproduce` plan first and stop before any change (exit 2) when the plan does not
resolve, then run the playbooks with the plan's values (exit 1 naming the failing task). `reproduce` then
deploys the profile, so a bare host becomes a serving container in one command.
"""

from __future__ import annotations

import argparse
from typing import Any

from toolkit.cli.envelope import emit
from toolkit.cli.options import inventory_option
from toolkit.core.errors import EXIT_OK, ToolkitError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="host_command", metavar="SUBCOMMAND")
    facts = sub.add_parser(
        "facts",
        help="read a Proxmox host (read-only): versions, kernels, GPUs by bus id, VM assignments, driver, storages",
        description="Run playbooks/facts.yml (read-only) against HOST and print what the plan reads of it.",
    )
    facts.add_argument("host", help="inventory name of the Proxmox host")
    inventory_option(facts)
    facts.add_argument("--json", action="store_true", help="print the facts as JSON")
    facts.set_defaults(func=run_facts)

    plan = sub.add_parser(
        "plan",
        help="resolve the stack for a profile on a host (driver, modules, CUDA, storages, GPUs) and the changes; "
        "exit 2 with each refusal's fix",
        description="Read HOST once (read-only), resolve the profile and inventory against the compatibility "
        "matrix (toolkit/data/compat/), print the stack with the reason for each choice and the changes in order. "
        "Changes nothing. Exit 0 when it resolves, 2 with each refusal's reason, fix and source.",
    )
    plan.add_argument("host", help="inventory name of the Proxmox host")
    plan.add_argument("--profile", help="the profile to plan for (profiles/NAME.yaml); without it, the host only")
    inventory_option(plan)
    plan.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE",
                      help="a role variable as provision would get it (YAML value), e.g. a driver pin; repeatable")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=run_plan)
    prov = sub.add_parser(
        "provision",
        help="driver, nvidia_uvm HMM off, device-node unit on a Proxmox host (--containers: and its GPU containers)",
        description="Run playbooks/host.yml against HOST (a host of the inventory's proxmox_hosts group); with "
        "--containers also playbooks/container.yml for the containers whose lxc_gpu_container_proxmox_host is HOST.",
    )
    prov.add_argument("host", help="inventory name of the Proxmox host, or `all`: each host of proxmox_hosts in turn")
    prov.add_argument("--containers", action="store_true", help="also create/configure its GPU containers")
    prov.add_argument("--profile", action="append", default=[], dest="profiles", metavar="NAME",
                      help="a profile that will run in the containers (repeatable): their model cache is sized "
                      "for the largest model.size_gib (without one: the role's 128 GiB, unless the inventory sizes it)")
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
    inventory_option(p)
    p.add_argument("--check", action="store_true", help="Ansible check mode: report what would change, change nothing")
    p.add_argument("--diff", action="store_true", help="print each changed task's diff (files, packages) under it")
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
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            parsed = value
        # A dotted number is a version far more often than a fraction here (580.140 must not become 580.14, which
        # names another driver): kept as written, as Ansible's own `-e k=v` keeps every value.
        out[key] = value if isinstance(parsed, float) else parsed
    return out


def _request(args: argparse.Namespace) -> Any:
    from toolkit.app.host import HostRequest

    return HostRequest(host=args.host, inventory=args.inventory, containers=getattr(args, "containers", False),
                       check=args.check, diff=args.diff, extravars=parse_extra_vars(args.extra_var),
                       tags=[t for t in (args.tags or "").split(",") if t], profiles=getattr(args, "profiles", []))


def _runner(console: Any, as_json: bool) -> Any:
    """run_playbook with a live progress display, then (not --json) the per-host table and each failure."""
    from toolkit.adapters.ansible import run_playbook
    from toolkit.cli.render import PlaybookProgress, summary_table

    def run(book: str, title: str, **kw: Any) -> Any:
        with PlaybookProgress(console, title, show_diffs=bool(kw.get("diff"))) as progress:
            result = run_playbook(book, on_event=progress.on_event, **kw)
        if not as_json:
            console.print(summary_table(result, f"{title}: {result.status}"))
            for failure in result.failures:
                what = "unreachable" if failure.unreachable else f"task {failure.task!r} failed"
                console.print(f"[red]{failure.host}: {what}[/]\n  {failure.message}", markup=True)
            console.print(f"[dim]artifacts: {result.artifacts_dir}[/]")
        return result

    return run


def _start(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from rich.console import Console

    from toolkit.app.host import host_plan

    console = Console(stderr=True)
    req = _request(args)
    plan = host_plan(req.host, req.inventory)
    for note in plan.notes:  # what this inventory substitutes for a real host, on every run
        console.print(f"[yellow]{note}[/]", highlight=False)
    return console, req, plan


def _resolve(console: Any, plan: Any, profile: str | None, extravars: dict[str, Any], out: Any) -> tuple[Any, Any]:
    """Facts (one gathering, its progress on `console`) and the plan, printed for people on `out` (None: not)."""
    from toolkit.app.host import resolve_plan
    from toolkit.cli.render import PlaybookProgress, print_host_plan

    with PlaybookProgress(console, f"facts of {plan.host.name}") as progress:
        facts, resolved = resolve_plan(plan, profile, extravars, on_event=progress.on_event)
    if out is not None:
        print_host_plan(out, resolved)
    return facts, resolved


def _show_plan(console: Any, as_json: bool) -> Any:
    from toolkit.cli.render import print_host_plan

    return None if as_json else (lambda resolved: print_host_plan(console, resolved))


def run_facts(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.app.host import gather_facts, host_plan
    from toolkit.cli.render import PlaybookProgress, print_host_facts

    plan = host_plan(args.host, args.inventory)
    with PlaybookProgress(Console(stderr=True), f"facts of {args.host}") as progress:
        facts = gather_facts(plan, on_event=progress.on_event)
    if args.json:
        emit("host.facts", facts.to_json())
    else:
        print_host_facts(Console(), facts)
    return EXIT_OK


def run_plan(args: argparse.Namespace) -> int:
    from rich.console import Console

    from toolkit.app.host import host_plan
    from toolkit.core.errors import EXIT_BAD_INPUT

    plan = host_plan(args.host, args.inventory)
    console = Console(stderr=True)
    for note in plan.notes:
        console.print(f"[yellow]{note}[/]", highlight=False)
    _facts, resolved = _resolve(console, plan, args.profile, parse_extra_vars(args.extra_var),
                                None if args.json else Console())
    if args.json:
        emit("host.plan", resolved.to_json())
    return EXIT_OK if resolved.resolved else EXIT_BAD_INPUT


def run_provision(args: argparse.Namespace) -> int:
    from toolkit.app.host import ALL_HOSTS, provision, provision_targets
    from toolkit.cli.render import say

    outcomes = []
    for host in provision_targets(args.host, args.inventory):
        console, req, plan = _start(argparse.Namespace(**{**vars(args), "host": host}))
        outcome = provision(req, plan, _runner(console, args.json), on_plan=_show_plan(console, args.json),
                            on_message=say(console))
        outcomes.append(outcome)
        if outcome.exit_code != EXIT_OK:
            break
    if args.json:
        emit("host.provision", {"hosts": [o.to_json() for o in outcomes]} if args.host == ALL_HOSTS
             else outcomes[0].to_json())
    return outcomes[-1].exit_code


def run_reproduce(args: argparse.Namespace) -> int:
    from toolkit.app.apply import ApplyOutcome, ApplyRequest, apply
    from toolkit.app.host import reproduce
    from toolkit.cli.render import PlaybookProgress, print_apply_summary, say

    console, req, plan = _start(args)

    def deploy(apply_req: ApplyRequest) -> ApplyOutcome:
        with PlaybookProgress(console, f"apply {args.profile}") as progress:
            applied = apply(apply_req, on_event=progress.on_event, on_message=say(console))
        if not args.json:
            print_apply_summary(console, applied, as_json=False)
        return applied

    outcome = reproduce(req, plan, args.profile, _runner(console, args.json), deploy,
                        on_plan=_show_plan(console, args.json), on_message=say(console))
    if args.json:
        emit("host.reproduce", outcome.to_json())
    else:
        console.print(f"reproduce {args.host} with {args.profile}: "
                      f"{'done' if outcome.exit_code == EXIT_OK else 'FAILED'} in {outcome.duration_s} s")
    return outcome.exit_code
