"""What a sweep's point paid before its deploy playbook when it ran `toolkit apply` as a child process, against the
same steps in the sweep's own process (the apply runner calls the use case in process).

    python3 benchmarks/bench_point_overhead.py [--repeats 5] [-i INVENTORY] [--profile glm5-tp8]

child       a new interpreter: the command's and the use case's imports (rich, ansible-runner, Ansible's inventory
            parser), the profile resolved and checked (the flag catalogue read), the inventory read
in process  the profile resolved and checked and the inventory read again, in a process that has done it once
Both leave out what every point does either way (the wheelhouse check, the playbook, the probe). Prints one JSON
object: medians and each run, in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _steps(profile: str, inventory: str) -> str:
    profiles = str(REPO / "profiles")
    return ("from toolkit.app.profiles import resolve_checked; from toolkit.adapters.ansible import read_inventory; "
            f"resolve_checked({profile!r}, {profiles!r}); read_inventory({inventory!r}, 'gpu_containers')")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-i", "--inventory", default=str(REPO / "inventory" / "lab.yml"))
    parser.add_argument("--profile", default="glm5-tp8")
    args = parser.parse_args()
    steps = _steps(args.profile, args.inventory)
    child_code = ("import toolkit.cli.main, toolkit.cli.apply_cmd, rich.console, ansible_runner; "
                  "from toolkit.app.apply import apply; " + steps)
    child: list[float] = []
    for _ in range(args.repeats):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", child_code], check=True, cwd=REPO)
        child.append(time.monotonic() - started)
    exec(child_code)  # this process, after its first point
    in_process: list[float] = []
    for _ in range(args.repeats):
        started = time.monotonic()
        exec(steps)
        in_process.append(time.monotonic() - started)
    print(json.dumps({
        "child_median_s": round(statistics.median(child), 3), "child_s": [round(x, 3) for x in child],
        "in_process_median_s": round(statistics.median(in_process), 3),
        "in_process_s": [round(x, 3) for x in in_process],
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
