"""Apply a profile: validate it (an invalid one touches no host), plan the deploy (the extravars of
playbooks/deploy.yml, from toolkit.core.deploy), fill the wheelhouse, run the playbook on the inventory's GPU
containers under their host locks, then (asked) probe and record.

An inventory may name an overlay (`toolkit_overlay: NAME` in its variables): a plug-in of the group
toolkit.deploy_overlays that amends the plan through the same inputs a real host's deploy uses (extravars for
the roles' generic inputs, the bench command, the probe's options) and says what it changed. The lab's
inventory names the lab's (toolkit.lab.deploy_overlay); a production inventory names none.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.adapters import wheelhouse as wheelhouse_adapter
from toolkit.adapters.ansible import (
    InventoryHost,
    PlaybookInterrupted,
    PlaybookTimedOut,
    find_inventory,
    read_inventory,
    run_playbook,
)
from toolkit.adapters.files import os_reason, read_capped
from toolkit.adapters.host_lock import host_locks
from toolkit.adapters.wheelhouse import tarball_path
from toolkit.app import plugins
from toolkit.app.profiles import CheckedProfile, resolve_checked
from toolkit.core import deploy
from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult
from toolkit.core.engine_lock import parse_lock
from toolkit.core.errors import EXIT_FAILED, EXIT_OK, ToolkitError
from toolkit.core.probe.verdict import Verdict
from toolkit.core.profile.render import client_url, render_bench_argv
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.validate import SECRET_FILE_ROOTS, SYSTEM_PREFIXES

REMOTE_RUNS_DIR = "/var/lib/toolkit/runs"
OVERLAY_VAR = "toolkit_overlay"  # an inventory variable: the deploy overlay that amends every plan for it


@dataclass
class ApplyRequest:
    profile: str
    inventory: str | None = None  # default: $TOOLKIT_INVENTORY, else the lab's inventory/lab.yml
    limit: str | None = None  # Ansible --limit
    check: bool = False
    probe: bool = False
    record: bool = False
    profiles_dir: str | None = None
    runs_dir: str = "runs"  # where fetched run artifacts go on this machine
    num_prompts: int | None = None  # the bench's prompts instead of the profile's
    max_concurrency: int | None = None  # the bench's requests in flight instead of the profile's
    wait: bool = True  # wait for another apply or sweep holding a target host (else refuse at once)
    # The deploy playbook's (and so the probe's) wall time; past it the playbook and the probe are stopped as on
    # Ctrl-C and PlaybookTimedOut is raised. None: no limit (a person runs apply and can press Ctrl-C).
    timeout_s: float | None = None


@dataclass(frozen=True)
class OverlayContext:
    """What a deploy overlay sees: the profile, its deploy inputs, the target hosts with their inventory
    variables, the multi-node argvs, the bench command as planned, and the toolkit's own wheel."""

    resolved: ResolvedProfile
    inputs: deploy.DeployInputs
    hosts: dict[str, InventoryHost]
    nodes: dict[str, tuple[list[str], str]]
    bench_argv: list[str]
    num_prompts: int | None  # the request's --num-prompts (None: the overlay may choose)
    toolkit_wheel: Path
    lock_src: Path | None = None  # the engine lock the venv is installed from (sglang_venv_lock_src)
    probe_wheels: tuple[Path, ...] = ()  # the probe's runtime wheels, for the lock's CPython (beside the lock's)


@dataclass
class Amendment:
    """An overlay's changes, each announced by a note: extravars merged over the plan's (the roles' generic
    inputs), the bench command replaced, options added to the probe's."""

    extravars: dict[str, Any] = field(default_factory=dict)
    bench_argv: list[str] | None = None
    probe_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The engine check's imports instead of the profile's (deploy.engine_imports), announced in the notes; the
    # distribution check always stays whole.
    engine_imports: list[deploy.EngineImport] | None = None


