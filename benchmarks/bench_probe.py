"""Cost of the probe: replay+judge at scale (CPU), and NVML sampling cost per GPU-sample (GPU machine).

    python3 benchmarks/bench_probe.py                 # replay + judge a synthetic 1 h, 8-GPU, 10 Hz trace
    python3 benchmarks/bench_probe.py --nvml --seconds 10   # sampling cost at 10 and 50 Hz on real GPUs

Replay: builds the trace text once (synthetic, labelled so in its header), then times parse_trace +
summarize + judge, `--repeats` times; prints the median and the ratio to a baseline measured in the same
run (a bare csv.reader pass over the same text: the floor any CSV replay pays). Goal: under 2 s.
NVML: runs NvmlSampler.sample() for each sampler config (every reading every tick, the baseline; tiered;
tiered with a 5 s energy interval) at 10, 20 and 50 Hz and with 8 GPU slots at 20 Hz, --seconds each, in
--rounds interleaved rounds; reports medians of wall ms per GPU-sample and of the sampling thread's CPU
time as a share of one core. Goal: 8 GPUs at 20 Hz under 2 %.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from toolkit.core.probe.summary import summarize
from toolkit.core.probe.trace import dump_trace, parse_trace, trace_from_rows
from toolkit.core.probe.verdict import judge


def synthetic_trace_text(gpus: int = 8, seconds: float = 3600.0, hz: float = 10.0) -> str:
    rows = []
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


def bench_replay(repeats: int) -> dict[str, object]:
    text = synthetic_trace_text()
    rows = text.count("\n") - 2
    run = {"idle_start_s": 0.0, "idle_end_s": 10.0, "bench_start_s": 10.0, "bench_end_s": 3599.9, "exit_code": 0,
           "data_source": "synthetic (benchmarks/bench_probe.py)"}
    times, base = [], []
    verdict = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _row in csv.reader(io.StringIO(text)):
            pass
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trace = parse_trace(text, "synthetic.csv")
        summary = summarize(trace, run, {})
        verdict = judge(summary, {}, {})
        times.append(time.perf_counter() - t0)
    med, med_base = statistics.median(times), statistics.median(base)
    return {
        "what": "parse_trace + summarize + judge, synthetic 1 h x 8 GPUs x 10 Hz",
        "rows": rows,
        "repeats": repeats,
        "median_s": round(med, 3),
        "baseline_csv_reader_median_s": round(med_base, 3),
        "ratio_to_baseline": round(med / med_base, 2),
        "goal_s": 2.0,
        "verdict": verdict.cls if verdict else None,
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


# Sampler settings compared in one run: every reading on every tick (the sampler before SLOW_INTERVAL_S,
# the baseline) against the tiered default, and the tiered one with the energy counter read every 5 s.
NVML_CONFIGS: dict[str, dict[str, float]] = {
    "every_tick": {"slow_interval_s": 0.0, "energy_interval_s": 1.0},
    "tiered": {},
    "tiered_energy_5s": {"energy_interval_s": 5.0},
}


def _run_sampler(sampler: object, seconds: float, hz: float) -> tuple[list[float], float, float]:
    """Tick sampler.sample() at hz for seconds: (wall s per tick, CPU s inside sample(), wall s)."""
    period = 1.0 / hz
    per_tick: list[float] = []
    cpu = 0.0
    t_start = time.monotonic()
    k = 0
    while time.monotonic() - t_start < seconds:
        target = t_start + k * period
        now = time.monotonic()
        if target > now:
            time.sleep(target - now)
        c0, w0 = time.thread_time(), time.perf_counter()
        sampler.sample(time.monotonic() - t_start)  # type: ignore[attr-defined]
        per_tick.append(time.perf_counter() - w0)
        cpu += time.thread_time() - c0
        k += 1
    return per_tick, cpu, time.monotonic() - t_start


def bench_nvml(seconds: float, rates: list[float], rounds: int = 3) -> dict[str, object]:
    """Per config and rate: medians over `rounds` interleaved rounds of `seconds` each.

    `slots8_20hz` samples 8 GPU slots per tick at 20 Hz, cycling over the GPUs present (on a 1-GPU machine all
    8 read GPU 0, each with its own GPM samples and timers): the goal's 8 GPUs x 20 Hz measured as calls, not
    projected. The driver work per call does not depend on which GPU answers."""
    from toolkit.adapters.nvml import NvmlSampler

    out: dict[str, object] = {"per_call_ms_median": nvml_call_costs()}
    cases = [(name, hz, 0) for name in NVML_CONFIGS for hz in rates] + [(name, 20.0, 8) for name in NVML_CONFIGS]
    acc: dict[str, dict[str, list[float]]] = {}
    gpus_seen = 0
    for _round in range(rounds):
        for name, hz, slots in cases:  # interleaved: drift on a noisy machine hits every config alike
            sampler = NvmlSampler(**NVML_CONFIGS[name])  # type: ignore[arg-type]
            gpus = sampler.open(None)
            gpus_seen = len(gpus)
            try:
                if slots:
                    sampler._gpus = [sampler._setup(gpus[i % len(gpus)]) for i in range(slots)]
                n = len(sampler._gpus)
                sampler.sample(0.0)  # the first call pays one-time set-up; not counted
                per_tick, cpu, wall = _run_sampler(sampler, seconds, hz)
            finally:
                sampler.close()
            key = f"{name}_{'slots8_' if slots else ''}{hz:g}hz"
            d = acc.setdefault(key, {"ms_per_gpu_sample_median": [], "cpu_share_of_one_core": [],
                                     "projected_8_gpus_20hz_cpu_share": [], "gpu_samples_per_tick": []})
            d["ms_per_gpu_sample_median"].append(statistics.median(per_tick) / n * 1000)
            d["cpu_share_of_one_core"].append(cpu / wall)
            d["projected_8_gpus_20hz_cpu_share"].append(cpu / wall / n * 8 * 20 / hz)
            d["gpu_samples_per_tick"].append(n)
    for key, d in acc.items():
        out[key] = {k: round(statistics.median(v), 5) for k, v in d.items()} | {"rounds": rounds,
                                                                              "seconds_per_round": seconds}
    out["gpus_present"] = gpus_seen
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvml", action="store_true", help="measure sampling cost on this machine's GPUs")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="--nvml: interleaved rounds per config (medians)")
    args = ap.parse_args()
    result = bench_nvml(args.seconds, [10.0, 20.0, 50.0], args.rounds) if args.nvml else bench_replay(args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
