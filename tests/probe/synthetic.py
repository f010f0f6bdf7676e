"""Synthetic traces for tests, each labelled as such in its header (source=synthetic:...).

`seed_run` is shaped like the seed's published figures (DOMAIN.md section 1; seed/000_*.txt): 8 GPUs of
600 W, idle ~87 W, then 100 % utilization at the per-GPU powers nvidia-smi printed 20 s into the benchmark
(256.54, 248.95, 255.94, 247.21, 248.81, 249.72, 255.02, 251.61 W), PCIe only, no P2P, 3,740 output tok/s.
Only what the seed measured is filled in (power, limit, util); every other metric is empty (unavailable),
as it would be from nvidia-smi. It is derived from published numbers, not measured.
"""

from __future__ import annotations

import math
from typing import Any

from toolkit.core.probe.trace import Trace, trace_from_rows

SEED_POWER_W = (256.54, 248.95, 255.94, 247.21, 248.81, 249.72, 255.02, 251.61)
SEED_LIMIT_W = 600.0
SEED_IDLE_W = 87.0


def ramp(t: float, start: float, ramp_s: float, end: float, drain_s: float) -> float:
    """0 before start, linear up over ramp_s, 1 on the plateau, linear down over drain_s before end."""
    if t < start or t > end:
        return 0.0
    return max(0.0, min(1.0, (t - start) / ramp_s, (end - t) / drain_s))


def seed_run(hz: float = 10.0, idle_s: float = 10.0, bench_s: float = 35.0) -> tuple[Trace, dict[str, Any],
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
    run = {"idle_start_s": 0.0, "idle_end_s": b0, "bench_start_s": b0, "bench_end_s": b1, "exit_code": 0,
           "data_source": "synthetic: shaped from the seed's published figures, not measured",
           "target": {"profile": "glm5-tp8", "gpu_count": 8, "interconnect": "pcie", "p2p": False, "tp_size": 8}}
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
    (d / "run.json").write_text(json.dumps({"schema_version": 1, **run}, indent=2, sort_keys=True) + "\n")
    (d / "topology.json").write_text(json.dumps(topology, indent=2, sort_keys=True) + "\n")
