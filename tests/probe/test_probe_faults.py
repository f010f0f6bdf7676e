"""Faults during a probe run, through the real probe loop: NVML failing mid-run (the fake pynvml at the adapter's
boundary raises, as the library cannot run here), and a real full disk (a tmpfs) under the run directory.
Each records its row of docs/reliability.md (the `reliability` fixture, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pynvml
import pytest

import toolkit.adapters.nvml as nvml_adapter
from toolkit.cli.main import main

from . import fake_pynvml as fp

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "tests" / "fixtures" / "probe" / "seed-synthetic-8gpu" / "trace.csv"


def test_nvml_failing_mid_run_leaves_a_recorded_gap_and_a_verdict_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reliability
) -> None:
    gpus = [fp.FakeGpu(util_gpu=100, power_mw=250_000, limit_mw=600_000) for _ in range(2)]
    fake = fp.make_fake(gpus)

    def fail(code: int | None) -> None:
        for g in gpus:
            g.fail_with = code

    out = tmp_path / "r"
    with mock.patch.object(nvml_adapter, "pynvml", fake):
        # Every GPU's NVML calls raise from 2.0 s to 3.5 s of the run (a driver hiccup), then answer again.
        timers = [threading.Timer(2.0, fail, (pynvml.NVML_ERROR_UNKNOWN,)), threading.Timer(3.5, fail, (None,))]
        for t in timers:
            t.start()
        rc = main(["probe", "run", "--idle-s", "0.5", "--out", str(out), "--json", "--",
                   sys.executable, "-c", "import time; time.sleep(6)"])
        for t in timers:
            t.cancel()
    printed = json.loads(capsys.readouterr().out)["data"]
    assert rc == 0  # the run went on
    summary = json.loads((out / "summary.json").read_text())
    gaps = summary["gaps"]
    assert sorted(g["gpu"] for g in gaps) == [0, 1]
    for gap in gaps:
        assert 1.8 <= gap["start_s"] <= 2.3 and 3.2 <= gap["end_s"] <= 3.7, gap
        assert 10 <= gap["samples"] <= 17 and "Unknown Error" in gap["error"]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["class"] != "benchmark-failed"
    assert len(verdict["evidence"]["not_seen"]) == 2 and "not seen: GPU 0" in verdict["headline"]
    # Sampling went on after the gap: rows with power come after it, on both GPUs.
    rows = [line.split(",") for line in (out / "trace.csv").read_text().splitlines()[2:]]
    after = [r for r in rows if float(r[0]) > 4.0 and r[2]]
    assert {r[1] for r in after} == {"0", "1"}
    reliability(
        fault="NVML failing mid-run (every GPU's calls raise NVML_ERROR_UNKNOWN for 1.5 s; fake pynvml at the "
        "adapter, the real probe loop)",
        user_saw=f"exit {rc}; verdict: {printed['verdict']['headline']}",
        recorded=f"trace.csv error cells; summary.json gaps {[(g['gpu'], g['start_s'], g['end_s']) for g in gaps]}; "
        f"verdict.json evidence.not_seen, confidence {verdict['confidence']}",
        next_run=f"the same run went on: {len(after)} rows with readings after the gap",
        area="probe",
    )


@pytest.fixture
def full_disk(tmp_path: Path):
    """A real, tiny filesystem (tmpfs, 32 KiB) for the run directory: writes fail with ENOSPC as on a full disk."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "runs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _alive_with(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_disk_full_under_the_run_directory(full_disk: Path, tmp_path: Path, reliability) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    before = (profiles / "glm5-tp8.yaml").read_bytes()
    marker = f"h19-disk-full-{os.getpid()}"
    out = full_disk / "r"
    env = {**os.environ, "TOOLKIT_PROFILES_DIR": str(profiles)}
    probe = [sys.executable, "-m", "toolkit", "probe", "run", "--replay-gpu-trace", str(SEED), "--hz", "50",
             "--idle-s", "0.5", "--profile", "glm5-tp8", "--record", "--live", "off"]
    proc = subprocess.run([*probe, "--out", str(out), "--", sys.executable, "-c",
                           f"import time; time.sleep(60)  # {marker}"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: ")
    assert "no space left on the device" in proc.stderr and "nothing was recorded" in proc.stderr
    assert _alive_with(marker) == []  # the benchmark was stopped, not left running
    assert (profiles / "glm5-tp8.yaml").read_bytes() == before
    left = sorted(p.name for p in out.iterdir())
    assert not [n for n in left if n.endswith((".partial", ".tmp")) or n.startswith(".")], left
    for name in left:  # what is left is whole
        json.loads((out / name).read_text())
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and "no space left" in run["error"]

    # The next run, with room for its artifacts, runs and records as usual.
    again = tmp_path / "r2"
    nxt = subprocess.run([*probe, "--out", str(again), "--", sys.executable, "-c", "import time; time.sleep(1)"],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert nxt.returncode == 0, nxt.stderr
    assert (profiles / "glm5-tp8.yaml").read_bytes() != before and (again / "verdict.json").exists()
    reliability(
        fault="disk full under the run directory while the probe writes its artifacts (a 32 KiB tmpfs)",
        user_saw=f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[0]}",
        recorded=f"run directory holds only whole files {left} (run.json status {run['status']}); "
        "the profile byte for byte unchanged; the benchmark process stopped",
        next_run=f"with room on another --out: exit {nxt.returncode}, verdict written, recorded into the profile",
        area="probe",
    )
