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
import dataclasses
import hashlib
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
from toolkit.app.fleet_probe import FleetProbeOutcome
from toolkit.app.profiles import CheckedProfile, resolve_checked
from toolkit.core import deploy, fleet, installer, nccl
from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult
from toolkit.core.engine_lock import parse_lock
from toolkit.core.errors import EXIT_FAILED, EXIT_OK, Problem, ToolkitError
from toolkit.core.probe.verdict import Verdict
from toolkit.core.profile.render import client_url, render_bench_argv
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.validate import SECRET_FILE_ROOTS, SOCKET_IFNAME_VARS, SYSTEM_PREFIXES, dist_port
from toolkit.core.router import DEFAULT_PROMETHEUS_PORT

REMOTE_RUNS_DIR = "/var/lib/toolkit/runs"
# Where the router's venv is on its host (the pinned router installed in it: toolkit.core.router's pin).
ROUTER_VENV = "/opt/sglang/router-venv"
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
    # Where each part of a profile over several hosts runs (toolkit.core.fleet); a one-host profile: SINGLE.
    layout: fleet.Layout | None = None
    # A profile over several hosts: the extravars of playbooks/fleet_preflight.yml (run before deploy.yml).
    preflight: dict[str, Any] = field(default_factory=dict)
    # How --probe measures it: each host itself, or the fleet probe from here (toolkit.core.fleet.probe_plan).
    probe_plan: fleet.ProbePlan = field(default_factory=lambda: fleet.ProbePlan(fleet=False))
    # The fleet probe's benchmark, run over SSH on the probe plan's bench_host, and where it writes its result there.
    fleet_bench_argv: list[str] = field(default_factory=list)
    fleet_bench_result: str = ""
    # The NCCL preflight's bus bandwidth between the hosts (GB/s): what the fleet verdict weighs traffic by.
    network_gb_s: float | None = None


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
    # A deploy over several hosts: the fleet probe's run (its directory, fleet_verdict.json) instead of `probes`.
    fleet_probe: FleetProbeOutcome | None = None

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
        if self.fleet_probe is not None and self.fleet_probe.exit_code:
            return self.fleet_probe.exit_code
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
        if self.fleet_probe is not None:
            out["fleet_probe"] = {"run_dir": str(self.fleet_probe.out), "verdict": self.fleet_probe.verdict}
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
    lay = fleet.layout(resolved, [fleet.Host(n, inventory_address(h)) for n, h in hosts.items()],
                       inventory=str(inventory))
    probe_plan = fleet.probe_plan(lay, router_prometheus_port=DEFAULT_PROMETHEUS_PORT)
    # The fleet probe's samplers own <runs dir>/<run id> on every host: the benchmark's result goes beside it.
    bench_result = f"{remote_run}.bench.jsonl" if probe_plan.fleet else f"{remote_run}/bench.jsonl"
    bench_url = client_url(inputs.host, inputs.port)
    if lay.kind == fleet.REPLICAS and resolved.spec.replicas is not None:
        # The benchmark goes through the router, on its host: what a client of the replica set sees.
        bench_url = client_url(resolved.spec.replicas.router.bind, resolved.spec.replicas.router.port)
        hosts = {n: hosts[n] for n in lay.names}
    bench_argv = render_bench_argv(resolved, base_url=bench_url, output_file=bench_result,
                                   python=inputs.venv_path.rstrip("/") + "/bin/python")
    notes: list[str] = list(lay.notes)
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
    nodes: dict[str, tuple[list[str], str]] = {}
    if lay.kind == fleet.NODES:
        # Node 0's init address as the layout found it (the profile's, or node 0's inventory address).
        server = resolved.spec.server.model_copy(update={"dist_init_addr": lay.dist_init_addr})
        nodes = deploy.per_node(dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"server": server})),
                                lay.names)
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
    # The lock is installed on the host with the pinned uv (toolkit.core.installer), which the sglang_venv role
    # copies to the host's tools/ beside the venvs; its wheel is downloaded once, checked against its sha256.
    status(f"the installer (uv {installer.UV_VERSION}: its wheel from PyPI, once)")
    extravars["sglang_venv_uv_src"] = str(wheelhouse_adapter.installer_binary(lock.python))
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
    preflight: dict[str, Any] = {}
    if lay.kind != fleet.SINGLE:
        extravars.update(fleet_extravars(resolved, lay, nodes, hosts))
        if lay.kind == fleet.REPLICAS:
            from toolkit.adapters.sglang_router import load_pins, router_venv
            from toolkit.core.router import router_pin

            pin = router_pin(load_pins(), str(resolved.spec.engine.sglang_version))
            status(f"the router's wheels ({pin.requirement}: pip download, once)")
            router_venv(pin)  # its wheels downloaded once into the cache, beside a venv that proves they install
        preflight = fleet_preflight_vars(resolved, lay, extravars)
        if probe_plan.fleet:
            # The samplers' venv on every host (bench_probe installs it there); the fleet probe runs it from here.
            extravars.update({"deploy_probe_hosts": list(probe_plan.sampled), "bench_probe_run": False})
        notes += [f"deploy order: {line}" for line in
                  fleet.order(lay, preflight=True, rolls=False).text()]
    secrets, key_vars = _api_key(inputs.api_key_secret, secret_roots(hosts))
    extravars.update(key_vars)
    if os.environ.get("HF_TOKEN"):
        secrets["sglang_venv_hf_token"] = os.environ["HF_TOKEN"]
    return DeployPlan(inputs.profile_name, inventory, extravars, secrets, fetch_dir,
                      [*notes, *amendment.notes], limit, lay, preflight, probe_plan,
                      list(extravars["bench_probe_bench_argv"]) if probe_plan.fleet else [], bench_result)


