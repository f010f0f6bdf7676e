"""Cost of installing an engine lock into a fresh venv: the venv's pip against the toolkit's pinned uv.

    python3 benchmarks/bench_lock_install.py [--repeats 3] [--python /usr/bin/python3] [--lock FILE]

What the sglang_venv role runs on a host for a venv still to be installed (roles/sglang_venv/tasks/install.yml),
here on this machine: `PYTHON -m venv` (Debian 12's python3-venv: pip 23.0.1), then either
  pip   `VENV/bin/pip install --disable-pip-version-check --no-input --no-index --find-links WHEELHOUSE
        --require-hashes --no-deps -r LOCK --no-compile`
  uv    `UV pip install --no-config --no-cache --no-progress --python VENV/bin/python --no-index --find-links
        WHEELHOUSE --require-hashes --no-deps -r LOCK` (the uv of toolkit.core.installer)
(--no-compile and uv's default: the lab's sglang_venv_pip_compile=false, what CI runs eleven times). The lock is
the lab's 0.5.9 lock and its wheelhouse (`toolkit lab wheelhouse glm5-tp8` fills it: 140 real wheels, 29 lab
stand-ins) unless --lock names another whose wheels are beside it. The two alternate, so drift hits both alike;
each run's CPU is the installer's process tree (user and system, getrusage of the children), the venv's creation
left out, each from the same state (synced, the page cache dropped when run as root, the wheels read once): the
system time is mostly the filesystem's and varies with the machine's other writes far more than the user time.
Prints one JSON object: medians, and uv's ratios to pip.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _children_cpu_s() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def _lab_lock() -> tuple[Path, Path]:
    from toolkit.adapters.wheelhouse import lock_directory

    locks = lock_directory("x").parent
    found = [p for p in locks.glob("lab-sglang-0.5.9-*.lock") if p.with_suffix(".complete").exists()]
    if not found:
        raise SystemExit("bench_lock_install: no lab lock in the wheelhouse; run `toolkit lab wheelhouse glm5-tp8`")
    lock = max(found, key=lambda p: p.stat().st_mtime)  # the one the lab's last apply built
    return lock, lock.with_suffix("")


def _install(tool: str, uv: Path, python: str, lock: Path, wheels: Path, work: Path) -> tuple[float, float, float]:
    venv = work / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    source = ["--no-index", "--find-links", str(wheels), "--require-hashes", "--no-deps", "-r", str(lock)]
    if tool == "pip":
        cmd = [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "--no-input", *source,
               "--no-compile"]
    else:
        cmd = [str(uv), "pip", "install", "--no-config", "--no-cache", "--no-progress", "--python",
               str(venv / "bin" / "python"), *source]
    # Each run from the same state: the previous run's files written out and the page cache dropped (as root; the
    # kernel charges writeback and reclaim to whoever dirties pages next, which made the later runs of either tool
    # cost three times the first), then the wheels read once, as on a host that has just unpacked its wheelhouse.
    os.sync()
    if os.geteuid() == 0:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    for wheel in wheels.glob("*.whl"):
        wheel.read_bytes()
    (u0, s0), t0 = _children_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    wall, (u1, s1) = time.perf_counter() - t0, _children_cpu_s()
    if proc.returncode != 0:
        raise SystemExit(f"bench_lock_install: {tool} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, u1 - u0, s1 - s0


def _num(value: float | list[float]) -> float:
    assert isinstance(value, float)
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter that makes the venv")
    ap.add_argument("--lock", type=Path, help="a lock file whose wheels are in the directory of its name less .lock")
    args = ap.parse_args()
    from toolkit.adapters.wheelhouse import installer_binary

    lock, wheels = (args.lock, args.lock.with_suffix("")) if args.lock else _lab_lock()
    uv = installer_binary("3.11")
    runs: dict[str, list[tuple[float, float, float]]] = {"pip": [], "uv": []}
    with tempfile.TemporaryDirectory(prefix="bench-lock-install-") as tmp:
        for _ in range(args.repeats):
            for tool in ("pip", "uv"):
                runs[tool].append(_install(tool, uv, args.python, lock, wheels, Path(tmp)))
    med: dict[str, dict[str, float | list[float]]] = {tool: {"wall_s": round(statistics.median(w for w, _, _ in r), 2),
                  "cpu_s": round(statistics.median(u + k for _, u, k in r), 2),
                  "user_s": round(statistics.median(u for _, u, _ in r), 2),
                  "system_s": round(statistics.median(k for _, _, k in r), 2),
                  "cpu_s_each": [round(u + k, 2) for _, u, k in r]} for tool, r in runs.items()}
    out = {"lock": lock.name, "packages": sum(1 for line in lock.read_text().splitlines()
                                              if line and not line[0].isspace() and "==" in line),
           "repeats": args.repeats, **med,
           **{f"uv_{key}_ratio": round(_num(med["uv"][f"{key}_s"]) / _num(med["pip"][f"{key}_s"]), 3)
              for key in ("cpu", "user", "wall")}}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
