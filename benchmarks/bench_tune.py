"""`toolkit tune` against the full grid `toolkit sweep` over the same knobs.

    python3 benchmarks/bench_tune.py [--profile glm5-baseline] [--runner engine-model | apply -i INV
        --num-prompts N] [--repeats 3] [--concurrency 1024] [--grid proposed|powers-of-two]
        [--objective throughput|goodput|tokens-per-joule --slo ttft_p99_ms=3000,itl_p99_ms=100]

1. `toolkit tune PROFILE` as a process, into a temporary runs directory; its tune.json is the record.
2. The grid: every knob the tune's verdicts proposed (a candidate's change, the knobs that went with it), each
   with the base's value and every value a verdict proposed for it, measured or not; `toolkit sweep PROFILE
   --vary ...` over their full product at the tune's concurrency, with the same runner (invalid combinations,
   e.g. tp 8 x pp 2 on 8 GPUs, are skipped by the sweep's validation and not counted as measured).
3. Confirmation, like with like: one run of a grid variant (one capacity search, with --slo) is one draw, and
   the grid's first place is the largest of dozens of draws, so it is measured again beside the tune's best. The
   finalists (the grid's first --confirm-top by the objective, and the tune's best) are each swept alone (every
   knob of the grid and the tune's best at the finalist's value) over the same workload drawn with each of the
   --confirm-seeds (bench.seed: a profile extending PROFILE with only the seed changed; 2 to 11 by default,
   draws neither side has made), the same runner and levels, and a finalist's confirmed figure is its median over
   the seeds. The verdict compares the tune's
   confirmed figure with the best confirmed figure among the grid's finalists; the single draws are printed too.
4. One JSON object: each side's best (output tok/s; with --objective goodput, output tok/s at the highest request
   rate meeting the SLO, each grid variant's capacity searched the same way) and its knobs, the probe runs each made
   (the tune's include the base's repeats, its capacity searches and the variants that failed), the confirmation
   (each finalist's figure per seed and median, its runs: counted apart from both sides'), the tune's confirmed
   best as a share of the grid's confirmed best, the ratio of runs.

With `--runner engine-model` (the default) both sides answer from the lab's engine model in-process: simulated,
seconds in all. `--runner apply` deploys every point into the lab (`-i`): each point is a real apply + probe
(minutes each; the grid is dozens of points).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _toolkit(args: list[str], cwd: Path) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"toolkit {' '.join(args[:2])} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0, proc.stderr


def grid_axes(tune: dict[str, Any], base_spec: dict[str, Any], fill: str = "proposed") -> dict[str, list[Any]]:
    """Every knob the tune's verdicts proposed, with the base's value and every proposed value, in order; with
    fill="powers-of-two", a whole-number axis also gets every power of two between its smallest and largest value
    (64, 128, ..., 1024: the grid a person writes without a verdict to read)."""
    from toolkit.core.sweep.promote import spec_value

    axes: dict[str, list[Any]] = {}

    def add(path: str, value: Any) -> None:
        values = axes.setdefault(path, [spec_value(base_spec, path)])
        if value not in values:
            values.append(value)

    for step in tune["steps"][1:]:
        for cand in step["candidates"]:
            for path, (_old, new) in cand["change"].items():
                add(path, new)
        for ladder in step.get("ladders", []):
            for s in step["skipped"]:
                if s["knob"] == ladder["knob"]:
                    add(ladder["knob"], s["value"])
                    for path, value in ladder["together"].items():
                        add(path, value)
    for path in axes:
        # The base's own value leads, unset (null: SGLang picks) included: the grid holds the base.
        unset = [None] if None in axes[path] else []
        axes[path] = [v for v in axes[path] if v is not None]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in axes[path]):
            axes[path] = sorted(axes[path])
            lo, hi = axes[path][0], axes[path][-1]
            if fill == "powers-of-two" and all(isinstance(v, int) for v in axes[path]) and lo >= 1 and hi > 2 * lo:
                p2 = 1
                while p2 <= hi:
                    if p2 >= lo and p2 not in axes[path]:
                        axes[path].append(p2)
                    p2 *= 2
                axes[path] = sorted(axes[path])
        axes[path] = unset + axes[path]
    return axes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="glm5-baseline")
    parser.add_argument("--runner", default="engine-model")
    parser.add_argument("-i", "--inventory")
    parser.add_argument("--num-prompts", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency")
    parser.add_argument("--grid", choices=("proposed", "powers-of-two"), default="proposed",
                        help="the grid's values: those the tune's verdicts proposed (and the base's), or also every "
                        "power of two between a whole-number knob's smallest and largest")
    parser.add_argument("--keep", help="keep the runs in this directory (default: a temporary one)")
    parser.add_argument("--objective", choices=("throughput", "goodput", "tokens-per-joule"), default="throughput")
    parser.add_argument("--slo", help="the SLO of a goodput (or tokens-per-joule) tune and of the grid's capacity "
                        "searches, e.g. ttft_p99_ms=3000,itl_p99_ms=100")
    parser.add_argument("--rate-start", help="both sides' first request rate (req/s)")
    parser.add_argument("--rate-tolerance-pct", help="both sides' capacity bracket (default 4)")
    parser.add_argument("--max-rounds", help="both sides' rates per variant (default 10)")
    parser.add_argument("--max-repeats", help="the tune's runs of a side before a gain inside the noise is given up "
                        "(default 6)")
    parser.add_argument("--confirm-top", type=int, default=3, help="the grid's first N by the objective measured "
                        "again beside the tune's best (0: compare the single draws, no confirmation)")
    parser.add_argument("--confirm-seeds", default=",".join(map(str, range(2, 12))),
                        help="the bench.seed values every finalist is measured with (comma-separated; default 2 to "
                        "11); its confirmed figure is the median. Not the profile's own seed (bench_serving's default "
                        "1): the grid's first would be its first draw again, the tune's best a fresh one. Ten, not "
                        "three: at an SLO's edge one seed's capacity differs from the next by up to 25 %")
    parser.add_argument("--grid-knobs", help="only these of the knobs the tune touched span the grid (comma-separated "
                        "paths; default all): a smaller grid for the lab, where a point takes minutes")
    parser.add_argument("--tune-run", help="a finished tune's run directory (its tune.json and state.json): its "
                        "record is the tune's side and its wall time is read from its points, and only the grid "
                        "runs (the tune's own options are then not used)")
    parser.add_argument("--grid-run", help="a finished sweep's run directory (its ranking.json and state.json) as the "
                        "grid, read as it is (with --tune-run: nothing is measured, the comparison is made again)")
    args = parser.parse_args()

    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.core.provenance import Provenance, mark
    from toolkit.core.sweep.promote import base_spec

    spec = base_spec(ProfileStore(REPO / "profiles").resolve(args.profile))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-tune-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--runner", args.runner, "--profiles-dir", str(REPO / "profiles")]
    if args.inventory:
        extra += ["-i", args.inventory]
    if args.num_prompts:
        extra += ["--num-prompts", str(args.num_prompts)]
    conc = ["--concurrency", args.concurrency] if args.concurrency else []

    slo = ["--slo", args.slo] if args.slo else []
    for flag in ("rate_start", "rate_tolerance_pct", "max_rounds"):
        if getattr(args, flag):
            slo += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    again = ["--max-repeats", args.max_repeats] if args.max_repeats else []
    if args.tune_run:
        tune_dir = Path(args.tune_run)
        tune_s = _points_wall_s(json.loads((tune_dir / "state.json").read_text()))
    else:
        tune_s, _ = _toolkit(["tune", args.profile, *extra, *conc, "--repeats", str(args.repeats), *again,
                              "--objective", args.objective, *slo, "--tunes-dir", str(work / "tunes")], cwd=work)
        (tune_dir,) = [p for p in (work / "tunes").iterdir() if (p / "tune.json").is_file()]
    tune = json.loads((tune_dir / "tune.json").read_text())
    state = json.loads((tune_dir / "state.json").read_text())
    levels = state["concurrency"]

    axes = grid_axes(state["tune"], spec, args.grid)
    if args.grid_knobs:
        axes = {path: values for path, values in axes.items() if path in args.grid_knobs.split(",")}
    vary = [a for path, values in axes.items() for a in ("--vary", f"{path}={','.join(map(_fmt, values))}")]
    if args.grid_run:
        sweep_dir = Path(args.grid_run)
        grid_s = _points_wall_s(json.loads((sweep_dir / "state.json").read_text()))
    else:
        grid_s, _ = _toolkit(["sweep", args.profile, *vary, "--concurrency", ",".join(map(str, levels)), *extra,
                              *slo, "--sweeps-dir", str(work / "sweeps")], cwd=work)
        (sweep_dir,) = [p for p in (work / "sweeps").iterdir() if (p / "ranking.json").is_file()]
    ranking = json.loads((sweep_dir / "ranking.json").read_text())
    grid_state = json.loads((sweep_dir / "state.json").read_text())
    grid_points = sum(1 for v in grid_state["variants"] for p in v["points"] if p["status"] != "pending")
    invalid = [v["id"] for v in grid_state["variants"] if v["status"] == "invalid"]
    by = {"goodput": "by_goodput", "tokens-per-joule": "by_tokens_per_j"}.get(args.objective, "by_throughput")
    grid_best = ranking[by][0]
    tune_best = tune["best"]
    grid_value = _figure(grid_best, by)
    share = tune_best["value"] / grid_value * 100

    confirm = None
    if args.confirm_top > 0:
        seeds = [int(x) for x in args.confirm_seeds.split(",")]
        t0 = time.monotonic()
        confirm = confirm_finalists(args, spec, work, extra, levels, slo, by,
                                    grid_finalists(ranking[by][:args.confirm_top], grid_state, by),
                                    dict(tune_best["knobs"]), list(axes), seeds)
        confirm["wall_s"] = round(time.monotonic() - t0, 2)
        share_confirmed = confirm["tune"]["median"] / confirm["grid_best"]["median"] * 100 \
            if confirm["grid_best"]["median"] else float("inf")
    out = {
        "profile": args.profile,
        "runner": args.runner,
        "data_source": mark(Provenance.from_dict(grid_best["provenance"]), detail=True),
        "concurrency": levels,
        "objective": args.objective,
        "slo": args.slo,
        "tune": {"best": round(tune_best["value"], 4), "best_request_rate": tune_best.get("request_rate"),
                 "best_knobs": tune_best["knobs"],
                 "probe_runs": tune["points_run"], "stop": tune["stop"]["reason"], "wall_s": round(tune_s, 2),
                 "run": str(tune_dir)},
        "grid": {"fill": args.grid, "axes": axes, "variants": len(grid_state["variants"]),
                 "invalid_skipped": len(invalid),
                 "probe_runs": grid_points, "best": round(grid_value, 4),
                 "best_request_rate": grid_best.get("request_rate"),
                 "best_knobs": grid_best["label"], "wall_s": round(grid_s, 2), "run": str(sweep_dir)},
        "single_draw": {"tune_best_of_grid_best_pct": round(share, 2), "within_5_pct": share >= 95.0},
    }
    if confirm is not None:
        out["confirmation"] = confirm
        one = "capacity search" if args.slo else "run"
        out["method"] = (f"the grid's first {args.confirm_top} and the tune's best, each measured again with "
                         f"bench.seed {args.confirm_seeds} (one {one} per seed, same runner and levels); confirmed "
                         "figure = median over the seeds; the verdict compares the tune's confirmed figure with the "
                         "grid's best confirmed figure")
        out["tune_best_of_grid_best_pct"] = round(share_confirmed, 2)
        out["within_5_pct"] = share_confirmed >= 95.0
    else:
        out["method"] = "single draws: the tune's best against the grid's first (--confirm-top 0)"
        out["tune_best_of_grid_best_pct"] = round(share, 2)
        out["within_5_pct"] = share >= 95.0
    out |= {
        "tune_runs_of_grid_runs": round(tune["points_run"] / grid_points, 3),
        "at_most_a_third": tune["points_run"] * 3 <= grid_points,
    }
    print(json.dumps(out, indent=1))
    return 0


def _points_wall_s(state: dict[str, Any]) -> float:
    """A finished run's wall time from its points' own durations (a reused tune was not timed here)."""
    return round(sum(float(p.get("duration_s") or 0.0) for v in state["variants"] for p in v["points"]), 2)


def _figure(entry: dict[str, Any], by: str) -> float:
    """A ranking entry's figure for the objective: tokens per joule, goodput (the output tok/s its capacity rate
    carries, as the tune scores it), or steady output tok/s."""
    if by == "by_tokens_per_j":
        return float(entry["tokens_per_j"])
    if by == "by_goodput" and entry.get("goodput_tok_per_s") is not None:
        return float(entry["goodput_tok_per_s"])
    return float(entry["steady_output_tok_per_s"])


def grid_finalists(entries: list[dict[str, Any]], grid_state: dict[str, Any], by: str) -> list[dict[str, Any]]:
    """The ranking's first entries with their knobs (from the sweep's state) and their single-draw figures."""
    knobs = {v["id"]: {path: value for path, value in v["knobs"]} for v in grid_state["variants"]}
    return [{"variant": e["variant_id"], "label": e["label"], "knobs": knobs[e["variant_id"]],
             "single_draw": {"value": _figure(e, by), "request_rate": e.get("request_rate")}} for e in entries]


def confirm_finalists(args: argparse.Namespace, spec: dict[str, Any], work: Path, extra: list[str],
                      levels: list[int], slo: list[str], by: str, finalists: list[dict[str, Any]],
                      tune_knobs: dict[str, Any], paths: list[str], seeds: list[int]) -> dict[str, Any]:
    """Each finalist swept alone once per seed (every path at its value: the base's where it sets none), through
    a profiles directory holding the repository's profiles and one PROFILE-confirm-sN per seed (bench.seed only)."""
    import shutil
    import statistics

    from toolkit.core.sweep.promote import spec_value

    profiles = work / "confirm-profiles"
    if not profiles.is_dir():
        shutil.copytree(REPO / "profiles", profiles)
    for seed in seeds:
        (profiles / f"{args.profile}-confirm-s{seed}.yaml").write_text(
            f"schema_version: 1\nname: {args.profile}-confirm-s{seed}\nextends: {args.profile}\n"
            f"description: {args.profile}'s workload drawn with bench_serving's seed {seed} (bench_tune.py's "
            f"confirmation)\nbench:\n  seed: {seed}\n")
    cmd_extra = [a if a != str(REPO / "profiles") else str(profiles) for a in extra]
    paths = list(dict.fromkeys([*paths, *tune_knobs, *(p for f in finalists for p in f["knobs"])]))
    sides = [{"side": "grid", **f} for f in finalists] + [{"side": "tune", "label": "the tune's best",
                                                          "knobs": tune_knobs}]
    runs = 0
    for n, side in enumerate(sides):
        full = {path: side["knobs"].get(path, spec_value(spec, path)) for path in paths}
        side["knobs"] = full
        vary = [a for path, value in full.items() for a in ("--vary", f"{path}={_fmt(value)}")]
        side["per_seed"] = {}
        for seed in seeds:
            where = work / "confirm" / f"f{n + 1}-s{seed}"
            _toolkit(["sweep", f"{args.profile}-confirm-s{seed}", *vary, "--concurrency", ",".join(map(str, levels)),
                      *cmd_extra, *slo, "--sweeps-dir", str(where)], cwd=work)
            (run_dir,) = [p for p in where.iterdir() if (p / "ranking.json").is_file()]
            ranked = json.loads((run_dir / "ranking.json").read_text())[by]
            state = json.loads((run_dir / "state.json").read_text())
            runs += sum(1 for v in state["variants"] for p in v["points"] if p["status"] != "pending")
            # No rate met the SLO (or the run failed): nothing served within it, 0 for this seed.
            value = _figure(ranked[0], by) if ranked else 0.0
            side["per_seed"][seed] = {"value": value, "request_rate": ranked[0].get("request_rate") if ranked else None}
        side["median"] = statistics.median(v["value"] for v in side["per_seed"].values())
        print(f"confirm {side['side']} {side['label']}: " + ", ".join(
            f"seed {s} {v['value']}" for s, v in side["per_seed"].items()) + f"; median {side['median']}",
            file=sys.stderr)
    grid_sides = [s for s in sides if s["side"] == "grid"]
    best = max(grid_sides, key=lambda s: s["median"])
    for s in sides:
        s.pop("side", None)
    return {"seeds": seeds, "probe_runs": runs, "grid_finalists": grid_sides, "tune": sides[-1],
            "grid_best": {"label": best["label"], "median": best["median"]}}


def _fmt(value: Any) -> str:
    from toolkit.core.sweep.variants import format_value

    return format_value(value)


if __name__ == "__main__":
    raise SystemExit(main())
