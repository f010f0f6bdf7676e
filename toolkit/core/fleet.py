"""A deploy over several hosts: which inventory host is which node rank or replica, node 0's init address, the
router's backends, the order the plays run in, and the checks of what the hosts report before the model loads
(the same GPUs and driver on each, the init port free on node 0 and reachable from the others).

Pure: the inventory's hosts and the preflight's reports come in as data (toolkit.app.apply reads them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.validate import DEFAULT_DIST_INIT_PORT, DIST_PORT_SPAN, dist_host, dist_port

SINGLE, NODES, REPLICAS = "single", "nodes", "replicas"


@dataclass(frozen=True)
class Host:
    """An inventory host as the layout needs it: its name and the address the other hosts reach it at."""

    name: str
    address: str  # ansible_host, else the name


@dataclass(frozen=True)
class Layout:
    """Where each part of the profile runs, in order."""

    kind: str  # SINGLE, NODES or REPLICAS
    hosts: tuple[Host, ...]  # node 0 first, or replica 0 first; SINGLE: every target host runs the same unit
    dist_init_addr: str | None = None  # NODES: node 0's address and the init port
    router_host: str | None = None  # REPLICAS: the inventory host the router runs on
    worker_urls: tuple[str, ...] = ()  # REPLICAS: each replica's base URL, as the router reaches it
    notes: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def node0(self) -> Host | None:
        return self.hosts[0] if self.kind == NODES else None


def _url_host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def layout(resolved: ResolvedProfile, hosts: Sequence[Host], *, inventory: str) -> Layout:
    """The deploy's layout over the target hosts (in the order the profile's target.hosts or replicas.hosts put
    them, else the inventory's). Refuses, naming the field and the fix, too few hosts, too many nodes, and a
    dist_init_addr that is not node 0's."""
    spec = resolved.spec
    server, replicas = spec.server, spec.replicas
    if replicas is not None:
        return _replica_layout(resolved, hosts, inventory)
    if server.nnodes <= 1:
        return Layout(SINGLE, tuple(hosts))
    if len(hosts) != server.nnodes:
        field_name = "target.hosts" if spec.target.hosts else "server.nnodes"
        raise ToolkitError.of(
            f"server.nnodes is {server.nnodes} but the inventory deploys {len(hosts)} host(s): "
            f"{', '.join(h.name for h in hosts) or 'none'}", file=resolved.file, field=field_name,
            fix=f"name {server.nnodes} hosts in target.hosts (node 0 first), or list {server.nnodes} in the "
            "inventory's gpu_containers group, or use --limit")
    node0 = hosts[0]
    notes: list[str] = []
    if server.dist_init_addr:
        given = dist_host(server.dist_init_addr)
        port = dist_port(server.dist_init_addr) or DEFAULT_DIST_INIT_PORT
        if given not in (node0.address, node0.name):
            raise ToolkitError.of(
                f"dist_init_addr {server.dist_init_addr} is not node 0's: node 0 is {node0.name} at "
                f"{node0.address} (the first of {', '.join(h.name for h in hosts)})", file=resolved.file,
                field="server.dist_init_addr",
                fix=f"set it to {_url_host(node0.address)}:{port}, leave it unset (apply then uses node 0's "
                "inventory address), or put that host first in target.hosts")
        addr = f"{_url_host(node0.address)}:{port}"
    else:
        addr = f"{_url_host(node0.address)}:{DEFAULT_DIST_INIT_PORT}"
        notes.append(f"dist_init_addr {addr}: node 0 ({node0.name})'s inventory address, the default init port")
    return Layout(NODES, tuple(hosts), dist_init_addr=addr, notes=tuple(notes))


def _replica_layout(resolved: ResolvedProfile, hosts: Sequence[Host], inventory: str) -> Layout:
    spec = resolved.spec
    replicas = spec.replicas
    assert replicas is not None
    if len(hosts) < replicas.count:
        raise ToolkitError.of(
            f"replicas.count is {replicas.count} but the inventory deploys {len(hosts)} host(s): "
            f"{', '.join(h.name for h in hosts) or 'none'} (one replica a host)", file=resolved.file,
            field="replicas.hosts" if replicas.hosts else "replicas.count",
            fix=f"name {replicas.count} hosts in replicas.hosts, list them in the inventory's gpu_containers, or "
            "lower replicas.count")
    chosen = tuple(hosts[: replicas.count])
    notes = []
    if len(hosts) > replicas.count:
        notes.append(f"{replicas.count} replica(s) on {', '.join(h.name for h in chosen)}; "
                     f"{', '.join(h.name for h in hosts[replicas.count:])} left as they are")
    router = replicas.router.host or chosen[0].name
    if router not in {h.name for h in chosen}:
        raise ToolkitError.of(f"replicas.router.host {router} is not one of the replicas' hosts "
                              f"({', '.join(h.name for h in chosen)})", file=resolved.file,
                              field="replicas.router.host",
                              fix="run the router on one of the replicas' hosts, or leave it unset (the first)")
    urls = tuple(f"http://{_url_host(h.address)}:{spec.server.port}" for h in chosen)
    return Layout(REPLICAS, chosen, router_host=router, worker_urls=urls, notes=tuple(notes))


