"""`toolkit sweep` as a user runs it: a real process, interrupted by real signals, resumed, promoted.

The runner is the in-process one over the recorded 3 x 2 table (each point replays a recorded duration,
so there is time to interrupt); the profiles are a copy of the shipped ones, so a promotion writes
into the copy. The promoted profile must then validate and render through `toolkit profile`. Bad input and
skipped variants are about what the command prints, the same in this process: they run here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolkit.cli.main import main

from .conftest import FIXTURES

REPO = Path(__file__).resolve().parents[2]
VARY = ["--vary", "server.max_running_requests=256,512,1024", "--vary", "server.cuda_graph=on,off"]
POINT_S = 0.3


def in_process(*args: str, cwd: Path) -> tuple[int, str]:
    """A command whose point is what it prints, not the process: run here, its exit code and stderr."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stderr(err):
        env.chdir(cwd)
        rc = main(list(args))
    return rc, err.getvalue()


def toolkit(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(tmp: Path) -> tuple[str | None, int]:
    states = list((tmp / "sweeps").glob("*/state.json"))
    if not states:
        return None, 0
    data = json.loads(states[0].read_text())  # atomic writes: never half a file
    n = sum(1 for v in data["variants"] for p in v["points"] if p["status"] != "pending")
    return data["run_id"], n


def wait_for(tmp: Path, at_least: int, proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run_id, n = finished(tmp)
        if run_id and n >= at_least:
            return run_id
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"sweep did not reach {at_least} points")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    table = json.loads((FIXTURES / "sweep_3x2_results.json").read_text())
    for p in table["points"]:
        p["duration_s"] = POINT_S
    (tmp_path / "table.json").write_text(json.dumps(table))
    return tmp_path


def common(tmp: Path) -> list[str]:
    return ["--profiles-dir", str(tmp / "profiles"), "--sweeps-dir", str(tmp / "sweeps")]


@pytest.mark.slow
def test_sigint_and_sigkill_then_resume_and_promote(workdir: Path) -> None:
    runner = ["--runner", f"recorded:{workdir / 'table.json'}"]
    first = toolkit("sweep", "glm5-tp8", *VARY, "--concurrency", "64,256,1024", *runner, *common(workdir), cwd=workdir)
    run_id = wait_for(workdir, 3, first)
    first.send_signal(signal.SIGINT)
    _out, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    assert f"toolkit sweep --resume {run_id}" in err
    _, after_sigint = finished(workdir)
    assert 3 <= after_sigint < 16

    second = toolkit("sweep", "--resume", run_id, *runner, *common(workdir), cwd=workdir)
    wait_for(workdir, after_sigint + 3, second)
    second.send_signal(signal.SIGKILL)  # no handler runs: only the atomic state file protects the sweep
    second.communicate(timeout=30)
    assert second.returncode == -signal.SIGKILL
    _, after_sigkill = finished(workdir)
    assert after_sigint + 3 <= after_sigkill < 18

    third = toolkit(
        "sweep",
        "--resume",
        run_id,
        *runner,
        *common(workdir),
        "--promote",
        "--promote-by",
        "tokens-per-joule",
        "--promote-name",
        "glm5-tp8-swept",
        cwd=workdir,
    )
    _out, err = third.communicate(timeout=120)
    assert third.returncode == 0, err
    assert f"resuming: {after_sigkill} point(s) finished are skipped" in err
    assert "variant 6 of 6" in err and "ETA" in err and "elapsed" in err

    state: dict[str, Any] = json.loads((workdir / "sweeps" / run_id / "state.json").read_text())
    points = [p for v in state["variants"] for p in v["points"]]
    assert all(p["status"] != "pending" for p in points)
    # Each point was measured once, except those in flight when a signal landed (at most one per signal).
    # v05 failed at its first level; the runner was never asked for its other two.
    attempts = sum(p["attempts"] for p in points)
    assert 16 <= attempts <= 18

    ranking = json.loads((workdir / "sweeps" / run_id / "ranking.json").read_text())
    assert [r["variant_id"] for r in ranking["by_throughput"]] == ["v06", "v04", "v03", "v01", "v02"]
    assert [r["variant_id"] for r in ranking["by_tokens_per_j"]] == ["v02", "v01", "v06", "v04", "v03"]
    assert [(p["variant_id"], p["concurrency"]) for p in ranking["pareto_front"]] == [
        ("v02", 256),
        ("v01", 1024),
        ("v06", 1024),
    ]
    report = (workdir / "sweeps" / run_id / "report.md").read_text()
    assert "## Pareto front" in report and "NaN in outputs" in report and "server did not come up" in report

    promoted = workdir / "profiles" / "glm5-tp8-swept.yaml"
    text = promoted.read_text()
    assert "extends: glm5-tp8" in text and "max_running_requests: 256" in text
    assert f"sweep {run_id}" in text and "why:" in text
    doc = yaml.safe_load(text)
    assert doc["server"] == {"max_running_requests": 256}  # cuda_graph=off is the base's value: not written
    assert list(doc["why"]) == ["server.max_running_requests"]
    for cmd in (["profile", "validate", "glm5-tp8-swept"], ["profile", "render", "glm5-tp8-swept"]):
        proc = toolkit(*cmd, "--profiles-dir", str(workdir / "profiles"), cwd=workdir)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert "--max-running-requests" in out and "256" in out

    # --show measures nothing and prints the same rankings for machines.
    show = toolkit("sweep", "--show", run_id, "--json", *common(workdir), cwd=workdir)
    out, err = show.communicate(timeout=60)
    assert show.returncode == 0, err
    shown = json.loads(out)["data"]
    assert shown["schema_version"] == 1 and shown["by_throughput"] == ranking["by_throughput"]
    assert "runner:" not in err  # nothing was run
    # A past run is shown after its profile changed: its figures are its own (resuming it is what is refused).
    base = workdir / "profiles" / "glm5-tp8.yaml"
    base.write_text(base.read_text().replace("max_running_requests: 1024", "max_running_requests: 768", 1))
    show = toolkit("sweep", "--show", run_id, "--json", *common(workdir), cwd=workdir)
    out, err = show.communicate(timeout=60)
    assert show.returncode == 0, err
    assert json.loads(out)["data"]["by_throughput"] == ranking["by_throughput"]
    assert "profile glm5-tp8 changed since this sweep" in " ".join(err.split())
    resume = toolkit("sweep", "--resume", run_id, *common(workdir), cwd=workdir)
    _out, err = resume.communicate(timeout=60)
    assert resume.returncode == 2 and "changed since this sweep started" in err


def test_bad_input_exits_2_and_writes_nothing(workdir: Path) -> None:
    cases = [
        (["sweep", "glm5-tp8", "--vary", "bench.num_prompts=1,2", "--concurrency", "64"], "cannot be varied"),
        (["sweep", "glm5-tp8", "--vary", "server.max_running_requests=256,x", "--concurrency", "64"], "int"),
        (["sweep", "glm5-tp8", "--vary", "server.cuda_graph=on,off", "--concurrency", "64,0"], "positive"),
        (["sweep", "no-such-profile", "--vary", "server.cuda_graph=on,off", "--concurrency", "64"], "no profile"),
        (["sweep", "--resume", "glm5-tp8-19990101-000000"], "no sweep"),
        (["sweep"], "which profile"),
    ]
    for args, needle in cases:
        rc, err = in_process(*args, *common(workdir), cwd=workdir)
        assert rc == 2, (args, err)
        assert needle in err and "fix:" in err, (args, err)
    assert not (workdir / "sweeps").exists()


def test_invalid_variants_are_skipped_with_their_rule(workdir: Path) -> None:
    table = workdir / "table.json"
    rc, err = in_process("sweep", "glm5-tp8", "--vary", "server.allreduce_fusion=off,on", "--concurrency", "1024",
                         "--runner", f"recorded:{table}", "--budget", "1", *common(workdir), cwd=workdir)
    # The one valid variant has no recorded result: it fails with that reason, nothing is ranked.
    assert rc == 1, err
    assert "skipped v02 allreduce_fusion=on: invalid, rejected by sm120-allreduce-fusion" in err
    assert "no recorded result" in err