def inventory_address(host: InventoryHost) -> str:
    """The address the other hosts reach an inventory host at: its ansible_host, else its name."""
    return str(host.vars.get("ansible_host") or host.name)


def spanning_hosts(resolved: ResolvedProfile, inventory: Path, hosts: dict[str, InventoryHost],
                   limit: str | None) -> dict[str, InventoryHost]:
    """The target hosts in the order a profile over several hosts names them (target.hosts for node ranks,
    replicas.hosts for replicas: inventory hosts or groups, each in the inventory's order), narrowed to the
    inventory's gpu_containers and --limit. A profile that names none keeps the inventory's order."""
    spec = resolved.spec
    patterns = spec.replicas.hosts if spec.replicas is not None else spec.target.hosts
    if not patterns:
        return hosts
    out: dict[str, InventoryHost] = {}
    for pattern in patterns:
        matched = read_inventory(inventory, pattern, limit)
        if not matched:
            raise ToolkitError.of(f"{pattern} names no host of the inventory (with --limit {limit})" if limit
                                  else f"{pattern} names no host of the inventory", file=resolved.file,
                                  field="replicas.hosts" if spec.replicas is not None else "target.hosts",
                                  fix=f"name an inventory host or group ({', '.join(hosts) or 'none'} are GPU "
                                  f"containers of {inventory.name}), or leave it unset")
        for name in matched:
            if name not in hosts:
                raise ToolkitError.of(f"{name} (from {pattern}) is not one of the inventory's gpu_containers",
                                      file=resolved.file,
                                      field="replicas.hosts" if spec.replicas is not None else "target.hosts",
                                      fix="name GPU containers only, or add it to the gpu_containers group")
            out.setdefault(name, hosts[name])
    return out