@dataclass
class DeployPlan:
    """Everything one apply runs with; benchmarks/bench_apply.py runs the same plan through plain ansible-playbook."""

    profile_name: str
    inventory: Path
    extravars: dict[str, Any]
    secrets: dict[str, str]
    fetch_dir: Path
    notes: list[str]  # what an overlay changed, one line each
    limit: str | None = None  # ansible-playbook's --limit: the request's, with the power-limit hosts it needs


@dataclass(frozen=True)
class HostProbe:
    """One host's probe run, fetched to this machine: its directory (named by the run id the results entry
    records) and its verdict as the probe wrote it (None: the probe wrote none)."""

    run_dir: Path
    verdict: Verdict | None


@dataclass
class ApplyOutcome:
    """What one apply did: the deploy playbook's result per host, what the plan noted, each host's probe run
    (asked with `probe`), what was recorded. A sweep's point reads it in process; `summary` is its JSON form."""

    profile: str
    check: bool
    playbook: PlaybookResult
    notes: list[str]
    artifacts_dir: Path  # where the hosts' probe runs are fetched to
    probes: dict[str, HostProbe] | None = None  # by host; None when the probe was not asked for
    record: dict[str, Any] | None = None  # what `record` did per host

    @property
    def unreachable(self) -> list[str]:
        return sorted(h for h, s in self.playbook.hosts.items() if s.unreachable)

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, s in self.playbook.hosts.items() if s.failed)

    @property
    def deployed(self) -> bool:
        """The playbook ran to its end on every host."""
        return self.playbook.rc == 0 and not self.unreachable and not self.failed_hosts

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.deployed else EXIT_FAILED

    @property
    def summary(self) -> dict[str, Any]:
        """What `toolkit apply --json` prints."""
        result = self.playbook
        hosts = {h: {"ok": s.ok, "changed": s.changed, "failed": s.failed, "unreachable": s.unreachable,
                     "skipped": s.skipped} for h, s in sorted(result.hosts.items())}
        out: dict[str, Any] = {
            "profile": self.profile,
            "rc": result.rc,
            "status": result.status,
            "check": self.check,
            "hosts": hosts,
            "changed": sum(s["changed"] for s in hosts.values()),
            "unreachable": self.unreachable,
            "failed_hosts": self.failed_hosts,
            "failures": [{"host": f.host, "task": f.task, "message": f.message} for f in result.failures],
            "notes": self.notes,
            "artifacts_dir": str(self.artifacts_dir),
            "ansible_artifacts_dir": str(result.artifacts_dir) if result.artifacts_dir else None,
        }
        if self.probes is not None:
            out["probe"] = {h: {"run_dir": str(p.run_dir), "verdict": p.verdict.to_dict() if p.verdict else None}
                            for h, p in self.probes.items()}
        if self.record is not None:
            out["record"] = self.record
        return out


# An API key is a line of text; a larger key file is not read (nor a device that never ends).
MAX_KEY_FILE_BYTES = 64 * 1024


def _key_file(name: str, roots: tuple[str, ...]) -> str:
    """The key in `name`, read only where the roots allow once every symbolic link is followed (a link from
    /etc/sglang/ to /etc/shadow is refused), capped in size."""
    try:
        real = Path(name).resolve(strict=True)
    except (OSError, RuntimeError) as err:
        reason = os_reason(err) if isinstance(err, OSError) else "a symbolic link loop"
        raise ToolkitError.of(f"cannot read the API key file {name}: {reason}", field="server.api_key_secret",
                              fix="create it (mode 0600) before `toolkit apply`, or point file: at it") from None
    allowed = []
    for root in roots:
        with contextlib.suppress(OSError, RuntimeError):  # a root that is a link loop allows nothing
            allowed.append(Path(root).resolve())
    if not any(real.is_relative_to(root) and real != root for root in allowed):
        raise ToolkitError.of(
            f"the API key file {name} is {real}, outside the secret roots ({', '.join(roots)}): it is not read",
            field="server.api_key_secret",
            fix="keep the key in a file of its own under /etc/sglang/, or declare its directory in the inventory's "
            "toolkit_secret_roots (a list of absolute directories)",
        )
    try:
        raw = read_capped(real, MAX_KEY_FILE_BYTES, what="API key file")
    except ToolkitError as err:
        for problem in err.problems:
            problem.field = "server.api_key_secret"
        raise
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise ToolkitError.of(f"the API key file {name} is {len(raw):,} bytes or more: not a key",
                              field="server.api_key_secret", fix="the file holds the key alone, on one line")
    return raw.decode("utf-8", errors="replace").strip()