@dataclass(frozen=True)
class HostReport:
    """What the fleet preflight read on one host: its GPUs (nvidia-smi's name and driver per GPU), the unit now
    installed (its sha1; None: none yet), and node 0's init port."""

    gpus: tuple[tuple[str, str], ...]  # (name, driver_version) per GPU
    unit_sha1: str | None = None
    port_free: bool | None = None  # node 0 only: could the preflight bind the init port
    port_holder_active: bool = False  # node 0 only: the service is running (and may hold the port itself)
    reached_node0: bool | None = None  # other nodes: did a connection to node 0's init port open


def hardware_problems(resolved: ResolvedProfile, reports: Mapping[str, HostReport], *, inventory: str) -> list[Problem]:
    """The same GPUs and driver on every host, and as many GPUs as the profile's target has per node: SGLang's
    ranks assume it (one model split evenly; NCCL between different driver branches fails at init)."""
    out: list[Problem] = []
    want = resolved.spec.target.gpu_count
    for host, rep in reports.items():
        if want is not None and len(rep.gpus) != want:
            out.append(Problem(f"{host} has {len(rep.gpus)} GPU(s), the profile {want} per node",
                               file=inventory, field=f"{host}.lxc_gpu_container_gpus",
                               fix=f"give the container {want} GPUs (lxc_gpu_container_gpus), or deploy a profile "
                               "made for this host"))
    models = {host: sorted({n for n, _ in rep.gpus}) for host, rep in reports.items() if rep.gpus}
    drivers = {host: sorted({d for _, d in rep.gpus}) for host, rep in reports.items() if rep.gpus}
    for what, seen, fix in (
        ("GPUs", models, "deploy over hosts with the same GPU model, or give each its own profile"),
        ("driver", drivers, "install the same driver on every Proxmox host (proxmox_gpu_host_driver_version), "
         "then `toolkit host provision HOST` on the odd one"),
    ):
        distinct = {tuple(v) for v in seen.values()}
        if len(distinct) > 1:
            listing = "; ".join(f"{h}: {', '.join(v)}" for h, v in seen.items())
            out.append(Problem(f"the hosts differ in their {what}: {listing}", file=inventory,
                               field="proxmox_gpu_host_driver_version" if what == "driver" else "gpu_containers",
                               fix=fix))
    return out


def init_port_problems(lay: Layout, reports: Mapping[str, HostReport], *, file: str) -> list[Problem]:
    """Node 0's init port free (or held by the service already running there) and reachable from every other
    node: otherwise the ranks wait at init until SGLang's timeout, minutes into a load."""
    if lay.kind != NODES or lay.node0 is None or not lay.dist_init_addr:
        return []
    node0 = lay.node0
    port = dist_port(lay.dist_init_addr) or DEFAULT_DIST_INIT_PORT
    out: list[Problem] = []
    rep0 = reports.get(node0.name)
    if rep0 is not None and rep0.port_free is False and not rep0.port_holder_active:
        out.append(Problem(f"port {port} on node 0 ({node0.name}) is taken by another program: SGLang's init "
                           f"(dist_init_addr {lay.dist_init_addr}) cannot listen there", file=file,
                           field="server.dist_init_addr",
                           fix=f"stop what listens there (`ss -ltnp 'sport = :{port}'` on {node0.name}), or "
                           f"choose another port in dist_init_addr (and keep the {DIST_PORT_SPAN} after it free)"))
    for host in lay.hosts[1:]:
        rep = reports.get(host.name)
        if rep is not None and rep.reached_node0 is False:
            out.append(Problem(f"{host.name} cannot reach node 0's init address {lay.dist_init_addr}", file=file,
                               field="server.dist_init_addr",
                               fix=f"open TCP {port} to {port + DIST_PORT_SPAN} on {node0.name} for the other "
                               "nodes (a firewall, the bridge), or set dist_init_addr to an address they reach"))
    return out


