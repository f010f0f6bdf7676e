"""How fast hostile profiles are refused: every case of the broken-profile corpus, a few generated ones (a file
over the size limit, a deeper alias bomb), and the hostile cases by class (tests/profile/hostile_cases.py: FIFOs,
link loops, long chains, sparse patches, ...), against a valid profile as the baseline; and `validate all` over
extends chains of growing depth (each parent resolved once: the time per profile stays flat).

    .venv/bin/python benchmarks/bench_hostile_profiles.py [--repeats 5] [--cli 3]

In-process: `check_profiles` as `toolkit profile validate` calls it (load, resolve, validate, file checks),
median and worst of --repeats per case. As a fresh process: `toolkit profile validate` for the slowest
in-process cases and the baseline, --cli times each (process start included). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BROKEN = REPO / "tests" / "profile" / "broken"
sys.path.insert(0, str(REPO))

from toolkit.adapters.profile_store import ProfileStore  # noqa: E402
from toolkit.app.profiles import check_profiles  # noqa: E402
from toolkit.core.errors import ToolkitError  # noqa: E402
from toolkit.core.profile.source import MAX_PROFILE_BYTES  # noqa: E402


def _generated(folder: Path) -> list[str]:
    """Cases too large to keep in git: a file past the size limit, an alias bomb of 9^12 values."""
    head = "schema_version: 1\nname: {}\nextends: ok-base\n"
    (folder / "gen-too-large.yaml").write_text(
        head.format("gen-too-large") + "description: " + "x" * (MAX_PROFILE_BYTES + 10) + "\n")
    lines = ["a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    (folder / "gen-alias-bomb-9e12.yaml").write_text(head.format("gen-alias-bomb-9e12") + "\n".join(lines) + "\n")
    return ["gen-too-large", "gen-alias-bomb-9e12"]


def _once(store_dir: Path, name: str) -> tuple[float, int]:
    start = time.perf_counter()
    store = ProfileStore(store_dir)
    try:
        problems = check_profiles(store, [name])[name]
    except ToolkitError as err:  # a name that is no profile name is refused before any file is read
        problems = err.problems
    return time.perf_counter() - start, sum(p.severity == "error" for p in problems)


def _hostile(folder: Path) -> tuple[Path, list[str]]:
    """The hostile cases by class, in their own profiles directory (they extend its ok-base)."""
    sys.path.insert(0, str(REPO / "tests" / "profile"))
    import hostile_cases  # type: ignore[import-not-found]

    return hostile_cases.build(folder), [c.name for c in hostile_cases.cases()]


def _validate_all_by_depth(folder: Path) -> dict[str, dict[str, float]]:
    """`validate all` over one extends chain of each depth: seconds in all and per profile."""
    out = {}
    base = (BROKEN / "ok-base.yaml").read_text()
    for depth in (2, 4, 8, 16):
        d = folder / f"chain-{depth}"
        d.mkdir()
        (d / "ok-base.yaml").write_text(base)
        for i in range(depth - 1):
            parent = f"link-{i + 1}" if i + 1 < depth - 1 else "ok-base"
            (d / f"link-{i}.yaml").write_text(f"schema_version: 1\nname: link-{i}\nextends: {parent}\n"
                                             f"server:\n  max_running_requests: {64 + i}\n")
        store = ProfileStore(d)
        start = time.perf_counter()
        check_profiles(store, store.names())
        took = time.perf_counter() - start
        out[str(depth)] = {"all_s": round(took, 4), "per_profile_s": round(took / depth, 4)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cli", type=int, default=3, help="fresh-process runs for the slowest cases")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "broken"
        shutil.copytree(BROKEN, folder)
        cases = sorted(yaml.safe_load((BROKEN / "EXPECTED.yaml").read_text())) + _generated(folder)
        hostile_dir, hostile = _hostile(Path(tmp) / "hostile")
        _once(folder, "ok-base")  # imports and catalogue cache warm
        rows = {}
        for where, name in [(folder, "ok-base"), *((folder, c) for c in cases), *((hostile_dir, c) for c in hostile)]:
            times, errors = [], 0
            for _ in range(args.repeats):
                t, errors = _once(where, name)
                times.append(t)
            rows[name if where == folder else f"class:{name[:40]!a}"] = {
                "median_s": round(statistics.median(times), 4), "max_s": round(max(times), 4), "errors": errors}
        cases += [f"class:{name[:40]!a}" for name in hostile]
        by_depth = _validate_all_by_depth(Path(tmp))
        baseline = rows["ok-base"]["median_s"]
        slowest = sorted(cases, key=lambda c: rows[c]["max_s"], reverse=True)[:3]
        cli = {}
        commands = {"baseline: python -c pass": ["-c", "pass"]}
        commands |= {name: ["-m", "toolkit", "profile", "validate", name, "--profiles-dir", str(folder)]
                     for name in ["ok-base", *slowest] if not name.startswith("class:")}
        for name, command in commands.items():
            times = []
            for _ in range(args.cli):
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, check=False)
                times.append(time.perf_counter() - start)
            cli[name] = {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                         "exit": proc.returncode, "traceback": "Traceback" in proc.stderr}
    refused = [c for c in cases if rows[c]["errors"] >= 1]
    out = {
        "cases": len(cases),
        "refused": len(refused),
        "baseline_valid_profile_median_s": baseline,
        "hostile_median_of_medians_s": round(statistics.median(rows[c]["median_s"] for c in cases), 4),
        "hostile_worst_s": max(rows[c]["max_s"] for c in cases),
        "worst_vs_baseline": round(max(rows[c]["max_s"] for c in cases) / baseline, 2),
        "slowest": {c: rows[c] for c in slowest},
        "validate_all_by_chain_depth": by_depth,
        "cli": cli,
        "per_case": rows,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0 if len(refused) == len(cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
