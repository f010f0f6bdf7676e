"""`toolkit tune` as a user runs it: a real process, a real SIGINT in the middle of a step (step 2), a resume, a
promotion that `toolkit profile validate` and `render` accept.

The table it replays is recorded here from the lab's engine model (each point the variant's own simulated
measurement, verdict and knob steps), with a duration per point so there is time to interrupt; the path the
process takes must be the one the in-process tune over the engine model took."""

from __future__ import annotations

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

from toolkit.adapters.profile_store import ProfileStore
from toolkit.core.sweep.run import PointRequest, VariantFailed
from toolkit.core.sweep.state import Measurement
from toolkit.lab.engine_runner import EngineModelRunner

from .conftest import BASE, REPO, fresh, tune

POINT_S = 0.4


class Recording:
    """The engine model, each answer kept as a recorded table's point."""

    def __init__(self, inner: EngineModelRunner) -> None:
        self.inner = inner
        self.points: list[dict[str, Any]] = []

    def __call__(self, request: PointRequest) -> Measurement:
        knobs = request.variant.knob_dict()
        try:
            m = self.inner(request)
        except VariantFailed as exc:
            self.points.append({"knobs": knobs, "fail": "variant", "reason": exc.reason})
            raise
        self.points.append({"knobs": knobs, "concurrency": request.concurrency, "repeat": request.repeat,
                            "steady_output_tok_per_s": m.steady_output_tok_per_s, "power_w_total": m.power_w_total,
                            "verdict": m.verdict, "knob_steps": m.knob_steps,
                            "verdict_headline": m.verdict_headline, "duration_s": POINT_S})
        return m


def toolkit(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "toolkit", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(tmp: Path) -> tuple[str | None, int]:
    states = list((tmp / "tunes").glob("*/state.json"))
    if not states:
        return None, 0
    data = json.loads(states[0].read_text())
    return data["run_id"], sum(1 for v in data["variants"] for p in v["points"] if p["status"] != "pending")


@pytest.mark.slow
def test_sigint_mid_step_then_resume_and_promote(tmp_path: Path, profiles: ProfileStore) -> None:
    state, spec = fresh(profiles)
    recording = Recording(EngineModelRunner(base=BASE, profile_names=profiles.names()))
    tune(profiles, state, spec, recording)
    assert state.tune is not None
    (tmp_path / "table.json").write_text(json.dumps({"about": "engine model", "points": recording.points}))
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    common = ["--profiles-dir", str(tmp_path / "profiles"), "--tunes-dir", str(tmp_path / "tunes"),
              "--runner", f"recorded:{tmp_path / 'table.json'}"]

    first = toolkit("tune", BASE, *common, cwd=tmp_path)
    deadline = time.monotonic() + 60
    run_id, n = None, 0
    while time.monotonic() < deadline:
        run_id, n = finished(tmp_path)
        if n >= 5:  # the base's three, step 1's one, step 2's first of two: the middle of a step
            break
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    assert run_id
    first.send_signal(signal.SIGINT)
    _out, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    assert f"toolkit tune --resume {run_id}" in err
    on_disk = json.loads((tmp_path / "tunes" / run_id / "state.json").read_text())
    assert on_disk["tune"]["steps"][-1]["result"] is None  # interrupted inside a step
    _, after = finished(tmp_path)
    assert 5 <= after < len(recording.points)

    second = toolkit("tune", "--resume", run_id, *common, "--promote", "--promote-name", "glm5-tuned", cwd=tmp_path)
    _out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert f"resuming: {after} point(s) finished are kept" in err
    result = json.loads((tmp_path / "tunes" / run_id / "tune.json").read_text())
    # The same path as the uninterrupted tune: the same steps, candidates and decisions.
    assert [(s["step"], [c["change"] for c in s["candidates"]], (s["result"] or {}).get("decision"))
            for s in result["steps"]] == [
        (s["step"], [c["change"] for c in s["candidates"]], (s["result"] or {}).get("decision"))
        for s in state.tune["steps"]]
    assert result["stop"]["kind"] == "converged" and result["best"]["knobs"]["server.max_running_requests"] >= 512
    states = json.loads((tmp_path / "tunes" / run_id / "state.json").read_text())
    attempts = sum(p["attempts"] for v in states["variants"] for p in v["points"])
    # Each point once, and the one in flight when the SIGINT landed once more.
    assert attempts in (len(recording.points), len(recording.points) + 1)

    run_dir = tmp_path / "tunes" / run_id
    md = (run_dir / "report.md").read_text()
    assert "## The path taken" in md and "![step 1](step-1.png)" in md and (run_dir / "step-2.png").is_file()
    assert "Promoted: `glm5-tuned`" in md

    doc = yaml.safe_load((tmp_path / "profiles" / "glm5-tuned.yaml").read_text())
    best_cap = result["best"]["knobs"]["server.max_running_requests"]
    assert doc["extends"] == BASE and doc["server"] == {"max_running_requests": best_cap}
    why = doc["why"]["server.max_running_requests"]["reason"]
    assert f"tune {run_id} step 1: the verdict of v01" in why and "scheduler-capped" in why
    for cmd in (["profile", "validate", "glm5-tuned"], ["profile", "render", "glm5-tuned"]):
        proc = toolkit(*cmd, "--profiles-dir", str(tmp_path / "profiles"), cwd=tmp_path)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert "--max-running-requests" in out
