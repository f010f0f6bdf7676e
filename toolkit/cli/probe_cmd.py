"""`toolkit probe run|replay`: benchmark plus NVML sampling of every GPU, and a verdict.

Thin: parse, call toolkit.app.probe, render. Needs only the standard library, pynvml and rich (the GPU machine
has no pydantic); the profile code is imported only when --profile is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.cli.envelope import emit
from toolkit.cli.options import inventory_option
from toolkit.core.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.core.probe.records import Summary
    from toolkit.core.probe.verdict import Verdict


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
    run.add_argument("--base-url", default=None, metavar="URL",
                     help="server URL for the profile's bench (default: the profile's server host and port)")
    run.add_argument("--target-json", default=None, metavar="JSON",
                     help="the run's target as a JSON object (profile, knobs, why, variants...), merged over the "
                     "--profile's; `toolkit apply --probe` passes the deployed profile's this way")
    run.add_argument("--gpu-source", default=None, metavar="SOURCE",
                     help="where GPU samples come from: nvml (default), replay:TRACE.csv (a recorded trace, "
                     "labelled lab data), or NAME:ARG of an installed GPU source (the lab's simulated:URL reads "
                     "its stand-in server's engine model; labelled simulated in every artifact)")
    run.add_argument("--replay-gpu-trace", type=Path, default=None, metavar="FILE",
                     help="the same as --gpu-source replay:FILE")
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
                     help="write the results entry into the --profile's file (as `toolkit results record` does)")
    run.add_argument("--until-eof", action="store_true",
                     help="a fleet's per-host sampler: no benchmark; sample until stdin closes (the controller's "
                     "`probe run --fleet` starts it over SSH); the fleet is judged on the controller, this host "
                     "alone here")
    run.add_argument("--fleet", action="store_true",
                     help="probe a deployment over several hosts: a sampler on each inventory host over SSH, the "
                     "benchmark here, the traces merged on this machine's clock, a verdict across nodes")
    inventory_option(run)
    run.add_argument("--hosts", default="gpu_containers", metavar="PATTERN",
                     help="--fleet: the inventory hosts to sample (an Ansible pattern; default gpu_containers)")
    run.add_argument("--network-gb-s", type=float, default=None, metavar="GB_S",
                     help="--fleet: the network's measured bus bandwidth between the hosts in GB/s (the NCCL "
                     "preflight's), for the inter-node communication verdict")
    run.add_argument("--router-metrics", default=None, metavar="URL",
                     help="--fleet: the router's Prometheus exposition (smg --prometheus-port; e.g. "
                     "http://ROUTER:29000/metrics), scraped here: its per-backend load for the replicas' balance")
    run.add_argument("--sampler-arg", action="append", default=[], metavar="ARG",
                     help="--fleet: one more argument for every host's sampler (repeat it: "
                     "--sampler-arg=--gpu-source --sampler-arg=simulated:http://127.0.0.1:30000)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...: the benchmark to run")
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser("replay", help="judge a recorded run directory with the same summary and verdict code",
                         description="Recompute a recorded probe run's summary and verdict from its files, with "
                         "the same code `toolkit probe run` uses.")
    rep.add_argument("dir", type=Path, help="the run directory (toolkit probe run --out)")
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


class _LiveView:
    """The sampling as a rich table, refreshed twice a second (toolkit.app.probe.Display)."""

    COLUMNS = ("GPU", "power W", "limit W", "util %", "SM MHz", "GPM SM %", "error")

    def __init__(self) -> None:
        from rich.live import Live

        self.live = Live(refresh_per_second=4, transient=True)
        self.last_s = 0.0

    def __enter__(self) -> Any:
        return self.live.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.live.__exit__(*exc)  # type: ignore[arg-type]

    def on_tick(self, phase: str, t_s: float, rows: list[dict[str, Any]]) -> None:
        from rich.table import Table

        if t_s - self.last_s < 0.5:
            return
        self.last_s = t_s
        table = Table(title=f"probe: {phase} t={t_s:6.1f} s", caption=None)
        for col in self.COLUMNS:
            table.add_column(col, justify="right")
        for r in rows:
            def f(key: str, r: dict[str, Any] = r) -> str:
                v = r.get(key)
                return "-" if v is None else f"{v:.0f}" if isinstance(v, float) else str(v)

            table.add_row(str(r["gpu"]), f("power_w"), f("power_limit_w"), f("util_gpu_pct"), f("sm_clock_mhz"),
                          f("gpm_sm_util_pct"), str(r.get("error") or "")[:30])
        self.live.update(table)


def _target(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolkitError.of(f"not valid JSON: {err.msg}", field="--target-json",
                              fix="give a JSON object, e.g. '{\"knobs\": {\"server.max_running_requests\": 64}}'"
                              ) from None
    if not isinstance(extra, dict):
        raise ToolkitError.of("expected a JSON object", field="--target-json", fix="give {...}")
    return extra


def _gpu_source(args: argparse.Namespace) -> str:
    if args.replay_gpu_trace and args.gpu_source:
        raise ToolkitError.of("--replay-gpu-trace and --gpu-source both name the GPU source", field="--gpu-source",
                              fix="give one of them")
    if args.replay_gpu_trace:
        return f"replay:{args.replay_gpu_trace}"
    return str(args.gpu_source or "nvml")


def cmd_run(args: argparse.Namespace) -> int:
    from toolkit.app import probe

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.fleet:
        return _cmd_fleet(args, command)
    request = probe.ProbeRequest(
        command=command, gpus=_parse_gpus(args.gpus), idle_s=args.idle_s, sample_hz=args.hz, out=args.out,
        profile=args.profile, base_url=args.base_url, target=_target(args.target_json),
        gpu_source=_gpu_source(args), gpm=not args.no_gpm, energy_interval_s=args.energy_interval_s,
        host_hz=args.host_hz, server_url=args.server_url, server_hz=args.server_hz, server_pid=args.server_pid,
        server_unit=args.server_unit, record=args.record, until_eof=args.until_eof)
    if args.until_eof:
        outcome = probe.run(request, _ReadyLine())
        # The host's own view, judged here too (hosts/HOST/verdict.json on the controller); the fleet's is there.
        print(f"sampled into {outcome.out} until stdin closed; alone: {outcome.verdict.headline}", file=sys.stderr)
        return outcome.exit_code
    live = args.live == "on" or (args.live == "auto" and sys.stdout.isatty() and not args.json)
    outcome = probe.run(request, _LiveView() if live else None)
    _print(outcome.summary, outcome.verdict, outcome.out, as_json=args.json)
    if outcome.not_recorded:
        print(outcome.not_recorded, file=sys.stderr)
    elif outcome.record is not None and not args.json:
        print(f"recorded into {outcome.record.file} ({outcome.record.action}: {outcome.record.entry.run_id})")
    return outcome.exit_code


class _ReadyLine:
    """The per-host sampler's one line to its controller, on stdout once the first samples are in."""

    def __init__(self) -> None:
        self.said = False

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> Any:
        return None

    def on_tick(self, phase: str, t_s: float, rows: list[dict[str, Any]]) -> None:
        if not self.said:
            from toolkit.core.probe.fleet import SAMPLER_READY

            print(SAMPLER_READY, flush=True)
            self.said = True


