"""`toolkit probe run --record`: a real probe run (recorded trace played back, the lab's idle load) recorded
into a scratch copy of the profiles; bad input is refused before anything runs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.results.conftest import REPO, Scratch
from toolkit.app.record import load_results
from toolkit.cli.main import main


def _argv(s: Scratch, out: Path, *args: str, bench_s: float = 2.0) -> list[str]:
    return ["probe", "run", *args, "--replay-gpu-trace", str(s.run / "trace.csv"), "--idle-s", "1", "--hz", "5",
            "--live", "off", "--out", str(out), "--",
            sys.executable, str(REPO / "loads" / "gpu_phases.py"), "idle", "--duration-s", str(bench_s)]


def _probe(s: Scratch, out: Path, *args: str, bench_s: float = 2.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOOLKIT_PROFILES_DIR": str(s.profiles), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "toolkit", *_argv(s, out, *args, bench_s=bench_s)],
                          capture_output=True, text=True, env=env, timeout=120, check=False, cwd=s.root)


def _refused(s: Scratch, out: Path, *args: str) -> tuple[int, str]:
    """A refusal is what the command prints, the same in this process: its exit code and stderr."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stderr(err):
        env.setenv("TOOLKIT_PROFILES_DIR", str(s.profiles))
        env.chdir(s.root)
        rc = main(_argv(s, out, *args))
    return rc, err.getvalue()


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
    rc, err = _refused(scratch, out, "--record")
    assert rc == 2 and "--record needs --profile" in err
    path = scratch.profiles / "glm5-tp8.yaml"
    path.write_text(path.read_text().replace("output_tok_per_s: 3740", "output_tok_per_s: 3740: 1"))
    before = scratch.snapshot()
    rc, err = _refused(scratch, out, "--profile", "glm5-tp8", "--record")
    assert rc == 2 and "results block is not valid YAML" in err, err
    assert not out.exists(), "nothing may run when the results cannot be recorded"
    assert scratch.snapshot() == before