def fleet_extravars(resolved: ResolvedProfile, lay: fleet.Layout, nodes: dict[str, tuple[list[str], str]],
                    hosts: dict[str, InventoryHost]) -> dict[str, Any]:
    """deploy.yml's inputs for a profile over several hosts: the plays' hosts (the layout's, in its order), the
    smoke only where an API answers (node 0), the probe on node 0 or the router's host, the router's unit."""
    out: dict[str, Any] = {"deploy_hosts": lay.names}
    if lay.kind == fleet.NODES:
        out["sglang_service_smoke_by_host"] = {name: False for name in lay.names[1:]}
        out["deploy_probe_hosts"] = lay.names[:1]
    if lay.kind == fleet.REPLICAS and resolved.spec.replicas is not None and lay.router_host:
        from toolkit.adapters.sglang_router import load_pins, venv_directory
        from toolkit.core.router import router_argv, router_pin

        router = resolved.spec.replicas.router
        release = str(resolved.spec.engine.sglang_version)
        pins = load_pins()
        argv = router_argv(release, list(lay.worker_urls), router.policy, router.bind, router.port, pins=pins)
        argv[0] = f"{ROUTER_VENV}/bin/{argv[0]}"
        pin = router_pin(pins, release)
        out.update({
            "sglang_router_requirement": pin.requirement,
            "sglang_router_wheels_src": str(venv_directory(pin) / "wheels"),
            "sglang_router_venv": ROUTER_VENV,
            "deploy_router_host": [lay.router_host],
            "deploy_probe_hosts": [lay.router_host],
            "sglang_router_argv": argv,
            "sglang_router_unit": fleet.router_unit(resolved.name, argv),
            "sglang_router_base_url": client_url(router.bind, router.port),
            "sglang_router_worker_urls": list(lay.worker_urls),
        })
    return out


def fleet_preflight_vars(resolved: ResolvedProfile, lay: fleet.Layout, extravars: dict[str, Any]) -> dict[str, Any]:
    """playbooks/fleet_preflight.yml's inputs: the hosts, node 0 and its init port, NCCL's all-reduce command
    (an overlay may have replaced it through fleet_preflight_* extravars)."""
    out: dict[str, Any] = {"deploy_hosts": lay.names,
                           "sglang_service_name": extravars.get("sglang_service_name", "sglang")}
    if lay.kind == fleet.NODES and lay.node0 is not None and lay.dist_init_addr:
        out.update({
            "fleet_preflight_node0": lay.node0.name,
            "fleet_preflight_init_address": lay.node0.address,
            "fleet_preflight_init_port": dist_port(lay.dist_init_addr),
            # A site's launcher (or the lab's stand-in) goes in front of mpirun: fleet_preflight_nccl_launcher.
            "fleet_preflight_nccl_argv": [*extravars.get("fleet_preflight_nccl_launcher", []),
                                          *nccl.command([h.address for h in lay.hosts],
                                                        resolved.spec.target.gpu_count or 1)],
            "fleet_preflight_nccl_env": {k: v for k, v in resolved.spec.env.items() if k in SOCKET_IFNAME_VARS},
        })
    out.update({k: v for k, v in extravars.items()
                if k.startswith("fleet_preflight_") and k not in ("fleet_preflight_nccl_argv",
                                                                   "fleet_preflight_nccl_launcher")})
    return out


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
    hosts = spanning_hosts(checked.resolved, inventory, hosts, req.limit)
    # One apply or sweep per host at a time (toolkit.adapters.host_lock), taken before anything is prepared for
    # the hosts; a sweep's own applies re-enter it.
    with host_locks({name: h.address for name, h in hosts.items()}, purpose="toolkit apply", wait=req.wait,
                    on_message=on_message):
        deploy_plan = plan(req, checked, inventory, hosts, on_status=on_status)
        for note in deploy_plan.notes:
            on_message(note)
        if deploy_plan.preflight:
            preflight_fleet(deploy_plan, checked.resolved, check=req.check, on_event=on_event,
                            on_message=on_message)
        try:
            result = run_playbook("deploy", inventory=deploy_plan.inventory, extravars=deploy_plan.extravars,
                                  limit=deploy_plan.limit, check=req.check, on_event=on_event,
                                  secrets=deploy_plan.secrets, timeout_s=req.timeout_s)
        except (PlaybookInterrupted, PlaybookTimedOut):
            if req.probe and not deploy_plan.probe_plan.fleet:
                _stop_remote_probe(deploy_plan, req.limit, on_message)
            raise  # the host lock is released on the way out; the command exits 130
        outcome = ApplyOutcome(profile=deploy_plan.profile_name, check=bool(req.check), playbook=result,
                               notes=deploy_plan.notes, artifacts_dir=deploy_plan.fetch_dir)
        if req.probe and deploy_plan.probe_plan.fleet:
            # Measured only once every rank or replica serves (and the router in front): a fleet run of a deploy
            # that failed would judge a half-started model.
            if outcome.deployed and not req.check:
                outcome.fleet_probe = run_fleet_probe(deploy_plan, on_message)
                if req.record:
                    outcome.record = _record_fleet(outcome.fleet_probe, deploy_plan, checked)
            return outcome
    if req.probe:
        # A failed probe's run (benchmark-failed, with the server's log tail) was fetched before the role failed:
        # show its verdict; record only a deploy that succeeded, and only runs that were not failures.
        outcome.probes = _probe_results(deploy_plan.fetch_dir)
        if req.record and result.rc == 0:
            outcome.record = _record(outcome.probes, deploy_plan.profile_name, checked)
    return outcome