def _cmd_fleet(args: argparse.Namespace, command: list[str]) -> int:
    from toolkit.app import fleet_probe

    if args.record or args.profile or args.until_eof:
        flag = "--record" if args.record else "--profile" if args.profile else "--until-eof"
        raise ToolkitError.of(f"{flag} is not taken with --fleet", field=flag,
                              fix="give the benchmark after -- (record the fleet's run with `toolkit results record "
                              "DIR --profile NAME`)" if flag != "--until-eof" else "drop one of them")
    # What the single-host options say about sampling goes to every host's sampler.
    sampler_args = [*(["--server-unit", args.server_unit] if args.server_unit else []),
                    *(["--server-url", args.server_url] if args.server_url else []),
                    *(["--server-hz", f"{args.server_hz:g}"] if args.server_hz else []),
                    *(["--gpus", args.gpus] if args.gpus != "all" else []),
                    *(["--gpu-source", _gpu_source(args)] if args.gpu_source or args.replay_gpu_trace else []),
                    *(["--no-gpm"] if args.no_gpm else []),
                    "--host-hz", f"{args.host_hz:g}", *args.sampler_arg]
    request = fleet_probe.FleetProbeRequest(
        command=command, inventory=args.inventory, pattern=args.hosts,
        idle_s=args.idle_s if args.idle_s is not None else 5.0,
        sample_hz=args.hz if args.hz is not None else 10.0, out=args.out, sampler_args=sampler_args,
        network_gb_s=args.network_gb_s, router_metrics_url=args.router_metrics)
    outcome = fleet_probe.run(request, on_message=lambda m: print(m, file=sys.stderr))
    _print_fleet(outcome.verdict, outcome.out, as_json=args.json)
    return outcome.exit_code