def secret_roots(hosts: dict[str, InventoryHost]) -> tuple[str, ...]:
    """Where a `file:` key may be read from: the toolkit's own roots and those the inventory declares
    (toolkit_secret_roots on the hosts), each an absolute directory that is no system location."""
    roots = list(SECRET_FILE_ROOTS)
    for host in hosts.values():
        declared = host.vars.get("toolkit_secret_roots") or []
        for root in declared if isinstance(declared, list) else [declared]:
            text = str(root).rstrip("/") + "/"
            if text.startswith("/") and ".." not in text.split("/") and text not in roots \
                    and not any(text.startswith(p) or p.startswith(text) for p in SYSTEM_PREFIXES):
                roots.append(text)
    return tuple(roots)


def _api_key(ref: str | None, roots: tuple[str, ...] = SECRET_FILE_ROOTS) -> tuple[dict[str, str], dict[str, str]]:
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
        return {"sglang_service_api_key": _key_file(name, roots)}, {}
    if kind == "vault":
        # Ansible resolves the vaulted variable on the host side; the value never passes through here.
        return {}, {"sglang_service_api_key": "{{ " + name + " }}"}
    raise ToolkitError.of(f"unknown secret reference {ref!r}", field="server.api_key_secret",
                          fix="use env:NAME, file:PATH or vault:NAME")


def target(req: ApplyRequest) -> tuple[Path, dict[str, InventoryHost]]:
    """The inventory and the GPU containers a deploy on it runs on (in the inventory's order)."""
    inventory = find_inventory(req.inventory)
    return inventory, read_inventory(inventory, "gpu_containers", req.limit)


def _overlay(hosts: dict[str, InventoryHost], inventory: Path) -> Any:
    """The deploy overlay the target hosts' inventory names (one for all of them), or None."""
    named = {str(h.vars[OVERLAY_VAR]) for h in hosts.values() if h.vars.get(OVERLAY_VAR)}
    if not named:
        return None
    if len(named) > 1 or any(not h.vars.get(OVERLAY_VAR) for h in hosts.values()):
        raise ToolkitError.of(f"the target hosts name different deploy overlays ({OVERLAY_VAR}: "
                              f"{sorted(named)} and unset)", file=str(inventory), field=OVERLAY_VAR,
                              fix="deploy one kind of host at a time (--limit), or set the same overlay for all")
    return plugins.load("deploy_overlays", named.pop(), field=OVERLAY_VAR,
                        fix="remove it from the inventory, or install the package that provides it")


