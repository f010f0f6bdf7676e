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
from typing import TYPE_CHECKING, Any

from toolkit.adapters.ansible import InventoryHost, find_inventory, read_inventory, run_playbook
from toolkit.app.profiles import resolve_checked
from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult
from toolkit.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, ToolkitError
from toolkit.core.hostplan.facts import HostFacts, parse_facts, raw_from_json
from toolkit.core.hostplan.plan import Plan, ProfileNeeds, make_plan

if TYPE_CHECKING:  # apply's imports (the wheelhouse, deploy planning) cost `host plan` a second it never uses
    from toolkit.app.apply import ApplyOutcome, ApplyRequest

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
    container_vars: dict[str, Any] = field(default_factory=dict)  # the first container's variables (the plan's)


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
    return HostPlan(path, hosts[host], containers, list(notes), dict(hosts[containers[0]].vars) if containers else {})


# `toolkit host provision all`: every host of the inventory's proxmox_hosts, one after another.
ALL_HOSTS = "all"


def provision_targets(host: str, inventory: str | Path | None) -> list[str]:
    """The hosts a command names: `all` is every host of proxmox_hosts in the inventory's order (a host that fails
    stops the ones after it), anything else the one host (checked by host_plan)."""
    if host != ALL_HOSTS:
        return [host]
    path = find_inventory(inventory)
    found = list(read_inventory(path, "proxmox_hosts"))
    if not found:
        raise ToolkitError.of("the inventory lists no host under proxmox_hosts", file=str(path), field="HOST",
                              fix="add the Proxmox hosts under proxmox_hosts (see inventory/real-host.example.yml)")
    return found


FACTS_TASK = "Facts | read the host"


def facts_of_result(host: str, result: PlaybookResult) -> HostFacts | None:
    """The facts playbook's raw outputs for `host`, parsed; None when the run did not report them."""
    import json

    stdout = result.results_of(FACTS_TASK).get(host, {}).get("stdout")
    try:
        raw = json.loads(stdout) if isinstance(stdout, str) else None
    except ValueError:
        return None
    return parse_facts(host, raw_from_json(raw)) if isinstance(raw, dict) else None


def gather_facts(plan: HostPlan, *, on_event: Callable[[PlaybookEvent], None] | None = None) -> HostFacts:
    """One read-only gathering (playbooks/facts.yml), parsed; every later step of the run uses it."""
    result = run_playbook("facts", inventory=plan.inventory, on_event=on_event, extravars=_host_vars(plan))
    facts = facts_of_result(plan.host.name, result)
    if facts is None:
        why = "; ".join(f.message for f in result.failures) or f"rc {result.rc}"
        raise ToolkitError.of(f"could not read {plan.host.name}'s facts: {why}", file=str(plan.inventory),
                              field=plan.host.name, fix="check that Ansible reaches the host (toolkit doctor HOST)",
                              exit_code=EXIT_FAILED)
    return facts


def _host_vars(plan: HostPlan) -> dict[str, Any]:
    return {"toolkit_hosts": plan.host.name, "toolkit_proxmox_host": plan.host.name}


