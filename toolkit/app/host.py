"""Provision a Proxmox GPU host (playbooks/host.yml) and its GPU containers (container.yml), reproduce a serving
container from a bare host in one step (then `apply`), and read it back with the doctor (doctor.yml, read-only).

The host is checked against the inventory first: a typo must not become "no hosts matched, nothing done". An
inventory may carry `toolkit_notes` (a list of lines): what it substitutes for a real host, said before every
run against it (the lab's inventory says what its stand-ins change for the roles).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.adapters.ansible import InventoryHost, find_inventory, read_inventory, run_playbook
from toolkit.app.apply import ApplyOutcome, ApplyRequest
from toolkit.app.profiles import resolve_checked
from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult
from toolkit.core.errors import EXIT_FAILED, EXIT_OK, ToolkitError

NOTES_VAR = "toolkit_notes"


@dataclass
class HostRequest:
    host: str
    inventory: str | None = None
    containers: bool = False
    check: bool = False
    diff: bool = False
    extravars: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)  # what will run in the containers: sizes the model cache


@dataclass(frozen=True)
class HostPlan:
    inventory: Path
    host: InventoryHost
    containers: list[str]  # the inventory's GPU containers on this host
    notes: list[str]  # the inventory's own notes (what it substitutes), said before a run


def host_plan(host: str, inventory: str | Path | None) -> HostPlan:
    """The host and its containers as the inventory says. Refuses a host the inventory lacks."""
    path = find_inventory(inventory)
    hosts = read_inventory(path)
    if not hosts:
        raise ToolkitError.of("the inventory lists no hosts", file=str(path),
                              fix="add the Proxmox host under proxmox_hosts (see inventory/real-host.example.yml)")
    if host not in hosts or "proxmox_hosts" not in hosts[host].groups:
        known = sorted(h for h, v in hosts.items() if "proxmox_hosts" in v.groups)
        raise ToolkitError.of(
            f"{host!r} is not a host of the group proxmox_hosts in this inventory", file=str(path), field="HOST",
            fix=f"name one of {known}" if known else "add it under proxmox_hosts (see inventory/real-host.example.yml)")
    containers = sorted(h for h, v in hosts.items()
                        if "gpu_containers" in v.groups and v.vars.get("lxc_gpu_container_proxmox_host", host) == host)
    notes = hosts[host].vars.get(NOTES_VAR) or []
    if isinstance(notes, str) or not all(isinstance(n, str) for n in notes):
        raise ToolkitError.of(f"{NOTES_VAR} must be a list of lines", file=str(path), field=NOTES_VAR,
                              fix=f"write {NOTES_VAR}: [\"one line\", ...]")
    return HostPlan(path, hosts[host], containers, list(notes))


@dataclass
class ProvisionOutcome:
    host: str
    containers: list[str]
    notes: list[str] = field(default_factory=list)  # the inventory's own (what it substitutes for a real host)
    runs: list[dict[str, Any]] = field(default_factory=list)  # one per playbook (and the deploy, on reproduce)
    duration_s: float | None = None
    exit_code: int = EXIT_OK
    model_cache: str = ""  # how the containers' model cache is sized (said before the run)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "containers": self.containers, "notes": self.notes,
                               "runs": self.runs}
        if self.model_cache:
            out["model_cache"] = self.model_cache
        if self.duration_s is not None:
            out["duration_s"] = self.duration_s
        return out


def result_json(result: PlaybookResult) -> dict[str, Any]:
    return {
        "rc": result.rc,
        "status": result.status,
        "hosts": {h: vars(s) for h, s in sorted(result.hosts.items())},
        "failures": [vars(f) for f in result.failures],
        "artifacts_dir": str(result.artifacts_dir) if result.artifacts_dir else None,
    }


# The container role's inputs for its model cache (roles/lxc_gpu_container/defaults/main.yml).
CACHE_SIZE_VAR = "lxc_gpu_container_model_cache_size_gib"
MODEL_SIZE_VAR = "lxc_gpu_container_model_size_gib"
DEFAULT_CACHE_GIB = 128  # the role's size when neither is known


def model_cache_vars(profiles: list[str]) -> dict[str, Any]:
    """The container role's model size and name from the profiles that will run in the containers: the largest
    model.size_gib among them (the cache holds one model at a time, the largest must fit). Resolving them first
    also stops a bad profile before any host changes. Empty when no profile knows its model's size."""
    sized = []
    for name in profiles:
        model = resolve_checked(name).resolved.spec.model
        if model.size_gib:
            sized.append((float(model.size_gib), model.repo_id or model.local_path or name, name))
    if not sized:
        return {}
    size_gib, model_name, _ = max(sized)
    return {MODEL_SIZE_VAR: size_gib, "lxc_gpu_container_model_name": model_name}


