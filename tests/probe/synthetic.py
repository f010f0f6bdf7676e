"""Synthetic traces for tests, each labelled as such in its header (source=synthetic:...).

`seed_run` is shaped like the story's published figures (docs/story.md): 8 GPUs of
600 W, idle ~87 W, then 100 % utilization at the per-GPU powers nvidia-smi printed 20 s into the benchmark
(256.54, 248.95, 255.94, 247.21, 248.81, 249.72, 255.02, 251.61 W), PCIe only, no P2P, 3,740 output tok/s.
Only what the seed measured is filled in (power, limit, util); every other metric is empty (unavailable),
as it would be from nvidia-smi. It is derived from published numbers, not measured.
"""

from __future__ import annotations

import math
from typing import Any

from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.series import Trace
from toolkit.core.probe.trace import trace_from_rows

SEED_POWER_W = (256.54, 248.95, 255.94, 247.21, 248.81, 249.72, 255.02, 251.61)
SEED_LIMIT_W = 600.0
SEED_IDLE_W = 87.0


def ramp(t: float, start: float, ramp_s: float, end: float, drain_s: float) -> float:
    """0 before start, linear up over ramp_s, 1 on the plateau, linear down over drain_s before end."""
    if t < start or t > end:
        return 0.0
    return max(0.0, min(1.0, (t - start) / ramp_s, (end - t) / drain_s))


def seed_run(hz: float = 10.0, idle_s: float = 10.0, bench_s: float = 35.0) -> tuple[Trace, RunRecord,
                                                                                     dict[str, Any], dict[str, Any]]:
    """(trace, run manifest fields, raw bench result, topology) of the seed-shaped synthetic run."""
    rows = []
    b0, b1 = idle_s, idle_s + bench_s
    n = int((b1 + 1.0) * hz)
    for i in range(n):
        t = i / hz
        x = ramp(t, b0, 3.0, b1, 3.0)
        for g, p in enumerate(SEED_POWER_W):
            wobble = 2.0 * math.sin(1.3 * t + g)  # deterministic, so tests are repeatable
            power = SEED_IDLE_W + x * (p - SEED_IDLE_W) + x * wobble
            rows.append({"t_s": round(t, 3), "gpu": g, "power_w": round(power, 2),
                         "power_limit_w": SEED_LIMIT_W, "util_gpu_pct": round(100.0 * x)})
    trace = trace_from_rows(rows, {"sample_hz": str(hz), "source": "synthetic:seed-figures", "gpus": "0;1;2;3;4;5;6;7"})
    run = RunRecord.from_dict(_seed_manifest(b0, b1))
    bench = {"duration": bench_s, "completed": 1024, "total_input_tokens": 1024 * 256,
             "total_output_tokens": round(3740 * bench_s), "request_throughput": 1024 / bench_s,
             "input_throughput": 1024 * 256 / bench_s, "output_throughput": 3740.0, "max_output_tokens_per_s": 3945.0}
    topology = {
        "schema_version": 1, "driver_version": None, "data_source": "synthetic:seed-figures",
        "gpus": [{"index": g, "name": "NVIDIA RTX PRO 6000 Blackwell (synthetic)", "power_limit_w": SEED_LIMIT_W,
                  "gpm_supported": None} for g in range(8)],
        "links": [{"a": a, "b": b, "common_ancestor": "SYSTEM", "p2p_read_ok": False, "p2p_nvlink_ok": False}
                  for a in range(8) for b in range(a + 1, 8)],
    }
    return trace, run, bench, topology


def _seed_manifest(b0: float, b1: float) -> dict[str, Any]:
    """The seed run's run.json as committed (schema 1: its provenance from its sentence, read on load)."""
    return {"idle_start_s": 0.0, "idle_end_s": b0, "bench_start_s": b0, "bench_end_s": b1, "exit_code": 0,
            "data_source": "synthetic: shaped from the story's published figures, not measured",
            "target": {"profile": "glm5-tp8", "gpu_count": 8, "interconnect": "pcie", "p2p": False, "tp_size": 8}}


