"""A fleet probe's traces on one clock, and the per-node figures beside the fleet's.

Each host's sampler writes its times as seconds since its own start (its `time.monotonic()`) and records the wall
clock of that start (`clock_origin_epoch_ns`). Its clock's offset to the controller's, measured at the run's start
and end (clock.py), moves every time onto the controller's clock: seconds since the controller's own start, the
clock the benchmark's window is measured on. What a merged time may be off by is the host clock's bound.

Pure: the traces come in already read (adapters/probe_store.py), figures go out as dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from toolkit.core.probe.bench import normalize_bench_result
from toolkit.core.probe.clock import NS_PER_S, HostClock
from toolkit.core.probe.host_trace import HostTrace
from toolkit.core.probe.net_trace import NetSeries, interval_rates_gb_s, rate_figures, shifted
from toolkit.core.probe.numbers import rounded as _r
from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.series import COLUMNS, NUMERIC_COLUMNS, GpuSeries, Trace
from toolkit.core.probe.server_trace import ServerTrace, counter_delta
from toolkit.core.probe.summary import gpu_window_stats, idle_power, summarize
from toolkit.core.probe.trace import format_row
from toolkit.core.probe.verdict import judge

# What a host's sampler (`toolkit probe run --until-eof`) prints on its stdout once its first samples are taken: the
# controller starts the idle baseline's clock on it.
SAMPLER_READY = "toolkit-probe-sampler: sampling"


@dataclass(frozen=True)
class NetCounters:
    """A host's network interfaces' byte counters (/proc/net/dev: name -> (rx, tx)) at a time of the controller's
    clock."""

    t_s: float
    bytes_by_iface: dict[str, tuple[int, int]]


@dataclass
class HostRun:
    """One host's sampler run, its times on the controller's clock (`aligned` does that)."""

    host: str
    trace: Trace
    server: ServerTrace | None = None
    host_trace: HostTrace | None = None
    clock: HostClock | None = None  # None: the times are the controller's already
    idle_start_s: float = 0.0
    idle_end_s: float = 0.0
    net: tuple[NetCounters, NetCounters] | None = None  # the benchmark window's first and last counters
    net_series: NetSeries | None = None  # net_trace.csv: the counters over the run
    notes: list[str] = field(default_factory=list)


def to_controller_s(clock: HostClock, host_origin_epoch_ns: int, controller_origin_epoch_ns: int,
                    t_s: list[float]) -> list[float]:
    """Host times (s since the host's start) as seconds since the controller's start, on the controller's clock."""
    out = []
    for t in t_s:
        host_ns = host_origin_epoch_ns + round(t * NS_PER_S)
        out.append((clock.to_controller_ns(host_ns) - controller_origin_epoch_ns) / NS_PER_S)
    return out


def aligned(run: HostRun, host_origin_epoch_ns: int, controller_origin_epoch_ns: int) -> HostRun:
    """`run` (times on its host's clock since its start) with every time on the controller's clock."""
    clock = run.clock
    if clock is None:
        return run

    def move(t_s: list[float]) -> list[float]:
        assert clock is not None
        return to_controller_s(clock, host_origin_epoch_ns, controller_origin_epoch_ns, list(t_s))

    gpus = {g: GpuSeries(g, move(s.t_s), s.values, s.errors) for g, s in run.trace.gpus.items()}
    trace = Trace(dict(run.trace.meta, clock="controller"), gpus)
    server = replace(run.server, t_s=move(run.server.t_s)) if run.server is not None else None
    host_trace = replace(run.host_trace, t_s=move(run.host_trace.t_s)) if run.host_trace is not None else None
    idle = move([run.idle_start_s, run.idle_end_s])
    net_series = (shifted(run.net_series, {i: move([r[0] for r in rows]) for i, rows in run.net_series.items()})
                  if run.net_series is not None else None)
    return replace(run, trace=trace, server=server, host_trace=host_trace, idle_start_s=idle[0], idle_end_s=idle[1],
                   net_series=net_series)


def net_gb_s(net: tuple[NetCounters, NetCounters] | None) -> float | None:
    """The busiest interface's busier direction over the window, in GB/s (10^9 bytes, as nccl-tests reports its
    bus bandwidth). The busiest, not the sum: a bridge and the port under it count the same bytes twice."""
    if net is None:
        return None
    a, b = net
    span = b.t_s - a.t_s
    if span <= 0:
        return None
    moved = [max(b.bytes_by_iface[i][0] - rx, b.bytes_by_iface[i][1] - tx)
             for i, (rx, tx) in a.bytes_by_iface.items() if i in b.bytes_by_iface]
    moved = [m for m in moved if m >= 0]  # a counter that went back (an interface reset) says nothing
    return max(moved) / span / 1e9 if moved else None


def host_figures(run: HostRun, start_s: float, end_s: float) -> dict[str, Any]:
    """One host's figures over the benchmark's window (controller clock): its GPUs' statistics, their sums and
    means, the energy, the tokens its server generated, and the inter-node traffic."""
    idle = idle_power(run.trace, run.idle_start_s, run.idle_end_s)
    gpus = {g: gpu_window_stats(s, start_s, end_s, idle.get(g)) for g, s in sorted(run.trace.gpus.items())}

    def vals(key: str) -> list[float]:
        return [float(v) for v in (g[key] for g in gpus.values()) if v is not None]

    power = [float(g["power_w"]["mean"]) for g in gpus.values() if g["power_w"]["mean"] is not None]
    energy = vals("energy_j")
    tokens = None
    if run.server is not None:
        delta = counter_delta(run.server, "generation_tokens_total", start_s, end_s)
        tokens = delta[0] if delta is not None else None
    energy_j = sum(energy) if len(energy) == len(gpus) and gpus else None
    util = vals("util_gpu_pct")
    clocks = vals("sm_clock_mhz")
    return {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "power_w": _r(sum(power)) if power else None,
        "power_of_limit": _r(_mean(vals("power_of_limit")), 3),
        "util_gpu_pct": _r(_mean(util)),
        "sm_clock_mhz": _r(_mean(clocks), 0),
        "energy_j": _r(energy_j),
        "generated_tokens": _r(tokens, 0),
        "tokens_per_j": _r(tokens / energy_j, 4) if tokens is not None and energy_j else None,
        "net_gb_s": _r(net_gb_s(run.net), 4),
        **{k: _r(v, 4) for k, v in rate_figures(interval_rates_gb_s(run.net_series or {}, start_s, end_s)).items()},
    }


def node_verdict(run: HostRun, host_manifest: RunRecord, topology: dict[str, Any], start_s: float,
                 end_s: float) -> dict[str, Any]:
    """One host judged alone over the fleet's benchmark window (controller clock) by the single-host summary and
    verdict code, its own server and host timelines included: what that node shows beside the fleet's verdict
    (a replica kv-bound while the other idles)."""
    manifest = replace(host_manifest, idle_start_s=run.idle_start_s, idle_end_s=run.idle_end_s,
                       bench_start_s=start_s, bench_end_s=end_s, exit_code=0, interrupted=False,
                       requests_sent=None, failed_requests=None)
    summary = summarize(run.trace, manifest, normalize_bench_result(None), server=run.server, host=run.host_trace)
    verdict = judge(summary, topology, manifest.target, trace=run.trace, server=run.server, host=run.host_trace)
    return {"class": verdict.cls, "confidence": round(verdict.confidence, 2), "headline": verdict.headline,
            "judged_s": [summary.steady.start_s if summary.steady.start_s is not None else start_s,
                         summary.steady.end_s if summary.steady.end_s is not None else end_s]}


def fleet_figures(per_host: dict[str, dict[str, Any]], output_tokens: float | None) -> dict[str, Any]:
    """The fleet's figures from the hosts': sums where they add up (power, energy), means where they do not.
    Tokens per joule: the benchmark's output tokens over every GPU's energy (one model over several hosts has its
    tokens counted once, by the client)."""
    energy = [h["energy_j"] for h in per_host.values()]
    energy_j = sum(energy) if energy and None not in energy else None
    power = [h["power_w"] for h in per_host.values() if h["power_w"] is not None]
    gpus = sum(h["gpu_count"] for h in per_host.values())
    utils = [(h["util_gpu_pct"], h["gpu_count"]) for h in per_host.values() if h["util_gpu_pct"] is not None]
    return {
        "hosts": len(per_host),
        "gpu_count": gpus,
        "power_w": _r(sum(power)) if power else None,
        "util_gpu_pct": _r(sum(u * n for u, n in utils) / sum(n for _, n in utils)) if utils else None,
        "energy_j": _r(energy_j),
        "output_tokens": _r(output_tokens, 0),
        "tokens_per_j": _r(output_tokens / energy_j, 4) if output_tokens and energy_j else None,
    }


FLEET_TRACE_MAGIC = "# toolkit-probe-fleet-trace"
FLEET_TRACE_SCHEMA_VERSION = 1


def dump_fleet_trace(runs: list[HostRun]) -> str:
    """Every host's GPU samples on the controller's clock in one CSV: `host` first, then trace.csv's columns."""
    lines = [f"{FLEET_TRACE_MAGIC} schema_version={FLEET_TRACE_SCHEMA_VERSION} clock=controller "
             f"hosts={';'.join(r.host for r in runs)}\n", "host," + ",".join(COLUMNS) + "\n"]
    for run in runs:
        for g, s in sorted(run.trace.gpus.items()):
            cols = {c: s.values[c] for c in NUMERIC_COLUMNS}
            for i, t in enumerate(s.t_s):
                row: dict[str, float | int | str | None] = {c: v[i] for c, v in cols.items()}
                row.update({"t_s": t, "gpu": g, "error": s.errors[i] if s.errors else ""})
                lines.append(f"{run.host},{format_row(row)}")
    return "".join(lines)


def _mean(vs: list[float]) -> float | None:
    return sum(vs) / len(vs) if vs else None
