"""Probe a run over several hosts on one clock: one controller, a sampler on each host, the benchmark here.

Each inventory host gets the toolkit's own sampler over SSH (`toolkit probe run --until-eof`: every GPU through
NVML or the host's GPU source, its server's /metrics, its /proc), its clock's offset to this machine's measured
before and after (round-trip bounded, core/probe/clock.py), its interfaces' byte counters read around the
benchmark. The benchmark runs here, on this machine's clock. The hosts' run directories come back under
`hosts/<host>/`; their times are moved onto this clock (`fleet_trace.csv`), and the fleet is judged across nodes
(`fleet_verdict.json`). run.json holds each host's clock with its bound.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from toolkit import __version__
from toolkit.adapters.probe_store import (
    clocks_record,
    read_clocks,
    read_fleet_run,
    read_net,
    router_trace_text,
    write_fleet_record,
)
from toolkit.core.errors import EXIT_FAILED, ToolkitError
from toolkit.core.probe.clock import ClockOffset

DEFAULT_PATTERN = "gpu_containers"
DEFAULT_VENV = "/opt/toolkit/venv"  # bench_probe's bench_probe_venv_path
DEFAULT_RUNS_DIR = "/var/lib/toolkit/runs"  # bench_probe's bench_probe_runs_dir
CLOCK_EXCHANGES = 8
MIN_JUDGED_S = 3.0  # a common judged window shorter than this is not one: the whole benchmark is judged

T = TypeVar("T")


@dataclass
class FleetProbeRequest:
    command: list[str]  # the benchmark, run on this machine
    inventory: str | None = None  # default: find_inventory's
    pattern: str = DEFAULT_PATTERN  # the hosts to sample (an Ansible pattern)
    limit: str | None = None
    idle_s: float = 5.0
    sample_hz: float = 10.0
    out: Path | None = None
    sampler_args: list[str] = field(default_factory=list)  # added to every host's sampler (--server-unit ...)
    network_gb_s: float | None = None  # the measured bus bandwidth between the hosts (the NCCL preflight's)
    backend_load: dict[str, float] | None = None  # a per-backend load from elsewhere (the router's, given)
    router_metrics_url: str | None = None  # the router's Prometheus exposition: its per-backend load, scraped here
    router_hz: float = 2.0


@dataclass
class FleetProbeOutcome:
    out: Path
    verdict: dict[str, Any]
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return EXIT_FAILED if self.verdict["class"] == "benchmark-failed" else 0


@dataclass
class _Host:
    name: str
    ssh: list[str]
    prefix: list[str]  # toolkit_probe_exec_prefix: before every command run on the host
    sampler_argv: list[str]
    remote_dir: str

    def argv(self, *argv: str) -> list[str]:
        return [*self.prefix, *argv]


def _hosts(request: FleetProbeRequest, run_id: str) -> list[_Host]:
    from toolkit.adapters.ansible import find_inventory, read_inventory
    from toolkit.adapters.remote_sampler import exec_prefix, ssh_argv

    inventory = read_inventory(find_inventory(request.inventory), request.pattern, request.limit)
    if not inventory:
        raise ToolkitError.of(f"no host matches {request.pattern!r}" + (f" with --limit {request.limit}"
                              if request.limit else ""), field="--hosts",
                              fix="name the group or hosts that run the deployment (default gpu_containers)")
    out = []
    for name, host in inventory.items():
        v = host.vars
        command = v.get("toolkit_probe_sampler_command") or [
            f"{v.get('bench_probe_venv_path') or DEFAULT_VENV}/bin/toolkit"]
        if isinstance(command, str):
            command = shlex.split(command)
        extra = v.get("toolkit_probe_sampler_args") or []
        if not isinstance(extra, list):
            raise ToolkitError.of(f"{name}'s toolkit_probe_sampler_args is not a list",
                                  field="toolkit_probe_sampler_args",
                                  fix="give a YAML list of `toolkit probe run` options")
        remote_dir = f"{v.get('bench_probe_runs_dir') or DEFAULT_RUNS_DIR}/{run_id}"
        argv = [*map(str, command), "probe", "run", "--until-eof", "--out", remote_dir,
                "--idle-s", f"{request.idle_s:g}", "--hz", f"{request.sample_hz:g}", "--live", "off",
                *map(str, extra), *request.sampler_args]
        prefix = exec_prefix(name, v)
        out.append(_Host(name, ssh_argv(name, v), prefix, [*prefix, *argv], remote_dir))
    return out


def _each(hosts: list[_Host], fn: Callable[[_Host], T]) -> dict[str, T]:
    """fn on every host at once (one SSH round trip's wait, not one per host)."""
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        futures = {h.name: pool.submit(fn, h) for h in hosts}
        return {name: f.result() for name, f in futures.items()}


def _router_timeline(request: FleetProbeRequest, out: Path) -> tuple[Any, Any] | None:
    """The router's per-backend load, scraped here on this clock (a thread beside the benchmark)."""
    if not request.router_metrics_url:
        return None
    from toolkit.adapters import sglang_metrics
    from toolkit.adapters.timeline_thread import TimelineThread

    if not sglang_metrics.available():
        raise ToolkitError.of("the router's metrics need prometheus-client here", field="--router-metrics",
                              fix="pip install prometheus-client (scripts/setup installs it)")
    scraper = sglang_metrics.RouterScraper(request.router_metrics_url)
    return TimelineThread(out / "router_trace.csv", scraper.header(request.router_hz), request.router_hz,
                          scraper.tick, "router"), scraper


def _counters(h: _Host, now_s: Callable[[], float]) -> tuple[float, dict[str, tuple[int, int]]]:
    """The host's interface counters and when they were read on this clock: the middle of the SSH round trip (a
    new connection takes a few hundred ms, which would otherwise shift the window)."""
    from toolkit.adapters.remote_sampler import net_counters

    before = now_s()
    counters = net_counters(h.name, h.ssh, h.prefix)
    return (before + now_s()) / 2, counters


def _or_note(fn: Callable[[], T]) -> tuple[T | None, str]:
    """fn's result and no note, or no result and why (its ToolkitError's message)."""
    try:
        return fn(), ""
    except ToolkitError as err:
        return None, "; ".join(p.message for p in err.problems)


def _clock(h: _Host) -> ClockOffset:
    from toolkit.adapters.clock_exchange import exchange_burst

    return exchange_burst(h.name, h.ssh, count=CLOCK_EXCHANGES, remote_shell=bool(h.ssh), host_prefix=h.prefix)


def run(request: FleetProbeRequest, on_message: Callable[[str], None] = lambda _m: None) -> FleetProbeOutcome:
    """Sample every host while the benchmark runs here; bring the runs back, merge on this clock, judge."""
    from toolkit.adapters.bench_process import stop_process, tail
    from toolkit.adapters.remote_sampler import RemoteSampler, fetch_dir
    from toolkit.core.probe.clock import HostClock
    from toolkit.core.text import redact_argv

    if not request.command:
        raise ToolkitError.of("no benchmark to run", field="command",
                              fix="give the benchmark after --: toolkit probe run --fleet -- CMD ...")
    if not 0 < request.sample_hz <= 100:
        raise ToolkitError.of(f"--hz {request.sample_hz} is out of range", field="--hz", fix="use 1 to 100")
    if request.idle_s < 0:
        raise ToolkitError.of("--idle-s must be >= 0", field="--idle-s", fix="e.g. --idle-s 5")
    if request.network_gb_s is not None and request.network_gb_s <= 0:
        raise ToolkitError.of("--network-gb-s must be > 0", field="--network-gb-s",
                              fix="give the NCCL preflight's bus bandwidth in GB/s")
    out = request.out or Path("runs") / time.strftime("fleet-%Y%m%dT%H%M%SZ", time.gmtime())
    # What a deploy fetched there first (apply's <host>/server_info.json) may stay; a run never is overwritten.
    if (out / "run.json").exists() or (out / "hosts").exists():
        raise ToolkitError.of("already holds a run", file=str(out), field="--out",
                              fix="choose a new --out directory (runs are never overwritten)")
    hosts = _hosts(request, out.name)
    t0 = time.monotonic()
    t0_epoch_ns = time.time_ns()

    def now_s() -> float:
        return time.monotonic() - t0

    on_message(f"clocks of {', '.join(h.name for h in hosts)} against this machine's ...")
    # Before anything is written: a host that does not answer is exit 2 with nothing to clean up.
    start_offsets = _each(hosts, _clock)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hosts").mkdir(exist_ok=True)
    manifest: dict[str, Any] = {
        "toolkit_version": __version__, "kind": "fleet", "controller": socket.gethostname(),
        "started_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "clock": "seconds since the run's start on time.monotonic() of the controller",
        "clock_origin_epoch_ns": t0_epoch_ns, "hosts": [h.name for h in hosts], "sample_hz": request.sample_hz,
        "idle_s": request.idle_s, "command": redact_argv(request.command), "network_gb_s": request.network_gb_s,
        "status": "running",
    }
    write_fleet_record(out, "run.json", manifest)
    samplers = {h.name: RemoteSampler(h.name, h.ssh, h.sampler_argv, out / "hosts" / f"{h.name}.sampler.log")
                for h in hosts}
    interrupted = False
    exit_code: int | None = None
    net_a: dict[str, Any] = {}
    net_b: dict[str, Any] = {}
    bench_start_s = bench_end_s = idle_start_s = 0.0
    router = _router_timeline(request, out)
    try:
        for s in samplers.values():
            s.start()
        on_message("samplers starting on every host ...")
        _each(hosts, lambda h: samplers[h.name].wait_ready())
        idle_start_s = now_s()
        if router is not None:
            router[0].start(t0)
        time.sleep(request.idle_s)
        net_a = _each(hosts, lambda h: _counters(h, now_s))
        env = dict(os.environ, TOOLKIT_PROBE_BENCH_JSONL=str((out / "bench.jsonl").resolve()),
                   TOOLKIT_PROBE_OUT=str(out.resolve()))
        bench_start_s = now_s()
        on_message("benchmark running ...")
        with (out / "bench.stdout.log").open("wb") as so, (out / "bench.stderr.log").open("wb") as se:
            try:
                proc = subprocess.Popen(request.command, stdout=so, stderr=se, env=env)
            except OSError as err:
                raise ToolkitError.of(f"cannot start the benchmark: {err}", field="command",
                                      fix="check the command after `--` (is it installed, on PATH?)") from None
            try:
                exit_code = proc.wait()
            except KeyboardInterrupt:
                interrupted = True
                stop_process(proc)
                exit_code = proc.returncode
        bench_end_s = now_s()
        net_b = _each(hosts, lambda h: _counters(h, now_s))
    except ToolkitError as err:
        # A sampler that never sampled, a host gone mid-run: what the hosts wrote stays on them, this run is marked.
        manifest.update({"status": "failed", "error": "; ".join(p.message for p in err.problems)})
        write_fleet_record(out, "run.json", manifest)
        raise
    finally:
        if router is not None:
            router[0].stop()
        # When each host's run was ended, on this clock: the host's own end of it (its bench_end_s) merged must
        # land just after (one of its ticks, the pipe's latency), which checks the merge end to end.
        stopped = _each(hosts, lambda h: (round(now_s(), 4), samplers[h.name].stop()))
    on_message("samplers stopped; clocks again, then the runs fetched ...")
    # A host that stops answering now must not cost the others' run: its start offset stands for its end (said),
    # and a run that cannot be fetched is left out of the merge (said), the rest judged.
    end_offsets = _each(hosts, lambda h: _or_note(lambda: _clock(h)))
    fetched = _each(hosts, lambda h: _or_note(
        lambda: fetch_dir(h.name, h.ssh, h.remote_dir, out / "hosts" / h.name, h.prefix)))
    notes = [f"{h}: the clock at the end was not measured ({why}); its start offset is used" for h, (_, why)
             in end_offsets.items() if why] + [f"{h}: its run was not fetched ({why}); it is left out"
                                               for h, (_, why) in fetched.items() if why]
    clocks = [HostClock(start_offsets[h.name], end_offsets[h.name][0] or start_offsets[h.name]) for h in hosts]
    manifest.update({
        "status": "interrupted" if interrupted else "finished",
        "idle_start_s": round(idle_start_s, 4), "idle_end_s": round(bench_start_s, 4),
        "bench_start_s": round(bench_start_s, 4), "bench_end_s": round(bench_end_s, 4),
        "exit_code": exit_code, "interrupted": interrupted, "stderr_tail": tail(out / "bench.stderr.log"),
        "sampler_exit_codes": {h: code for h, (_, code) in stopped.items()},
        "sampler_stopped_s": {h: at for h, (at, _) in stopped.items()},
        "host_runs": {h.name: f"hosts/{h.name}" for h in hosts if fetched[h.name][0] is not None},
        "host_files": {h: names for h, (names, _) in fetched.items() if names is not None},
        "notes": notes,
        "net_counters": {h: {"start": {"t_s": round(net_a[h][0], 4), "bytes": net_a[h][1]},
                             "end": {"t_s": round(net_b[h][0], 4), "bytes": net_b[h][1]}}
                         for h in net_a if h in net_b},
        "backend_load": request.backend_load,
        "router": {"metrics_url": request.router_metrics_url, "scrapes": router[1].rows, "gaps": router[1].gaps,
                   "cost": router[0].cost()} if router is not None else None,
        "clocks": clocks_record(clocks),
    })
    write_fleet_record(out, "run.json", manifest)
    verdict = judge_fleet_dir(out, write=True)
    return FleetProbeOutcome(out, verdict, interrupted)


def judge_fleet_dir(out: Path, *, write: bool) -> dict[str, Any]:
    """A fleet run's directory merged on the controller's clock and judged across nodes (a replay of a recorded
    one is this too); with `write`, fleet_trace.csv and fleet_verdict.json are (re)written."""
    from toolkit.adapters.bench_process import read_bench_jsonl
    from toolkit.adapters.files import write_atomic
    from toolkit.adapters.probe_store import load_run
    from toolkit.core.probe.bench import normalize_bench_result
    from toolkit.core.probe.fleet import (
        HostRun,
        NetCounters,
        aligned,
        dump_fleet_trace,
        fleet_figures,
        host_figures,
        node_verdict,
    )
    from toolkit.core.probe.fleet_verdict import judge_fleet
    from toolkit.core.probe.records import RunRecord
    from toolkit.core.probe.router_trace import LOAD_IS, backend_load, busy_span
    from toolkit.core.probe.server_trace import counter_delta

    manifest = read_fleet_run(out)
    clocks = {c.host: c for c in read_clocks(manifest)}
    origin_ns = int(manifest["clock_origin_epoch_ns"])
    start_s, end_s = float(manifest["bench_start_s"]), float(manifest["bench_end_s"])
    nets = manifest.get("net_counters") or {}
    runs: list[HostRun] = []
    manifests: dict[str, tuple[RunRecord, dict[str, Any]]] = {}
    for host, rel in sorted((manifest.get("host_runs") or {}).items()):
        loaded = load_run(out / rel)
        m = loaded.manifest
        net = None
        if host in nets:
            a, b = nets[host]["start"], nets[host]["end"]
            net = (NetCounters(float(a["t_s"]), {k: (int(v[0]), int(v[1])) for k, v in a["bytes"].items()}),
                   NetCounters(float(b["t_s"]), {k: (int(v[0]), int(v[1])) for k, v in b["bytes"].items()}))
        raw = HostRun(host, loaded.trace, loaded.server, loaded.host, clocks.get(host),
                      float(m.idle_start_s or 0.0), float(m.idle_end_s or 0.0), net, read_net(out / rel))
        runs.append(aligned(raw, int(m.extra["clock_origin_epoch_ns"]), origin_ns))
        manifests[host] = (m, loaded.topology)
    per_host = {r.host: host_figures(r, start_s, end_s) for r in runs}
    for r in runs:
        per_host[r.host]["verdict"] = node_verdict(r, *manifests[r.host], start_s, end_s)
    # The classes are judged over the nodes' common judged (steady) window, the figures over the whole benchmark.
    spans = [fig["verdict"]["judged_s"] for fig in per_host.values()]
    judged_s = (max(a for a, _ in spans), min(b for _, b in spans)) if spans else (start_s, end_s)
    router_text = router_trace_text(out)
    busy = busy_span(router_text, start_s, end_s, str(out / "router_trace.csv")) if router_text else None
    if busy is not None and min(judged_s[1], busy[1]) - max(judged_s[0], busy[0]) >= MIN_JUDGED_S:
        # Replicas: judged while the router had requests in flight. A replica idle through the benchmark's
        # start-up sits at its lowest clock; over half the window, its median clock would read as a slow node
        # (seen in the lab with 160 prompts: 7 s of load in a 13 s window).
        judged_s = (max(judged_s[0], busy[0]), min(judged_s[1], busy[1]))
    judged = ({r.host: host_figures(r, *judged_s) for r in runs} if judged_s[1] - judged_s[0] >= MIN_JUDGED_S
              else None)
    bench = normalize_bench_result(read_bench_jsonl(out / "bench.jsonl"))
    load, load_is = manifest.get("backend_load"), "as given"
    if router_text is not None:
        load, load_is = backend_load(router_text, start_s, end_s, str(out / "router_trace.csv")), LOAD_IS
    elif load is None:
        # Replicas: each host's own server counts what the router sent it (a rank that serves nothing has no
        # counter and is left out: one model across hosts has one front end).
        served = {r.host: counter_delta(r.server, "num_requests_total", start_s, end_s) for r in runs if r.server}
        load, load_is = {h: d[0] for h, d in served.items() if d is not None}, "requests each host's server counted"
    exit_code = manifest.get("exit_code")
    failed = (f"exit code {exit_code}" if exit_code not in (0, None) else
              "interrupted" if manifest.get("interrupted") else None)
    verdict = judge_fleet(per_host, fleet_figures(per_host, bench.get("total_output_tokens")),
                          clocks=list(clocks.values()), sample_interval_s=1.0 / float(manifest["sample_hz"]),
                          network_gb_s=manifest.get("network_gb_s"), backend_load=load, backend_load_is=load_is,
                          bench_failed=failed, notes=manifest.get("notes") or [], judged=judged)
    verdict["judged_s"] = [round(t, 3) for t in judged_s] if judged is not None else [start_s, end_s]
    if write:
        write_atomic(out / "fleet_trace.csv", dump_fleet_trace(runs))
        write_fleet_record(out, "fleet_verdict.json", verdict)
    return verdict