def plan(req: ApplyRequest, checked: CheckedProfile, inventory: Path, hosts: dict[str, InventoryHost], *,
         on_status: Callable[[str], Any] | None = None) -> DeployPlan:
    """The deploy's extravars and secrets: raises ToolkitError (exit 2) before any host is touched."""
    from toolkit.adapters.ansible import share_dir
    from toolkit.core.probe.knobs import run_target

    if req.record and not req.probe:
        raise ToolkitError.of("--record records a probe run", field="--record", fix="add --probe")
    if req.max_concurrency is not None and req.max_concurrency < 1:
        raise ToolkitError.of(f"--max-concurrency {req.max_concurrency}: at least one", field="--max-concurrency",
                              fix="e.g. --max-concurrency 128")
    if req.num_prompts is not None and req.num_prompts < 1:
        raise ToolkitError.of(f"--num-prompts {req.num_prompts}: at least one", field="--num-prompts",
                              fix="e.g. --num-prompts 160")
    resolved = checked.resolved
    # The files a profile names (patches) are relative to its repository: the profiles directory's parent.
    inputs = deploy.inputs_from_resolved(resolved, repo_root=checked.store.dir.resolve().parent)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{inputs.profile_name}"
    fetch_dir = Path(req.runs_dir).resolve() / run_id
    remote_run = f"{REMOTE_RUNS_DIR}/{run_id}"
    bench_argv = render_bench_argv(resolved, base_url=client_url(inputs.host, inputs.port),
                                   output_file=f"{remote_run}/bench.jsonl",
                                   python=inputs.venv_path.rstrip("/") + "/bin/python")
    notes: list[str] = []
    if req.num_prompts is not None:
        bench_argv = deploy.with_bench_flags(bench_argv, {"--num-prompts": str(req.num_prompts)})
        notes.append(f"bench --num-prompts {req.num_prompts} instead of the profile's "
                     f"{resolved.spec.bench.num_prompts}")
    if req.max_concurrency is not None:
        bench_argv = deploy.with_bench_flags(bench_argv, {"--max-concurrency": str(req.max_concurrency)})
        notes.append(f"bench --max-concurrency {req.max_concurrency} instead of the profile's "
                     f"{resolved.spec.bench.max_concurrency or 'none (every request at once)'}")
    # A failed benchmark's verdict carries the server's journal since the probe started (killed, crashed).
    probe_args = ["--server-unit", inputs.service_name]
    if req.probe:
        # The probe on the host has no profiles: the deployed profile's knobs travel with it, so the verdict's
        # next steps name their current values (verdict.json knob_steps).
        run_tgt = run_target(resolved.name, resolved.spec.model_dump(mode="json"), set(checked.store.names()))
        probe_args += ["--target-json", json.dumps(run_tgt, sort_keys=True, separators=(",", ":"))]
    nodes = deploy.per_node(resolved, list(hosts)) if resolved.spec.server.nnodes > 1 else {}
    overlay = _overlay(hosts, inventory)
    status = on_status or (lambda _: None)
    lock_src = engine_lock_src(resolved, checked.store.dir.resolve().parent)
    lock = parse_lock(lock_src.read_text(), str(lock_src))
    # The engine lock is all the SGLang venv installs; the probe's own venv needs its few runtime wheels beside it.
    status(f"the probe's wheels for CPython {lock.python} (pip download, once) and the toolkit's (this checkout)")
    probe = wheelhouse_adapter.probe_wheels(lock.python, repo_root=share_dir())
    amendment = Amendment()
    if overlay is not None:
        amendment = overlay(OverlayContext(resolved=resolved, inputs=inputs, hosts=hosts, nodes=nodes,
                                           bench_argv=bench_argv, num_prompts=req.num_prompts,
                                           toolkit_wheel=probe.toolkit_wheel, lock_src=lock_src,
                                           probe_wheels=probe.runtime))
    lock_dir = wheelhouse_adapter.lock_directory(f"sglang-{lock.sglang_version}-{lock.digest[:16]}")
    extravars = deploy.build_extravars(
        inputs,
        run_id=run_id,
        wheelhouse_dir=str(lock_dir),
        wheelhouse_tar=str(tarball_path(lock_dir)),
        toolkit_wheel=str(probe.toolkit_wheel),
        # The lock's CPython only: a container of another is refused before anything changes (its wheels are the
        # lock's, for that interpreter).
        wheelhouse_pythons=(lock.python,),
        fetch_dir=str(fetch_dir),
        bench_argv=amendment.bench_argv or bench_argv,
        probe_args=[*probe_args, *amendment.probe_args],
        nodes=nodes,
    )
    extravars.setdefault("sglang_venv_lock_src", str(lock_src))
    extravars["sglang_venv_python_refusals"] = python_refusals(resolved, checked.store.dir.resolve().parent)
    if "sglang_venv_wheelhouse_src" not in amendment.extravars:
        # What a host installs from: every wheel of the lock, torch and the CUDA wheels included, and the probe's
        # (bench_probe installs from the same host directory). An overlay that ships its own wheelhouse (the lab's,
        # with stand-ins for the GPU-only wheels) is not made to download these.
        status(f"the engine lock's wheels ({lock_src.name}: pip download of what the cache lacks, once)")
        wheelhouse_adapter.lock_wheelhouse(lock, lock_dir.name, probe.runtime)
    extravars.update(amendment.extravars)
    imports = amendment.engine_imports if amendment.engine_imports is not None else deploy.engine_imports(resolved)
    extravars["sglang_venv_engine_check"] = engine_check(Path(extravars["sglang_venv_lock_src"]),
                                                         checked.store.dir.resolve().parent,
                                                         imports)
    power = _power_limit(resolved, inventory, hosts)
    extravars.update(power)
    limit, limit_note = _limit_with_power_hosts(req.limit, power.get("deploy_power_limit_hosts", []), inventory)
    if limit_note:
        notes.append(limit_note)
    extravars["deploy_probe"] = bool(req.probe)
    secrets, key_vars = _api_key(inputs.api_key_secret, secret_roots(hosts))
    extravars.update(key_vars)
    if os.environ.get("HF_TOKEN"):
        secrets["sglang_venv_hf_token"] = os.environ["HF_TOKEN"]
    return DeployPlan(inputs.profile_name, inventory, extravars, secrets, fetch_dir,
                      [*notes, *amendment.notes], limit)


