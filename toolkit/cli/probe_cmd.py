"""`toolkit probe run|replay`: benchmark plus NVML sampling of every GPU, and a verdict.

Thin: parse, call the adapters and the pure core, render. Needs only the standard library, pynvml and
rich (the GPU machine has no pydantic); the profile code is imported only when --profile is given.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from toolkit import __version__
from toolkit.core.errors import EXIT_FAILED, ToolkitError

RECORDED_LABEL = "recorded GPU trace: lab data, not measured on a GPU"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="probe_cmd", metavar="SUBCOMMAND")
    run = sub.add_parser("run", help="sample every GPU while a benchmark runs; write artifacts and a verdict",
                         description="Idle baseline, then the benchmark (the profile's bench, or COMMAND after --) "
                         "while NVML samples the GPUs. Writes run.json, trace.csv, bench.jsonl, topology.json, "
                         "summary.json and verdict.json to --out. The benchmark finds its result path in "
                         "$TOOLKIT_PROBE_BENCH_JSONL.")
    run.add_argument("--gpus", default="all", help="all, or comma-separated NVML indices (default all)")
    run.add_argument("--idle-s", type=float, default=None, help="idle baseline seconds (default: profile's, or 10)")
    run.add_argument("--hz", type=float, default=None, help="samples per second (default: profile's, or 10)")
    run.add_argument("--out", type=Path, default=None, help="artifact directory (default runs/probe-<UTC time>)")
    run.add_argument("--profile", default=None, help="profile NAME: benchmark its bench section, judge its target")
    run.add_argument("--base-url", default="http://127.0.0.1:30000", help="server URL for the profile's bench")
    run.add_argument("--target-json", default=None, metavar="JSON",
                     help="the run's target as a JSON object (profile, knobs, why, variants...), merged over the "
                     "--profile's; `toolkit apply --probe` passes the deployed profile's this way")
    run.add_argument("--replay-gpu-trace", type=Path, default=None, metavar="FILE",
                     help="play a recorded trace.csv instead of NVML (the lab: no GPU); labelled lab data")
    run.add_argument("--simulated-gpus", default=None, metavar="URL",
                     help="lab only: read SIMULATED GPUs from the lab stand-in's /lab/gpus at URL (its engine "
                     "model) instead of NVML; labelled simulated in every artifact")
    run.add_argument("--no-gpm", action="store_true", help="do not sample GPM metrics (judge without them)")
    run.add_argument("--energy-interval-s", type=float, default=None,
                     help="read the energy counter this often besides the benchmark's start and end (default 20; "
                     "one read costs ~3 ms of CPU on an H200; energy between reads comes from 20 ms power samples)")
    run.add_argument("--host-hz", type=float, default=2.0,
                     help="host timeline (CPU of the benchmark's and the server's processes, /proc) samples per "
                     "second (default 2; 0 = off)")
    run.add_argument("--server-url", default=None, metavar="URL",
                     help="scrape this SGLang server's /metrics and /v1/loads into server_trace.csv (default: the "
                     "--profile's server host and port; none without a profile)")
    run.add_argument("--server-hz", type=float, default=None,
                     help="server scrapes per second (default: the profile's probe.server_scrape_hz, or 2)")
    run.add_argument("--server-pid", type=int, default=None, metavar="PID",
                     help="the serving process (its tree goes into host_trace.csv as role server)")
    run.add_argument("--live", choices=("auto", "on", "off"), default="auto", help="live view (auto: on a TTY)")
    run.add_argument("--json", action="store_true", help="print the verdict as JSON")
    run.add_argument("--server-unit", default=None, metavar="UNIT",
                     help="systemd unit of the server under test: its MainPID's process tree goes into "
                     "host_trace.csv (role server), and a failed benchmark's verdict carries its journal tail")
    run.add_argument("--record", action="store_true",
                     help="write the results entry into the --profile's file (toolkit results record; issue #4)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...: the benchmark to run")
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser("replay", help="judge a recorded run directory with the same summary and verdict code")
    rep.add_argument("dir", type=Path)
    rep.add_argument("--write", action="store_true", help="rewrite summary.json and verdict.json in DIR")
    rep.add_argument("--json", action="store_true", help="print the verdict as JSON")
    rep.set_defaults(func=cmd_replay)


def _parse_gpus(text: str) -> list[int] | None:
    if text.strip().lower() == "all":
        return None
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ToolkitError.of(f"{text!r} is not 'all' or a comma-separated list of GPU indices", field="--gpus",
                              fix="e.g. --gpus all or --gpus 0,1") from None
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ToolkitError.of(f"{text!r}: give distinct non-negative indices", field="--gpus", fix="e.g. --gpus 0,1")
    return gpus


def _profile_plan(name: str, base_url: str, bench_jsonl: Path) -> dict[str, Any]:
    """The profile's bench command, probe settings and target. Imports the (pydantic) profile code lazily."""
    try:
        from toolkit.adapters.profile_store import ProfileStore
        from toolkit.core.profile.render import render_bench_argv
    except ImportError as err:
        raise ToolkitError.of(f"--profile needs the profile code and pydantic ({err})", field="--profile",
                              fix="install the toolkit with its dependencies, or pass the benchmark after --") from None
    store = ProfileStore()
    resolved = store.resolve(name)
    spec = resolved.spec
    from toolkit.core.probe.knobs import run_target

    # Next steps name only variants that exist beside this profile, and the knobs' current values.
    target = run_target(resolved.name, spec.model_dump(mode="json"), set(store.names()))
    host = "127.0.0.1" if spec.server.host in ("0.0.0.0", "::") else spec.server.host
    return {
        "argv": render_bench_argv(resolved, base_url=base_url, output_file=str(bench_jsonl), python=sys.executable),
        "server_url": f"http://{host}:{spec.server.port}",
        "server_scrape_hz": float(spec.probe.server_scrape_hz),
        "idle_s": float(spec.probe.idle_s),
        "sample_hz": float(spec.probe.sample_hz),
        "steady_state": spec.probe.steady_state.model_dump(),
        "target": target,
    }