def _print_fleet(verdict: dict[str, Any], out: Path, *, as_json: bool, replay: bool = False) -> None:
    if as_json:
        emit("probe.fleet", {"dir": str(out), "replay": replay, "verdict": verdict})
        return
    from rich.console import Console

    from toolkit.cli.render import print_fleet_verdict

    print_fleet_verdict(Console(), verdict, f"fleet probe {out} (on the controller's clock)")


def cmd_replay(args: argparse.Namespace) -> int:
    from toolkit.app.probe import judge_dir

    if (args.dir / "fleet_verdict.json").exists() or (args.dir / "hosts").is_dir():
        from toolkit.app.fleet_probe import judge_fleet_dir

        _print_fleet(judge_fleet_dir(args.dir, write=args.write), args.dir, as_json=args.json, replay=True)
        return 0

    summary, verdict = judge_dir(args.dir, write=args.write)
    _print(summary, verdict, args.dir, as_json=args.json, replay=True)
    return 0


def _fmt(v: Any, nd: int = 0) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, int | float) else str(v)


def _print(summary: Summary, verdict: Verdict, out: Path, *, as_json: bool, replay: bool = False) -> None:
    if as_json:
        emit("probe.replay" if replay else "probe.run",
             {"dir": str(out), "data_source": summary.data_source, "verdict": verdict.to_dict()})
        return
    from rich.console import Console
    from rich.table import Table

    from toolkit.core.provenance import mark

    con = Console()
    prov = summary.provenance
    if prov.kind != "measured" or replay:
        con.print(f"[yellow]data: {mark(prov, detail=True)}"
                  f"{' (judged again from ' + str(out) + ')' if replay else ''}[/yellow]")
    f, s = summary.full, summary.steady
    tb = Table(title=f"probe {out}  ({'steady window ' if summary.steady_state.found else 'no steady window: '}"
               f"{s.start_s}-{s.end_s} s)")
    for col in ("GPU", "idle W", "full W", "steady W", "p95 W", "limit W", "util %", "SM MHz", "GPM SM %",
                "tensor %", "DRAM %", "energy J"):
        tb.add_column(col, justify="right")
    for g, st in s.gpus.items():
        full = f.gpus[g]
        gpm = st["gpm"] or {}
        tb.add_row(g, _fmt(st["idle_power_w"]), _fmt(full["power_w"]["mean"]), _fmt(st["power_w"]["mean"]),
                   _fmt(st["power_w"]["p95"]), _fmt(st["power_limit_w"]), _fmt(st["util_gpu_pct"]),
                   _fmt(st["sm_clock_mhz"]), _fmt(gpm.get("sm_util_pct"), 1), _fmt(gpm.get("tensor_util_pct"), 1),
                   _fmt(gpm.get("dram_bw_util_pct"), 1), _fmt(full["energy_j"]))
    con.print(tb)
    con.print(f"throughput out tok/s: full {_fmt(f.throughput.output_tok_per_s, 1)}, steady "
              f"{_fmt(s.throughput.output_tok_per_s, 1)}; "
              f"J/output token: full {_fmt(f.j_per_output_token, 3)}")
    con.print(f"[bold]verdict: {verdict.headline}[/bold]  (confidence {round(verdict.confidence, 2)} "
              f"{verdict.confidence_label}, basis {verdict.basis})")
    for d in verdict.disagreements:
        con.print(f"  signals disagree: {d}", markup=False)
    phases = verdict.timeline.phases if verdict.timeline is not None else []
    if len(phases) > 1:
        con.print("  phases: " + "; ".join(f"{p['state']} {p['start_s']:.1f}-{p['end_s']:.1f} s" for p in phases[:8])
                  + (f"; {len(phases) - 8} more" if len(phases) > 8 else ""), markup=False)
    for step in verdict.next_steps:
        con.print(f"  next: {step}", markup=False)
    if summary.benchmark.exit_code not in (0, None):
        con.print(f"[red]benchmark exit code {summary.benchmark.exit_code}; stderr tail:[/red]")
        con.print(summary.benchmark.stderr_tail[-1500:], markup=False, highlight=False)