def _limit_with_power_hosts(limit: str | None, power_hosts: list[str], inventory: Path) -> tuple[str | None, str]:
    """`--limit` as given, widened to the Proxmox hosts that must set the profile's power limit, and a note saying
    so. A limit naming only containers would otherwise leave deploy.yml's first play with no host: Ansible skips
    it ("no hosts matched") and the GPUs keep their old limit, with the deploy reporting success."""
    if not limit or not power_hosts:
        return limit, ""
    matched = set(read_inventory(inventory, "proxmox_hosts", limit))
    added = [h for h in power_hosts if h not in matched]
    if not added:
        return limit, ""
    return (f"{limit},{','.join(added)}",
            f"--limit {limit}: the profile's power limit is set on the Proxmox host(s) of these containers, so "
            f"{', '.join(added)} joined the limit (deploy.yml's first play runs there)")


def python_refusals(resolved: ResolvedProfile, repo_root: Path) -> dict[str, str]:
    """CPython -> why the profile's release cannot be locked for it (its committed refusal): the role names it when
    it refuses a container of that CPython, so the operator reads the cause (a requirement the index lacks), not
    just a version mismatch."""
    from toolkit.app.profiles import committed_lock_file
    from toolkit.core.engine_lock import CONTAINER_PYTHONS, parse_refusal, refusal_path

    version = str(resolved.spec.engine.sglang_version)
    out = {}
    for python in CONTAINER_PYTHONS:
        rel = refusal_path(version, python)
        found = committed_lock_file(rel, repo_root)
        if found is not None:
            refusal = parse_refusal(found.read_text(encoding="utf-8"), rel)
            by = f" (required by {refusal.required_by})" if refusal.required_by else ""
            out[python] = (f"SGLang {version} cannot be locked for CPython {python}: the index has no "
                           f"{refusal.missing}{by} ({rel})")
    return out