PREFLIGHT_REPORT_TASK = "Fleet preflight | report"


def preflight_fleet(deploy_plan: DeployPlan, resolved: ResolvedProfile, *, check: bool,
                    on_event: Callable[[PlaybookEvent], None], on_message: Callable[[str], None]) -> None:
    """Before any model loads on a profile over several hosts: one play over all of them (fleet_preflight.yml)
    reads each host's GPUs and driver, the unit it runs, node 0's init port, NCCL's all-reduce between them; the
    core judges it. A problem raises before deploy.yml runs (nothing changed); a replica set that already serves
    gets its change rolled (deploy_rolling)."""
    lay = deploy_plan.layout
    assert lay is not None
    result = run_playbook("fleet_preflight", inventory=deploy_plan.inventory, extravars=deploy_plan.preflight,
                          check=check, on_event=on_event)
    raw = {h: r.get("msg") for h, r in result.results_of(PREFLIGHT_REPORT_TASK).items()}
    missing = [h for h in lay.names if not isinstance(raw.get(h), dict)]
    if missing or result.rc != 0:
        why = "; ".join(f"{f.host}: {f.message}" for f in result.failures) or "no report"
        raise ToolkitError.of(f"the fleet preflight did not read {', '.join(missing) or 'every host'}: {why}",
                              file=str(deploy_plan.inventory), field=", ".join(missing) or "gpu_containers",
                              fix="make every host reachable (`toolkit host doctor`), then apply again",
                              exit_code=EXIT_FAILED)
    reports = {h: _host_report(dict(raw[h] or {})) for h in lay.names}
    problems = fleet.hardware_problems(resolved, reports, inventory=str(deploy_plan.inventory))
    problems += fleet.init_port_problems(lay, reports, file=resolved.file)
    node0 = raw.get(lay.names[0]) or {}
    if lay.kind == fleet.NODES and not check:
        if node0.get("nccl_tool") is False:
            on_message(f"NCCL preflight skipped: {deploy_plan.preflight['fleet_preflight_nccl_argv'][0]} is not on "
                       f"{lay.names[0]} (nccl-tests' all_reduce_perf under mpirun); the network is first tried by "
                       "the model's load")
        elif node0.get("nccl_tool"):
            parsed = nccl.parse(str(node0.get("nccl_output") or ""))
            verdict = nccl.judge(parsed, expected_ranks=len(lay.hosts) * (resolved.spec.target.gpu_count or 1),
                                 hosts=lay.names, rc=int(node0.get("nccl_rc") or 0))
            for note in verdict.notes:
                on_message(note)
            on_message(f"NCCL preflight ({verdict.kind}): {verdict.text}")
            deploy_plan.network_gb_s = parsed.busbw_gbps
            if not verdict.ok:
                problems.append(Problem(verdict.text, file=resolved.file, field="env.NCCL_SOCKET_IFNAME",
                                        fix="check env.NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name the "
                                        "interface of the hosts' shared network, and that the hosts reach each "
                                        "other on it (NCCL_DEBUG=INFO above says what NCCL tried)"))
    if problems:
        raise ToolkitError(problems)
    new_units = {h: hashlib.sha1(str(deploy_plan.extravars.get("sglang_service_unit_by_host", {}).get(
        h, deploy_plan.extravars["sglang_service_unit"])).encode()).hexdigest() for h in lay.names}
    enabled = resolved.spec.replicas.rolling if resolved.spec.replicas is not None else False
    rolls = fleet.rolling(lay, reports, new_units, enabled)
    deploy_plan.extravars["deploy_rolling"] = rolls
    if rolls:
        on_message("a change to a replica set that serves: rolled one replica at a time, each health-gated; the "
                   "first that fails goes back on its previous unit and the roll stops")