def profile_needs(profile: str) -> ProfileNeeds:
    """What the plan reads of a profile (resolved and checked first: a bad profile stops here)."""
    spec = resolve_checked(profile).resolved.spec
    server = spec.server
    per_node = spec.target.gpu_count or max(1, server.tp_size * server.pp_size // max(1, server.nnodes))
    return ProfileNeeds(name=profile, sglang_version=spec.engine.sglang_version, gpu_count=per_node,
                        tp_size=server.tp_size, p2p=spec.target.p2p, nnodes=server.nnodes,
                        model_size_gib=spec.model.size_gib, power_limit_w=spec.gpu.power_limit_w)


def plan_variables(plan: HostPlan, extravars: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The variables the plan reads: the host's, then its first GPU container's (its lxc_* ones), -e on top; and
    where each came from."""
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name, values in [(plan.host.name, plan.host.vars), *((c, plan.container_vars) for c in plan.containers[:1])]:
        for key, value in values.items():
            merged.setdefault(key, value)
            origins.setdefault(key, f"inventory: {name}")
    for key, value in extravars.items():
        merged[key] = value
        origins[key] = "-e"
    return merged, origins


def plan_from_facts(plan: HostPlan, facts: HostFacts, profile: str | None, extravars: dict[str, Any]) -> Plan:
    """Facts + the profile's needs + the inventory (and -e) -> the plan, against the compatibility matrix."""
    from toolkit.adapters.compat_store import read_matrix

    needs = profile_needs(profile) if profile else None
    variables, origins = plan_variables(plan, extravars)
    return make_plan(facts, read_matrix(), needs, variables, origins)


def resolve_plan(plan: HostPlan, profile: str | None, extravars: dict[str, Any], *,
                 on_event: Callable[[PlaybookEvent], None] | None = None) -> tuple[HostFacts, Plan]:
    """Facts (one gathering) and the plan. Changes nothing. The profile is resolved first: a bad one stops before
    the host is read."""
    if profile:
        profile_needs(profile)
    facts = gather_facts(plan, on_event=on_event)
    return facts, plan_from_facts(plan, facts, profile, extravars)


class PlanRefused(ToolkitError):
    """The plan did not resolve: nothing was changed on the host."""


def refusal_error(resolved: Plan) -> PlanRefused:
    from toolkit.core.errors import Problem

    return PlanRefused([Problem(f"{r.reason}" + (f" (source: {r.source})" if r.source else ""), field=r.finding,
                                fix=r.fix) for r in resolved.refusals], exit_code=EXIT_BAD_INPUT)


@dataclass
class ProvisionOutcome:
    host: str
    containers: list[str]
    notes: list[str] = field(default_factory=list)  # the inventory's own (what it substitutes for a real host)
    runs: list[dict[str, Any]] = field(default_factory=list)  # one per playbook (and the deploy, on reproduce)
    plan: dict[str, Any] | None = None  # the host plan the run acted on
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
        if self.plan is not None:
            out["plan"] = self.plan
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


def provision(req: HostRequest, plan: HostPlan, run: Callable[..., PlaybookResult], *, profile: str | None = None,
              on_plan: Callable[[Plan], None] | None = None,
              on_message: Callable[[str], None] | None = None) -> ProvisionOutcome:
    """The plan, then host.yml, then (containers) container.yml; stops at the first that fails. `run(book, title,
    **kw)` runs a playbook with the caller's progress display (toolkit.adapters.ansible.run_playbook's keywords).
    The plan reads the host once (facts.yml); one that does not resolve raises before any other playbook (nothing
    stopped or changed); a resolved one's values go to the roles, the run's own -e on top (the plan took them in).
    The plan judges `profile`, else the first of `req.profiles`. `on_plan` sees the plan before anything runs. The
    model cache is sized from `req.profiles`, and how it is sized is said through `on_message` before any run."""
    sized = model_cache_vars(req.profiles)
    planned_profile = profile if profile is not None else (req.profiles[0] if req.profiles else None)
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
    start = time.monotonic()
    result = run("facts", f"facts.yml on {req.host}", inventory=plan.inventory, extravars=_host_vars(plan))
    outcome.runs.append(result_json(result) | {"playbook": "facts.yml",
                                               "duration_s": round(time.monotonic() - start, 1)})
    facts = facts_of_result(req.host, result)
    if facts is None:
        outcome.exit_code = EXIT_FAILED
        return outcome
    resolved = plan_from_facts(plan, facts, planned_profile, req.extravars)
    outcome.plan = resolved.to_json()
    if on_plan is not None:
        on_plan(resolved)
    if not resolved.resolved:
        raise refusal_error(resolved)
    extravars = {**sized, **resolved.extravars(), **req.extravars, "toolkit_hosts": req.host,
                 "toolkit_proxmox_host": req.host}
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
              on_plan: Callable[[Plan], None] | None = None,
              on_message: Callable[[str], None] | None = None) -> ProvisionOutcome:
    """From a bare Proxmox host to a container serving `profile`: host.yml, container.yml, then the profile
    applied to the host's containers (`deploy`: toolkit.app.apply.apply with the caller's progress display)."""
    start = time.monotonic()
    # The profile is resolved first (a bad one stops before any host changes), and its model's size goes to the
    # container role: the model cache's storage is checked against it before anything is made or downloaded.
    outcome = provision(HostRequest(**{**req.__dict__, "containers": True, "profiles": [profile]}), plan, run,
                        profile=profile, on_plan=on_plan, on_message=on_message)
    if outcome.exit_code == EXIT_OK and not req.check:
        deploy_start = time.monotonic()
        limit = ",".join(outcome.containers)
        from toolkit.app.apply import ApplyRequest

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
