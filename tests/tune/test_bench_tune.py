"""benchmarks/bench_tune.py end to end over the engine model: `toolkit tune` and the full grid `toolkit sweep` over
the knobs and values the tune's verdicts proposed, both as processes with the same runner."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tune_finds_the_grids_best_with_a_fraction_of_its_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_tune.py"), "--repeats", "2",
                           "--confirm-seeds", "2,3", "--keep", str(tmp_path)], capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    grid, tune = out["grid"], out["tune"]
    # The grid holds every knob the tune touched, the base's value among each axis.
    assert grid["axes"]["server.max_running_requests"][0] == 64
    assert {"server.tp_size", "server.pp_size", "server.ep_size"} <= set(grid["axes"])
    assert tune["best_knobs"]["server.max_running_requests"] >= 512
    # The verdict is on the confirmed figures: the grid's first three and the tune's best, each measured again
    # over the same two seeds, a finalist's figure its median.
    conf = out["confirmation"]
    finalists = conf["grid_finalists"]
    assert conf["seeds"] == [2, 3] and len(finalists) == 3
    assert finalists[0]["single_draw"]["value"] == grid["best"]
    for f in [*finalists, conf["tune"]]:
        values = [v["value"] for v in f["per_seed"].values()]
        assert list(f["per_seed"]) == ["2", "3"] and f["median"] == statistics.median(values)
        assert set(f["knobs"]) == set(grid["axes"]) | set(tune["best_knobs"])  # every knob at its value
    # The seed reaches the runs: the same finalist's two workloads do not measure alike.
    assert any(len({v["value"] for v in f["per_seed"].values()}) == 2 for f in finalists)
    best_median = max(f["median"] for f in finalists)
    assert conf["grid_best"]["median"] == best_median
    assert out["tune_best_of_grid_best_pct"] == round(conf["tune"]["median"] / best_median * 100, 2)
    assert "median" in out["method"] and "single_draw" in out
    assert out["tune_best_of_grid_best_pct"] >= 95.0 and out["within_5_pct"]
    assert tune["probe_runs"] * 3 <= grid["probe_runs"] and out["at_most_a_third"]
    assert "ENGINE MODEL" in out["data_source"]
    # A finished tune's run is reused as it is: the same tune side, and a grid over the knobs asked for only.
    (tune_dir,) = [p for p in (tmp_path / "tunes").iterdir() if (p / "tune.json").is_file()]
    again = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_tune.py"), "--tune-run", str(tune_dir),
                            "--grid-knobs", "server.max_running_requests", "--confirm-top", "0",
                            "--keep", str(tmp_path / "again")], capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr
    reused = json.loads(again.stdout)
    assert not (tmp_path / "again" / "tunes").exists()
    assert {k: reused["tune"][k] for k in ("best", "best_knobs", "probe_runs", "run")} == {
        k: tune[k] for k in ("best", "best_knobs", "probe_runs", "run")}
    assert list(reused["grid"]["axes"]) == ["server.max_running_requests"]
    assert reused["grid"]["axes"]["server.max_running_requests"] == grid["axes"]["server.max_running_requests"]
    # Both sides reused: nothing is measured and the comparison is made again, to the same figures.
    (sweep_dir,) = [p for p in (tmp_path / "again" / "sweeps").iterdir() if (p / "ranking.json").is_file()]
    replay = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_tune.py"), "--tune-run", str(tune_dir),
                             "--grid-run", str(sweep_dir), "--grid-knobs", "server.max_running_requests",
                             "--confirm-top", "0", "--keep", str(tmp_path / "replay")],
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr
    replayed = json.loads(replay.stdout)
    assert not (tmp_path / "replay" / "sweeps").exists()
    assert replayed["grid"]["best"] == reused["grid"]["best"] and replayed["grid"]["run"] == str(sweep_dir)
    assert replayed["tune_best_of_grid_best_pct"] == reused["tune_best_of_grid_best_pct"]
