"""`toolkit apply profile NAME`: deploy a profile as a service, then (--probe) measure it and (--record) record it.

Thin: resolve and validate the profile (an invalid one touches no host), compute the extravars
(toolkit.core.deploy), fill the wheelhouse, run playbooks/deploy.yml through the ansible-runner
adapter with live progress, then summarise per host. The work is in the core and the roles.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, ToolkitError

# The lab (toolkit lab up) writes this inventory; with no -i it is the default, as issue #7 asks.
LAB_INVENTORY = Path("inventory/lab.yml")
LAB_TOKENIZER_DIR = "/opt/sglang/standin/lab-tokenizer"
LAB_DATASET_PATH = "/opt/sglang/standin/lab-sharegpt.json"
# 1024 prompts (the seed's count) would take the stand-in's engine model 75 s for glm5-baseline (it runs in real
# time at the seed's ~880 tok/s); 160 prompts of the profile's lengths keep a lab run to about 13 s for
# glm5-baseline (64 running, the rest queued for most of it) and 7 s for glm5-tp8 (all 160 at once), long
# enough for the steady-state rule's 5 s plateau. The lab says so in its notes and in the results entry.
LAB_NUM_PROMPTS = 160
REMOTE_RUNS_DIR = "/var/lib/toolkit/runs"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="apply_command", metavar="SUBCOMMAND")
    p = sub.add_parser(
        "profile",
        help="deploy a profile to the GPU containers of an inventory (the lab's by default)",
        description="Resolve and validate the profile, deploy it as a systemd service through Ansible, "
        "optionally probe (benchmark + GPU power) and record the result into the profile.",
    )
    p.add_argument("name", help="profile name (profiles/NAME.yaml)")
    p.add_argument("-i", "--inventory", help=f"Ansible inventory (default: the lab's, {LAB_INVENTORY})")
    p.add_argument("--limit", help="only these hosts (Ansible --limit pattern)")
    p.add_argument("--check", action="store_true", help="Ansible check mode: report what would change")
    p.add_argument("--probe", action="store_true", help="after the deploy, run the probe with the profile's bench")
    p.add_argument("--record", action="store_true", help="record the probe's results into the profile (needs --probe)")
    p.add_argument("--profiles-dir", help="directory of profiles (default: TOOLKIT_PROFILES_DIR or ./profiles)")
    p.add_argument("--runs-dir", default=os.environ.get("TOOLKIT_RUNS_DIR", "runs"),
                   help="where fetched run artifacts go on this machine (default: ./runs)")
    lab = p.add_mutually_exclusive_group()
    lab.add_argument("--lab", dest="lab", action="store_true", default=None,
                     help="treat the inventory as the lab's: stand-in server, smaller bench (default: detected)")
    lab.add_argument("--no-lab", dest="lab", action="store_false", help="a real host, even if the inventory says lab")
    p.add_argument("--lab-num-prompts", type=int, default=LAB_NUM_PROMPTS, metavar="N",
                   help=f"lab only: prompts of the lab's bench (default {LAB_NUM_PROMPTS}; the profile's count runs "
                   "the engine model in real time: 1024 take glm5-baseline about 75 s)")
    p.add_argument("--lab-fail-health", action="store_true", help=argparse.SUPPRESS)  # tests: stand-in fails /health
    p.add_argument("--lab-nan-log", action="store_true", help=argparse.SUPPRESS)  # tests: stand-in logs a NaN line
    p.add_argument("--no-wait", action="store_true",
                   help="refuse at once when another toolkit apply or sweep holds a target host "
                   "(default: wait for it, naming the holder)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run_apply_profile)


def _is_lab_inventory(path: Path) -> bool:
    """The lab's inventory says so (`toolkit_overlay: lab` in all.vars, written by `toolkit lab up`; `lab: true`
    from a lab made before); a real one never does."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("toolkit_overlay") == "lab" or node.get("lab") is True or node.get("toolkit_lab") is True:
                return True
            return any(walk(v) for v in node.values())
        return False

    return walk(data)