def engine_lock_src(resolved: ResolvedProfile, repo_root: Path) -> Path:
    """The engine lock the profile's venv is installed from: the first container CPython's committed lock
    (toolkit.app.engine_lock.profile_locks); refused, before any host is touched, without one (validation refuses
    such a profile first: this names the file when a lock went missing since)."""
    from toolkit.app.engine_lock import profile_locks
    from toolkit.core.engine_lock import lock_path

    locks = profile_locks(resolved, repo_root)
    if locks:
        return next(iter(locks.values()))
    version = str(resolved.spec.engine.sglang_version)
    raise ToolkitError.of(
        f"{resolved.name}'s SGLang {version} has no committed engine lock (e.g. {lock_path(version, '3.11')}): a venv "
        "installed without one would not be the engine the release needs", file=resolved.file,
        field="engine.sglang_version",
        fix=f"lock it (`toolkit profile lock --sglang-version {version}`), or pin a release that has one")


def engine_check(lock_src: Path, repo_root: Path, imports: list[deploy.EngineImport]) -> dict[str, Any]:
    """The engine check's inputs (the role's sglang_venv_engine_check) from the lock file the venv is installed
    from, parsed by the toolkit's one lock parser."""
    name = str(lock_src.relative_to(repo_root)) if lock_src.is_relative_to(repo_root) else str(lock_src)
    try:
        text = lock_src.read_text()
    except OSError as err:
        raise ToolkitError.of(f"cannot read the engine lock {lock_src}: {err.strerror}", field="sglang_venv_lock_src",
                              fix="write it with `toolkit profile lock`") from None
    return deploy.engine_check_inputs(parse_lock(text, name), name, imports)


def _power_limit(resolved: ResolvedProfile, inventory: Path, hosts: dict[str, InventoryHost]) -> dict[str, Any]:
    """The profile's gpu.power_limit_w for the Proxmox hosts of the target containers (a container cannot set it):
    the extravars of deploy.yml's first play, which runs the host role's power-limit tasks there. Nothing when the
    profile leaves the limit alone."""
    limit = resolved.spec.gpu.power_limit_w
    if limit is None:
        return {}
    proxmox = list(read_inventory(inventory, "proxmox_hosts"))
    first = proxmox[0] if proxmox else ""
    owners = {str(h.vars.get("lxc_gpu_container_proxmox_host") or first) for h in hosts.values()}
    missing = sorted(owners - set(proxmox))
    if missing or not owners:
        raise ToolkitError.of(f"{resolved.name} sets gpu.power_limit_w, which only the Proxmox host can apply, but the "
                              f"inventory names no such host for these containers ({', '.join(missing) or 'none'} "
                              "is not in proxmox_hosts)", file=str(inventory), field="proxmox_hosts",
                              fix="add the host to the proxmox_hosts group (and lxc_gpu_container_proxmox_host), or "
                              "leave gpu.power_limit_w unset")
    # Only these containers' GPUs: another container's on the same host keep the limit its own profile set.
    vmids = sorted({int(h.vars["lxc_gpu_container_vmid"]) for h in hosts.values()
                    if str(h.vars.get("lxc_gpu_container_vmid", "")).isdigit()})
    return {"deploy_power_limit_hosts": sorted(owners), "proxmox_gpu_host_gpu_power_limit_w": f"{limit:g}",
            "proxmox_gpu_host_power_limit_vmids": vmids}


