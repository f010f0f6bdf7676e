"""Cost of the probe: replay+judge at scale (CPU), and NVML sampling cost per GPU-sample (GPU machine).

    python3 benchmarks/bench_probe.py                 # replay + judge a synthetic 1 h, 8-GPU, 10 Hz trace
    python3 benchmarks/bench_probe.py --nvml          # each NVML call's cost on GPU 0
    python3 benchmarks/bench_probe.py --fleet --phase compute --seconds 15 --rounds 3   # 8 states at 50 Hz

Replay: builds the trace text once (synthetic, labelled so in its header), then times parse_trace +
summarize + judge, `--repeats` times, on the default path (numpy columns where numpy is present) and on the
list path (TOOLKIT_PROBE_STDLIB=1), interleaved with a baseline in the same run (a bare csv.reader pass over
the same text: the floor any CSV replay pays); prints medians, ratios and whether the verdicts are identical.
Goal: under 1 s, at most 3x the floor.
NVML (--nvml): median wall ms of each NVML call on GPU 0 (where a sampler's time would go).
Fleet (--fleet, GPU machine): the probe's NVML sampler thread with 8 independent sampler states on GPU 0 (own
buffers, lastSeen, GPM pair each; 50 Hz rows from the driver's samples), its rows formatted and written as the
probe writes trace.csv, while `loads/gpu_phases.py PHASE` runs in its own process. Interleaved windows of
--seconds: sampler off (the idle baseline: the same collecting loop with nothing to collect) and on. Reports
per window the sampler thread's CPU (time.thread_time) and the whole process's (time.process_time: every
thread, to the nanosecond, where os.times counts 10 ms ticks) as shares of one core, the process's on minus off
(both windows read the energy counter twice for the check below); the load's throughput in each window from
its timeline (on vs off); and the energy over each on-window's steady middle from state 0's 20 ms samples
against the counter's delta. Goals: < 2 % of
one core (median of rounds), energy within 1 %.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.sampler import Row
from toolkit.core.probe.summary import summarize
from toolkit.core.probe.trace import dump_trace, parse_trace, trace_from_rows
from toolkit.core.probe.verdict import judge


def synthetic_trace_text(gpus: int = 8, seconds: float = 3600.0, hz: float = 10.0) -> str:
    rows: list[Row] = []
    n = int(seconds * hz)
    for i in range(n):
        t = i / hz
        for g in range(gpus):
            busy = t >= 10.0
            rows.append({
                "t_s": round(t, 3), "gpu": g,
                "power_w": 250.0 + 5 * math.sin(t + g) if busy else 87.0,
                "power_limit_w": 600.0, "energy_j": 1e6 + t * 250.0,
                "util_gpu_pct": 100.0 if busy else 0.0, "util_mem_pct": 20.0,
                "sm_clock_mhz": 2400.0, "sm_clock_max_mhz": 2430.0, "mem_clock_mhz": 14001.0,
                "mem_clock_max_mhz": 14001.0, "clock_reasons": 0, "temp_c": 60.0,
                "pcie_tx_kib_s": 1.0e6, "pcie_rx_kib_s": 1.0e6,
            })
    meta = {"sample_hz": str(hz), "source": "synthetic:bench_probe", "gpus": ";".join(map(str, range(gpus)))}
    return dump_trace(trace_from_rows(rows, meta))


def _replay_once(text: str, run: dict[str, object], *, stdlib: bool) -> tuple[float, dict[str, object]]:
    """parse_trace + summarize + judge of the text: (seconds, verdict dict)."""
    from toolkit.core.probe import columnar

    with columnar.list_path() if stdlib else contextlib.nullcontext():
        t0 = time.perf_counter()
        trace = parse_trace(text, "synthetic.csv")
        summary = summarize(trace, RunRecord.from_dict(run), {})
        verdict = judge(summary, {}, {})
        return time.perf_counter() - t0, verdict.to_dict()


def bench_replay(repeats: int) -> dict[str, object]:
    """The default path (numpy columns where numpy is present) and the list path, interleaved with the floor."""
    from toolkit.core.probe import columnar

    text = synthetic_trace_text()
    rows = text.count("\n") - 2
    run = {"idle_start_s": 0.0, "idle_end_s": 10.0, "bench_start_s": 10.0, "bench_end_s": 3599.9, "exit_code": 0,
           "data_source": "synthetic (benchmarks/bench_probe.py)"}
    times: dict[str, list[float]] = {"default": [], "stdlib": [], "csv_reader": []}
    verdicts: dict[str, dict[str, object]] = {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _row in csv.reader(io.StringIO(text)):
            pass
        times["csv_reader"].append(time.perf_counter() - t0)
        for path in ("default", "stdlib"):
            dt, verdicts[path] = _replay_once(text, run, stdlib=path == "stdlib")
            times[path].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "what": "parse_trace + summarize + judge, synthetic 1 h x 8 GPUs x 10 Hz (trace schema 2)",
        "rows": rows,
        "repeats": repeats,
        "numpy": columnar.np.__version__ if columnar.available() else None,
        "median_s": round(med["default"], 3),
        "baseline_csv_reader_median_s": round(med["csv_reader"], 3),
        "ratio_to_baseline": round(med["default"] / med["csv_reader"], 2),
        "stdlib_median_s": round(med["stdlib"], 3),
        "stdlib_ratio_to_baseline": round(med["stdlib"] / med["csv_reader"], 2),
        "goal": {"median_s": 1.0, "ratio_to_baseline": 3.0},
        "verdict": verdicts["default"]["class"],
        "verdict_stdlib": verdicts["stdlib"]["class"],
        "verdicts_identical": verdicts["default"] == verdicts["stdlib"],
        "times_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


def nvml_call_costs(repeats: int = 20) -> dict[str, float]:
    """Median wall ms of each NVML call the sampler makes, on GPU 0: where a GPU-sample's time goes."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        calls = {
            "power_usage": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "field_power_instant": lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT]),
            "enforced_power_limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
            "total_energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
            "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "clock_mem": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "clock_event_reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
            "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "pcie_throughput_tx": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_throughput_rx": lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
        }
        if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
            calls["gpm_sample_get"] = lambda: nv.nvmlGpmSampleGet(h, s1)

            def metrics_get() -> None:
                nv.nvmlGpmSampleGet(h, s2)
                mg = nv.c_nvmlGpmMetricsGet_t()
                mg.version, mg.numMetrics, mg.sample1, mg.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, 1, s1, s2
                mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
                nv.nvmlGpmMetricsGet(mg)

            calls["gpm_sample_get_plus_metrics_get"] = metrics_get
        out = {}
        for name, fn in calls.items():
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                with contextlib.suppress(nv.NVMLError):
                    fn()
                ts.append(time.perf_counter() - t0)
            out[name] = round(statistics.median(ts) * 1000, 4)
        return out
    finally:
        nv.nvmlShutdown()