def rolling(lay: Layout, reports: Mapping[str, HostReport], new_unit_sha1: Mapping[str, str],
            enabled: bool) -> bool:
    """Whether a replica set changes one replica at a time: it has replicas, at least one of them already runs a
    unit, and some replica's unit changes. A first deploy (no unit anywhere) starts every replica at once."""
    if lay.kind != REPLICAS or not enabled or len(lay.hosts) < 2:
        return False
    running = [h.name for h in lay.hosts if (reports.get(h.name) or HostReport(())).unit_sha1]
    changed = [h.name for h in lay.hosts
               if (reports.get(h.name) or HostReport(())).unit_sha1 != new_unit_sha1.get(h.name)]
    return bool(running) and bool(changed)


@dataclass(frozen=True)
class Step:
    """One step of the deploy's order: a play and the hosts it runs on at once."""

    what: str
    hosts: tuple[str, ...]
    serial: int | None = None  # None: all of them at once


@dataclass(frozen=True)
class Order:
    steps: tuple[Step, ...] = field(default_factory=tuple)

    def text(self) -> list[str]:
        return [f"{i}. {s.what} on {', '.join(s.hosts)}"
                + (f", {s.serial} at a time" if s.serial else (", at once" if len(s.hosts) > 1 else ""))
                for i, s in enumerate(self.steps, 1)]


def order(lay: Layout, *, preflight: bool, rolls: bool) -> Order:
    """The deploy's order: the fleet preflight (GPUs, driver, init port, NCCL) over every host at once, before
    any model loads; the ranks or replicas at once (a rolling change one replica at a time, stopping at the
    first that fails); the router last, once every backend answers."""
    names = tuple(lay.names)
    steps = []
    if preflight:
        steps.append(Step("fleet preflight (GPUs and driver alike, init port, NCCL all-reduce)", names))
    if lay.kind == NODES:
        steps.append(Step(f"the {len(names)} node ranks (node 0: {names[0]})", names))
    elif lay.kind == REPLICAS:
        steps.append(Step("the replicas, health-gated, the failed one back on its previous unit"
                          if rolls else "the replicas", names, 1 if rolls else None))
    else:
        steps.append(Step("the server", names))
    if lay.kind == REPLICAS and lay.router_host:
        steps.append(Step(f"SGLang's router over {len(lay.worker_urls)} backends, once each answers",
                          (lay.router_host,)))
    return Order(tuple(steps))


ROUTER_SERVICE = "sglang-router"


def router_unit(profile: str, argv: Sequence[str]) -> str:
    """The systemd unit of SGLang's router for a replica set: the argv as the router's release takes it
    (toolkit.core.router.router_argv), restarted on failure like the server's."""
    from toolkit.core.profile.render import systemd_specifiers, systemd_word

    exec_start = " \\\n    ".join(systemd_word(a) for a in argv)
    return (f"# Generated by toolkit from profile {profile}: SGLang's router in front of its replicas; edit the "
            "profile, not this file.\n"
            "[Unit]\n"
            f"Description=SGLang router (toolkit profile {systemd_specifiers(profile)})\n"
            "After=network-online.target\nWants=network-online.target\n\n"
            "[Service]\nType=exec\n"
            f"ExecStart={exec_start}\n"
            "Restart=on-failure\nRestartSec=5\nLimitNOFILE=1048576\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


@dataclass(frozen=True)
class ProbePlan:
    """How `toolkit apply --probe` measures a layout. One host's server (SINGLE): each target host probes itself
    (bench_probe's run on the host, its run fetched). A deploy over several hosts: the fleet probe, driven from
    the controller on one clock: a sampler on every host of the layout (`sampled`), the benchmark over SSH on
    `bench_host` (node 0, whose API is the model's; or the router's host, the benchmark through the router), the
    router's own per-backend load from its Prometheus exporter (`router_metrics_url`) for replicas."""

    fleet: bool
    sampled: tuple[str, ...] = ()
    bench_host: str | None = None
    router_metrics_url: str | None = None


def probe_plan(lay: Layout, *, router_prometheus_port: int | None = None) -> ProbePlan:
    """Which probe a layout gets (pure: the layout in, the plan out)."""
    if lay.kind == SINGLE:
        return ProbePlan(fleet=False)
    if lay.kind == NODES:
        return ProbePlan(fleet=True, sampled=tuple(lay.names), bench_host=lay.names[0])
    by_name = {h.name: h for h in lay.hosts}
    router = by_name[lay.router_host] if lay.router_host in by_name else lay.hosts[0]
    url = (f"http://{_url_host(router.address)}:{router_prometheus_port}/metrics"
           if router_prometheus_port is not None else None)
    return ProbePlan(fleet=True, sampled=tuple(lay.names), bench_host=router.name, router_metrics_url=url)