def write_seed_fixture(directory: Any) -> None:
    """tests/fixtures/probe/seed-synthetic-8gpu/: the seed-shaped trace and topology, for the lab's --replay-gpu-trace.

    Regenerate with: .venv/bin/python -c "from tests.probe.synthetic import write_seed_fixture as w;
    w('tests/fixtures/probe/seed-synthetic-8gpu')"
    """
    import json
    from pathlib import Path

    from toolkit.core.probe.trace import dump_trace

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    trace, run, _bench, topology = seed_run()
    (d / "trace.csv").write_text(dump_trace(trace))
    # Its phases, so a replay follows the live run's idle and benchmark (RecordedSampler).
    manifest = _seed_manifest(run.idle_end_s or 0.0, run.bench_end_s or 0.0)
    (d / "run.json").write_text(json.dumps({"schema_version": 1, **manifest}, indent=2, sort_keys=True) + "\n")
    (d / "topology.json").write_text(json.dumps(topology, indent=2, sort_keys=True) + "\n")


# --- Timelines for the verdict over time (tests/probe/test_timeline_verdict.py) ---------------------------------
# GPU shapes as the H200 read them (tests/fixtures/probe/h200-*), 700 W limit, idle ~80 W.
H200_SHAPES: dict[str, dict[str, float]] = {
    "compute": {"power_w": 692.0, "util_gpu_pct": 99.0, "gpm_sm_util_pct": 96.0, "gpm_tensor_util_pct": 93.0,
                "gpm_dram_bw_util_pct": 17.0, "sm_clock_mhz": 1470.0, "clock_reasons": 4},
    "memory": {"power_w": 473.0, "util_gpu_pct": 99.0, "gpm_sm_util_pct": 99.0, "gpm_tensor_util_pct": 0.0,
               "gpm_dram_bw_util_pct": 88.0, "sm_clock_mhz": 1980.0, "clock_reasons": 0},
    "spin": {"power_w": 123.0, "util_gpu_pct": 100.0, "gpm_sm_util_pct": 0.8, "gpm_tensor_util_pct": 0.0,
             "gpm_dram_bw_util_pct": 0.0, "sm_clock_mhz": 1980.0, "clock_reasons": 0},
    "launch": {"power_w": 120.0, "util_gpu_pct": 13.0, "gpm_sm_util_pct": 0.5, "gpm_tensor_util_pct": 0.0,
               "gpm_dram_bw_util_pct": 0.0, "sm_clock_mhz": 1980.0, "clock_reasons": 0},
    # the sample on each phase edge: NVML's util window (~0.2 s) straddles it
    "edge": {"power_w": 400.0, "util_gpu_pct": 45.0, "gpm_sm_util_pct": 50.0, "gpm_tensor_util_pct": 45.0,
             "gpm_dram_bw_util_pct": 8.0, "sm_clock_mhz": 1700.0, "clock_reasons": 0},
    "idle": {"power_w": 80.0, "util_gpu_pct": 0.0, "gpm_sm_util_pct": 0.0, "gpm_tensor_util_pct": 0.0,
             "gpm_dram_bw_util_pct": 0.0, "sm_clock_mhz": 1980.0, "clock_reasons": 0},
}
TIMELINE_IDLE_S = 5.0


def timeline_trace(shape_at: Any, seconds: float, *, gpus: int = 1, hz: float = 10.0,
                   limit_w: float = 700.0) -> tuple[Trace, RunRecord]:
    """A GPU trace whose every tick after the idle baseline has the shape `shape_at(t)` names (t from the benchmark's
    start), with the manifest fields summarize() reads. Labelled synthetic."""
    rows = []
    b0 = TIMELINE_IDLE_S
    b1 = b0 + seconds
    for i in range(int((b1 + 0.5) * hz)):
        t = round(i / hz, 3)
        name = shape_at(t - b0) if b0 <= t <= b1 else "idle"
        m = dict(H200_SHAPES[name])
        if not b0 <= t <= b1:
            m["util_gpu_pct"] = 0.0
        for g in range(gpus):
            rows.append({"t_s": t, "gpu": g, "power_limit_w": limit_w, "sm_clock_max_mhz": 1980.0,
                         "power_instant_w": m["power_w"], **m})
    trace = trace_from_rows(rows, {"sample_hz": str(hz), "source": "synthetic:timeline"})
    run = RunRecord.from_dict({"idle_start_s": 0.0, "idle_end_s": b0, "bench_start_s": b0, "bench_end_s": b1,
                               "exit_code": 0,
                               "data_source": "synthetic: timeline shapes from the H200 readings, not measured"})
    return trace, run


