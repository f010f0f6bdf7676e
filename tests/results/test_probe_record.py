"""`toolkit probe run --record`: a real probe run (recorded trace played back, the lab's idle load) recorded
into a scratch copy of the profiles; bad input is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.results.conftest import REPO, Scratch
from toolkit.app.record import load_results


def _probe(s: Scratch, out: Path, *args: str, bench_s: float = 2.0) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "toolkit", "probe", "run", *args, "--replay-gpu-trace", str(s.run / "trace.csv"),
           "--idle-s", "1", "--hz", "5", "--live", "off", "--out", str(out), "--",
           sys.executable, str(REPO / "loads" / "gpu_phases.py"), "idle", "--duration-s", str(bench_s)]
    env = {**os.environ, "TOOLKIT_PROFILES_DIR": str(s.profiles), "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False, cwd=s.root)


@pytest.mark.slow
def test_probe_run_record_writes_the_entry(scratch: Scratch) -> None:
    out = scratch.root / "runs" / "probe-1"
    # 9 s: the replay follows the benchmark's start, so its 3 s ramp and a 5 s plateau fit in.
    proc = _probe(scratch, out, "--profile", "glm5-tp8", "--record", bench_s=9.0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recorded into" in proc.stdout
    entry = load_results("glm5-tp8", scratch.profiles).block.entries[-1]
    assert entry.run_id == "probe-1" and entry.artifacts == "runs/probe-1"
    # The GPU figures are a replayed trace (declared by the GPU source), and the load (loop iterations, not a
    # model's tokens) says so too.
    assert entry.lab is not None and entry.lab.kind == "replay" and entry.provenance().kind == "replayed"
    assert "recorded GPU trace" in entry.lab.note and "loop iteration" in entry.lab.note
    # The recorded verdict is the run's own, and the replayed plateau is the recording's (busy-but-waiting).
    run_verdict = json.loads((out / "verdict.json").read_text())
    assert entry.verdict is not None and entry.verdict.class_ == run_verdict["class"] == "busy-but-waiting"


def test_record_without_profile_or_with_a_broken_block_runs_nothing(scratch: Scratch) -> None:
    out = scratch.root / "runs" / "never"
    proc = _probe(scratch, out, "--record")
    assert proc.returncode == 2 and "--record needs --profile" in proc.stderr
    path = scratch.profiles / "glm5-tp8.yaml"
    path.write_text(path.read_text().replace("output_tok_per_s: 3740", "output_tok_per_s: 3740: 1"))
    before = scratch.snapshot()
    proc = _probe(scratch, out, "--profile", "glm5-tp8", "--record")
    assert proc.returncode == 2 and "results block is not valid YAML" in proc.stderr, proc.stderr
    assert not out.exists(), "nothing may run when the results cannot be recorded"
    assert scratch.snapshot() == before