def _host_report(raw: dict[str, Any]) -> fleet.HostReport:
    gpus = []
    for line in raw.get("gpus") or []:
        name, _, driver = str(line).rpartition(",")
        gpus.append((name.strip(), driver.strip()))
    bound, reached = raw.get("bound"), raw.get("reached")
    return fleet.HostReport(tuple(gpus), unit_sha1=raw.get("unit_sha1") or None,
                            port_free=bound if isinstance(bound, bool) else None,
                            port_holder_active=bool(raw.get("active")),
                            reached_node0=reached if isinstance(reached, bool) else None)


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


def fleet_bench_command(ssh: list[str], prefix: list[str], bench_argv: list[str], result_file: str,
                        hf_home: str) -> list[str]:
    """The fleet probe's benchmark, run here: the profile's bench over SSH on the probe host (where its API and
    tokenizer are), then its result file brought to where the probe reads it ($TOOLKIT_PROBE_BENCH_JSONL). The
    benchmark's exit code is the command's."""
    import shlex

    from toolkit.adapters.remote_sampler import remote_argv

    bench = remote_argv(ssh, [*prefix, "env", "HF_HUB_OFFLINE=1", f"HF_HOME={hf_home}", *bench_argv])
    fetch = remote_argv(ssh, [*prefix, "cat", result_file])
    script = (f'{shlex.join(bench)}; rc=$?; {shlex.join(fetch)} > "$TOOLKIT_PROBE_BENCH_JSONL" || '
              'rm -f "$TOOLKIT_PROBE_BENCH_JSONL"; exit $rc')
    return ["sh", "-c", script]


def run_fleet_probe(deploy_plan: DeployPlan, on_message: Callable[[str], None]) -> FleetProbeOutcome:
    """The fleet probe over the deployed layout (toolkit.app.fleet_probe): a sampler on every host, the benchmark
    over SSH on node 0 or the router's host, the NCCL preflight's bandwidth and the router's own per-backend load
    beside it; the run goes where a one-host apply fetches its runs."""
    from toolkit.adapters.remote_sampler import exec_prefix, ssh_argv
    from toolkit.app import fleet_probe

    probe = deploy_plan.probe_plan
    assert probe.bench_host is not None
    host = read_inventory(deploy_plan.inventory, probe.bench_host)[probe.bench_host]
    extravars = deploy_plan.extravars
    command = fleet_bench_command(ssh_argv(host.name, host.vars), exec_prefix(host.name, host.vars),
                                  deploy_plan.fleet_bench_argv, deploy_plan.fleet_bench_result,
                                  str(extravars.get("bench_probe_hf_home") or "/models/huggingface"))
    on_message(f"fleet probe over {', '.join(probe.sampled)} on this machine's clock; the benchmark on "
               f"{probe.bench_host}" + (f", the router's load from {probe.router_metrics_url}"
                                        if probe.router_metrics_url else ""))
    request = fleet_probe.FleetProbeRequest(
        command=command, inventory=str(deploy_plan.inventory), pattern=":".join(probe.sampled),
        out=deploy_plan.fetch_dir, sampler_args=[str(a) for a in extravars.get("bench_probe_probe_args") or []],
        network_gb_s=deploy_plan.network_gb_s, router_metrics_url=probe.router_metrics_url,
        bench_argv=list(deploy_plan.fleet_bench_argv), bench_host=probe.bench_host)
    return fleet_probe.run(request, on_message=on_message)


def _record_fleet(run: FleetProbeOutcome, deploy_plan: DeployPlan, checked: CheckedProfile) -> dict[str, Any]:
    from toolkit.app.record import record_fleet_run

    if run.exit_code:
        return {"recorded": {"fleet": f"skipped: {run.verdict.get('class')} (a failure is not a result)"}}
    outcome = record_fleet_run(run.out, deploy_plan.profile_name, checked.store.dir)
    return {"recorded": {"fleet": f"{outcome.action} in {outcome.file}"}}
