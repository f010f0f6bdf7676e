"""Probe a run: an idle baseline, then the benchmark while every GPU is sampled, the side timelines (the server's
/metrics, the host's /proc) beside it, the artifacts written, the run judged, and (asked) recorded.

Needs only the standard library, pynvml and rich on the GPU machine (which has no pydantic): the profile code is
imported only when a profile is named, the recorder only when asked to record.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from toolkit import __version__
from toolkit.adapters.probe_store import write_judged, write_run_record, write_topology
from toolkit.core.errors import EXIT_FAILED, ToolkitError
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.verdict import Verdict
from toolkit.core.provenance import mark

DEFAULT_STEADY = {"plateau_fraction": 0.8, "smooth_s": 2.0, "min_window_s": 5.0}
ARTIFACT_FILES = ("run.json", "trace.csv", "bench.jsonl", "bench.stdout.log", "bench.stderr.log", "topology.json",
                  "summary.json", "verdict.json")

Tick = Callable[[str, float, list[dict[str, Any]]], None]


class Display(Protocol):
    """A live view of the sampling (the command's rich table): entered around the run, fed every tick."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...

    def on_tick(self, phase: str, t_s: float, rows: list[dict[str, Any]]) -> None: ...


@dataclass
class ProbeRequest:
    """What to probe. Unset figures come from the profile (when one is named), else the defaults here."""

    command: list[str] = field(default_factory=list)  # the benchmark; empty: the profile's bench_serving
    gpus: list[int] | None = None  # NVML indices; None: all
    idle_s: float | None = None
    sample_hz: float | None = None
    out: Path | None = None  # default runs/probe-<UTC time>
    profile: str | None = None
    base_url: str | None = None  # the server the profile's bench targets; default: the profile's server
    target: dict[str, Any] = field(default_factory=dict)  # merged over the profile's run target
    gpu_source: str = "nvml"  # nvml, replay:FILE, or a plug-in's NAME:ARG (toolkit.app.plugins)
    gpm: bool = True
    energy_interval_s: float | None = None
    host_hz: float = 2.0
    server_url: str | None = None  # default: the profile's server
    server_hz: float | None = None
    server_pid: int | None = None
    server_unit: str | None = None
    record: bool = False
    # A fleet's per-host sampler: no benchmark here (the controller runs it); sample until stdin closes, write
    # the run directory with its clock's origin, and leave the judging to the controller.
    until_eof: bool = False


# The sampler's stand-in for a benchmark: it inherits the probe's stdin (the controller's SSH session) and ends when
# the controller closes it, which ends the run as a benchmark's exit would.
UNTIL_EOF_ARGV = ("-c", "import sys; sys.stdin.buffer.read()")


@dataclass
class ProbeOutcome:
    out: Path
    summary: Summary
    verdict: Verdict
    interrupted: bool
    record: Any = None  # the recorder's outcome (toolkit.app.record.RecordOutcome) when recorded
    not_recorded: str | None = None  # why a requested record was not made

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return EXIT_FAILED if self.verdict.failed else 0


@dataclass
class _Plan:
    argv: list[str]
    idle_s: float = 10.0
    sample_hz: float = 10.0
    steady_state: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    server_url: str | None = None
    server_scrape_hz: float = 2.0


def _profile_plan(name: str, base_url: str | None, bench_jsonl: Path, argv: list[str]) -> _Plan:
    """The profile's bench command (unless `argv` is given), probe settings and target."""
    import sys

    from toolkit.app.profiles import open_store
    from toolkit.core.probe.knobs import run_target
    from toolkit.core.profile.render import client_url, render_bench_argv

    store = open_store()
    resolved = store.resolve(name)
    spec = resolved.spec
    server_url = client_url(spec.server.host, spec.server.port)
    return _Plan(
        argv=argv or render_bench_argv(resolved, base_url=base_url or server_url, output_file=str(bench_jsonl),
                                       python=sys.executable),
        idle_s=float(spec.probe.idle_s),
        sample_hz=float(spec.probe.sample_hz),
        steady_state=spec.probe.steady_state.model_dump(),
        # Next steps name only variants that exist beside this profile, and the knobs' current values.
        target=run_target(resolved.name, spec.model_dump(mode="json"), set(store.names())),
        server_url=server_url,
        server_scrape_hz=float(spec.probe.server_scrape_hz),
    )


def open_sampler(source: str, *, gpm: bool, energy_interval_s: float | None) -> Any:
    """The GPU sampler for `--gpu-source`: NVML, a recorded trace, or a plug-in's; each declares its provenance."""
    name, _, arg = source.partition(":")
    if name == "nvml" and not arg:
        from toolkit.adapters.nvml import ENERGY_INTERVAL_S, NvmlSampler

        interval = ENERGY_INTERVAL_S if energy_interval_s is None else energy_interval_s
        return NvmlSampler(gpm=gpm, energy_interval_s=interval)
    if not arg:
        raise ToolkitError.of(f"{source!r} names no argument", field="--gpu-source",
                              fix="give nvml, replay:TRACE.csv, or NAME:ARG of an installed GPU source")
    if name == "replay":
        from toolkit.adapters.probe_store import read_run_record, read_topology, read_trace
        from toolkit.core.probe.sampler import RecordedSampler

        path = Path(arg)
        # The recording's own run.json gives its phases, so the replay follows this run's idle and benchmark.
        recorded = read_run_record(path.parent) if (path.parent / "run.json").exists() else None
        return RecordedSampler(read_trace(path), str(path), read_topology(path.parent), recorded)
    from toolkit.app import plugins

    factory = plugins.load("gpu_sources", name, field="--gpu-source",
                           fix="give nvml or replay:TRACE.csv, or install the package that provides it")
    return factory(arg)


def check_recordable(profile: str | None) -> None:
    """Checked before anything runs: a missing profile or a broken results block is exit 2, not an error after
    a long benchmark."""
    if not profile:
        raise ToolkitError.of("--record needs --profile NAME (the profile the results go into)", field="--record",
                              fix="add --profile NAME, or record later with "
                              "`toolkit results record DIR --profile NAME`")
    from toolkit.app.record import load_results

    load_results(profile)


def run(request: ProbeRequest, display: Display | None = None) -> ProbeOutcome:
    """Probe one benchmark. Bad input raises ToolkitError (exit 2) before the sampler opens or anything starts;
    no driver or no GPU is exit 2 with nothing run; a full disk mid-run is exit 1 with the cut files removed."""
    if request.record:
        check_recordable(request.profile)
    out = request.out or Path("runs") / time.strftime("probe-%Y%m%dT%H%M%SZ", time.gmtime())
    if out.exists() and any(p.name in ("run.json", "trace.csv") for p in out.iterdir()):
        raise ToolkitError.of("already holds a probe run", file=str(out), field="--out",
                              fix="choose a new --out directory (runs are never overwritten)")
    bench_jsonl = out / "bench.jsonl"
    if request.until_eof:
        if request.command or request.record:
            raise ToolkitError.of("--until-eof samples for a fleet's controller: it runs no benchmark and records "
                                  "nothing here", field="--until-eof",
                                  fix="drop the command after -- and --record (the controller runs and records)")
        import sys

        request = replace(request, command=[sys.executable, *UNTIL_EOF_ARGV])
    plan = (_profile_plan(request.profile, request.base_url, bench_jsonl.resolve(), list(request.command))
            if request.profile else _Plan(argv=list(request.command)))
    plan.target = {**plan.target, **request.target}
    if not plan.argv:
        raise ToolkitError.of("no benchmark to run", field="command",
                              fix="give --profile NAME, or the benchmark after --: toolkit probe run -- CMD ...")
    if shutil.which(plan.argv[0]) is None:
        raise ToolkitError.of(f"benchmark command {plan.argv[0]!r} not found", field="command",
                              fix="give an installed program (or a path to one) after --")
    idle_s = request.idle_s if request.idle_s is not None else plan.idle_s
    hz = request.sample_hz if request.sample_hz is not None else plan.sample_hz
    if hz <= 0 or hz > 100:
        raise ToolkitError.of(f"--hz {hz} is out of range", field="--hz", fix="use 1 to 100 samples per second")
    if idle_s < 0:
        raise ToolkitError.of("--idle-s must be >= 0", field="--idle-s", fix="e.g. --idle-s 10")
    if request.host_hz < 0 or request.host_hz > 20:
        raise ToolkitError.of(f"--host-hz {request.host_hz} is out of range", field="--host-hz",
                              fix="use 0 (off) to 20 samples per second")
    server_url = request.server_url or plan.server_url
    server_hz = request.server_hz if request.server_hz is not None else plan.server_scrape_hz
    if server_hz <= 0 or server_hz > 20:
        raise ToolkitError.of(f"--server-hz {server_hz} is out of range", field="--server-hz",
                              fix="use 0.1 to 20 scrapes per second (AIPerf scrapes at 3)")
    server_pid = request.server_pid
    if server_pid is None and request.server_unit:
        from toolkit.adapters.host_sampler import server_pid_of_unit

        server_pid = server_pid_of_unit(request.server_unit)
    if server_pid is not None and not Path(f"/proc/{server_pid}").exists():
        raise ToolkitError.of(f"no process {server_pid}", field="--server-pid",
                              fix="give the pid of the running server (systemctl show -p MainPID --value UNIT)")

    # The sampler opens BEFORE anything starts: no driver or no GPU is exit 2 with nothing run.
    sampler = open_sampler(request.gpu_source, gpm=request.gpm, energy_interval_s=request.energy_interval_s)
    gpus = sampler.open(request.gpus)
    try:
        interrupted, summary, verdict = _sampled_run(request, sampler, gpus, plan, out, idle_s, hz,
                                                     (server_pid, server_url, server_hz), display)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise _disk_full(out, err) from None
    outcome = ProbeOutcome(out, summary, verdict, interrupted)
    if request.record and not interrupted:
        if verdict.failed:
            outcome.not_recorded = f"not recorded into {request.profile}: the benchmark failed"
        else:
            from toolkit.app.record import record_run

            assert request.profile is not None
            outcome.record = record_run(out, request.profile)
    return outcome


def _sampled_run(request: ProbeRequest, sampler: Any, gpus: list[int], plan: _Plan, out: Path,
                 idle_s: float, hz: float, side_cfg: tuple[int | None, str | None, float],
                 display: Display | None) -> tuple[bool, Summary, Verdict]:
    """The idle baseline, the benchmark under sampling and the artifacts: (interrupted, summary, verdict).
    side_cfg: (server pid, server URL, scrape Hz) for the host and server timelines."""
    from toolkit.adapters.bench_process import read_bench_jsonl, run_sampled, server_log_tail
    from toolkit.core.probe.bench import failed_requests, normalize_bench_result, requests_sent
    from toolkit.core.text import redact_argv

    bench_jsonl = out / "bench.jsonl"
    started_epoch_s = time.time()
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_topology(out, sampler.topology())
        manifest = RunRecord(
            provenance=sampler.provenance,
            # The same in words, for a person reading the file (nothing reads it back).
            data_source=mark(sampler.provenance, detail=True),
            host=socket.gethostname(),
            # "host" becomes the host timeline's facts when there is one (run.json `host`): the name stays here.
            hostname=socket.gethostname(),
            started_at_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            gpus=gpus, sample_hz=hz, idle_s=idle_s, command=redact_argv(plan.argv), profile=request.profile,
            target=plan.target, steady_state=plan.steady_state or DEFAULT_STEADY, status="running",
            extra={"toolkit_version": __version__, "sampler_source": sampler.source,
                   "clock": "seconds since the run's start on time.monotonic() of the probe process",
                   "energy_interval_s": getattr(sampler, "energy_interval_s", request.energy_interval_s)},
        )
        write_run_record(out, manifest)
        env = dict(os.environ, TOOLKIT_PROBE_BENCH_JSONL=str(bench_jsonl.resolve()),
                   TOOLKIT_PROBE_OUT=str(out.resolve()))
        trace_meta = {"sample_hz": str(hz), **getattr(sampler, "trace_meta", {}), "source": sampler.source,
                      "gpus": ";".join(map(str, gpus))}
        server_pid, server_url, server_hz = side_cfg
        side, on_bench_pid, side_info = _side_timelines(out, request.host_hz, server_pid, server_url, server_hz,
                                                        net=request.until_eof)
        kw: dict[str, Any] = {"gpus": gpus, "sample_hz": hz, "idle_s": idle_s, "trace_meta": trace_meta, "env": env,
                              "side": side, "on_bench_pid": on_bench_pid}
        with display if display is not None else contextlib.nullcontext():
            result = run_sampled(sampler, plan.argv, out, on_tick=display.on_tick if display else None, **kw)
    finally:
        sampler.close()
    os.replace(out / "trace.csv.partial", out / "trace.csv")
    sent = requests_sent(plan.argv, result.stderr_tail)
    lost = failed_requests(normalize_bench_result(read_bench_jsonl(bench_jsonl)).get("completed"), sent)
    manifest = replace(
        manifest,
        status="interrupted" if result.interrupted else "finished",
        idle_start_s=round(result.idle_start_s, 4),
        idle_end_s=round(result.idle_end_s, 4),
        bench_start_s=round(result.bench_start_s, 4),
        bench_end_s=round(result.bench_end_s, 4),
        exit_code=result.exit_code,
        interrupted=result.interrupted,
        stderr_tail=result.stderr_tail,
        requests_sent=sent,
        failed_requests=lost,
        # The server's side of a failed benchmark (killed, crashed): its journal since this run started.
        server_log_tail=server_log_tail(request.server_unit, started_epoch_s)
        if request.server_unit and (result.exit_code != 0 or result.interrupted or lost) else "",
        extra={**manifest.extra, "server_unit": request.server_unit, "sampler_cost": result.cost.to_dict(),
               "files": [*ARTIFACT_FILES, *(tl.path.name for tl in side)],
               **({"net": side_info["net"]()} if "net" in side_info else {}),
               **(sampler_origin(result.t0_epoch_ns) if request.until_eof else {})},
        # the side timelines' facts: run.json `host` (the name stays in `hostname`), `server`
        host=side_info["host"]() if "host" in side_info else manifest.host,
        server=side_info["server"]() if "server" in side_info else None,
    )
    write_run_record(out, manifest)
    summary, verdict = judge_dir(out, write=True)
    return result.interrupted, summary, verdict


def sampler_origin(t0_epoch_ns: int) -> dict[str, Any]:
    """run.json's fields of a fleet's per-host sampler: what its `t_s` are on its host's wall clock."""
    return {"role": "fleet-sampler", "clock_origin_epoch_ns": t0_epoch_ns}


def _side_timelines(out: Path, host_hz: float, server_pid: int | None, server_url: str | None,
                    server_hz: float, *, net: bool = False
                    ) -> tuple[list[Any], Any, dict[str, Callable[[], dict[str, Any]]]]:
    """The host timeline and, where a server is known, its scrape: threads beside the GPU loop. `net`: the
    interfaces' counters too (a fleet's sampler: the traffic between the hosts), at the host timeline's rate.

    Returns (threads, the callback that learns the benchmark's pid, run.json sections to fill in at the end)."""
    import sys

    from toolkit.adapters.timeline_thread import TimelineThread

    side: list[Any] = []
    info: dict[str, Callable[[], dict[str, Any]]] = {}
    on_bench_pid = None
    if server_url:
        from toolkit.adapters import sglang_metrics

        if sglang_metrics.available():
            scraper = sglang_metrics.ServerScraper(server_url, server_hz)
            stl = TimelineThread(out / "server_trace.csv", scraper.header(), server_hz, scraper.tick, "server")
            side.append(stl)

            def server_info() -> dict[str, Any]:
                return {**scraper.info(), "cost": stl.cost()}

            info["server"] = server_info
        else:
            why = "the Python package prometheus-client is not installed (pip install prometheus-client)"
            print(f"probe: server timeline skipped: {why}", file=sys.stderr)
            info["server"] = lambda: {"url": server_url, "scrape_hz": server_hz, "metrics_enabled": None,
                                      "rows": 0, "gaps": 0, "resets": 0, "skipped": why,
                                      "what_was_not_seen": [f"the whole server timeline: {why}"]}
    if host_hz > 0 and Path("/proc/self/stat").exists():
        from toolkit.adapters.host_sampler import HostSampler

        host = HostSampler()
        if server_pid is not None:
            host.set_root("server", server_pid)
        tl = TimelineThread(out / "host_trace.csv", host.header(host_hz), host_hz, host.tick, "host")
        side.append(tl)

        def on_bench_pid(pid: int) -> None:
            host.set_root("bench", pid)

        def host_info() -> dict[str, Any]:
            return {"sample_hz": host_hz, "server_pid": server_pid, "rows": host.rows, "source": "proc",
                    "cost": tl.cost()}

        info["host"] = host_info
        if net and Path("/proc/net/dev").exists():
            from toolkit.adapters.host_sampler import NetSampler

            net_sampler = NetSampler()
            ntl = TimelineThread(out / "net_trace.csv", net_sampler.header(host_hz), host_hz, net_sampler.tick, "net")
            side.append(ntl)
            info["net"] = lambda: {"sample_hz": host_hz, "rows": net_sampler.rows, "cost": ntl.cost()}
    return side, on_bench_pid, info


def _disk_full(out: Path, err: OSError) -> ToolkitError:
    """The run directory's disk filled up mid-run. Files written whole (JSON: temp file + rename) are complete or
    absent; the streamed ones (trace.csv.partial, bench.*.log, the side timelines) may be cut mid-line, so they go,
    which also gives back the space to mark run.json as failed."""
    from toolkit.adapters.files import stale_temp_files
    from toolkit.adapters.probe_store import read_run_record

    removed = []
    for name in ("trace.csv.partial", "trace.csv", "bench.stdout.log", "bench.stderr.log", "bench.jsonl",
                 "server_trace.csv.partial", "server_trace.csv", "host_trace.csv.partial", "host_trace.csv",
                 "net_trace.csv.partial", "net_trace.csv"):
        path = out / name
        if path.exists():
            path.unlink()
            removed.append(name)
    for name in ("run.json", "topology.json", "summary.json", "verdict.json"):
        for leftover in stale_temp_files(out / name):  # a temp file of an atomic write cut short
            leftover.unlink()
    note = f"no space left on the device of {out} ({err.strerror}); removed the cut files: {', '.join(removed)}"
    try:
        if (out / "run.json").exists():
            write_run_record(out, replace(read_run_record(out), status="failed", error=note))
    except (OSError, ToolkitError):
        pass  # still full: run.json stays as it was, complete (status running)
    return ToolkitError.of(
        note + "; nothing was recorded into any profile",
        file=str(err.filename or out),
        field="--out",
        fix=f"free space there (df -h {out}) or give --out on another disk, then run again",
        exit_code=EXIT_FAILED,
    )


def judge_dir(run_dir: Path, *, write: bool) -> tuple[Summary, Verdict]:
    """A run directory through the probe's summary and verdict code; with `write`, summary.json and verdict.json
    are (re)written in it. `probe replay` is this over a recorded run."""
    from toolkit.adapters.probe_store import load_run
    from toolkit.core.probe.judge import judge_run

    summary, verdict = judge_run(load_run(run_dir))
    if write:
        write_judged(run_dir, summary, verdict)
    return summary, verdict
