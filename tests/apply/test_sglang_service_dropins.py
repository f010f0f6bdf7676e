"""The sglang_service role's drop-ins for real under systemd (the lab's pve1, install phase only): written with
the unit, the service restarted with what they say, removed when no longer listed, an operator's own drop-in never
touched, a second run changing nothing, and a bad file name refused before anything changes."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.ansible import PlaybookResult, run_playbook

HERE = Path(__file__).parent
UNIT = "toolkit-dropin-check"
DIR = f"/etc/systemd/system/{UNIT}.service.d"
UNIT_TEXT = f"[Unit]\nDescription={UNIT} (sglang_service role test)\n[Service]\nExecStart=/bin/sleep infinity\n"
ENV = "[Service]\nEnvironment=TOOLKIT_DROPIN_CHECK=1\n"
EXEC = "[Service]\nExecStart=\nExecStart=/bin/sleep 12345\n"
OPERATOR = "[Service]\nEnvironment=OPERATOR_OWN=1\n"


def pve(lab: Any, command: str) -> str:
    proc = lab.ssh("pve1", command)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return str(proc.stdout)


def run(lab: Any, tmp: Path, **extravars: Any) -> PlaybookResult:
    return run_playbook(
        str(HERE / "playbooks" / "service_dropins.yml"),
        inventory=Path(lab.inventory_path),
        tags=["sglang_service_install"],
        private_data_dir=tmp / "runner",
        extravars={"sglang_service_name": UNIT, "sglang_service_unit": UNIT_TEXT,
                   "sglang_service_argv": ["/bin/sleep", "infinity", "--"], **extravars},
    )


def show(lab: Any, prop: str) -> str:
    return pve(lab, f"systemctl show -p {prop} --value {UNIT}").strip()


def main_command(lab: Any) -> str:
    return pve(lab, f"tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value {UNIT})/cmdline").strip()


@pytest.fixture
def unit(lab: Any) -> Any:
    pve(lab, f"mkdir -p {DIR} && printf %s {shlex.quote(OPERATOR)} > {DIR}/operator.conf")
    yield lab
    lab.ssh("pve1", f"systemctl disable --now {UNIT}; rm -rf {DIR} /etc/systemd/system/{UNIT}.service; "
                    "systemctl daemon-reload")


def test_dropins_written_removed_and_an_operators_own_kept(unit: Any, tmp_path: Path) -> None:
    lab = unit
    first = run(lab, tmp_path, sglang_service_dropins={"10-env.conf": ENV, "20-exec.conf": EXEC})
    assert first.rc == 0, [f.message for f in first.failures]
    assert pve(lab, f"cat {DIR}/20-exec.conf") == EXEC
    assert pve(lab, f"stat -c %a {DIR}/10-env.conf {DIR}/20-exec.conf").split() == ["644", "644"]
    env = show(lab, "Environment")
    assert "TOOLKIT_DROPIN_CHECK=1" in env and "OPERATOR_OWN=1" in env
    assert main_command(lab) == "/bin/sleep 12345"  # restarted with the drop-in's ExecStart

    again = run(lab, tmp_path, sglang_service_dropins={"10-env.conf": ENV, "20-exec.conf": EXEC})
    assert again.rc == 0 and again.hosts["pve1"].changed == 0, [e.task for e in again.events if e.kind == "changed"]

    # 20-exec.conf is no longer listed: removed, and the unit's own ExecStart runs again; the operator's stays.
    fewer = run(lab, tmp_path, sglang_service_dropins={"10-env.conf": ENV.replace("=1", "=2")})
    assert fewer.rc == 0, [f.message for f in fewer.failures]
    assert sorted(pve(lab, f"ls {DIR}").split()) == ["10-env.conf", "operator.conf"]
    assert main_command(lab) == "/bin/sleep infinity"
    assert "TOOLKIT_DROPIN_CHECK=2" in show(lab, "Environment")

    # A host's own list wins over the common one: here, none at all.
    none = run(lab, tmp_path, sglang_service_dropins={"10-env.conf": ENV}, sglang_service_dropins_by_host={"pve1": {}})
    assert none.rc == 0, [f.message for f in none.failures]
    assert pve(lab, f"ls -A {DIR}").split() == ["operator.conf"]
    env = show(lab, "Environment")
    assert "TOOLKIT_DROPIN_CHECK" not in env and "OPERATOR_OWN=1" in env


def test_a_bad_dropin_name_is_refused_before_anything_changes(unit: Any, tmp_path: Path) -> None:
    lab = unit
    before = pve(lab, f"ls -lA --time-style=full-iso {DIR} /etc/systemd/system | md5sum")
    bad = run(lab, tmp_path, sglang_service_dropins={"../../escape.conf": ENV, "limits": ENV, "ok.conf": ENV})
    assert bad.rc != 0
    message = "\n".join(f.message for f in bad.failures)
    assert "../../escape.conf" in message and "limits" in message and "ok.conf" not in message.split("Fix")[0]
    assert "Nothing was changed" in message
    assert pve(lab, f"ls -lA --time-style=full-iso {DIR} /etc/systemd/system | md5sum") == before


EXITING = (f"[Unit]\nDescription={UNIT} (sglang_service role test: a server that exits while starting)\n[Service]\n"
           "Type=exec\nExecStart=/usr/bin/python3 -c 'import torch_standin_missing'\n"
           "Restart=on-failure\nRestartSec=10\n")


def test_a_server_that_exits_at_once_fails_the_wait_within_seconds_with_its_journal(unit: Any, tmp_path: Path) -> None:
    # The unit restarts on failure, as the rendered one does; a health timeout of 600 s must not be waited out.
    import time

    started = time.monotonic()
    result = run_playbook(
        str(HERE / "playbooks" / "service_dropins.yml"), inventory=Path(unit.inventory_path),
        private_data_dir=tmp_path / "runner",
        extravars={"sglang_service_name": UNIT, "sglang_service_unit": EXITING,
                   "sglang_service_argv": ["/usr/bin/python3", "-c", "import torch_standin_missing"],
                   "sglang_service_base_url": "http://127.0.0.1:9", "sglang_service_health_timeout_s": 600})
    elapsed_s = time.monotonic() - started
    assert result.rc != 0
    assert [f.task for f in result.failures] == [
        "Fail at once when the server's process exited while starting, showing its log tail"], result.failures
    message = result.failures[0].message
    assert f"service {UNIT} exited before answering http://127.0.0.1:9/health" in message
    assert "exit status 1" in message
    assert "ModuleNotFoundError: No module named 'torch_standin_missing'" in message  # the journal's line
    assert "Fix: the module torch_standin_missing is missing from the venv the unit runs" in message
    # Half the health timeout: a role that waited it out fails this, and a loaded CI machine (62 s at load 25, the
    # playbook's own start and facts included) does not.
    assert elapsed_s < 300, f"{elapsed_s:.1f} s"
    print(f"the role failed {elapsed_s:.1f} s after it started (health timeout 600 s)")