def _live_view(enabled: bool, gpus_count: int) -> tuple[Any, Any]:
    if not enabled:
        return None, None
    from rich.live import Live
    from rich.table import Table

    state = {"last": 0.0}

    def table(phase: str, t_s: float, rows: list[dict[str, Any]]) -> Table:
        tb = Table(title=f"probe: {phase} t={t_s:6.1f} s", caption=None)
        for col in ("GPU", "power W", "limit W", "util %", "SM MHz", "GPM SM %", "error"):
            tb.add_column(col, justify="right")
        for r in rows:
            def f(key: str, r: dict[str, Any] = r) -> str:
                v = r.get(key)
                return "-" if v is None else f"{v:.0f}" if isinstance(v, float) else str(v)

            tb.add_row(str(r["gpu"]), f("power_w"), f("power_limit_w"), f("util_gpu_pct"), f("sm_clock_mhz"),
                       f("gpm_sm_util_pct"), str(r.get("error") or "")[:30])
        return tb

    live = Live(refresh_per_second=4, transient=True)

    def on_tick(phase: str, t_s: float, rows: list[dict[str, Any]]) -> None:
        if t_s - state["last"] >= 0.5:
            state["last"] = t_s
            live.update(table(phase, t_s, rows))

    return live, on_tick


def cmd_run(args: argparse.Namespace) -> int:
    from toolkit.adapters.probe_store import read_json, read_trace

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    gpus_wanted = _parse_gpus(args.gpus)
    if args.record:
        # Checked before anything runs: a missing profile or a hand-broken results block is exit 2, not an
        # error after a long benchmark.
        if not args.profile:
            raise ToolkitError.of("--record needs --profile NAME (the profile the results go into)",
                                  field="--record", fix="add --profile NAME, or record later with "
                                  "`toolkit results record DIR --profile NAME`")
        from toolkit.adapters.results_store import load_profile_results

        load_profile_results(args.profile)
    out: Path = args.out or Path("runs") / time.strftime("probe-%Y%m%dT%H%M%SZ", time.gmtime())
    if out.exists() and any(p.name in ("run.json", "trace.csv") for p in out.iterdir()):
        raise ToolkitError.of("already holds a probe run", file=str(out), field="--out",
                              fix="choose a new --out directory (runs are never overwritten)")
    bench_jsonl = out / "bench.jsonl"
    plan: dict[str, Any] = {"argv": command, "idle_s": 10.0, "sample_hz": 10.0, "steady_state": {}, "target": {},
                            "server_url": None, "server_scrape_hz": 2.0}
    if args.profile:
        plan = {**plan, **_profile_plan(args.profile, args.base_url, bench_jsonl.resolve())}
        if command:
            plan["argv"] = command  # an explicit command wins; the profile still gives target and probe settings
    if args.target_json:
        try:
            extra = json.loads(args.target_json)
        except json.JSONDecodeError as err:
            raise ToolkitError.of(f"not valid JSON: {err.msg}", field="--target-json",
                                  fix="give a JSON object, e.g. '{\"knobs\": {\"server.max_running_requests\": 64}}'"
                                  ) from None
        if not isinstance(extra, dict):
            raise ToolkitError.of("expected a JSON object", field="--target-json", fix="give {...}")
        plan["target"] = {**plan["target"], **extra}
    if not plan["argv"]:
        raise ToolkitError.of("no benchmark to run", field="command",
                              fix="give --profile NAME, or the benchmark after --: toolkit probe run -- CMD ...")
    exe = plan["argv"][0]
    if shutil.which(exe) is None:
        raise ToolkitError.of(f"benchmark command {exe!r} not found", field="command",
                              fix="give an installed program (or a path to one) after --")
    idle_s = args.idle_s if args.idle_s is not None else plan["idle_s"]
    hz = args.hz if args.hz is not None else plan["sample_hz"]
    if hz <= 0 or hz > 100:
        raise ToolkitError.of(f"--hz {hz} is out of range", field="--hz", fix="use 1 to 100 samples per second")
    if idle_s < 0:
        raise ToolkitError.of("--idle-s must be >= 0", field="--idle-s", fix="e.g. --idle-s 10")
    if args.host_hz < 0 or args.host_hz > 20:
        raise ToolkitError.of(f"--host-hz {args.host_hz} is out of range", field="--host-hz",
                              fix="use 0 (off) to 20 samples per second")
    server_url = args.server_url or plan["server_url"]
    server_hz = args.server_hz if args.server_hz is not None else plan["server_scrape_hz"]
    if server_hz <= 0 or server_hz > 20:
        raise ToolkitError.of(f"--server-hz {server_hz} is out of range", field="--server-hz",
                              fix="use 0.1 to 20 scrapes per second (AIPerf scrapes at 3)")
    server_pid = args.server_pid
    if server_pid is None and args.server_unit:
        from toolkit.adapters.host_sampler import server_pid_of_unit

        server_pid = server_pid_of_unit(args.server_unit)
    if server_pid is not None and not Path(f"/proc/{server_pid}").exists():
        raise ToolkitError.of(f"no process {server_pid}", field="--server-pid",
                              fix="give the pid of the running server (systemctl show -p MainPID --value UNIT)")

    # The sampler opens BEFORE anything starts: no driver or no GPU is exit 2 with nothing run.
    sampler: Any
    if args.replay_gpu_trace and args.simulated_gpus:
        raise ToolkitError.of("--replay-gpu-trace and --simulated-gpus both replace NVML", field="--simulated-gpus",
                              fix="give one of them")
    if args.simulated_gpus:
        from toolkit.adapters.simulated_gpus import SIMULATED_LABEL, SimulatedSampler

        sampler = SimulatedSampler(args.simulated_gpus)
        data_source = SIMULATED_LABEL
    elif args.replay_gpu_trace:
        from toolkit.core.probe.sampler import RecordedSampler

        recorded = read_trace(args.replay_gpu_trace)
        topo = read_json(args.replay_gpu_trace.parent / "topology.json", required=False)
        # The recording's own run.json gives its phases, so the replay follows this run's idle and benchmark.
        rec_run = read_json(args.replay_gpu_trace.parent / "run.json", required=False)
        sampler = RecordedSampler(recorded, str(args.replay_gpu_trace), topo, rec_run)
        data_source = f"{RECORDED_LABEL} ({args.replay_gpu_trace.name})"
    else:
        from toolkit.adapters.nvml import ENERGY_INTERVAL_S, NvmlSampler

        if args.energy_interval_s is None:
            args.energy_interval_s = ENERGY_INTERVAL_S
        sampler = NvmlSampler(gpm=not args.no_gpm, energy_interval_s=args.energy_interval_s)
        data_source = "measured (NVML)"
    gpus = sampler.open(gpus_wanted)
    try:
        result, summary, verdict = _sampled_run(args, sampler, gpus, plan, out, bench_jsonl, data_source, idle_s, hz,
                                                (server_pid, server_url, server_hz))
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise _disk_full(out, err) from None
    _print(summary, verdict, out, as_json=args.json)
    if result.interrupted:
        return 130
    if args.record:
        _record(out, args.profile, verdict, quiet=args.json)
    return EXIT_FAILED if verdict["class"] == "benchmark-failed" else 0


