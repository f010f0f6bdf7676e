"""A profile's GPU power limit, applied for real in the lab: deploy.yml's host play (as `toolkit apply` runs it) runs
the host role's power-limit tasks on pve1 (the lab's nvidia-smi stand-in, which refuses what the real one refuses),
the doctor reads the limit back against the boot unit, a container cannot set it, a limit outside the GPUs' range
stops the role before any change, and `default` puts the GPUs back. Three host plays and one doctor: kept small
for CI (a probe under the cap and the engine model's clocks are tested without the lab, tests/tune)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.adapters.ansible import run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
UNIT = "/etc/systemd/system/nvidia-power-limit.service"
# The lab's GPUs by PCI bus id, in bus order (lab-init).
BUSES = [f"0000:{0x01 + i * 0x20:02x}:00.0" for i in range(8)]


@pytest.fixture(scope="module")
def inventory(request: pytest.FixtureRequest) -> str:
    """The lab's host and container, provisioned (idempotent when another lab test did it first); POWER_LAB_INVENTORY
    points at a developer's own."""
    own = os.environ.get("POWER_LAB_INVENTORY")
    if own:
        return own
    lab = request.getfixturevalue("lab")
    for book in ("host", "container"):
        result = run_playbook(book, inventory=lab.inventory_path)
        assert result.rc == 0, [f"{f.host}: {f.task}: {f.message}" for f in result.failures]
    return str(lab.inventory_path)


def toolkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)


def ssh(inventory: str, host: str, command: str) -> subprocess.CompletedProcess[str]:
    import toolkit.lab

    state = toolkit.lab.status()
    assert state is not None
    return state.ssh(host, command)


def limits(inventory: str, host: str = "pve1") -> list[float]:
    out = ssh(inventory, host, "nvidia-smi --query-gpu=power.limit --format=csv,noheader,nounits").stdout
    return [float(x) for x in out.split()]


def test_a_profiles_power_limit_is_applied_on_the_host_kept_and_read_back(inventory: str, tmp_path: Path) -> None:
    # deploy.yml's host play as `toolkit apply` runs it for a profile with gpu.power_limit_w: 450 on a container of
    # pve1 (the service's play on no host here: no server restarts).
    # The container's GPUs (`toolkit apply` passes the target containers' vmids; ct has all 8): each by bus id.
    first = run_playbook("deploy", inventory=inventory, extravars={
        "deploy_power_limit_hosts": ["pve1"], "proxmox_gpu_host_gpu_power_limit_w": "450", "deploy_hosts": [],
        "proxmox_gpu_host_power_limit_vmids": [100]})
    assert first.rc == 0 and first.hosts["pve1"].changed >= 1, [f.message for f in first.failures]
    assert limits(inventory) == [450.0] * 8
    unit = ssh(inventory, "pve1", f"cat {UNIT}; systemctl is-enabled nvidia-power-limit.service").stdout
    assert all(f"ExecStart=/usr/bin/nvidia-smi -i {bus} -pl 450" in unit for bus in BUSES) and "enabled" in unit
    assert "Before=pve-guests.service pve-ha-lrm.service" in unit
    # The container sees the host's limit (the stand-in server's GPUs read it there) and cannot change it.
    assert limits(inventory, "ct") == [450.0] * 8
    refused = ssh(inventory, "ct", "nvidia-smi -pl 400")
    assert refused.returncode == 4 and "Insufficient Permissions" in refused.stdout
    assert limits(inventory) == [450.0] * 8

    doctor = toolkit("doctor", "pve1", "-i", inventory, "--json", cwd=tmp_path)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["data"] if c["subject"] == "pve1"}
    assert checks["power limit"]["status"] == "pass" and "450 W on 8 GPU(s), kept at boot" in \
        checks["power limit"]["detail"]

    # Past the GPUs' range: the role stops before any change, naming the GPUs and their range.
    bad = run_playbook("host", inventory=inventory, extravars={"proxmox_gpu_host_gpu_power_limit_w": "250"},
                       tags=["proxmox_gpu_host_power_limit"])
    assert bad.rc != 0
    assert any("outside the range of GPU 0 (300.0 to 600.0 W" in f.message and "Nothing was changed" in f.message
               for f in bad.failures), [f.message for f in bad.failures]
    assert limits(inventory) == [450.0] * 8

    # Two profiles on one host, each for its own GPUs (ct-a's 0-3 and ct-b's 4-7, as the plan names them by bus id):
    # the second leaves the first's GPUs as they were, now and at boot.
    for watts, buses in (("400", BUSES[:4]), ("350", BUSES[4:])):
        scoped = run_playbook("host", inventory=inventory, tags=["proxmox_gpu_host_power_limit"], extravars={
            "proxmox_gpu_host_gpu_power_limit_w": watts, "proxmox_gpu_host_power_limit_gpus": buses})
        assert scoped.rc == 0, [f.message for f in scoped.failures]
    assert limits(inventory) == [400.0] * 4 + [350.0] * 4
    unit = ssh(inventory, "pve1", f"cat {UNIT}").stdout
    assert [line for line in unit.splitlines() if line.startswith("ExecStart=")] == [
        f"ExecStart=/usr/bin/nvidia-smi -i {bus} -pl {w}" for bus, w in zip(BUSES, [400] * 4 + [350] * 4, strict=True)]
    ssh(inventory, "pve1", "systemctl restart nvidia-power-limit.service")  # what the next boot runs
    assert limits(inventory) == [400.0] * 4 + [350.0] * 4
    doctor = toolkit("doctor", "pve1", "-i", inventory, "--json", cwd=tmp_path)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["data"] if c["subject"] == "pve1"}
    assert checks["power limit"]["status"] == "pass", checks["power limit"]

    # Back to the defaults (the GPUs as the other lab tests expect them): the unit goes, every GPU at 600 W.
    back = run_playbook("host", inventory=inventory, extravars={"proxmox_gpu_host_gpu_power_limit_w": "default"},
                        tags=["proxmox_gpu_host_power_limit"])
    assert back.rc == 0, [f.message for f in back.failures]
    assert limits(inventory) == [600.0] * 8
    assert ssh(inventory, "pve1", f"test -e {UNIT}").returncode == 1