def model_cache_note(plan: HostPlan, containers: list[str], extravars: dict[str, Any], sized: dict[str, Any],
                     profiles: list[str]) -> str:
    """How the containers' model cache will be sized, for the user before the run: from -e, from the profiles
    (`sized`: model_cache_vars), from the inventory, or the role's default, with how to size it."""
    where = f"model cache of {', '.join(containers)}"
    if CACHE_SIZE_VAR in extravars or MODEL_SIZE_VAR in extravars:
        return f"{where}: sized by -e"
    if sized:
        return (f"{where}: sized for {sized['lxc_gpu_container_model_name']} ({float(sized[MODEL_SIZE_VAR]):g} GiB, "
                f"the largest model.size_gib of --profile {', '.join(profiles)}) and a tenth more")
    hosts = read_inventory(plan.inventory, "gpu_containers")
    unsized = [c for c in containers
               if not any(float((hosts[c].vars if c in hosts else {}).get(v) or 0) > 0
                          for v in (CACHE_SIZE_VAR, MODEL_SIZE_VAR))]
    if not unsized:
        return f"{where}: sized by the inventory ({CACHE_SIZE_VAR} or {MODEL_SIZE_VAR})"
    why = "no --profile given" if not profiles else f"{', '.join(profiles)} give no model.size_gib"
    return (f"model cache of {', '.join(unsized)}: {DEFAULT_CACHE_GIB} GiB, the container role's default ({why}, "
            f"and the inventory sets neither {CACHE_SIZE_VAR} nor {MODEL_SIZE_VAR}). A larger model will not fit: "
            f"pass --profile NAME (repeatable) to size it from the profiles that will run there, or set "
            f"{CACHE_SIZE_VAR} in the inventory")


def provision(req: HostRequest, plan: HostPlan, run: Callable[..., PlaybookResult], *,
              on_message: Callable[[str], None] | None = None) -> ProvisionOutcome:
    """host.yml, then (containers) container.yml; stops at the first that fails. `run(book, title, **kw)` runs a
    playbook with the caller's progress display (toolkit.adapters.ansible.run_playbook's keywords). The model
    cache is sized from `req.profiles`, and how it is sized is said through `on_message` before any run."""
    sized = model_cache_vars(req.profiles)
    extravars = {**sized, **req.extravars, "toolkit_hosts": req.host, "toolkit_proxmox_host": req.host}
    outcome = ProvisionOutcome(req.host, plan.containers if req.containers else [], plan.notes)
    if req.containers and not plan.containers:
        raise ToolkitError.of(f"no container in the inventory has lxc_gpu_container_proxmox_host: {req.host}",
                              file=str(plan.inventory), field="gpu_containers",
                              fix="add one under gpu_containers (see inventory/real-host.example.yml)")
    if req.profiles and not req.containers:
        raise ToolkitError.of("--profile sizes the containers' model cache, and this run makes no container",
                              field="--profile", fix="add --containers, or leave --profile out")
    if req.containers:
        outcome.model_cache = model_cache_note(plan, plan.containers, req.extravars, sized, req.profiles)
        if on_message is not None:
            on_message(outcome.model_cache)
    # The containers' storage first: a host is not provisioned for containers that cannot be made there.
    for book in (["containers_preflight", "host", "container"] if req.containers else ["host"]):
        start = time.monotonic()
        result = run(book, f"{book}.yml on {req.host}", inventory=plan.inventory, extravars=extravars,
                     check=req.check, diff=req.diff, tags=req.tags or None)
        outcome.runs.append(result_json(result) | {"playbook": f"{book}.yml",
                                                   "duration_s": round(time.monotonic() - start, 1)})
        if result.rc != 0 or result.failures:
            outcome.exit_code = EXIT_FAILED
            break
    return outcome


def reproduce(req: HostRequest, plan: HostPlan, profile: str, run: Callable[..., PlaybookResult],
              deploy: Callable[[ApplyRequest], ApplyOutcome], *,
              on_message: Callable[[str], None] | None = None) -> ProvisionOutcome:
    """From a bare Proxmox host to a container serving `profile`: host.yml, container.yml, then the profile
    applied to the host's containers (`deploy`: toolkit.app.apply.apply with the caller's progress display)."""
    start = time.monotonic()
    # The profile is resolved first (a bad one stops before any host changes), and its model's size goes to the
    # container role: the model cache's storage is checked against it before anything is made or downloaded.
    outcome = provision(HostRequest(**{**req.__dict__, "containers": True, "profiles": [profile]}), plan, run,
                        on_message=on_message)
    if outcome.exit_code == EXIT_OK and not req.check:
        deploy_start = time.monotonic()
        limit = ",".join(outcome.containers)
        applied = deploy(ApplyRequest(profile=profile, inventory=str(plan.inventory), limit=limit))
        outcome.runs.append({"command": f"toolkit apply profile {profile} -i {plan.inventory} --limit {limit}",
                             "summary": applied.summary, "rc": applied.exit_code,
                             "duration_s": round(time.monotonic() - deploy_start, 1)})
        outcome.exit_code = applied.exit_code
    outcome.duration_s = round(time.monotonic() - start, 1)
    return outcome


def doctor(host: str, inventory: str | None, *, on_event: Callable[[PlaybookEvent], None]) -> list[Any]:
    """The doctor's checks of the host and its containers (playbooks/doctor.yml only reads; toolkit.core.doctor
    judges what it read)."""
    from toolkit.core.doctor import judge

    plan = host_plan(host, inventory)
    result = run_playbook("doctor", inventory=plan.inventory,
                          extravars={"toolkit_hosts": host, "toolkit_proxmox_host": host}, on_event=on_event)
    reports = {h: dict(r.get("doctor") or {}) for h, r in result.results_of("Doctor | report").items()}
    unreachable = {f.host: f.message for f in result.failures if f.unreachable}
    unreachable |= {e.host: e.message for e in result.events if e.kind == "unreachable"}
    return judge(host, reports, unreachable)