def _sampled_run(args: argparse.Namespace, sampler: Any, gpus: list[int], plan: dict[str, Any], out: Path,
                 bench_jsonl: Path, data_source: str, idle_s: float, hz: float,
                 side_cfg: tuple[int | None, str | None, float]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The idle baseline, the benchmark under sampling and the artifacts: (run result, summary, verdict).
    side_cfg: (server pid, server URL, scrape Hz) for the host and server timelines."""
    from toolkit.adapters.bench_process import read_bench_jsonl, redact_argv, run_sampled, server_log_tail
    from toolkit.adapters.files import write_json
    from toolkit.core.probe.bench import failed_requests, normalize_bench_result, requests_sent

    started_epoch_s = time.time()
    try:
        out.mkdir(parents=True, exist_ok=True)
        topology = {"schema_version": 1, **sampler.topology()}
        write_json(out / "topology.json", topology)
        manifest: dict[str, Any] = {
            "schema_version": 1,
            "toolkit_version": __version__,
            "data_source": data_source,
            "sampler_source": sampler.source,
            "host": socket.gethostname(),
            "started_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "clock": "seconds since the run's start on time.monotonic() of the probe process",
            "gpus": gpus,
            "sample_hz": hz,
            "idle_s": idle_s,
            "energy_interval_s": args.energy_interval_s,
            "command": redact_argv(plan["argv"]),
            "profile": args.profile,
            "target": plan["target"],
            "steady_state": plan["steady_state"] or {"plateau_fraction": 0.8, "smooth_s": 2.0, "min_window_s": 5.0},
            "status": "running",
        }
        write_json(out / "run.json", manifest)
        env = dict(os.environ, TOOLKIT_PROBE_BENCH_JSONL=str(bench_jsonl.resolve()),
                   TOOLKIT_PROBE_OUT=str(out.resolve()))
        live_on = args.live == "on" or (args.live == "auto" and sys.stdout.isatty() and not args.json)
        live, on_tick = _live_view(live_on, len(gpus))
        trace_meta = {"sample_hz": str(hz), **getattr(sampler, "trace_meta", {}), "source": sampler.source,
                      "gpus": ";".join(map(str, gpus))}
        server_pid, server_url, server_hz = side_cfg
        side, on_bench_pid, side_info = _side_timelines(out, args.host_hz, server_pid, server_url, server_hz)
        kw: dict[str, Any] = {"gpus": gpus, "sample_hz": hz, "idle_s": idle_s, "trace_meta": trace_meta, "env": env,
                              "side": side, "on_bench_pid": on_bench_pid}
        if live is not None:
            with live:
                result = run_sampled(sampler, plan["argv"], out, on_tick=on_tick, **kw)
        else:
            result = run_sampled(sampler, plan["argv"], out, **kw)
    finally:
        sampler.close()
    os.replace(out / "trace.csv.partial", out / "trace.csv")
    sent = requests_sent(plan["argv"], result.stderr_tail)
    lost = failed_requests(normalize_bench_result(read_bench_jsonl(bench_jsonl)).get("completed"), sent)
    manifest.update({
        "status": "interrupted" if result.interrupted else "finished",
        "idle_start_s": round(result.idle_start_s, 4),
        "idle_end_s": round(result.idle_end_s, 4),
        "bench_start_s": round(result.bench_start_s, 4),
        "bench_end_s": round(result.bench_end_s, 4),
        "exit_code": result.exit_code,
        "interrupted": result.interrupted,
        "stderr_tail": result.stderr_tail,
        "requests_sent": sent,
        "failed_requests": lost,
        "server_unit": args.server_unit,
        # The server's side of a failed benchmark (killed, crashed): its journal since this run started.
        "server_log_tail": server_log_tail(args.server_unit, started_epoch_s)
        if args.server_unit and (result.exit_code != 0 or result.interrupted or lost) else "",
        "sampler_cost": result.cost.to_dict(),
        "files": ["run.json", "trace.csv", "bench.jsonl", "bench.stdout.log", "bench.stderr.log", "topology.json",
                  "summary.json", "verdict.json", *(tl.path.name for tl in side)],
        **{k: f() for k, f in side_info.items()},
    })
    write_json(out / "run.json", manifest)
    summary, verdict = _judge_and_write(out)
    return result, summary, verdict


def _side_timelines(out: Path, host_hz: float, server_pid: int | None, server_url: str | None,
                    server_hz: float) -> tuple[list[Any], Any, dict[str, Any]]:
    """The host timeline and, where a server is known, its scrape: threads beside the GPU loop.

    Returns (threads, the callback that learns the benchmark's pid, run.json sections to fill in at the end)."""
    from toolkit.adapters.timeline_thread import TimelineThread

    side: list[Any] = []
    info: dict[str, Any] = {}
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
    return side, on_bench_pid, info


def _record(out: Path, profile: str, verdict: dict[str, Any], *, quiet: bool) -> None:
    if verdict["class"] == "benchmark-failed":
        print(f"not recorded into {profile}: the benchmark failed", file=sys.stderr)
        return
    from toolkit.adapters.results_store import record_run

    outcome = record_run(out, profile)
    if not quiet:
        print(f"recorded into {outcome.file} ({outcome.action}: {outcome.entry.run_id})")


def _disk_full(out: Path, err: OSError) -> ToolkitError:
    """The run directory's disk filled up mid-run. Files written whole (JSON: temp file + rename) are complete or
    absent; the streamed ones (trace.csv.partial, bench.*.log, the side timelines) may be cut mid-line, so they go,
    which also gives back the space to mark run.json as failed."""
    from toolkit.adapters.files import write_json
    from toolkit.adapters.probe_store import read_json

    removed = []
    for name in ("trace.csv.partial", "trace.csv", "bench.stdout.log", "bench.stderr.log", "bench.jsonl",
                 "server_trace.csv.partial", "server_trace.csv", "host_trace.csv.partial", "host_trace.csv"):
        path = out / name
        if path.exists():
            path.unlink()
            removed.append(name)
    for leftover in out.glob(".*.json.*"):  # a temp file of an atomic write cut short
        leftover.unlink()
    note = f"no space left on the device of {out} ({err.strerror}); removed the cut files: {', '.join(removed)}"
    try:
        manifest = read_json(out / "run.json", required=False)
        if manifest is not None:
            write_json(out / "run.json", {**manifest, "status": "failed", "error": note})
    except (OSError, ToolkitError):
        pass  # still full: run.json stays as it was, complete (status running)
    return ToolkitError.of(
        note + "; nothing was recorded into any profile",
        file=str(err.filename or out),
        field="--out",
        fix=f"free space there (df -h {out}) or give --out on another disk, then run again",
        exit_code=EXIT_FAILED,
    )


def _judge_and_write(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from toolkit.adapters.files import write_json
    from toolkit.adapters.probe_store import judge_run, load_run

    summary, verdict = judge_run(load_run(out))
    vd = verdict.to_dict()
    write_json(out / "summary.json", summary)
    write_json(out / "verdict.json", vd)
    return summary, vd


def cmd_replay(args: argparse.Namespace) -> int:
    from toolkit.adapters.files import write_json
    from toolkit.adapters.probe_store import judge_run, load_run

    run = load_run(args.dir)
    summary, verdict = judge_run(run)
    vd = verdict.to_dict()
    if args.write:
        write_json(args.dir / "summary.json", summary)
        write_json(args.dir / "verdict.json", vd)
    _print(summary, vd, args.dir, as_json=args.json, replay=True)
    return 0


def _fmt(v: Any, nd: int = 0) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, int | float) else str(v)


def _print(summary: dict[str, Any], verdict: dict[str, Any], out: Path, *, as_json: bool, replay: bool = False) -> None:
    if as_json:
        print(json.dumps({"dir": str(out), "data_source": summary["data_source"], "verdict": verdict},
                         indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    src = summary["data_source"]
    if "recorded" in src or "lab data" in src or "simulated" in src or replay:
        con.print(f"[yellow]data: {src}{' (replayed from ' + str(out) + ')' if replay else ''}[/yellow]")
    tb = Table(title=f"probe {out}  ({'steady window ' if summary['steady_state']['found'] else 'no steady window: '}"
               f"{summary['steady']['start_s']}-{summary['steady']['end_s']} s)")
    for col in ("GPU", "idle W", "full W", "steady W", "p95 W", "limit W", "util %", "SM MHz", "GPM SM %",
                "tensor %", "DRAM %", "energy J"):
        tb.add_column(col, justify="right")
    for g, st in summary["steady"]["gpus"].items():
        full = summary["full"]["gpus"][g]
        gpm = st["gpm"] or {}
        tb.add_row(g, _fmt(st["idle_power_w"]), _fmt(full["power_w"]["mean"]), _fmt(st["power_w"]["mean"]),
                   _fmt(st["power_w"]["p95"]), _fmt(st["power_limit_w"]), _fmt(st["util_gpu_pct"]),
                   _fmt(st["sm_clock_mhz"]), _fmt(gpm.get("sm_util_pct"), 1), _fmt(gpm.get("tensor_util_pct"), 1),
                   _fmt(gpm.get("dram_bw_util_pct"), 1), _fmt(full["energy_j"]))
    con.print(tb)
    f, s = summary["full"], summary["steady"]
    con.print(f"throughput out tok/s: full {_fmt(f['throughput']['output_tok_per_s'], 1)}, steady "
              f"{_fmt(s['throughput']['output_tok_per_s'], 1)}; "
              f"J/output token: full {_fmt(f['j_per_output_token'], 3)}")
    con.print(f"[bold]verdict: {verdict['headline']}[/bold]  (confidence {verdict['confidence']} "
              f"{verdict['confidence_label']}, basis {verdict['basis']})")
    for d in verdict.get("disagreements") or []:
        con.print(f"  signals disagree: {d}", markup=False)
    phases = verdict.get("phases") or []
    if len(phases) > 1:
        con.print("  phases: " + "; ".join(f"{p['state']} {p['start_s']:.1f}-{p['end_s']:.1f} s" for p in phases[:8])
                  + (f"; {len(phases) - 8} more" if len(phases) > 8 else ""), markup=False)
    for step in verdict["next_steps"]:
        con.print(f"  next: {step}", markup=False)
    if summary["benchmark"]["exit_code"] not in (0, None):
        con.print(f"[red]benchmark exit code {summary['benchmark']['exit_code']}; stderr tail:[/red]")
        con.print(summary["benchmark"]["stderr_tail"][-1500:], markup=False, highlight=False)