def apply(req: ApplyRequest, *, on_event: Callable[[PlaybookEvent], None], on_message: Callable[[str], None],
          on_status: Callable[[str], Any] | None = None) -> ApplyOutcome:
    """Deploy (and probe, and record). The profile's warnings, an overlay's notes and a waited-for host lock are
    said through `on_message`; a Ctrl-C (or the request's timeout_s passed) stops the playbook and this run's probe
    on the hosts, then re-raises (PlaybookInterrupted, PlaybookTimedOut)."""
    checked = resolve_checked(req.profile, req.profiles_dir)
    for warning in checked.warnings:  # on every apply, before anything else (an open bind the profile allows)
        on_message(warning.render())
    if req.record and not req.probe:  # bad input is refused before anything waits for, or writes, a lock
        raise ToolkitError.of("--record records a probe run", field="--record", fix="add --probe")
    inventory, hosts = target(req)
    # One apply or sweep per host at a time (toolkit.adapters.host_lock), taken before anything is prepared for
    # the hosts; a sweep's own applies re-enter it.
    with host_locks({name: h.address for name, h in hosts.items()}, purpose="toolkit apply", wait=req.wait,
                    on_message=on_message):
        deploy_plan = plan(req, checked, inventory, hosts, on_status=on_status)
        for note in deploy_plan.notes:
            on_message(note)
        try:
            result = run_playbook("deploy", inventory=deploy_plan.inventory, extravars=deploy_plan.extravars,
                                  limit=deploy_plan.limit, check=req.check, on_event=on_event,
                                  secrets=deploy_plan.secrets, timeout_s=req.timeout_s)
        except (PlaybookInterrupted, PlaybookTimedOut):
            if req.probe:
                _stop_remote_probe(deploy_plan, req.limit, on_message)
            raise  # the host lock is released on the way out; the command exits 130
    outcome = ApplyOutcome(profile=deploy_plan.profile_name, check=bool(req.check), playbook=result,
                           notes=deploy_plan.notes, artifacts_dir=deploy_plan.fetch_dir)
    if req.probe:
        # A failed probe's run (benchmark-failed, with the server's log tail) was fetched before the role failed:
        # show its verdict; record only a deploy that succeeded, and only runs that were not failures.
        outcome.probes = _probe_results(deploy_plan.fetch_dir)
        if req.record and result.rc == 0:
            outcome.record = _record(outcome.probes, deploy_plan.profile_name, checked)
    return outcome


def _stop_remote_probe(deploy_plan: DeployPlan, limit: str | None, on_message: Callable[[str], None]) -> None:
    """After Ctrl-C: ansible-playbook is gone, but the probe it started on each host runs on (nothing there
    notices the closed SSH connection). Interrupt this run's probe, so it stops its benchmark and writes what
    it has, and wait for it to end."""
    run_id = deploy_plan.extravars["deploy_run_id"]
    on_message(f"stopping this run's probe on the hosts ({run_id}) ...")
    try:
        result = run_playbook("stop_probe", inventory=deploy_plan.inventory, limit=limit,
                              extravars={"deploy_run_id": run_id,
                                         "deploy_hosts": deploy_plan.extravars.get("deploy_hosts", "gpu_containers")})
    except PlaybookInterrupted:
        on_message("interrupted again: the probe may still run on the hosts")
        return
    for failure in result.failures:
        on_message(f"could not stop the probe on {failure.host}: {failure.message}")


def _probe_results(fetch_dir: Path) -> dict[str, HostProbe]:
    from toolkit.adapters.probe_store import read_verdict

    out: dict[str, HostProbe] = {}
    # <fetch_dir>/<host>/<run id>/: the directory's name is the run id the results entry records.
    for host_dir in sorted(p for p in fetch_dir.glob(f"*/{fetch_dir.name}") if p.is_dir()):
        out[host_dir.parent.name] = HostProbe(host_dir, read_verdict(host_dir))
    return out


def _record(probes: dict[str, HostProbe], profile: str, checked: CheckedProfile) -> dict[str, Any]:
    from toolkit.app.record import record_run

    recorded = {}
    for host, probe in probes.items():
        if not probe.verdict:
            recorded[host] = "skipped: the probe wrote no verdict"
            continue
        if probe.verdict.failed:
            recorded[host] = "skipped: the benchmark failed (a failure is not a result)"
            continue
        outcome = record_run(probe.run_dir, profile, checked.store.dir)
        recorded[host] = f"{outcome.action} in {outcome.file}"
    return {"recorded": recorded}
