"""summary.json: full-run and steady-state figures side by side, per GPU and in total.

A pure function of the trace, the run's manifest and the benchmark's result. Its layout is documented in
docs/probe.md; results entries are built from it, so keys are only ever added.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe import columnar
from toolkit.core.probe.energy import window_energy
from toolkit.core.probe.host_trace import HostTrace, host_window
from toolkit.core.probe.numbers import percentile
from toolkit.core.probe.numbers import rounded as _r
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.series import REASON_BITS, GpuSeries, Trace
from toolkit.core.probe.server_trace import ServerTrace, counter_series, server_window
from toolkit.core.probe.steady import SteadyParams, SteadyWindow, find_counter_window, find_steady_window

SUMMARY_SCHEMA_VERSION = 1

GPM_KEYS = {
    "sm_util_pct": "gpm_sm_util_pct",
    "sm_occupancy_pct": "gpm_sm_occupancy_pct",
    "tensor_util_pct": "gpm_tensor_util_pct",
    "dram_bw_util_pct": "gpm_dram_bw_util_pct",
    "pcie_tx_mib_s": "gpm_pcie_tx_mib_s",
    "pcie_rx_mib_s": "gpm_pcie_rx_mib_s",
    "nvlink_tx_mib_s": "gpm_nvlink_tx_mib_s",
    "nvlink_rx_mib_s": "gpm_nvlink_rx_mib_s",
}





def _mean(vs: list[float]) -> float | None:
    return sum(vs) / len(vs) if vs else None


def _present(vs: list[float | None]) -> list[float]:
    if None not in vs:
        return vs  # type: ignore[return-value]
    return [v for v in vs if v is not None]


def _slice(s: GpuSeries, start_s: float, end_s: float) -> tuple[int, int]:
    return bisect.bisect_left(s.t_s, start_s), bisect.bisect_right(s.t_s, end_s)


def idle_power(trace: Trace, idle_start_s: float, idle_end_s: float) -> dict[int, float | None]:
    """Median power per GPU over the idle baseline (the median shrugs off the first sample's spike)."""
    if columnar.available():
        return columnar.idle_power(trace, idle_start_s, idle_end_s)
    out: dict[int, float | None] = {}
    for g, s in trace.gpus.items():
        lo, hi = _slice(s, idle_start_s, idle_end_s)
        vs = sorted(_present(s.values["power_w"][lo:hi]))
        out[g] = percentile(vs, 50) if vs else None
    return out


def gpu_window_stats(s: GpuSeries, start_s: float, end_s: float, idle_w: float | None) -> dict[str, Any]:
    if columnar.available():
        return columnar.gpu_window_stats(s, start_s, end_s, idle_w, GPM_KEYS, REASON_BITS)
    lo, hi = _slice(s, start_s, end_s)
    t = s.t_s[lo:hi]
    v = {c: col[lo:hi] for c, col in s.values.items()}
    errors = [e for e in s.errors[lo:hi] if e]
    power = sorted(_present(v["power_w"]))
    limit = _present(v["power_limit_w"])
    sm = sorted(_present(v["sm_clock_mhz"]))
    sm_max = _present(v["sm_clock_max_mhz"])
    mem = sorted(_present(v["mem_clock_mhz"]))
    energy = window_energy(t, v["energy_j"], v["power_w"], v["power_instant_w"], v["power_sample_w"]) if t else None
    sampled = sorted(_present(v["power_sample_w"]))
    reasons: dict[str, float] = {}
    masks = Counter(_present(v["clock_reasons"]))  # few distinct masks: count them once
    n_masks = sum(masks.values())
    if n_masks:
        for bit, name in REASON_BITS.items():
            share = sum(c for m, c in masks.items() if int(m) & bit) / n_masks
            if share > 0:
                reasons[name] = round(share, 3)
    gpm: dict[str, float | None] | None = {k: _r(_mean(_present(v[c]))) for k, c in GPM_KEYS.items()}
    if gpm is not None and all(x is None for x in gpm.values()):
        gpm = None  # GPM unavailable on this GPU (or not sampled): null, never zeros
    limit_w = _mean(limit)
    power_mean = _mean(power)
    sm_med = percentile(sm, 50) if sm else None
    sm_max_w = max(sm_max) if sm_max else None
    temps = _present(v["temp_c"])
    return {
        "samples": len(t),
        "error_samples": len(errors),
        "errors_seen": sorted(set(errors)),
        "power_w": {"mean": _r(power_mean), "p50": _r(percentile(power, 50)), "p95": _r(percentile(power, 95)),
                    "max": _r(power[-1] if power else None)},
        "power_limit_w": _r(limit_w),
        "power_of_limit": _r(power_mean / limit_w if power_mean is not None and limit_w else None, 3),
        "idle_power_w": _r(idle_w),
        "energy_j": _r(energy.energy_j if energy else None),
        "energy_source": energy.source if energy else None,
        "energy_integrated_j": _r(energy.integrated_j if energy else None),
        "energy_integrated_instant_j": _r(energy.integrated_instant_j if energy else None),
        "energy_integrated_sample_j": _r(energy.integrated_sample_j if energy else None),
        # the driver's 20 ms samples (schema 2 traces), beside the 1 s averaged power_w the rules were set on
        "power_sample_w": {"mean": _r(_mean(sampled)), "p95": _r(percentile(sampled, 95)),
                           "max": _r(sampled[-1] if sampled else None)} if sampled else None,
        "util_gpu_pct": _r(_mean(_present(v["util_gpu_pct"]))),
        "util_mem_pct": _r(_mean(_present(v["util_mem_pct"]))),
        "sm_clock_mhz": _r(sm_med, 0),
        "sm_clock_max_mhz": _r(sm_max_w, 0),
        "sm_clock_of_max": _r(sm_med / sm_max_w if sm_med and sm_max_w else None, 3),
        "mem_clock_mhz": _r(percentile(mem, 50) if mem else None, 0),
        "mem_clock_max_mhz": _r(max(_present(v["mem_clock_max_mhz"]), default=None), 0),
        "temp_c_max": _r(max(temps) if temps else None, 0),
        "pcie_tx_kib_s": _r(_mean(_present(v["pcie_tx_kib_s"]))),
        "pcie_rx_kib_s": _r(_mean(_present(v["pcie_rx_kib_s"]))),
        "clock_reasons_seen": reasons,
        "gpm": gpm,
    }


def _timeline_tokens(timeline: list[Any] | None, offset_s: float, start_s: float, end_s: float) -> float | None:
    """Output tokens produced inside [start_s, end_s] from a cumulative [[t_s, tokens], ...] timeline."""
    if not timeline:
        return None
    pts = sorted((offset_s + float(p[0]), float(p[1])) for p in timeline if isinstance(p, list) and len(p) == 2)
    if len(pts) < 2:
        return None

    def at(t: float) -> float:
        i = bisect.bisect_left([p[0] for p in pts], t)
        if i <= 0:
            return pts[0][1]
        if i >= len(pts):
            return pts[-1][1]
        (t0, v0), (t1, v1) = pts[i - 1], pts[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1

    return at(end_s) - at(start_s)


def window_summary(
    trace: Trace, start_s: float, end_s: float, idle: dict[int, float | None], bench: dict[str, Any],
    bench_start_s: float, *, full_run: bool, server: dict[str, Any] | None = None, where: str = "the steady window",
) -> dict[str, Any]:
    """One window's figures. `server` is server_window() over the same window: its realtime_tokens counter
    gives the steady window's throughput (it moves every forward pass; bench_serving's rates are whole-run)."""
    gpus = {str(g): gpu_window_stats(s, start_s, end_s, idle.get(g)) for g, s in trace.gpus.items()}
    energies = [g["energy_j"] for g in gpus.values()]
    total_j = sum(e for e in energies if e is not None) if any(e is not None for e in energies) else None
    duration = end_s - start_s
    if full_run:
        throughput = {
            "output_tok_per_s": bench.get("output_tok_per_s"),
            "total_tok_per_s": bench.get("total_tok_per_s"),
            "request_per_s": bench.get("request_per_s"),
            "source": "benchmark (whole run, ramp and drain included)",
        }
        out_tokens = bench.get("total_output_tokens")
    else:
        server_rate = (server or {}).get("output_tok_per_s")
        if server_rate is not None and duration > 0:
            # Tokens over the window at the counter's rate: the scrapes inside cover slightly less than the
            # window, the rate is the same.
            out_tokens = server_rate * duration
            throughput = {
                "output_tok_per_s": _r(server_rate),
                "total_tok_per_s": _r((server or {}).get("total_tok_per_s")),
                "request_per_s": None,
                "source": f"server counter sglang:realtime_tokens_total over {where}",
            }
        else:
            offset = 0.0 if bench.get("timeline_origin") == "probe_run" else bench_start_s
            out_tokens = _timeline_tokens(bench.get("timeline"), offset, start_s, end_s)
            throughput = {
                "output_tok_per_s": _r(out_tokens / duration) if out_tokens is not None and duration > 0 else None,
                "total_tok_per_s": None,
                "request_per_s": None,
                "source": f"benchmark timeline over {where}" if out_tokens is not None
                else "unavailable: the benchmark reports whole-run rates only and no server counter was scraped",
            }
    power_total = [g["power_w"]["mean"] for g in gpus.values() if g["power_w"]["mean"] is not None]
    return {
        "start_s": _r(start_s, 3),
        "end_s": _r(end_s, 3),
        "duration_s": _r(duration, 3),
        "throughput": throughput,
        "latency_ms": bench.get("latency_ms", {}) if full_run else {},
        "power_w_total_mean": _r(sum(power_total)) if power_total else None,
        "energy_j_total": _r(total_j),
        "output_tokens": _r(out_tokens),
        "j_per_output_token": _r(total_j / out_tokens, 4) if total_j and out_tokens else None,
        "output_tokens_per_j": _r(out_tokens / total_j, 4) if total_j and out_tokens else None,
        "gpus": gpus,
    }


def summarize(
    trace: Trace, run: RunRecord, bench: dict[str, Any], params: SteadyParams | None = None,
    server: ServerTrace | None = None, host: HostTrace | None = None,
) -> Summary:
    """run: its clock fields (idle_start_s, idle_end_s, bench_start_s, bench_end_s), exit code, tail; the rule
    is `params`, else the run's own. server, host: the run's server_trace.csv and host_trace.csv when it has them
    (summary `server`, `host`)."""
    params = params or SteadyParams.of_record(run.steady_state)
    if run.idle_end_s is None or run.bench_start_s is None or run.bench_end_s is None:
        raise ToolkitError.of("run.json has no benchmark window: the run was cut before its benchmark ended",
                              file="run.json", field="bench_end_s",
                              fix="give a run directory whose run.json says status finished or interrupted")
    idle = idle_power(trace, float(run.idle_start_s), float(run.idle_end_s))
    b0, b1 = float(run.bench_start_s), float(run.bench_end_s)
    gpu_rule: SteadyWindow = find_steady_window(trace, b0, b1, idle, params)
    # The server's token counter sees a drain that GPU utilisation (100 % while GPUs spin in communication
    # kernels) cannot: where the run has it, it decides.
    counter = find_counter_window(*counter_series(server, "realtime_decode_tokens_total"), b0, b1, params
                                  ) if server is not None else None
    steady: SteadyWindow = counter or gpu_rule
    # The window the verdict judges. Without a steady state the counter's rule says so (no steady rate is taken);
    # the GPUs' busy span, where the GPU rule finds one, is still judged rather than the whole benchmark window,
    # which holds bench_serving's warmup request and its one-second pause before the run.
    judged = steady if steady.found or not gpu_rule.found else gpu_rule
    if judged is steady:
        where = "the steady window" if steady.found else "the whole benchmark window (no steady window found)"
    else:
        where = "the GPUs' busy span (no steady state: the server's rate never held)"
    errors = [
        {"gpu": g, "t_s": round(s.t_s[i], 3), "error": e}
        for g, s in trace.gpus.items() if any(s.errors) for i, e in enumerate(s.errors) if e
    ]
    srv_full = server_window(server, b0, b1) if server is not None else None
    srv_steady = server_window(server, judged.start_s, judged.end_s) if server is not None else None
    run_server: dict[str, Any] = run.server or {}
    return Summary.from_dict({
        "provenance": run.provenance.to_dict(),
        "data_source": run.data_source,
        "gpus": sorted(trace.gpus),
        "sample_hz": float(trace.meta.get("sample_hz", run.sample_hz or 0) or 0),
        "benchmark": {
            "exit_code": run.exit_code,
            "interrupted": run.interrupted,
            "stderr_tail": run.stderr_tail,
            "server_log_tail": run.server_log_tail,
            "duration_s": bench.get("duration_s"),
            "completed": bench.get("completed"),
            "requests_sent": run.requests_sent,
            "failed_requests": run.failed_requests,
            "total_output_tokens": bench.get("total_output_tokens"),
            "peak_output_tok_per_s": bench.get("peak_output_tok_per_s"),
            "keys_present": bench.get("keys_present", []),
        },
        "idle": {"start_s": run.idle_start_s, "end_s": run.idle_end_s,
                 "power_w": {str(g): _r(w) for g, w in idle.items()}},
        "steady_state": {
            "found": steady.found,
            "reason": steady.reason,
            "signal": steady.signal,
            "peak_activity": round(gpu_rule.peak_activity, 3),
            "threshold": round(steady.threshold, 3),
            "peak_output_tok_per_s": round(counter.peak_activity, 1) if counter is not None else None,
            # what the GPU rule alone found, beside the counter's window (the drain GPU util cannot see)
            "gpu_rule": {"found": gpu_rule.found, "start_s": round(gpu_rule.start_s, 3),
                         "end_s": round(gpu_rule.end_s, 3)} if counter is not None else None,
            "rule": {"plateau_fraction": params.plateau_fraction, "smooth_s": params.smooth_s,
                     "min_window_s": params.min_window_s},
        },
        "full": window_summary(trace, b0, b1, idle, bench, b0, full_run=True, server=srv_full),
        "steady": window_summary(trace, judged.start_s, judged.end_s, idle, bench, b0, full_run=False,
                                 server=srv_steady, where=where),
        # SGLang's own view (server_trace.csv) and the host's CPU (host_trace.csv); None when not recorded.
        "server": None if server is None else {
            "source": server.meta.get("source"), "metrics_enabled": run_server.get("metrics_enabled"),
            "what_was_not_seen": run_server.get("what_was_not_seen", []), "rows": len(server),
            "gaps": server.gaps, "resets": server.resets, "full": srv_full, "steady": srv_steady},
        "host": None if host is None else {
            "full": host_window(host, b0, b1), "steady": host_window(host, judged.start_s, judged.end_s)},
        "gpu_errors": errors[:200],
        "gpu_error_count": len(errors),
        "gaps": reading_gaps(trace, b0, b1),
    })


def reading_gaps(trace: Trace, start_s: float, end_s: float) -> list[dict[str, Any]]:
    """Spans of the benchmark window in which a GPU was sampled but nothing was read (NVML failed: an error and
    no power, no utilization), one per GPU and span: what the verdict could not see."""
    gaps: list[dict[str, Any]] = []
    for g, s in sorted(trace.gpus.items()):
        lo, hi = _slice(s, start_s, end_s)
        span: dict[str, Any] | None = None
        for i in range(lo, hi):
            blind = bool(s.errors[i]) and s.values["power_w"][i] is None and s.values["util_gpu_pct"][i] is None
            if blind and span is None:
                span = {"gpu": g, "start_s": round(s.t_s[i], 3), "end_s": round(s.t_s[i], 3), "samples": 0,
                        "error": s.errors[i]}
            if blind and span is not None:
                span["end_s"] = round(s.t_s[i], 3)
                span["samples"] += 1
            elif span is not None:
                gaps.append(span)
                span = None
        if span is not None:
            gaps.append(span)
        total = hi - lo
        for gap in gaps:
            if gap["gpu"] == g:
                gap["of_samples"] = total
    return gaps
