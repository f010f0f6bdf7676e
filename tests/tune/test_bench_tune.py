"""benchmarks/bench_tune.py end to end over the engine model: `toolkit tune` and the full grid `toolkit sweep` over
the knobs and values the tune's verdicts proposed, both as processes with the same runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tune_finds_the_grids_best_with_a_fraction_of_its_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_tune.py"), "--repeats", "2",
                           "--keep", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    grid, tune = out["grid"], out["tune"]
    # The grid holds every knob the tune touched, the base's value among each axis.
    assert grid["axes"]["server.max_running_requests"][0] == 64
    assert {"server.tp_size", "server.pp_size", "server.ep_size"} <= set(grid["axes"])
    assert tune["best_knobs"]["server.max_running_requests"] >= 512
    assert out["tune_best_of_grid_best_pct"] >= 95.0 and out["within_5_pct"]
    assert tune["probe_runs"] * 3 <= grid["probe_runs"] and out["at_most_a_third"]
    assert "engine model" in out["data_source"]
