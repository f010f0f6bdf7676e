"""Where the NVML sampler's CPU goes, on a GPU machine under a real load (the process-cost goal).

    python3 loads/sampler_breakdown.py [--seconds 15] > breakdown.json

1. Per-call CPU (time.thread_time: user + system of this thread) and wall of each NVML call the sampler makes,
   on GPU 0 while `loads/gpu_phases.py compute` runs: the energy counter by its own call and through field
   values, a power-sample drain after 1 s and 2 s of samples and an empty one, the GPM pair, the fast trio.
2. One window of the real sampler (8 independent states on GPU 0, as benchmarks/bench_probe.py --fleet) with
   each of its methods wrapped to add up its thread CPU: which part of the 1.7 % is which.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cost(fn: Any, n: int, gap_s: float = 0.0) -> dict[str, float]:
    cpu, wall = [], []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        c0, w0 = time.thread_time(), time.perf_counter()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu_ms_median": round(statistics.median(cpu) * 1e3, 4),
            "wall_ms_median": round(statistics.median(wall) * 1e3, 4), "cpu_ms_max": round(max(cpu) * 1e3, 4), "n": n}


def per_call(nv: Any) -> dict[str, Any]:
    from toolkit.adapters import nvml

    h = nv.nvmlDeviceGetHandleByIndex(0)
    out: dict[str, Any] = {}
    out["total_energy"] = _cost(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), 20)
    fid = getattr(nv, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 83)
    fv = nv.nvmlDeviceGetFieldValues(h, [fid])
    out["field_energy_value"] = {"ret": int(fv[0].nvmlReturn), "mj": int(fv[0].value.ullVal),
                                 "counter_mj": int(nv.nvmlDeviceGetTotalEnergyConsumption(h))}
    out["field_energy"] = _cost(lambda: nv.nvmlDeviceGetFieldValues(h, [fid]), 20)
    fp = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", 186)
    out["field_power_instant"] = _cost(lambda: nv.nvmlDeviceGetFieldValues(h, [fp]), 50)
    s = nvml.NvmlSampler()
    s.open([0])
    g = s._gpus[0]
    n_seen: list[int] = []

    def drain() -> None:
        rows: list[Any] = []
        before = s._n_samples
        s._drain(g, rows)
        n_seen.append(s._n_samples - before)

    g.c_last_seen.value = time.time_ns() // 1000
    s._origin = time.monotonic()
    g.fast.append((0.0, 1.0, 1.0, 1.0, 1.0))
    for label, gap, n in (("drain_after_1s", 1.0, 5), ("drain_after_2s", 2.0, 4), ("drain_empty", 0.0, 20)):
        n_seen.clear()
        out[label] = {**_cost(drain, n, gap), "samples_median": statistics.median(n_seen)}
    raw = {}
    for label, n in (("getsamples_raw_after_1s", 5),):
        cpu = []
        for _ in range(n):
            g.c_last_seen.value = time.time_ns() // 1000
            time.sleep(1.0)
            g.c_count.value = nvml.SAMPLE_BUFFER
            c0 = time.thread_time()
            s._fn_samples(g.handle, 0, g.c_last_seen, g.p_value_type, g.p_count, g.c_samples)
            cpu.append(time.thread_time() - c0)
        raw[label] = {"cpu_ms_median": round(statistics.median(cpu) * 1e3, 4), "n": n}
    out.update(raw)
    out["fast_trio"] = _cost(lambda: s._read_fast(g, 0.0), 300)
    g.fast.clear()
    out["slow_four"] = _cost(lambda: s._read_slow(g, 0.0), 30)
    g.pending.clear()
    if g.gpm:
        out["gpm_pair_and_metrics"] = _cost(lambda: (time.sleep(0.11), s._gpm(g, 0.0, time.monotonic())), 20)
        s1 = g.gpm_prev
        out["gpm_sample_get"] = _cost(lambda: nv.nvmlGpmSampleGet(h, s1), 20)
        mg = g.gpm_request
        out["gpm_metrics_get"] = _cost(lambda: nv.nvmlGpmMetricsGet(mg), 20)
    s.close()
    return out


def instrumented_window(seconds: float, states: int = 8) -> dict[str, Any]:
    from toolkit.adapters import nvml
    from toolkit.adapters.bench_process import _write_rows

    acc: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def wrap(name: str) -> None:
        orig = getattr(nvml.NvmlSampler, name)

        def inner(self: Any, *a: Any, **k: Any) -> Any:
            c0 = time.thread_time()
            try:
                return orig(self, *a, **k)
            finally:
                acc[name] += time.thread_time() - c0
                calls[name] += 1
        setattr(nvml.NvmlSampler, name, inner)

    for name in ("_tick", "_read_fast", "_gpm", "_read_slow", "_read_energy", "_drain", "_rows_of"):
        wrap(name)
    s = nvml.NvmlSampler()
    s.open([0])
    s._gpus = [s._setup(0) for _ in range(states)]
    for i, g in enumerate(s._gpus):
        g.index = i
    s.bench_started(0.0)
    trace_path = Path(tempfile.mkdtemp(prefix="breakdown-")) / "trace.csv"
    with trace_path.open("w", buffering=1 << 16) as trace:
        t0 = time.monotonic()
        writer_cpu = 0.0
        rows_n = 0
        p0 = time.process_time()
        k = 0
        while time.monotonic() - t0 < seconds:
            got = s.sample(time.monotonic() - t0)
            c0 = time.thread_time()
            _write_rows(trace, got)
            writer_cpu += time.thread_time() - c0
            rows_n += len(got)
            k += 1
            time.sleep(max(0.0, t0 + k * 0.1 - time.monotonic()))
        rest = s.finish(time.monotonic() - t0)
        c0 = time.thread_time()
        _write_rows(trace, rest)
        writer_cpu += time.thread_time() - c0
        rows_n += len(rest)
    wall = time.monotonic() - t0
    p1 = time.process_time()
    cost = s.cost()
    s.close()
    return {
        "seconds": round(wall, 3), "states": states, "rows": rows_n,
        "process_cpu_share": round((p1 - p0) / wall, 5),
        "thread": cost,
        "writer_cpu_share": round(writer_cpu / wall, 5),
        "writer_us_per_row": round(writer_cpu / max(1, rows_n) * 1e6, 3),
        "by_method_cpu_share": {k: round(v / wall, 5) for k, v in acc.items()},
        "by_method_calls": dict(calls),
        "note": "_tick includes the others; _drain includes _rows_of",
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    import pynvml as nv

    load = subprocess.Popen([sys.executable, str(ROOT / "loads" / "gpu_phases.py"), "compute", "--duration-s",
                             str(args.seconds + 75)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(6.0)
    nv.nvmlInit()
    try:
        result = {"per_call_under_compute": per_call(nv), "instrumented_window": instrumented_window(args.seconds)}
    finally:
        nv.nvmlShutdown()
        load.terminate()
        load.wait(timeout=30)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