def _api_key(ref: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(secrets, extravars) for the API key reference. The key itself only ever travels as a secret."""
    if not ref:
        return {}, {}
    kind, _, name = ref.partition(":")
    if kind == "env":
        value = os.environ.get(name)
        if not value:
            raise ToolkitError.of(
                f"the profile's API key comes from the environment variable {name}, which is not set",
                field="server.api_key_secret",
                fix=f"export {name}=... before `toolkit apply` (it is written only to the unit's 0600 env file)",
            )
        return {"sglang_service_api_key": value}, {}
    if kind == "file":
        return {"sglang_service_api_key": Path(name).expanduser().read_text().strip()}, {}
    if kind == "vault":
        # Ansible resolves the vaulted variable on the host side; the value never passes through here.
        return {}, {"sglang_service_api_key": "{{ " + name + " }}"}
    raise ToolkitError.of(f"unknown secret reference {ref!r}", field="server.api_key_secret",
                          fix="use env:NAME, file:PATH or vault:NAME")


def _resolve(name: str, profiles_dir: str | None) -> Any:
    from toolkit.adapters.profile_store import ProfileStore, find_profiles_dir

    store = ProfileStore(find_profiles_dir(profiles_dir))
    resolved = store.resolve(name)
    problems = _validate(resolved)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ToolkitError(errors)  # nothing has touched a host yet
    return resolved, [p for p in problems if p.severity == "warning"], store


def _validate(resolved: Any) -> list[Any]:
    from toolkit.adapters.sglang_catalogue import load_catalogue
    from toolkit.core.profile import validate

    return list(validate(resolved, load_catalogue(str(resolved.spec.engine.sglang_version))))


def _inventory_hosts(inventory: Path, limit: str | None, group: str = "gpu_containers") -> list[str]:
    """The inventory's hosts of `group` in order (ansible-inventory's own parse, any inventory format)."""
    import subprocess
    import sys

    cmd = [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inventory), "--list"]
    if limit:
        cmd += ["--limit", limit]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolkitError.of(f"cannot read the inventory: {proc.stderr.strip()[-400:]}", file=str(inventory),
                              field="--inventory", fix="check the inventory with `ansible-inventory -i FILE --list`")
    data = json.loads(proc.stdout)
    return list((data.get(group) or {}).get("hosts") or [])


def _inventory_path(args: argparse.Namespace) -> Path:
    from toolkit.adapters.ansible import resolve_inventory, share_dir

    inventory = Path(args.inventory) if args.inventory else share_dir() / LAB_INVENTORY
    return resolve_inventory(inventory, fix="run `toolkit lab up` (writes inventory/lab.yml) or pass -i INVENTORY")


@dataclass
class ApplyPlan:
    """Everything one apply runs with; benchmarks/bench_apply.py runs the same plan through plain ansible-playbook."""

    profile_name: str
    inventory: Path
    extravars: dict[str, Any]
    secrets: dict[str, str]
    fetch_dir: Path
    left_out: list[str]
    is_lab: bool
    warnings: list[str]  # the profile's validation warnings (an open bind it allows), shown on every apply


def prepare(args: argparse.Namespace, console: Any) -> ApplyPlan:
    """Resolve, validate and plan: raises ToolkitError (exit 2) before any host is touched."""
    from toolkit.adapters.ansible import share_dir
    from toolkit.adapters.wheelhouse import ensure as ensure_wheelhouse
    from toolkit.core import deploy
    from toolkit.core.profile.render import render_bench_argv
    from toolkit.lab.standin_server import SERVER_PATH

    if args.record and not args.probe:
        raise ToolkitError.of("--record records a probe run", field="--record", fix="add --probe")
    resolved, warnings, store = _resolve(args.name, args.profiles_dir)

    share = share_dir()
    inventory = _inventory_path(args)
    is_lab = _is_lab_inventory(inventory) if args.lab is None else bool(args.lab)
    repo_root = share
    inputs = deploy.inputs_from_resolved(resolved, repo_root=repo_root)

    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{inputs.profile_name}"
    fetch_dir = Path(args.runs_dir).resolve() / run_id
    lab = deploy.LabOptions(
        standin_server=is_lab,
        standin_fail_health=args.lab_fail_health,
        standin_nan_log=args.lab_nan_log,
        bench_num_prompts=args.lab_num_prompts if is_lab else None,
        tokenizer_dir=LAB_TOKENIZER_DIR if is_lab else None,
        dataset_path=LAB_DATASET_PATH if is_lab else None,
    )
    remote_run = f"{REMOTE_RUNS_DIR}/{run_id}"
    bench_argv = render_bench_argv(
        resolved,
        base_url=f"http://127.0.0.1:{inputs.port}",
        output_file=f"{remote_run}/bench.jsonl",
        python=inputs.venv_path.rstrip("/") + "/bin/python",
    )
    probe_args: list[str] = []
    if is_lab:
        # The lab has no GPU: the probe reads the SIMULATED GPUs of the stand-in's engine model (its lab-only
        # /lab/gpus), which follow this profile's tp, running cap and memory; no live view in a log.
        probe_args = ["--live", "off", "--simulated-gpus", f"http://127.0.0.1:{inputs.port}"]

    # A failed benchmark's verdict carries the server's journal since the probe started (killed, crashed).
    probe_args += ["--server-unit", inputs.service_name]

    if args.probe:
        from toolkit.core.probe.knobs import run_target

        # The probe on the host has no profiles: the deployed profile's knobs travel with it, so the verdict's
        # next steps name their current values (verdict.json knob_steps).
        target = run_target(resolved.name, resolved.spec.model_dump(mode="json"), set(store.names()))
        probe_args = [*probe_args, "--target-json", json.dumps(target, sort_keys=True, separators=(",", ":"))]

    nodes = {}
    if resolved.spec.server.nnodes > 1:
        nodes = deploy.per_node(resolved, _inventory_hosts(inventory, args.limit))
    with console.status(f"wheelhouse for sglang {inputs.sglang_version} (pip download, once per release)"):
        wheelhouse = ensure_wheelhouse(inputs.sglang_version, repo_root=repo_root)
    extravars = deploy.build_extravars(
        inputs,
        run_id=run_id,
        wheelhouse_dir=str(wheelhouse.path),
        wheelhouse_tar=str(wheelhouse.tarball),
        toolkit_wheel=str(wheelhouse.toolkit_wheel),
        wheelhouse_pythons=wheelhouse.pythons,
        fetch_dir=str(fetch_dir),
        standin_server_src=str(SERVER_PATH),
        lab=lab,
        bench_argv=bench_argv,
        probe_args=probe_args,
        nodes=nodes,
    )
    extravars["deploy_probe"] = bool(args.probe)
    extravars["bench_probe_gpu_trace_src"] = ""  # recorded traces are the probe's tests' now, not the lab's
    extravars["bench_probe_bench_data_src"] = str(SERVER_PATH.with_name("make_bench_data.py"))
    secrets, key_vars = _api_key(inputs.api_key_secret)
    extravars.update(key_vars)
    if os.environ.get("HF_TOKEN"):
        secrets["sglang_venv_hf_token"] = os.environ["HF_TOKEN"]
    return ApplyPlan(inputs.profile_name, inventory, extravars, secrets, fetch_dir, wheelhouse.left_out, is_lab,
                     [w.render() for w in warnings])


def run_apply_profile(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from toolkit.adapters.ansible import target_hosts
    from toolkit.adapters.host_lock import host_locks

    console = Console(stderr=True)
    _, warnings, _ = _resolve(args.name, args.profiles_dir)

    def say(message: str) -> None:
        console.print(f"[yellow]{escape(message)}[/]")

    for warning in warnings:  # on every apply, before anything else (an open bind the profile allows)
        say(warning.render())
    # Bad input is refused before anything waits for, or writes, a lock.
    if args.record and not args.probe:
        raise ToolkitError.of("--record records a probe run", field="--record", fix="add --probe")

    # One apply or sweep per host at a time (toolkit.adapters.host_lock), taken before anything is prepared for
    # the hosts; a sweep's own applies re-enter it.
    hosts = target_hosts(_inventory_path(args), limit=args.limit)
    with host_locks(hosts, purpose="toolkit apply", wait=not args.no_wait, on_message=say):
        return _apply_locked(args, console)


def _apply_locked(args: argparse.Namespace, console: Any) -> int:
    from rich.markup import escape

    from toolkit.adapters.ansible import PlaybookInterrupted, run_playbook

    plan = prepare(args, console)
    extravars, fetch_dir = plan.extravars, plan.fetch_dir
    for note in extravars["deploy_lab_notes"]:
        console.print(f"[yellow]{escape(note)}[/]")
    if plan.left_out:
        console.print(f"[dim]not installed (GPU-side or not needed to serve here): {', '.join(plan.left_out)}[/]")

    try:
        with _Progress(console, title=f"apply {plan.profile_name}") as progress:
            result = run_playbook(
                "deploy",
                inventory=plan.inventory,
                extravars=extravars,
                limit=args.limit,
                check=args.check,
                on_event=progress.on_event,
                secrets=plan.secrets,
            )
    except PlaybookInterrupted:
        if args.probe:
            _stop_remote_probe(plan, args.limit, console)
        raise  # the host lock is released on the way out; main() exits 130

    summary = _summary(result, fetch_dir, args, plan.profile_name)
    summary["warnings"] = plan.warnings
    if args.probe:
        # A failed probe's run (benchmark-failed, with the server's log tail) was fetched before the role failed:
        # show its verdict; record only a deploy that succeeded, and only runs that were not failures.
        summary["probe"] = _probe_results(fetch_dir)
        if args.record and result.rc == 0:
            summary["record"] = _record(fetch_dir, plan.profile_name, args.profiles_dir, summary["probe"])
    _print_summary(console, summary, as_json=args.json)
    failed = result.rc != 0 or summary["unreachable"] or summary["failed_hosts"]
    return EXIT_FAILED if failed else EXIT_OK


class _Progress:
    """Live progress of the playbook: the current task, and a line per host result that matters."""

    def __init__(self, console: Any, *, title: str) -> None:
        self.console = console
        self.title = title
        self.tasks = 0
        self._status: Any = None

    def __enter__(self) -> _Progress:
        self._status = self.console.status(self.title)
        self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._status.__exit__(*exc)

    def on_event(self, event: Any) -> None:
        from rich.markup import escape

        kind = getattr(event, "kind", "")
        if kind == "task_start":
            self.tasks += 1
            self._status.update(f"{self.title}: [{self.tasks}] {event.task}")
        elif kind == "play_start":
            self.console.print(f"[bold]{event.play}[/]")
        elif kind == "changed":
            self.console.print(f"  [yellow]changed[/] {escape(event.host)}: {escape(event.task)}")
        elif kind in ("failed", "unreachable") and not getattr(event, "ignore_errors", False):
            self.console.print(f"  [red]{kind}[/] {escape(event.host)}: {escape(event.task)}")


def _stop_remote_probe(plan: ApplyPlan, limit: str | None, console: Any) -> None:
    """After Ctrl-C: ansible-playbook is gone, but the probe it started on each host runs on (nothing there
    notices the closed SSH connection). Interrupt this run's probe, so it stops its benchmark and writes what
    it has, and wait for it to end."""
    from toolkit.adapters.ansible import PlaybookInterrupted, run_playbook

    console.print(f"stopping this run's probe on the hosts ({plan.extravars['deploy_run_id']}) ...")
    try:
        result = run_playbook("stop_probe", inventory=plan.inventory, limit=limit,
                              extravars={"deploy_run_id": plan.extravars["deploy_run_id"],
                                         "deploy_hosts": plan.extravars.get("deploy_hosts", "gpu_containers")})
    except PlaybookInterrupted:
        console.print("[red]interrupted again: the probe may still run on the hosts[/]")
        return
    for failure in result.failures:
        console.print(f"[red]could not stop the probe on {failure.host}: {failure.message}[/]")


def _summary(result: Any, fetch_dir: Path, args: argparse.Namespace, profile: str) -> dict[str, Any]:
    hosts = {
        h: {"ok": s.ok, "changed": s.changed, "failed": s.failed, "unreachable": s.unreachable, "skipped": s.skipped}
        for h, s in sorted(result.hosts.items())
    }
    return {
        "profile": profile,
        "rc": result.rc,
        "status": result.status,
        "check": bool(args.check),
        "hosts": hosts,
        "changed": sum(s["changed"] for s in hosts.values()),
        "unreachable": sorted(h for h, s in hosts.items() if s["unreachable"]),
        "failed_hosts": sorted(h for h, s in hosts.items() if s["failed"]),
        "failures": [{"host": f.host, "task": f.task, "message": f.message} for f in result.failures],
        "artifacts_dir": str(fetch_dir),
        "ansible_artifacts_dir": str(result.artifacts_dir) if result.artifacts_dir else None,
    }


def _probe_results(fetch_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # <fetch_dir>/<host>/<run id>/: the directory's name is the run id the results entry records.
    for host_dir in sorted(p for p in fetch_dir.glob(f"*/{fetch_dir.name}") if p.is_dir()):
        verdict_file = host_dir / "verdict.json"
        verdict = json.loads(verdict_file.read_text()) if verdict_file.exists() else None
        out[host_dir.parent.name] = {"run_dir": str(host_dir), "verdict": verdict}
    return out


def _record(fetch_dir: Path, profile: str, profiles_dir: str | None, probe: dict[str, Any]) -> dict[str, Any]:
    import importlib

    record_run = None
    # Issue #4's recorder: toolkit.adapters.results_store.record_run (or the toolkit.results facade if present).
    for module in ("toolkit.results", "toolkit.adapters.results_store"):
        try:
            record_run = importlib.import_module(module).record_run
            break
        except (ImportError, AttributeError):
            continue
    if record_run is None:
        return {"skipped": "record_run (issue #4) is not in this checkout; nothing recorded"}
    from toolkit.adapters.profile_store import find_profiles_dir

    recorded = {}
    for host, info in probe.items():
        if not info.get("verdict"):
            recorded[host] = "skipped: the probe wrote no verdict"
            continue
        if info["verdict"].get("class") == "benchmark-failed":
            recorded[host] = "skipped: the benchmark failed (a failure is not a result)"
            continue
        outcome = record_run(Path(info["run_dir"]), profile, find_profiles_dir(profiles_dir))
        recorded[host] = f"{getattr(outcome, 'action', 'recorded')} in {getattr(outcome, 'file', profile)}"
    return {"recorded": recorded}


def _verdict_line(verdict: dict[str, Any] | None) -> str:
    if not verdict:
        return "no verdict (the probe wrote none)"
    text = str(verdict.get("headline") or verdict.get("class") or "?")
    conf = verdict.get("confidence_label") or verdict.get("confidence")
    source = str(verdict.get("data_source") or "")
    lab = " (lab data)" if "lab data" in source else ""
    return text + (f" (confidence {conf})" if conf is not None else "") + lab


def _print_summary(console: Any, summary: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"toolkit apply profile {summary['profile']}" + (" (check mode)" if summary["check"] else ""))
    for col in ("host", "ok", "changed", "failed", "unreachable"):
        table.add_column(col)
    for host, s in summary["hosts"].items():
        table.add_row(host, str(s["ok"]), str(s["changed"]), str(s["failed"]), str(s["unreachable"]))
    console.print(table)
    for f in summary["failures"]:
        # Log lines hold brackets ("[lab stand-in] ..."): print them as text, never as rich markup.
        console.print(f"[red]{escape(f['host'])}: {escape(f['task'])}[/]\n{escape(f['message'])}")
    if summary["unreachable"]:
        console.print(f"[red]unreachable: {', '.join(summary['unreachable'])}[/] (the other hosts were deployed)")
    for host, info in (summary.get("probe") or {}).items():
        verdict = escape(_verdict_line(info["verdict"]))
        console.print(f"[bold]{escape(host)}[/]: verdict {verdict}; run {info['run_dir']}")
        server_log = ((info["verdict"] or {}).get("evidence") or {}).get("server_log_tail")
        if server_log:
            tail = "\n".join(server_log.strip().splitlines()[-12:])
            console.print(f"the server's log ({escape(host)}, last lines):\n{escape(tail)}")
    rec = summary.get("record")
    if rec:
        console.print(rec.get("skipped") or f"recorded: {rec['recorded']}")
    console.print(f"artifacts: {summary['artifacts_dir']}")


__all__ = ["EXIT_BAD_INPUT", "configure", "run_apply_profile"]
