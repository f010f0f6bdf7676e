"""The apply runner in process (toolkit.app.measure.ApplyProbeRunner): each point calls the apply use case and reads
its typed outcome. What a child `toolkit apply` used to give each point is checked here without a lab: the request
it deploys, the host locks the sweep holds and the point's apply re-enters, Ctrl-C leaving the point pending and
the lock free for a resume, a timeout, a refusal and a crash failing only their variant, and the point's apply.log.

The deploy itself is the lab's to run (tests/sweep/test_sweep_lab.py: real applies, a real SIGINT, a resume); here
a stand-in for the use case answers with a recorded H200 probe run (tests/fixtures/probe), after taking the host
locks exactly as the use case does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.ansible import PlaybookInterrupted, PlaybookTimedOut, read_inventory
from toolkit.adapters.host_lock import host_locks, lock_path
from toolkit.app import measure, sweep
from toolkit.app.apply import ApplyOutcome, ApplyRequest, HostProbe
from toolkit.core.ansible_summary import HostStats, PlaybookEvent, PlaybookResult, TaskFailure
from toolkit.core.errors import ToolkitError
from toolkit.core.sweep.state import DONE, FAILED, PENDING

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "probe" / "h200-compute"
VARY = ["server.max_running_requests=256,512"]


class UseCase:
    """Stands in for toolkit.app.apply.apply: takes the target hosts' locks as it does, then answers each call
    with the next of `answers` (an exception to raise, a deploy failure, or None: the recorded probe run)."""

    def __init__(self, answers: list[BaseException | TaskFailure | None]) -> None:
        self.answers = answers
        self.requests: list[ApplyRequest] = []
        self.reentered: list[list[str]] = []

    def __call__(self, req: ApplyRequest, *, on_event: Callable[..., None], on_message: Callable[[str], None],
                 on_status: Callable[[str], Any]) -> ApplyOutcome:
        self.requests.append(req)
        assert req.inventory is not None
        hosts = read_inventory(req.inventory, "gpu_containers")
        with host_locks({n: h.address for n, h in hosts.items()}, purpose="toolkit apply", wait=req.wait,
                        on_message=on_message) as held:
            self.reentered.append(held.reentered)
            on_status("the deploy runs")
            answer = self.answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            fetch = Path(req.runs_dir) / "20261206T000000Z-run"
            run_dir = fetch / "ct" / fetch.name
            shutil.copytree(RECORDED, run_dir)
            failures = [answer] if answer is not None else []
            for f in failures:  # the playbook's events, as the use case passes them on
                on_event(PlaybookEvent(kind="failed", host=f.host, task=f.task, message=f.message))
            playbook = PlaybookResult(rc=2 if failures else 0, status="failed" if failures else "successful",
                                      hosts={"ct": HostStats(ok=9, changed=1, failed=len(failures))},
                                      failures=failures, artifacts_dir=None)
            verdict = json.loads((run_dir / "verdict.json").read_text())
            return ApplyOutcome(profile=req.profile, check=False, playbook=playbook, notes=[],
                                artifacts_dir=fetch, probes={"ct": HostProbe(run_dir, verdict)})


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text("all:\n  children:\n    gpu_containers:\n      hosts:\n        ct: {ansible_host: 10.0.0.9}\n")
    monkeypatch.setenv("TOOLKIT_LOCK_DIR", str(tmp_path / "locks"))
    return path


def _request(tmp_path: Path, inventory: Path, **kw: Any) -> sweep.SweepRequest:
    return sweep.SweepRequest(profile=None if kw.get("resume") else "glm5-tp8", vary=[] if kw.get("resume") else VARY,
                              concurrency=None if kw.get("resume") else "64", runner="apply",
                              inventory=str(inventory), point_timeout_s=120, profiles_dir=str(REPO / "profiles"),
                              sweeps_dir=str(tmp_path / "sweeps"), **kw)


def _measure(tmp_path: Path, inventory: Path, use_case: UseCase, **kw: Any) -> tuple[sweep.SweepSession, bool]:
    req = _request(tmp_path, inventory, **kw)
    session = sweep.open_session(req)
    point_runner = measure.ApplyProbeRunner(sweep.runner(session, req).ctx, use_case)
    interrupted = measure.measure(session.state, session.spec, point_runner, session.store, runner="apply",
                                  inventory=req.inventory, wait=False, purpose="toolkit sweep",
                                  on_progress=lambda _p: None, on_message=lambda _m: None)
    return session, interrupted


def _points(session: sweep.SweepSession) -> list[Any]:
    state = session.store.load(session.state.run_id)  # what is on disk, as a resume reads it
    return [p for v in state.planned() for p in v.points]


def test_each_point_is_applied_in_process_under_the_sweeps_locks(tmp_path: Path, inventory: Path) -> None:
    use_case = UseCase([None, None])
    session, interrupted = _measure(tmp_path, inventory, use_case)
    assert not interrupted
    points = _points(session)
    assert [p.status for p in points] == [DONE, DONE]
    summary = json.loads((RECORDED / "summary.json").read_text())
    expected = summary["steady"]["throughput"]["output_tok_per_s"]
    assert all(p.measurement.steady_output_tok_per_s == pytest.approx(expected, rel=1e-3) for p in points)
    # The sweep held the host; each point's apply re-entered it rather than waiting for its own sweep.
    assert use_case.reentered == [["ct"], ["ct"]]
    assert lock_path("10.0.0.9:22", tmp_path / "locks").read_text() == ""
    run_dir = session.store.run_dir(session.state.run_id)
    for req, point in zip(use_case.requests, points, strict=True):
        assert req.probe and not req.record and req.timeout_s == 120 and req.inventory == str(inventory.resolve())
        assert req.profiles_dir == str(run_dir / "profiles") and (run_dir / "profiles" / f"{req.profile}.yaml").exists()
        assert req.runs_dir == str(run_dir / point.artifacts)
        assert "the deploy runs" in (Path(req.runs_dir) / "apply.log").read_text()


def test_ctrl_c_mid_point_leaves_it_pending_the_host_free_and_a_resume_measures_it(tmp_path: Path,
                                                                                  inventory: Path) -> None:
    session, interrupted = _measure(tmp_path, inventory, UseCase([None, PlaybookInterrupted(tmp_path)]))
    assert interrupted
    first, second = _points(session)
    assert (first.status, first.attempts) == (DONE, 1)
    assert (second.status, second.attempts) == (PENDING, 1)  # its attempt counted: a resume measures it again
    with host_locks({"ct": "10.0.0.9:22"}, purpose="next apply", wait=False) as held:  # released on the way out
        assert held.taken == ["ct"]

    resumed = UseCase([None])
    session, interrupted = _measure(tmp_path, inventory, resumed, resume=session.state.run_id)
    assert not interrupted and len(resumed.requests) == 1
    first, second = _points(session)
    assert (first.status, first.attempts) == (DONE, 1)
    assert (second.status, second.attempts) == (DONE, 2)


@pytest.mark.parametrize(("answer", "reason", "logged"), [
    (PlaybookTimedOut(Path("/tmp"), 120), "apply did not finish in 120 s", "did not finish in 120 s"),
    (ToolkitError.of("the engine lock is gone", field="engine.sglang_version", fix="lock it"),
     "apply refused: error: engine.sglang_version: the engine lock is gone | fix: lock it", "lock it"),
    (RuntimeError("a bug in the plan"), "apply failed: RuntimeError: a bug in the plan", "Traceback"),
    (TaskFailure(host="ct", task="Wait for the server's /health", message="timed out after 300 s"),
     "deploy failed: Wait for the server's /health: timed out after 300 s", "failed ct: Wait"),
], ids=["timeout", "refused", "crash", "deploy-failed"])
def test_a_failing_apply_fails_its_variant_and_the_sweep_goes_on(tmp_path: Path, inventory: Path,
                                                                 answer: Any, reason: str, logged: str) -> None:
    session, interrupted = _measure(tmp_path, inventory, UseCase([answer, None]))
    assert not interrupted
    failed, measured = _points(session)
    assert failed.status == FAILED and failed.reason.startswith(reason), failed.reason
    assert failed.artifacts is not None and logged in Path(failed.artifacts).read_text()
    assert measured.status == DONE
