"""A load with phases a reader can predict, for checking the probe's verdict on a real GPU.

    python3 loads/gpu_phases.py PHASE [--duration-s 20] [--gpu 0] [--output-file FILE]

PHASE       what runs                                           expected verdict
compute     bf16 8192^3 matmul loop                             compute-bound (power-capped on an H200)
memory      2 GiB device-to-device copy loop                    memory-bandwidth-bound
spin        torch.cuda._sleep spinning kernels                  busy-but-waiting (what a collective waiting
                                                                on a slow link looks like: 100 % util, no work)
launch      1-element kernels with a host sync after each one   launch-bound (host-bound with the host timeline:
                                                                its one Python thread launches and syncs at ~100 %)
host        Python work (~2 ms of pure-Python arithmetic) between host-bound, naming the Python thread
            4096^2 matmuls whose result the Python code reads
alternate   the compute phase for --on-s, then nothing (sleep) for  intermittent-load (the load, not the GPU,
            --off-s, repeated                                    limits), not launch-bound
idle        nothing on the GPU (CUDA is not even initialised)   no-load

Writes one JSON line (bench_serving-like keys) to --output-file, default $TOOLKIT_PROBE_BENCH_JSONL:
`duration`, `completed` (loop iterations), and `timeline` [[t_s, iterations so far], ...] so the probe can
compute a steady-window rate (t_s on the probe run's clock when $TOOLKIT_PROBE_T0_MONOTONIC is set).
`total_output_tokens` is the iteration count: a stand-in for tokens, so the
J-per-unit path runs; `unit` says so. Needs torch (except idle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PHASES = ("compute", "memory", "spin", "launch", "host", "alternate", "idle")


def python_work(n: int) -> int:
    """Pure-Python arithmetic: holds the GIL, never waits (one thread at a full core)."""
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phase", choices=PHASES)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--output-file", default=os.environ.get("TOOLKIT_PROBE_BENCH_JSONL"))
    ap.add_argument("--on-s", type=float, default=2.0, help="alternate: seconds of compute per phase")
    ap.add_argument("--off-s", type=float, default=2.0, help="alternate: seconds of idle per phase")
    ap.add_argument("--work-n", type=int, default=40_000, help="host: Python loop iterations between kernels")
    args = ap.parse_args(argv)

    timeline: list[list[float]] = []
    iterations = 0
    # The probe exports its run's t0 on the same system-wide monotonic clock, so the timeline lands on the
    # trace's time axis exactly (torch's import and CUDA start-up would otherwise shift it by seconds).
    probe_t0 = os.environ.get("TOOLKIT_PROBE_T0_MONOTONIC")
    origin = float(probe_t0) if probe_t0 else time.monotonic()
    t_start = time.monotonic()
    if args.phase == "idle":
        time.sleep(args.duration_s)
        timeline = [[round(t_start - origin, 4), 0.0], [round(time.monotonic() - origin, 4), 0.0]]
    else:
        import torch

        dev = torch.device("cuda", args.gpu)
        torch.cuda.set_device(dev)
        if args.phase in ("compute", "alternate"):
            a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
            b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
            c = torch.empty_like(a)

            def step() -> None:
                torch.matmul(a, b, out=c)

            per_sync = 50  # ~1.4 ms each at ~790 TFLOP/s: a sync every ~70 ms keeps the queue short
        elif args.phase == "memory":
            src = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(src)
            src.fill_(1)

            def step() -> None:
                dst.copy_(src)

            per_sync = 50
        elif args.phase == "spin":
            # ~50 ms per kernel at ~1.98 GHz; the SMs spin on a clock read, doing no useful work.
            cycles = 100_000_000

            def step() -> None:
                torch.cuda._sleep(cycles)

            per_sync = 1
        elif args.phase == "host":
            ha = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
            hb = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

            def step() -> None:
                # ~0.2 ms of GPU work whose result the host reads (a sync), then ~2 ms of Python on it: the GPU
                # waits for the host, and the host's one thread never waits for anything.
                v = float((ha @ hb)[0, 0].item())
                python_work(args.work_n + int(v) % 2)

            per_sync = 1
        else:  # launch
            x = torch.zeros(1, device=dev)

            def step() -> None:
                x.add_(1.0)
                torch.cuda.synchronize(dev)

            per_sync = 1
        torch.cuda.synchronize(dev)
        t_start = time.monotonic()
        timeline.append([round(t_start - origin, 4), 0.0])
        last_mark = t_start
        phase_start = t_start
        while True:
            if args.phase == "alternate" and time.monotonic() - phase_start >= args.on_s:
                torch.cuda.synchronize(dev)
                time.sleep(args.off_s)  # the load pauses: nothing queued on the GPU, the thread asleep
                phase_start = time.monotonic()
            for _ in range(per_sync):
                step()
            iterations += per_sync
            torch.cuda.synchronize(dev)
            now = time.monotonic()
            if now - last_mark >= 0.1:
                timeline.append([round(now - origin, 4), float(iterations)])
                last_mark = now
            if now - t_start >= args.duration_s:
                break
        timeline.append([round(time.monotonic() - origin, 4), float(iterations)])
    duration = time.monotonic() - t_start
    result = {
        "backend": "toolkit-gpu-phases",
        "phase": args.phase,
        **({"on_s": args.on_s, "off_s": args.off_s} if args.phase == "alternate" else {}),
        "unit": "loop iteration (stands in for an output token)",
        "duration": round(duration, 4),
        "completed": iterations,
        "total_output_tokens": iterations,
        "output_throughput": round(iterations / duration, 3) if duration > 0 else None,
        "timeline": timeline,
        "timeline_origin": "probe_run" if probe_t0 else "benchmark_start",
    }
    print(json.dumps({k: v for k, v in result.items() if k != "timeline"}))
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
