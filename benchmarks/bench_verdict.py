"""Cost of the verdict over time against the window-mean verdict, on a synthetic 1 h, 8-GPU, 10 Hz run.

    python3 benchmarks/bench_verdict.py [--repeats 5]

Builds the trace once (benchmarks/bench_probe.py's synthetic text, labelled so), a server timeline at 2 Hz and a
host timeline at 2 Hz (two processes) in the formats of docs/probe.md, parses them and summarizes once; then
times, in alternating rounds, judge() on the summary alone (the window-mean fallback, the baseline) and judge() with
the GPU trace and both timelines (3,590 intervals). Prints one JSON object: medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_probe import synthetic_trace_text

from toolkit.core.probe.host_trace import read_host_trace
from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.server_trace import read_server_trace
from toolkit.core.probe.summary import summarize
from toolkit.core.probe.trace import parse_trace
from toolkit.core.probe.verdict import judge

SECONDS = 3600.0


def timelines_text() -> tuple[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.probe.synthetic import host_csv, server_csv

    def server(t: float) -> dict[str, float]:
        return {"running": 64, "queue": 100.0, "token_usage": 0.3, "cap": 64}

    def host(t: float) -> list[tuple[str, int, str, str, float]]:
        return [("bench", 100, "python3", "python3", 40.0), ("server", 200, "python3", "sglang::scheduler", 90.0)]

    return server_csv(server, SECONDS - 10.0), host_csv(host, SECONDS - 10.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    trace = parse_trace(synthetic_trace_text(seconds=SECONDS))
    s_text, h_text = timelines_text()
    server, host = read_server_trace(s_text), read_host_trace(h_text)
    run = {"idle_start_s": 0.0, "idle_end_s": 10.0, "bench_start_s": 10.0, "bench_end_s": SECONDS - 1.0,
           "exit_code": 0}
    summary = summarize(trace, RunRecord.from_dict(run), {})
    mean_s, over_s = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        base = judge(summary, {}, {})
        t1 = time.perf_counter()
        v = judge(summary, {}, {}, trace=trace, server=server, host=host)
        t2 = time.perf_counter()
        mean_s.append(t1 - t0)
        over_s.append(t2 - t1)
    m_mean, m_over = statistics.median(mean_s), statistics.median(over_s)
    print(json.dumps({
        "what": "judge(): window mean vs over time (GPU trace + server + host timelines), synthetic 1 h x 8 GPUs "
                "x 10 Hz, 2 Hz server and host",
        "repeats": args.repeats, "intervals": len(v.timeline.intervals) if v.timeline else 0,
        "window_mean_median_s": round(m_mean, 4), "over_time_median_s": round(m_over, 3),
        "over_time_minus_window_mean_s": round(m_over - m_mean, 3),
        "classes": [base.cls, v.cls],
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
