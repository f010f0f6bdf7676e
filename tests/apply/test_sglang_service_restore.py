"""A rolling change's safety net for real under systemd (the lab's pve1): the sglang_service role keeps the unit it
replaces, and when the new one fails its health wait it puts that unit back, restarts the service on it, waits for
its /health, and fails saying so. The playbook is the drop-ins test's (the role alone on pve1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.ansible import PlaybookResult, run_playbook

HERE = Path(__file__).parent
UNIT = "toolkit-restore-check"
PORT = 18931
DOCROOT = f"/run/{UNIT}"
# The old unit answers GET /health with 200 (a file of that name served by Python's http.server).
OLD = (f"[Unit]\nDescription={UNIT} old (sglang_service role test)\n[Service]\n"
       f"ExecStart=/usr/bin/python3 -m http.server {PORT} --bind 127.0.0.1 --directory {DOCROOT}\n")
# The new unit exits at once: the health wait sees the process gone and fails at its next poll.
NEW = f"[Unit]\nDescription={UNIT} new (sglang_service role test)\n[Service]\nExecStart=/bin/sh -c 'exit 3'\n"


def pve(lab: Any, command: str) -> str:
    proc = lab.ssh("pve1", command)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return str(proc.stdout)


def run(lab: Any, tmp: Path, unit: str, tags: list[str], **extravars: Any) -> PlaybookResult:
    return run_playbook(
        str(HERE / "playbooks" / "service_dropins.yml"),
        inventory=Path(lab.inventory_path),
        tags=tags,
        private_data_dir=tmp / "runner",
        extravars={"sglang_service_name": UNIT, "sglang_service_unit": unit,
                   "sglang_service_argv": unit.split("ExecStart=")[1].split()[:3],
                   "sglang_service_base_url": f"http://127.0.0.1:{PORT}", "sglang_service_health_timeout_s": 30,
                   "sglang_service_health_poll_s": 1, "sglang_service_previous_dir": f"/var/lib/{UNIT}",
                   **extravars},
    )


@pytest.fixture
def unit(lab: Any) -> Any:
    pve(lab, f"mkdir -p {DOCROOT} && echo ok > {DOCROOT}/health")
    yield lab
    lab.ssh("pve1", f"systemctl disable --now {UNIT}; rm -rf {DOCROOT} /var/lib/{UNIT} "
                    f"/etc/systemd/system/{UNIT}.service; systemctl daemon-reload")


def test_a_failed_new_unit_is_replaced_by_the_old_one_serving_again(unit: Any, tmp_path: Path) -> None:
    lab = unit
    first = run(lab, tmp_path, OLD, ["sglang_service_install"])
    assert first.rc == 0, [f.message for f in first.failures]
    # The old unit serves before the roll (systemd started it; Python's http.server binds a moment later: asked
    # at once, curl found nothing listening yet under load, which this assertion once took for a failure).
    assert pve(lab, f"for i in $(seq 100); do code=$(curl -s -o /dev/null -w '%{{http_code}}' "
                    f"http://127.0.0.1:{PORT}/health); [ \"$code\" = 200 ] && break; sleep 0.1; done; "
                    "echo $code").strip() == "200"
    rolled = run(lab, tmp_path, NEW, ["sglang_service_install", "sglang_service_run"],
                 sglang_service_restore_on_failure=True)
    assert rolled.rc != 0
    # The new unit's own failure (the health wait's), then the role's, saying what serves now.
    first_failure, failure = rolled.failures
    assert "exited before answering" in first_failure.message, first_failure.message
    assert "the new unit of toolkit-restore-check failed" in failure.message, failure.message
    assert "back on its previous unit, serving again" in failure.message, failure.message
    assert "Description=toolkit-restore-check old" in pve(lab, f"cat /etc/systemd/system/{UNIT}.service")
    assert pve(lab, f"systemctl is-active {UNIT}").strip() == "active"
    assert pve(lab, f"python3 -c \"import urllib.request; print(urllib.request.urlopen("
                    f"'http://127.0.0.1:{PORT}/health').status)\"").strip() == "200"
