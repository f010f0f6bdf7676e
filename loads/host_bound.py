"""A host-bound load: Python work between GPU kernels, for the probe's host timeline on a real GPU.

    python3 loads/host_bound.py [--duration-s 20] [--gpu 0] [--python-ms 20] [--output-file FILE]

Each iteration launches one small bf16 matmul (~tens of microseconds on an H200), waits for it, then spends
--python-ms of pure-Python work on one thread (the GIL-holding tokenizer/scheduler loop of a server that
starves its GPU looks like this). Under `toolkit probe run -- python3 loads/host_bound.py` the host timeline
shows the benchmark's busiest thread near 100 % of a core while the GPU sits mostly idle (low util.gpu, idle
power). Writes one JSON line like loads/gpu_phases.py (duration, completed, timeline, unit) to --output-file,
default $TOOLKIT_PROBE_BENCH_JSONL. Needs torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def python_work(ms: float) -> int:
    """Pure-Python busy work for about `ms` milliseconds (no sleeping: the thread holds a core)."""
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x = (x * 31 + i) % 1_000_003
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--python-ms", type=float, default=20.0)
    ap.add_argument("--output-file", default=os.environ.get("TOOLKIT_PROBE_BENCH_JSONL"))
    args = ap.parse_args(argv)

    import torch

    probe_t0 = os.environ.get("TOOLKIT_PROBE_T0_MONOTONIC")
    origin = float(probe_t0) if probe_t0 else time.monotonic()
    dev = torch.device(f"cuda:{args.gpu}")
    a = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
    b = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize(dev)
    t_start = time.monotonic()
    timeline = [[round(t_start - origin, 4), 0.0]]
    iterations = 0
    while time.monotonic() - t_start < args.duration_s:
        (a @ b).sum()
        torch.cuda.synchronize(dev)
        python_work(args.python_ms)
        iterations += 1
        if iterations % 10 == 0:
            timeline.append([round(time.monotonic() - origin, 4), float(iterations)])
    duration = time.monotonic() - t_start
    timeline.append([round(time.monotonic() - origin, 4), float(iterations)])
    result = {
        "backend": "loads/host_bound.py", "duration": round(duration, 3), "completed": iterations,
        "total_output_tokens": iterations, "output_throughput": round(iterations / duration, 3),
        "python_ms_per_iteration": args.python_ms, "timeline": timeline, "timeline_origin": "probe_run"
        if probe_t0 else "benchmark_start", "unit": "loop iteration (stands in for an output token)",
    }
    line = json.dumps(result)
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
