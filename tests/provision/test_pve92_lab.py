"""A Proxmox VE 9.2 host as installed (`toolkit lab up --flavour stock-pve9 --kernel 7.0`): its default kernel is 7.0,
on which the 580 branch builds only from 580.142 (the lab's stand-in module refuses older ones as Kbuild does). One lab
bring-up for the issue's must-show and the role checks that need a bare host:

- the roles refuse before any change a driver installed from apt (the .run installer would abort over it) and a GPU a
  stopped VM's hostpci names while a host driver holds it;
- `toolkit host plan pve1 --profile glm5-tp8 -e proxmox_gpu_host_driver_version=580.95.05` exits 2 naming the kernel
  and a driver that builds, and changes nothing;
- without the pin `toolkit host reproduce pve1 --profile glm5-tp8` passes; then `toolkit lab reboot pve1` and
  `toolkit doctor pve1` pass, the units ordered before pve-ha-lrm too;
- a GPU unbound at run time (a VM's start) leaves nvidia-smi's indices and the device minors apart, and the driver's
  /proc/driver/nvidia/gpus says which minor each GPU has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.own_lab import module_lab
from toolkit.adapters.ansible import run_playbook
from toolkit.lab.plan import LabConfig, LabState

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CONFIG = LabConfig(flavour="stock-pve9", kernel_series="7.0")
KERNEL = CONFIG.flavour_spec.kernel
# What the host looks like to apt, the boot and the guests: a refused run must leave all of it as it was.
SNAPSHOT = ("dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' | md5sum; "
            "ls -l /etc/modprobe.d /etc/systemd/system /opt 2>&1 | md5sum; pct list; "
            "cat /run/lab-standin/sys/bus/pci/devices/*/driver 2>/dev/null | sort | uniq -c")


@pytest.fixture(scope="module")
def pve92() -> Iterator[LabState]:
    yield from module_lab(CONFIG)


def pve(lab: LabState, command: str) -> str:
    proc = lab.ssh("pve1", command, timeout_s=300)
    return str(proc.stdout)


def toolkit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=1200)
    print(f"toolkit {' '.join(args)}: rc {proc.returncode}, {time.monotonic() - t0:.1f} s")
    return proc


def failures(result: object) -> list[str]:
    return [f"{f.task}: {f.message}" for f in getattr(result, "failures", [])]


def test_pve92_refusals_before_any_change_then_the_plan_driven_reproduce(pve92: LabState) -> None:
    inv = pve92.inventory_path
    assert pve(pve92, "uname -r").strip() == KERNEL and "pve-manager/9.2" in pve(pve92, "pveversion")
    bare = pve(pve92, SNAPSHOT)

    # A driver installed from apt: the host role stops in its preflight, before a container is stopped or anything
    # installed, with both ways out (NVIDIA's installer would abort over the marker after all that).
    pve(pve92, "mkdir -p /usr/lib/nvidia && touch /usr/lib/nvidia/alternate-install-present")
    refused = run_playbook("host", inventory=Path(inv), extravars={"proxmox_gpu_host_driver_version": "580.142"})
    message = " ".join(failures(refused))
    assert refused.rc != 0 and "driver installed from apt" in message and "Nothing was changed" in message, message
    assert "apt purge" in message and "proxmox_gpu_host_driver_install_method: package" in message
    pve(pve92, "rm -r /usr/lib/nvidia")

    # A stopped VM names a GPU the host's driver (nouveau, on a host as installed) holds: refused, bind it to vfio-pci.
    pve(pve92, "mkdir -p /etc/pve/qemu-server && printf 'name: gpu-vm\\nhostpci0: 0000:e1:00.0,pcie=1\\n' "
               "> /etc/pve/qemu-server/200.conf")
    refused = run_playbook("host", inventory=Path(inv), extravars={"proxmox_gpu_host_driver_version": "580.142"})
    message = " ".join(failures(refused))
    assert refused.rc != 0 and "e1:00.0 (VM 200, nouveau)" in message and "bind it to vfio-pci at boot" in message
    pve(pve92, "rm /etc/pve/qemu-server/200.conf")
    assert pve(pve92, SNAPSHOT) == bare

    # The pinned driver does not build on 7.0: the plan says so, names a release that builds, and changes nothing.
    plan = toolkit_cli("host", "plan", "pve1", "--profile", "glm5-tp8", "-i", inv,
                       "-e", "proxmox_gpu_host_driver_version=580.95.05")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert KERNEL in said and "580.95.05" in said and "580.142" in said, said
    assert pve(pve92, SNAPSHOT) == bare

    # Unpinned, the plan picks a release that builds on the running and the next kernels; the roles install it.
    reproduce = toolkit_cli("host", "reproduce", "pve1", "--profile", "glm5-tp8", "-i", inv)
    assert reproduce.returncode == 0, reproduce.stdout[-3000:] + reproduce.stderr[-2000:]
    version = pve(pve92, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0]
    assert version.split(".")[:2] >= ["580", "142"] and "Building kernel modules" not in reproduce.stdout
    for unit in ("nvidia-uvm-nodes", "nvidia-persistenced"):
        assert "pve-ha-lrm.service" in pve(pve92, f"systemctl show -p Before {unit}.service")

    reboot = toolkit_cli("lab", "reboot", "pve1", "--json")
    assert reboot.returncode == 0, reboot.stdout + reboot.stderr
    assert pve(pve92, "uname -r").strip().startswith("7.0.")
    doctor = toolkit_cli("doctor", "pve1", "-i", inv, "--json")
    checks = json.loads(doctor.stdout)["data"]
    assert doctor.returncode == 0, [c for c in checks if c["status"] == "fail"]


def test_a_gpu_unbound_at_run_time_leaves_the_indices_and_the_minors_apart(pve92: LabState) -> None:
    # What qemu-server does to a VM's hostpci GPU when the VM starts (unless vfio-pci took it at boot).
    pve(pve92, "python3 -c 'import sys; sys.path.insert(0, \"/usr/lib/lab-standin\"); import labstandin; "
               "labstandin.unbind_from_nvidia(\"0000:41:00.0\", \"vfio-pci\")'")
    rows = [line.split(", ") for line in
            pve(pve92, "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader").splitlines()]
    assert [r[0] for r in rows] == [str(i) for i in range(7)]  # renumbered 0..6 in bus order
    assert "00000000:41:00.0" not in [r[1] for r in rows]
    minors = pve(pve92, "grep -r '^Device Minor' /run/lab-standin/proc/driver/nvidia/gpus/ | sort")
    assert "0000:61:00.0/information:Device Minor: \t 3" in minors and "41:00.0" not in minors
    assert rows[2][1] == "00000000:61:00.0"  # nvidia-smi -i 2 is the GPU of /dev/nvidia3
