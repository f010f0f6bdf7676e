"""`toolkit host reproduce pve1 --profile glm5-tp8` on the homelab flavour, cold and warm, in one run.

    sudo .venv/bin/python benchmarks/bench_reproduce_homelab.py [--cold 1] [--warm 3] [--instance bhl]

Runs in its own lab instance (default `bhl`), so a lab others use is never touched. Through
the CLI, as a user runs it:
  cold  `toolkit lab down`, `toolkit lab up --flavour homelab` (caches warm: not timed), then reproduce from the
        bare host: the repositories switched, toolchain, headers and dkms from the mirror, the driver downloaded,
        built and registered for both kernels, the container made from Proxmox's template, the profile applied
  warm  reproduce again on the same host (changes nothing), with the lab's mirror stopped: no network for pve1
Each run's playbooks are timed apart (containers_preflight, host, container, apply). Prints one JSON object:
the medians in seconds, each playbook's, and the cold/warm ratio.
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


def toolkit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*TOOLKIT, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"`toolkit {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return proc


def reproduce(inventory: str, env: dict[str, str]) -> dict[str, float]:
    t0 = time.monotonic()
    proc = toolkit(["host", "reproduce", "pve1", "--profile", "glm5-tp8", "-i", inventory, "--json"], env)
    total_s = time.monotonic() - t0
    report = json.loads(proc.stdout)["data"]
    out = {"total_s": total_s}
    for run in report["runs"]:
        out[(run.get("playbook") or "apply").removesuffix(".yml") + "_s"] = float(run["duration_s"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=1, help="cold runs (each from a fresh homelab lab)")
    parser.add_argument("--warm", type=int, default=3, help="warm runs after the last cold one")
    parser.add_argument("--instance", default="bhl")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root")
    env = {**os.environ, "TOOLKIT_LAB_INSTANCE": args.instance, "PYTHONPATH": str(REPO)}
    inventory = f"/var/lib/toolkit-lab-{args.instance}/lab.yml"
    cold: list[dict[str, float]] = []
    for _ in range(args.cold):
        toolkit(["lab", "down"], env)
        toolkit(["lab", "up", "--flavour", "homelab"], env)
        cold.append(reproduce(inventory, env))
    toolkit(["lab", "ssh", "pve1", "systemctl stop lab-standin-mirror"], env)
    warm = [reproduce(inventory, env) for _ in range(args.warm)]
    toolkit(["lab", "ssh", "pve1", "systemctl start lab-standin-mirror"], env)

    def medians(runs: list[dict[str, float]]) -> dict[str, float]:
        return {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}

    cold_m, warm_m = medians(cold), medians(warm)
    print(json.dumps({"cold_runs": len(cold), "warm_runs": len(warm), "cold_median_s": cold_m,
                      "warm_median_s": warm_m, "cold_over_warm": round(cold_m["total_s"] / warm_m["total_s"], 2),
                      "cpus": os.cpu_count(), "load_average": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
