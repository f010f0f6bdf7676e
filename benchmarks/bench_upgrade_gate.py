"""How many paired runs the upgrade's gate needs, and how often it is wrong, over seeded trials.

    .venv/bin/python benchmarks/bench_upgrade_gate.py [--profile glm5-tp8] [--trials 200] [--max-pairs 10]

1. Calibration, from the lab's engine model (toolkit/lab/engine_runner.py, in-process): the profile's base measured
   --calibrate times (each run its own host pace): its throughput and run-to-run spread (CV).
2. The noise model: a run's figure is the engine model's throughput x the release's factor (1 + effect) x the host's
   level (a random walk between runs: drift, shared by the two runs of a pair only as far as it has not moved) x
   the run's own noise N(1, CV). Two hosts: the engine model's own CV, and the lab's stand-in server in real time
   (a loaded host: 2 % per run, the spread engine_runner.PACE_SD quotes, with 0.5 % drift per run), and a noisy
   shared host (5 %, 1 % drift).
3. Per effect (-15 %, -5 %, 0 %, +5 %, +10 %, +20 %), --trials trials, each seeded: old and new alternate, pair by
   pair, through the upgrade's own gate (toolkit.core.upgrade.gate, the code `toolkit upgrade` decides with) until
   it is done; counted: the pairs it took (median, 90th percentile) and what it decided. A false promotion is a
   promotion at an effect <= 0; a false refusal a refusal (loss) at an effect > 0.
4. One JSON object on stdout; a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from typing import Any

from toolkit.app.profiles import open_store
from toolkit.core import stats
from toolkit.core.sweep.promote import base_spec
from toolkit.core.sweep.run import PointRequest
from toolkit.core.sweep.variants import Variant
from toolkit.core.upgrade import PROMOTED, gate
from toolkit.lab.engine_runner import EngineModelRunner

EFFECTS = (-0.15, -0.05, 0.0, 0.05, 0.10, 0.20)


def calibrate(profile: str, runs: int) -> tuple[float, float]:
    store = open_store()
    spec = base_spec(store.resolve(profile))
    runner = EngineModelRunner(base=profile, profile_names=store.names())
    level = int((spec.get("bench") or {}).get("max_concurrency") or 64)
    got = [runner(PointRequest(run_id="cal", variant=Variant(1, ()), spec=spec, concurrency=level, artifacts="",
                               attempt=1, repeat=i)).steady_output_tok_per_s for i in range(runs)]
    return statistics.fmean(got), statistics.stdev(got) / statistics.fmean(got)


def trial(effect: float, tok_per_s: float, cv: float, drift: float, max_pairs: int, seed: int) -> tuple[str, str, int]:
    rng = random.Random(seed)
    old: list[float] = []
    new: list[float] = []
    level = 1.0
    while True:
        level *= 1 + rng.gauss(0, drift)
        old.append(tok_per_s * level * (1 + rng.gauss(0, cv)))
        level *= 1 + rng.gauss(0, drift)
        new.append(tok_per_s * (1 + effect) * level * (1 + rng.gauss(0, cv)))
        v = gate(old, new, max_pairs=max_pairs)
        if v.done:
            return v.final(), v.outcome, v.pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="glm5-tp8")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--max-pairs", type=int, default=10)
    ap.add_argument("--calibrate", type=int, default=8, help="engine-model runs of the base for its spread")
    args = ap.parse_args()
    t0 = time.monotonic()
    tok_per_s, model_cv = calibrate(args.profile, args.calibrate)
    hosts = {"engine model": (model_cv, 0.0), "lab in real time (loaded host)": (0.02, 0.005),
             "noisy shared host": (0.05, 0.01)}
    out: dict[str, Any] = {"profile": args.profile, "trials": args.trials, "max_pairs": args.max_pairs,
                           "calibration": {"runs": args.calibrate, "output_tok_per_s": round(tok_per_s, 1),
                                           "cv_pct": round(model_cv * 100, 3)},
                           "hosts": {}}
    for host, (cv, drift) in hosts.items():
        rows = []
        for effect in EFFECTS:
            res = [trial(effect, tok_per_s, cv, drift, args.max_pairs, seed) for seed in range(args.trials)]
            pairs = sorted(p for _, _, p in res)
            promoted = sum(1 for f, _, _ in res if f == PROMOTED)
            outcomes = Counter(o for _, o, _ in res)
            wrong = promoted if effect <= 0 else outcomes.get(stats.LOSS, 0)
            rows.append({"effect_pct": round(effect * 100), "pairs_median": statistics.median(pairs),
                         "pairs_p90": pairs[int(0.9 * (len(pairs) - 1))], "promoted": promoted,
                         "outcomes": dict(sorted(outcomes.items())),
                         "wrong": wrong, "wrong_pct": round(100 * wrong / args.trials, 1),
                         "wrong_is": "false promotion" if effect <= 0 else "false refusal"})
        out["hosts"][host] = {"cv_pct": round(cv * 100, 3), "drift_pct_per_run": drift * 100, "effects": rows}
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=2))
    for host, h in out["hosts"].items():
        print(f"\n{host}: CV {h['cv_pct']} % per run, drift {h['drift_pct_per_run']} % per run", file=sys.stderr)
        print("effect | pairs median | pairs p90 | promoted | outcomes | wrong", file=sys.stderr)
        for r in h["effects"]:
            print(f"{r['effect_pct']:+d} % | {r['pairs_median']} | {r['pairs_p90']} | {r['promoted']}/{args.trials} | "
                  f"{r['outcomes']} | {r['wrong_pct']} % {r['wrong_is']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
