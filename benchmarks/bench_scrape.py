"""Cost of one server-timeline scrape: GET /metrics + prometheus_client parse + row, against a bare HTTP GET.

    python3 benchmarks/bench_scrape.py [--scrapes 300] [--rounds 5]

The server is the lab's stand-in (a separate process, so its CPU is not counted), started with
--enable-metrics after a few requests so every histogram has counts: its exposition carries SGLang 0.5.9's
core families (SGLang 0.5.9's srt/metrics/collector.py) in its multiprocess layout. Per variant, in interleaved
rounds:
  bare_get       urllib GET /metrics, body read (the floor any scraper pays)
  get_parse      the same GET + parse_exposition (prometheus_client) + scrape_row
  scraper        ServerScraper.scrape(): what the probe's thread runs per tick (/v1/loads every 5 s)
Reports medians of wall ms and of this thread's CPU ms per scrape, the CPU share of one core at 2 Hz, and
the ratios to bare_get. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.adapters.sglang_catalogue import catalogue_path
from toolkit.adapters.sglang_metrics import ServerScraper, parse_exposition
from toolkit.core.probe.server_trace import scrape_row
from toolkit.lab.standin_server import SERVER_PATH


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hz", type=float, default=2.0)
    args = ap.parse_args()
    port = _port()
    proc = subprocess.Popen([sys.executable, str(SERVER_PATH), "--port", str(port), "--tp-size", "8",
                             "--model-path", "lab/standin-model", "--enable-metrics"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "SGLANG_STANDIN_STARTUP_S": "0",
                                 "SGLANG_STANDIN_FLAGS": str(catalogue_path("0.5.9"))})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                _get(base + "/health")
                break
            except OSError:
                time.sleep(0.05)
        for _ in range(10):  # fill the histograms and counters
            body = json.dumps({"prompt": "a b c d", "max_tokens": 8}).encode()
            urllib.request.urlopen(urllib.request.Request(base + "/v1/completions", data=body,
                                                          headers={"Content-Type": "application/json"})).read()
        text = _get(base + "/metrics")
        scraper = ServerScraper(base, args.hz)

        def bare() -> None:
            _get(base + "/metrics")

        def get_parse() -> None:
            scrape_row(parse_exposition(_get(base + "/metrics")), None)

        def full() -> None:
            scraper.scrape(time.monotonic())

        variants = {"bare_get": bare, "get_parse": get_parse, "scraper": full}
        wall: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                for _ in range(args.scrapes):
                    w0, c0 = time.perf_counter(), time.thread_time()
                    fn()
                    cpu[name].append(time.thread_time() - c0)
                    wall[name].append(time.perf_counter() - w0)
        med = {k: {"wall_ms": round(1000 * statistics.median(wall[k]), 3),
                   "cpu_ms": round(1000 * statistics.median(cpu[k]), 3),
                   "cpu_ms_mean": round(1000 * statistics.fmean(cpu[k]), 3),
                   "cpu_share_of_one_core_at_hz": round(statistics.fmean(cpu[k]) * args.hz, 5)}
               for k in variants}
        out = {
            "command": "python3 benchmarks/bench_scrape.py " + " ".join(sys.argv[1:]),
            "exposition_bytes": len(text.encode()),
            "exposition_families": text.count("# TYPE "),
            "exposition_samples": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
            "scrapes_per_variant": args.scrapes * args.rounds,
            "hz": args.hz,
            "median": med,
            "ratio_to_bare_get": {k: {"wall": round(med[k]["wall_ms"] / med["bare_get"]["wall_ms"], 2),
                                      "cpu": round(med[k]["cpu_ms"] / med["bare_get"]["cpu_ms"], 2)}
                                  for k in variants},
            "parse_only_cpu_ms": round(med["get_parse"]["cpu_ms"] - med["bare_get"]["cpu_ms"], 3),
        }
        print(json.dumps(out, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
