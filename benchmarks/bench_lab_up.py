"""Cost of `toolkit lab up` with a warm cache, next to an `up` of a running lab in the same run.

    sudo python3 benchmarks/bench_lab_up.py [--repeats 5] [--instance k] [--flavour stock-pve8]

Runs in its own lab instance (TOOLKIT_LAB_INSTANCE, default `k`), so a lab others use is never
touched. Builds the cache first if it is missing (that time is reported apart, as `cold_build_s`).
Each repeat, through the CLI as a user runs it:
  warm_up     `toolkit lab up` after `toolkit lab down` (netns, veth, overlay, pve1 booting systemd, SSH)
  running_up  `toolkit lab up` again (the baseline: process start plus one SSH round trip)
  reboot      `toolkit lab reboot pve1` (systemctl reboot in pve1, its systemd boots again, SSH answers)
  down        `toolkit lab down`
Prints one JSON object: medians in seconds and the ratio of each to running_up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLKIT = [sys.executable, "-m", "toolkit"]


def timed(args: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run([*TOOLKIT, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    duration_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"`toolkit {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr}")
    return duration_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--instance", default="k")
    parser.add_argument("--flavour", default="lab", help="lab flavour (stock-pve8: builds its package mirror once)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root")
    env = {**os.environ, "TOOLKIT_LAB_INSTANCE": args.instance, "PYTHONPATH": str(REPO)}
    sys.path.insert(0, str(REPO))
    from toolkit.lab import rootfs

    cold_build_s = None
    if not rootfs.is_cached():
        t0 = time.monotonic()
        rootfs.build()
        cold_build_s = round(time.monotonic() - t0, 1)
    timed(["lab", "down"], env)
    up = ["lab", "up", "--gpus", "8", "--flavour", args.flavour]
    if args.flavour != "lab":  # the mirror is built once, like the userland: reported apart
        t0 = time.monotonic()
        timed(up, env)
        cold_build_s = round(time.monotonic() - t0, 1) if cold_build_s is None else cold_build_s
        timed(["lab", "down"], env)
    runs: dict[str, list[float]] = {"warm_up_s": [], "running_up_s": [], "reboot_s": [], "down_s": []}
    for _ in range(args.repeats):
        runs["warm_up_s"].append(timed(up, env))
        runs["running_up_s"].append(timed(up, env))
        runs["reboot_s"].append(timed(["lab", "reboot", "pve1"], env))
        runs["down_s"].append(timed(["lab", "down"], env))
    medians = {k: round(statistics.median(v), 2) for k, v in runs.items()}
    base = medians["running_up_s"]
    print(json.dumps({
        "repeats": args.repeats,
        "flavour": args.flavour,
        "cold_build_s": cold_build_s,
        "median_s": medians,
        "ratio_to_running_up": {k: round(v / base, 2) for k, v in medians.items()},
        "cpus": os.cpu_count(),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