def _load_rate(timeline: list[list[float]], a: float, b: float) -> float | None:
    """Iterations per second of the load between a and b (its timeline: [[t_s, iterations so far], ...])."""
    pts = [(float(t), float(n)) for t, n in timeline]

    def at(x: float) -> float | None:
        for (t0, n0), (t1, n1) in itertools.pairwise(pts):
            if t0 <= x <= t1:
                return n0 + (n1 - n0) * (x - t0) / (t1 - t0) if t1 > t0 else n1
        return None

    na, nb = at(a), at(b)
    return (nb - na) / (b - a) if na is not None and nb is not None and b > a else None


def _sample_energy_j(rows: list[Row], a: float, b: float) -> float:
    """Trapezoid of one state's 20 ms power samples over [a, b], held flat to the bounds."""
    pts = sorted((float(r["t_s"]), float(r["power_sample_w"])) for r in rows  # type: ignore[arg-type]
                 if r.get("power_sample_w") is not None and a - 0.05 <= float(r["t_s"]) <= b + 0.05)  # type: ignore[arg-type]
    inside = [p for p in pts if a <= p[0] <= b]
    e = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(inside))
    return e + (inside[0][0] - a) * inside[0][1] + (b - inside[-1][0]) * inside[-1][1]


def bench_fleet(phase: str, seconds: float, rounds: int, states: int = 8) -> dict[str, object]:
    import os
    import subprocess
    import tempfile

    import pynvml as nv

    from toolkit.adapters.bench_process import _write_rows
    from toolkit.adapters.nvml import NvmlSampler

    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    out_jsonl = tmp / "load.jsonl"
    load_s = rounds * 2 * seconds + 8.0
    load = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "loads" / "gpu_phases.py"),
                             phase, "--duration-s", str(load_s), "--output-file", str(out_jsonl)],
                            env=dict(os.environ, TOOLKIT_PROBE_T0_MONOTONIC=repr(t0)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(6.0)  # torch import, CUDA start and the load's first seconds
    nv.nvmlInit()
    h0 = nv.nvmlDeviceGetHandleByIndex(0)
    windows: list[dict[str, object]] = []
    trace_f = (tmp / "trace.csv").open("w", buffering=1 << 16)
    for rnd in range(rounds):
        for on in (False, True):
            sampler = None
            if on:
                sampler = NvmlSampler()
                sampler.open([0])
                sampler._gpus = [sampler._setup(0) for _ in range(states)]  # 8 independent states on GPU 0
                for i, g in enumerate(sampler._gpus):
                    g.index = i
                sampler.bench_started(0.0)  # as `probe run` does: the counter read at the window's start edge
            rows: list[Row] = []
            e_reads: list[tuple[float, float]] = []
            start = time.monotonic()
            c0, p0 = time.thread_time(), time.process_time()
            k = 0
            while (now := time.monotonic()) - start < seconds:
                if sampler is not None:
                    got = sampler.sample(now - t0)
                    _write_rows(trace_f, got)
                    rows.extend(r for r in got if r["gpu"] == 0)
                # The check's own counter reads around the window's middle (after the first drains, before the
                # last second), in the off windows too: the baseline's loop does all the check does.
                if (not e_reads and now - start >= 1.5) or (len(e_reads) == 1 and now - start >= seconds - 1.0):
                    ta = time.monotonic()
                    e = nv.nvmlDeviceGetTotalEnergyConsumption(h0) / 1000.0
                    e_reads.append(((ta + time.monotonic()) / 2 - t0, e))
                k += 1
                time.sleep(max(0.0, start + k * 0.1 - time.monotonic()))
            wall = time.monotonic() - start
            p1 = time.process_time()
            w: dict[str, object] = {"round": rnd, "sampler": on, "start_s": round(start - t0, 3),
                                    "end_s": round(start - t0 + wall, 3), "wall_s": round(wall, 3),
                                    "main_thread_cpu_s": round(time.thread_time() - c0, 5)}
            if sampler is not None:
                rest = sampler.finish(time.monotonic() - t0)
                _write_rows(trace_f, rest)
                rows.extend(r for r in rest if r["gpu"] == 0)
                p1 = time.process_time()
                cost = sampler.cost()
                sampler.close()
                w["thread"] = cost
                w["thread_cpu_share"] = cost["thread_cpu_share_of_one_core"]
                (ta, ea), (tb, eb) = e_reads
                counter = eb - ea
                integ = _sample_energy_j(rows, ta, tb)
                w["energy"] = {"window_s": round(tb - ta, 3), "counter_j": round(counter, 2),
                               "samples_j": round(integ, 2), "error": round(integ / counter - 1, 5),
                               "state0_rows": len(rows)}
            w["process_cpu_share"] = round((p1 - p0) / wall, 5)
            windows.append(w)
    trace_f.close()
    nv.nvmlShutdown()
    load.wait(timeout=load_s + 60)
    timeline = json.loads(out_jsonl.read_text().splitlines()[-1])["timeline"] if out_jsonl.exists() else []
    for w in windows:  # the load's rate over each window, 1 s in from each end
        w["load_rate_per_s"] = _load_rate(timeline, float(w["start_s"]) + 1.0,  # type: ignore[arg-type]
                                          float(w["end_s"]) - 1.0)  # type: ignore[arg-type]
    on_ws = [w for w in windows if w["sampler"]]
    off_ws = [w for w in windows if not w["sampler"]]

    def med(ws: list[dict[str, object]], key: str) -> float | None:
        vs = [float(w[key]) for w in ws if w.get(key) is not None]  # type: ignore[arg-type]
        return round(statistics.median(vs), 5) if vs else None

    extra = [float(a["process_cpu_share"]) - float(b["process_cpu_share"])  # type: ignore[arg-type]
             for a, b in zip(on_ws, off_ws, strict=True)]
    rate_on, rate_off = med(on_ws, "load_rate_per_s"), med(off_ws, "load_rate_per_s")
    return {
        "what": f"NVML sampler thread, {states} independent states on GPU 0, 50 Hz driver samples, under "
                f"loads/gpu_phases.py {phase}; interleaved {seconds:g} s windows off/on, {rounds} rounds",
        "phase": phase,
        "sampler_thread_cpu_share_median": med(on_ws, "thread_cpu_share"),
        "process_cpu_share_on_median": med(on_ws, "process_cpu_share"),
        "process_cpu_share_off_median": med(off_ws, "process_cpu_share"),
        "process_cpu_share_on_minus_off_median": round(statistics.median(extra), 5),
        "energy_error_by_round": [w["energy"]["error"] for w in on_ws],  # type: ignore[index]
        "load_rate_on_median": rate_on,
        "load_rate_off_median": rate_off,
        "load_rate_on_over_off": round(rate_on / rate_off, 5) if rate_on and rate_off else None,
        "load_stderr_tail": (load.stderr.read().decode(errors="replace")[-500:] if load.stderr else ""),
        "windows": windows,
        "goal": {"cpu_share_of_one_core": 0.02, "energy_error": 0.01},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvml", action="store_true", help="measure sampling cost on this machine's GPUs")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="--nvml/--fleet: interleaved rounds (medians)")
    ap.add_argument("--fleet", action="store_true", help="8 sampler states at 50 Hz under a load (GPU machine)")
    ap.add_argument("--phase", default="compute", help="--fleet: the loads/gpu_phases.py phase running meanwhile")
    args = ap.parse_args()
    if args.fleet:
        result = bench_fleet(args.phase, args.seconds, args.rounds)
    elif args.nvml:
        result = {"per_call_ms_median": nvml_call_costs()}
    else:
        result = bench_replay(args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
