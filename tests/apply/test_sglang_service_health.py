"""The sglang_service role's script that the health wait repeats: when the unit's `systemctl show` properties
say the server's process has exited (so the wait stops at once instead of running out its timeout)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

MODULE = Path(__file__).resolve().parents[2] / "roles" / "sglang_service" / "files" / "sglang_service_health.py"


@pytest.fixture(scope="module")
def health() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sglang_service_health", MODULE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNING = {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0",
           "MainPID": "4242", "ExecMainStatus": "0"}


@pytest.mark.parametrize("props", [
    RUNNING,
    # ExecStartPre (the lab's tokenizer, a real host's nothing) runs with no main PID yet: starting, not exited.
    {**RUNNING, "ActiveState": "activating", "SubState": "start-pre", "MainPID": "0"},
    {**RUNNING, "ActiveState": "activating", "SubState": "start"},
])
def test_a_running_or_starting_server_has_not_exited(health: ModuleType, props: dict[str, str]) -> None:
    assert health.exit_reason(props, 0) == ""


def test_a_process_waiting_to_restart_has_exited_with_its_status(health: ModuleType) -> None:
    props = {**RUNNING, "ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code",
             "MainPID": "0", "ExecMainStatus": "1"}
    assert health.exit_reason(props, 0) == ("its process exited (exit status 1); systemd will restart it "
                                            "(Restart=on-failure)")


def test_a_restart_since_the_wait_began_counts_only_restarts_after_it(health: ModuleType) -> None:
    # Restarted between two polls: running again, but the server the wait started with is gone.
    assert health.exit_reason({**RUNNING, "NRestarts": "3"}, 2).startswith("systemd restarted it 1 time(s)")
    assert health.exit_reason({**RUNNING, "NRestarts": "3"}, 3) == ""


@pytest.mark.parametrize(("props", "start"), [
    ({**RUNNING, "ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": "1"},
     "the unit failed (exit status 1)"),
    ({**RUNNING, "ActiveState": "failed", "SubState": "failed", "Result": "signal", "ExecMainStatus": "0"},
     "the unit failed (result signal)"),
    ({**RUNNING, "ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}, "the unit stopped"),
])
def test_a_failed_or_stopped_unit_has_exited(health: ModuleType, props: dict[str, str], start: str) -> None:
    assert health.exit_reason(props, 0).startswith(start)
