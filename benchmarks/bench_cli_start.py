"""Startup cost of the commands that only read profiles (aim under 0.5 s).

    python3 benchmarks/bench_cli_start.py [--repeats 5]

Runs each command as a fresh process (process start included) `--repeats` times and reports the
median wall time, next to a baseline measured in the same run: `python -c pass` with the same
interpreter (the floor any Python CLI pays). Also lists which heavy modules each command imported
(it must be none of ansible_runner, pynvml, matplotlib). Prints one JSON object.
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
HEAVY = ("ansible_runner", "pynvml", "matplotlib", "ansible")

COMMANDS: dict[str, list[str]] = {
    "baseline: python -c pass": ["-c", "pass"],
    "toolkit --help": ["-m", "toolkit", "--help"],
    "toolkit profile validate all": ["-m", "toolkit", "profile", "validate", "all"],
}


def _time(args: list[str], repeats: int, env: dict[str, str]) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return times


def _heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    if args[0] != "-m":
        return []
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return sorted(n for n in names if n.split(".")[0] in HEAVY)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "TOOLKIT_PROFILES_DIR": str(REPO / "profiles")}
    _time(COMMANDS["toolkit --help"], 1, env)  # warm the page cache and .pyc files first
    out: dict[str, object] = {"python": sys.executable, "repeats": args.repeats, "commands": {}}
    baseline = None
    for name, cmd in COMMANDS.items():
        times = _time(cmd, args.repeats, env)
        median_s = statistics.median(times)
        baseline = baseline or median_s
        out["commands"][name] = {  # type: ignore[index]
            "median_s": round(median_s, 4),
            "min_s": round(min(times), 4),
            "ratio_to_baseline": round(median_s / baseline, 2),
            "heavy_imports": _heavy_imports(cmd, env),
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