def alternating(on_s: float, off_s: float, busy: str = "compute") -> Any:
    """busy for on_s, idle for off_s, repeating (an intermittent load); the first sample of each phase is an edge."""
    on_k, cycle_k = round(on_s * 10), round((on_s + off_s) * 10)  # in 0.1 s ticks: no float modulo drift

    def shape(t: float) -> str:
        x = round(t * 10) % cycle_k
        if x in (0, on_k):
            return "edge"
        return busy if x < on_k else "idle"

    return shape


SERVER_COLUMNS = ("t_s", "ok", "error", "num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens",
                  "max_total_num_tokens", "gen_throughput_tok_s", "max_running_requests", "num_retracted_reqs",
                  "realtime_prefill_compute_tokens_total", "realtime_prefill_cache_tokens_total",
                  "realtime_decode_tokens_total", "prompt_tokens_total", "generation_tokens_total",
                  "cached_tokens_total", "num_requests_total", "num_aborted_requests_total",
                  "retracted_requests_total", "counter_reset", "ttft_sum_s", "ttft_count", "itl_sum_s", "itl_count",
                  "e2e_sum_s", "e2e_count", "queue_time_sum_s", "queue_time_count")
HOST_COLUMNS = ("t_s", "role", "pid", "ppid", "comm", "cpu_pct", "threads", "busiest_tid", "busiest_thread",
                "busiest_thread_cpu_pct", "error")


def _cell(v: Any) -> str:
    return "" if v is None else f"{v:.4f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def server_csv(state_at: Any, seconds: float, *, hz: float = 2.0) -> str:
    """server_trace.csv text (schema 1, docs/probe.md): one scrape every 1/hz s over the benchmark; state_at(t)
    gives the gauges (running, queue, token_usage, max_running_requests, retracted_total) at t from its start."""
    lines = [f"# toolkit-probe-server-trace schema_version=1 scrape_hz={hz} source=synthetic:timeline",
             ",".join(SERVER_COLUMNS)]
    for i in range(int(seconds * hz) + 1):
        t = i / hz
        st = state_at(t)
        row = {"t_s": round(TIMELINE_IDLE_S + t, 3), "ok": 1, "num_running_reqs": float(st["running"]),
               "num_queue_reqs": float(st["queue"]), "token_usage": float(st["token_usage"]),
               "max_running_requests": st.get("cap"), "retracted_requests_total": st.get("retracted_total", 0),
               "num_retracted_reqs": 0, "counter_reset": 0}
        lines.append(",".join(_cell(row.get(c)) for c in SERVER_COLUMNS))
    return "\n".join(lines) + "\n"


def host_csv(threads_at: Any, seconds: float, *, hz: float = 2.0) -> str:
    """host_trace.csv text (schema 1, docs/probe.md): threads_at(t) lists (role, pid, comm, thread, cpu_pct) of
    the busiest thread of each process at t from the benchmark's start."""
    lines = [f"# toolkit-probe-host-trace schema_version=1 sample_hz={hz} source=proc", ",".join(HOST_COLUMNS)]
    for i in range(1, int(seconds * hz) + 1):
        t = i / hz
        for role, pid, comm, thread, cpu in threads_at(t):
            row = {"t_s": round(TIMELINE_IDLE_S + t, 3), "role": role, "pid": pid, "ppid": 1, "comm": comm,
                   "cpu_pct": float(cpu) + 2.0, "threads": 4, "busiest_tid": pid + 1, "busiest_thread": thread,
                   "busiest_thread_cpu_pct": float(cpu)}
            lines.append(",".join(_cell(row.get(c)) for c in HOST_COLUMNS))
    return "\n".join(lines) + "\n"


def parse_server(text: str) -> Any:
    from toolkit.core.probe.server_trace import read_server_trace

    return read_server_trace(text, "synthetic server_trace.csv")


def parse_host(text: str) -> Any:
    from toolkit.core.probe.host_trace import read_host_trace

    return read_host_trace(text, "synthetic host_trace.csv")
