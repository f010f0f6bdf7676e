"""The HTML report of each recorded H200 run (tests/fixtures/probe/, written by the probe engineer on the
project's H200 device machine) renders in headless Chromium with its plots.

Each run directory is replayed through the probe's own summary and verdict code (`toolkit probe replay
--write`), recorded into a one-GPU lab profile, and reported; the screenshot is checked like the synthetic
run's in test_report.py. Until recorded H200 runs are committed there, this test skips and says why.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.report.test_report import assert_first_screen, screenshot
from tests.results.conftest import REPO
from toolkit.app.record import load_results
from toolkit.cli.main import main

FIXTURES = REPO / "tests" / "fixtures" / "probe"
# Measured runs only: the seed-shaped synthetic trace has a run.json too (its phases, for the lab's replay).
H200_RUNS = sorted(p.parent for p in FIXTURES.glob("**/run.json") if (p.parent / "trace.csv").is_file()
                   and json.loads(p.read_text()).get("data_source") == "measured (NVML)")

PROFILE = """\
# One H200 of the project's device machine, driven by loads/gpu_phases.py (no model served).
schema_version: 1
name: h200-lab
description: the probe's recorded H200 phases (a load script, not a served model)
target:
  gpu_model: NVIDIA H200
  gpu_count: 1
  compute_capability: SM90
  interconnect: nvlink
  gpu_power_limit_w: 700
engine:
  sglang_version: 0.5.9
model:
  repo_id: none/gpu-phases
server:
  tp_size: 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("run", H200_RUNS or [None], ids=[p.name for p in H200_RUNS] or ["none"])
def test_report_of_a_recorded_h200_run_renders_in_chromium(run: Path | None, tmp_path: Path) -> None:
    if run is None:
        pytest.skip(f"no recorded run directory (run.json + trace.csv) under {FIXTURES} yet")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "h200-lab.yaml").write_text(PROFILE)
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    assert main(["probe", "replay", str(copy), "--write", "--json"]) == 0
    assert main(["results", "record", str(copy), "--profile", "h200-lab", "--profiles-dir", str(profiles)]) == 0
    entry = load_results("h200-lab", profiles).block.entries[-1]
    assert entry.verdict is not None
    # Real GPU figures under a stand-in load: the entry must not pass loop iterations off as a model's tokens.
    if (copy / "bench.jsonl").exists():  # a failed or interrupted run left no bench result to name its unit
        assert entry.lab is not None and entry.lab.kind == "load" and "not a served model" in entry.lab.note
    html_file = tmp_path / "report.html"
    assert main(["report", "h200-lab", "--profiles-dir", str(profiles), "--html", str(html_file)]) == 0
    page = html_file.read_text()
    assert "SIMULATED" not in page and "REPLAYED" not in page  # measured on the H200: no watermark
    assert str(tmp_path) not in page, "no absolute path of the machine that made it"
    img = screenshot(html_file, tmp_path / "shot.png", tmp_path)
    assert_first_screen(img)  # what ran, the verdict, then the power plot, on the first screen
