"""A 3 x 2 sweep against the lab with the real apply + probe runner, interrupted once and resumed.

Every point is `toolkit apply profile VARIANT --probe` over real SSH into the lab's LXC container: the
rendered unit changes with each variant's flags and the service restarts; the server is the lab's
announced stand-in and the GPUs are its engine model's (simulated), so the figures rank stand-in runs, not
GPUs. What this proves is the machinery: variants deployed, measured, failures recorded, a real
SIGINT in the middle of a deploy, a resume that re-measures only what is left, and a promotion that
validates and renders. The axes avoid the base's own values so that the winner always differs from
the base and a profile is always promoted.
"""

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

from toolkit.adapters.ansible import run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VARY = ["--vary", "server.max_running_requests=256,512,768", "--vary", "server.cuda_graph=off,on"]


@pytest.fixture(scope="module")
def inventory(request: pytest.FixtureRequest) -> str:
    """The lab's GPU container, provisioned by the #6 playbooks (idempotent when tests/apply ran first).

    SWEEP_LAB_INVENTORY points at another container of the same lab (a developer's own, so a sweep does
    not redeploy a container someone else is testing).
    """
    own = os.environ.get("SWEEP_LAB_INVENTORY")
    if own:
        return own
    lab = request.getfixturevalue("lab")
    for book in ("host", "container"):
        if not (REPO / "playbooks" / f"{book}.yml").exists():
            pytest.skip(f"playbooks/{book}.yml is not in this checkout yet")
        result = run_playbook(book, inventory=lab.inventory_path)
        assert result.rc == 0, [f"{f.host}: {f.task}: {f.message}" for f in result.failures]
    return str(lab.inventory_path)


def toolkit(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def state_of(work: Path) -> dict[str, Any] | None:
    found = list((work / "sweeps").glob("*/state.json"))
    return json.loads(found[0].read_text()) if found else None


def count(state: dict[str, Any] | None, status: str | None = None) -> int:
    if state is None:
        return 0
    return sum(
        1
        for v in state["variants"]
        for p in v["points"]
        if (p["status"] != "pending" if status is None else p["status"] == status)
    )


def test_lab_sweep_interrupted_resumed_promoted(inventory: str, tmp_path: Path) -> None:
    work = tmp_path
    shutil.copytree(REPO / "profiles", work / "profiles")
    common = ["--profiles-dir", str(work / "profiles"), "--sweeps-dir", str(work / "sweeps"), "-i", inventory]

    first = toolkit("sweep", "glm5-tp8", *VARY, "--concurrency", "64", *common, cwd=REPO)
    deadline = time.monotonic() + 900
    # Interrupt while the third point is being deployed: two finished, the third's attempt counted.
    while time.monotonic() < deadline:
        st = state_of(work)
        if count(st) >= 2 and st is not None and st["variants"][2]["points"][0]["attempts"] >= 1:
            break
        assert first.poll() is None, first.communicate()[1][-4000:]
        time.sleep(0.5)
    else:
        first.kill()
        raise AssertionError("the sweep did not reach its third point")
    time.sleep(3)  # well inside apply's playbook
    first.send_signal(signal.SIGINT)
    _out, err = first.communicate(timeout=300)
    assert first.returncode == 130, err[-4000:]
    st = state_of(work)
    assert st is not None
    run_id = st["run_id"]
    finished_before = count(st)
    assert 2 <= finished_before < 6

    second = toolkit(
        "sweep", "--resume", run_id, *common, "--promote", "--promote-name", "glm5-tp8-lab-swept", cwd=REPO
    )
    _out, err = second.communicate(timeout=1500)
    assert second.returncode == 0, err[-4000:]
    assert f"resuming: {finished_before} point(s) finished are skipped" in err
    assert "variant 6 of 6" in err and "ETA" in err

    st = state_of(work)
    assert st is not None and count(st) == 6
    points = [v["points"][0] for v in st["variants"]]
    # Finished before the SIGINT: measured once; the interrupted one again; none twice otherwise.
    assert sum(p["attempts"] for p in points) in (6, 7)
    done = [p for p in points if p["status"] == "done"]
    assert len(done) >= 3, [p["reason"] for p in points]
    sources = {(p["measurement"]["provenance"]["kind"], p["measurement"]["provenance"]["detail"]) for p in done}
    assert all(k == "stand-in" and "simulated GPUs" in d for k, d in sources), sources

    ranking = json.loads((work / "sweeps" / run_id / "ranking.json").read_text())
    tputs = [r["steady_output_tok_per_s"] for r in ranking["by_throughput"]]
    assert tputs == sorted(tputs, reverse=True) and len(tputs) == len(done)
    assert ranking["pareto_front"]
    report = (work / "sweeps" / run_id / "report.md").read_text()
    assert "simulated" in report

    promoted = work / "profiles" / "glm5-tp8-lab-swept.yaml"
    doc = yaml.safe_load(promoted.read_text())
    assert doc["extends"] == "glm5-tp8"
    assert all(run_id in w["reason"] for w in doc["why"].values())
    for cmd in (["profile", "validate", "glm5-tp8-lab-swept"], ["profile", "render", "glm5-tp8-lab-swept"]):
        proc = toolkit(*cmd, "--profiles-dir", str(work / "profiles"), cwd=REPO)
        _o, e = proc.communicate(timeout=60)
        assert proc.returncode == 0, e
