"""A real Proxmox VE host from scratch, in the lab's stock-pve8 flavour: no compiler, make,
libc or kernel headers, no dkms, nouveau bound to the GPUs, no /dev/nvidia* until something makes them,
a stand-in Proxmox kernel with newer ones on the package mirror. The stand-ins are as strict as
nvidia-modprobe, nvidia-installer and the kernel (review findings 1-5, 8, 19, 20).

One stock lab for the whole module (it takes the session's lab down and brings it back after), the
findings checked against it in sequence: each test leaves pve1 as the next one expects it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolkit.lab
from toolkit.adapters.ansible import PlaybookResult, run_playbook
from toolkit.lab import system
from toolkit.lab.plan import LabConfig, LabState

pytestmark = [pytest.mark.lab, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
FLAVOUR = "stock-pve8"
OLD, NEW = "580.95.05", "580.105.08"
VMID = 100
CUINIT = (REPO / "roles/container_nvidia_userspace/files/cuda_init_check.py").read_text()


@pytest.fixture(scope="module")
def stock() -> Iterator[LabState]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    before = toolkit.lab.status()
    was_up = bool(before and before.running)
    if before:
        toolkit.lab.down()
    # 4 NVSwitches (an HGX baseboard's): Fabric Manager is part of the host, or cuInit returns 802.
    state = toolkit.lab.up(config=LabConfig(flavour=FLAVOUR, nvswitches=4, extra_driver_versions=(NEW,)))
    yield state
    toolkit.lab.down()
    if was_up and before:
        toolkit.lab.up(config=before.config)  # the session's lab, bare again, for the tests after this module


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stock-runs")


def pve(lab: LabState, command: str, ok: bool = True) -> str:
    proc = lab.ssh("pve1", command, timeout_s=300)
    if ok:
        assert proc.returncode == 0, f"{command}: {proc.stdout}\n{proc.stderr}"
    return str(proc.stdout) + str(proc.stderr if not ok else "")


def book(lab: LabState, runs: Path, name: str, **extravars: Any) -> PlaybookResult:
    return run_playbook(name, inventory=Path(lab.inventory_path), extravars={"toolkit_hosts": "pve1", **extravars},
                        private_data_dir=runs)


def fails(result: PlaybookResult) -> list[str]:
    return [f"{f.host}: {f.task}: {f.message}" for f in result.failures]


def toolkit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=900, check=False)


def ct_cuinit(lab: LabState) -> dict[str, Any]:
    out = pve(lab, f"pct exec {VMID} -- python3 -c {shlex.quote(CUINIT)}", ok=False)
    return dict(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))


def test_stock_host_is_bare_and_the_installer_refuses_it_as_nvidia_installer_does(stock: LabState) -> None:
    out = pve(stock, "uname -r; pveversion; for t in cc make dkms; do command -v $t || echo no-$t; done; "
                     "test -e /usr/include/stdio.h || echo no-stdio; test -e /lib/modules/$(uname -r)/build || "
                     "echo no-headers; cat /run/lab-standin/sys/bus/pci/devices/*/driver | sort -u; "
                     "ls /dev | grep -c '^nvidia' || true")
    lines = out.splitlines()
    assert lines[0] == "6.8.12-9-pve" and lines[1].startswith("pve-manager/8.4.1/") and "lab stand-in" in lines[1]
    assert lines[2:8] == ["no-cc", "no-make", "no-dkms", "no-stdio", "no-headers", "nouveau"], lines
    assert lines[8] == "0"  # no /dev/nvidia* on a host where nothing made them
    get = f"curl -sf -o /tmp/i.run http://us.download.nvidia.com/XFree86/Linux-x86_64/{OLD}/NVIDIA-Linux-x86_64-{OLD}.run"
    pve(stock, get)
    refused = pve(stock, "sh /tmp/i.run --silent --dkms", ok=False)
    assert "The Nouveau kernel driver is currently in use by your system" in refused
    assert "ERROR: Installation has failed." in refused
    refused = pve(stock, "modprobe -r nouveau && sh /tmp/i.run --silent --dkms", ok=False)
    assert "Unable to find the development tool `cc` in your path; please make sure that you have the package " \
           "'gcc' installed." in refused
    # Back to stock: the installer's disable files go, and a reboot loads nouveau again (from the initramfs).
    pve(stock, "rm -f /tmp/i.run /etc/modprobe.d/nvidia-installer-disable-nouveau.conf "
               "/usr/lib/modprobe.d/nvidia-installer-disable-nouveau.conf")
    _state, _s, failed = system.reboot()
    assert failed == ""
    assert pve(stock, "cat /run/lab-standin/sys/bus/pci/devices/*/driver | sort -u").split() == ["nouveau"]


def test_reproduce_from_stock_then_reboot_with_persistenced_off(stock: LabState, runs: Path) -> None:
    proc = toolkit_cli("host", "reproduce", "pve1", "--profile", "glm5-tp8", "-i", stock.inventory_path, "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    host_run = report["runs"][0]
    assert host_run["playbook"] == "host.yml" and host_run["hosts"]["pve1"]["changed"] > 0
    print(f"reproduce from {FLAVOUR}: {report['duration_s']} s;",
          ", ".join(f"{r.get('playbook', 'apply')} {r['duration_s']} s" for r in report["runs"]))

    # Finding 2: toolchain, headers and dkms came with apt; the module is registered for the running kernel.
    assert "nvidia/580.95.05, 6.8.12-9-pve, x86_64: installed" in pve(stock, "dkms status")
    assert "Kernel module built against kernel 6.8.12-9-pve" in pve(stock, "cat /var/log/nvidia-installer.log")
    # Finding 3: nouveau blacklisted in the initramfs and off the GPUs; finding 5: the installer was downloaded.
    assert "blacklist nouveau" in pve(stock, "cat /boot/initrd.img-6.8.12-9-pve")
    assert pve(stock, "cat /run/lab-standin/sys/bus/pci/devices/*/driver | sort -u").split() == ["nvidia"]
    assert pve(stock, f"test -x /opt/nvidia/NVIDIA-Linux-x86_64-{OLD}.run && echo yes").strip() == "yes"
    # Finding 8: NVSwitches on the bus, so Fabric Manager at exactly the driver's version, running.
    assert pve(stock, "dpkg-query -W -f '${Version}' nvidia-fabricmanager-580").strip() == f"{OLD}-1"
    assert pve(stock, "systemctl is-active nvidia-fabricmanager").strip() == "active"

    # The second run changes nothing (the container roles' second run: tests/provision/test_provision_lab.py).
    again = book(stock, runs, "host")
    assert again.rc == 0 and again.hosts["pve1"].changed == 0, [e.task for e in again.events if e.kind == "changed"]

    # Finding 1: a reboot with persistenced off (disabled, as with proxmox_gpu_host_persistenced: false or a
    # daemon that fails). Nothing but the node unit makes the nodes then.
    pve(stock, "systemctl disable --now nvidia-persistenced")
    _state, _duration_s, failed = system.reboot()
    assert failed == "", failed
    assert pve(stock, "pgrep -x nvidia-persiste || echo none").strip() == "none"
    nodes = pve(stock, "ls /dev/nvidia0 /dev/nvidia7 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools")
    assert len(nodes.split()) == 5
    assert "status: running" in pve(stock, f"pct status {VMID}")  # started by pve-guests.service, onboot
    config = pve(stock, f"pct config {VMID}")
    for node in re.findall(r"^dev\d+: ([^,]+)", config, re.M):
        assert pve(stock, f"test -c {node} && echo ok").strip() == "ok", node
    cuda = ct_cuinit(stock)
    assert cuda["rc"] == 0 and cuda["device_count"] == 8, cuda
    assert pve(stock, f"pct exec {VMID} -- systemctl is-active sglang").strip() == "active"
    health = pve(stock, f"pct exec {VMID} -- python3 -c 'import urllib.request as u; "
                        "print(u.urlopen(\"http://127.0.0.1:8000/health\", timeout=30).status)'")
    assert health.strip() == "200"
    pve(stock, "systemctl enable --now nvidia-persistenced")


def test_strict_nvidia_modprobe_makes_only_what_each_flag_makes(stock: LabState) -> None:
    # As NVIDIA/nvidia-modprobe's main(): with -u the -c minors are the uvm pair's; ctl only from -c=255.
    pve(stock, "rm -f /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools && nvidia-modprobe -u -c=0")
    assert pve(stock, "ls /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools 2>/dev/null", ok=False) \
        .split() == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    pve(stock, "nvidia-modprobe -c=0")
    assert pve(stock, "ls /dev/nvidia0 /dev/nvidiactl 2>/dev/null", ok=False).split() == ["/dev/nvidia0"]
    pve(stock, "nvidia-modprobe -c=255")
    assert pve(stock, "test -c /dev/nvidiactl && echo ok").strip() == "ok"


def test_a_changed_node_unit_is_run_again(stock: LabState, runs: Path) -> None:
    unit = "/etc/systemd/system/nvidia-uvm-nodes.service"
    before = pve(stock, "systemctl show -p InvocationID --value nvidia-uvm-nodes").strip()
    # An older unit (the one that made only the uvm nodes), as a host provisioned by an earlier version has it.
    pve(stock, f"sed -i '/-c=255/d' {unit} && systemctl daemon-reload")
    result = book(stock, runs, "host")
    assert result.rc == 0, fails(result)
    assert "-c=255" in pve(stock, f"cat {unit}")
    after = pve(stock, "systemctl show -p InvocationID --value nvidia-uvm-nodes").strip()
    assert after and after != before  # restarted, not left "active" from the old ExecStart lines


def test_fabric_manager_down_gives_802_and_the_doctor_says_so(stock: LabState) -> None:
    pve(stock, "systemctl stop nvidia-fabricmanager && rm -f /run/lab-standin/sys/module/nvidia/fabric_state")
    assert '"rc": 802' in pve(stock, f"python3 -c {shlex.quote(CUINIT)}", ok=False)
    doctor = toolkit_cli("doctor", "pve1", "-i", stock.inventory_path, "--json")
    checks = {(c["subject"], c["name"]): c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 1 and checks[("pve1", "Fabric Manager")]["status"] == "fail", checks
    pve(stock, "systemctl start nvidia-fabricmanager")
    assert ct_cuinit(stock)["rc"] == 0


def test_driver_upgrade_on_a_host_in_use(stock: LabState, runs: Path) -> None:
    # persistenced on: it holds the module, as on most hosts.
    assert pve(stock, "systemctl is-active nvidia-persistenced").strip() == "active"
    assert "status: running" in pve(stock, f"pct status {VMID}")
    # Finding 4: the installer alone aborts while persistenced and the container hold the module.
    get = f"curl -sf -o /tmp/n.run http://us.download.nvidia.com/XFree86/Linux-x86_64/{NEW}/NVIDIA-Linux-x86_64-{NEW}.run"
    pve(stock, get)
    refused = pve(stock, "sh /tmp/n.run --silent --dkms", ok=False)
    assert "An NVIDIA kernel module 'nvidia' appears to already be loaded in your kernel" in refused
    assert pve(stock, "cat /run/lab-standin/sys/module/nvidia/version").strip() == OLD

    up = book(stock, runs, "host", proxmox_gpu_host_driver_version=NEW)
    assert up.rc == 0, fails(up)
    assert pve(stock, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0] == NEW
    assert pve(stock, "cat /run/lab-standin/sys/module/nvidia/version").strip() == NEW  # loaded, no reboot
    assert f"nvidia/{NEW}, 6.8.12-9-pve, x86_64: installed" in pve(stock, "dkms status")
    assert pve(stock, "dpkg-query -W -f '${Version}' nvidia-fabricmanager-580").strip() == f"{NEW}-1"
    assert "status: running" in pve(stock, f"pct status {VMID}")  # stopped for the change, started again
    # The container's userspace is still the old driver's: "Driver/library version mismatch" there, and
    # cuInit 803, until the container role brings it to the host's version.
    assert "Driver/library version mismatch" in pve(stock, f"pct exec {VMID} -- nvidia-smi -L", ok=False)
    cuda = ct_cuinit(stock)
    assert cuda["rc"] == 803 and cuda["error"] == "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", cuda


def test_kernel_update_rebuilds_with_dkms_and_the_doctor_names_a_missing_dkms(stock: LabState) -> None:
    # Without dkms: a new kernel gets no module, and after the reboot the GPUs are gone.
    pve(stock, "apt-get remove -y dkms && apt-get install -y proxmox-kernel-6.8.12-11-pve-signed")
    _state, _s, _failed = system.reboot()
    assert pve(stock, "uname -r").strip() == "6.8.12-11-pve"
    assert "couldn't communicate with the NVIDIA driver" in pve(stock, "nvidia-smi -L", ok=False)
    doctor = toolkit_cli("doctor", "pve1", "-i", stock.inventory_path, "--json")
    assert doctor.returncode == 1
    checks = {c["name"]: c for c in json.loads(doctor.stdout) if c["subject"] == "pve1"}
    assert checks["kernel module"]["status"] == "fail", checks
    assert "6.8.12-11-pve" in checks["kernel module"]["detail"]
    assert "dkms is not installed" in checks["kernel module"]["detail"]
    assert "apt install dkms" in checks["kernel module"]["fix"]

    # With dkms (as the role installs it): the kernel update's hook rebuilds the module; a reboot brings the GPUs back.
    out = pve(stock, "apt-get install -y dkms && apt-get install -y proxmox-kernel-6.8 2>&1")
    assert "Autoinstall of module nvidia" in out and "6.8.12-13-pve" in out
    _state, _s, failed = system.reboot()
    assert failed == "", failed
    assert pve(stock, "uname -r").strip() == "6.8.12-13-pve"
    assert pve(stock, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0] == NEW
    assert '"rc": 0' in pve(stock, f"python3 -c {shlex.quote(CUINIT)}")
    assert "status: running" in pve(stock, f"pct status {VMID}")  # onboot, its nodes there again


def test_secure_boot_preflight_stops_unsigned_and_a_signed_module_loads(stock: LabState, runs: Path) -> None:
    # Secure Boot turned on in the firmware (the stand-in's setting), then a driver change (back to OLD).
    pve(stock, "sed -i 's/\"secure_boot\": false/\"secure_boot\": true/' /etc/lab-standin/lab.json && "
               "mokutil --sb-state | grep -q 'SecureBoot enabled'")
    before = pve(stock, "cat /run/lab-standin/sys/module/nvidia/version").strip()
    stopped = book(stock, runs, "host", proxmox_gpu_host_driver_version=OLD)
    assert stopped.rc != 0 and stopped.hosts["pve1"].changed == 0, fails(stopped)
    message = stopped.failures[0].message
    assert "Secure Boot is on" in message and "mokutil --import" in message and "Nothing was changed" in message
    assert pve(stock, "cat /run/lab-standin/sys/module/nvidia/version").strip() == before
    # With the enrolled key pair given, the installer signs the module and the kernel takes it.
    pve(stock, "printf 'lab stand-in key\\n' > /root/mok.key && printf 'lab stand-in cert\\n' > /root/mok.der")
    signed = book(stock, runs, "host", proxmox_gpu_host_driver_version=OLD,
                  proxmox_gpu_host_module_signing_key="/root/mok.key",
                  proxmox_gpu_host_module_signing_public_key="/root/mok.der")
    assert signed.rc == 0, fails(signed)
    assert pve(stock, "cat /run/lab-standin/sys/module/nvidia/version").strip() == OLD
    assert "signed: yes" in pve(stock, "cat /lib/modules/$(uname -r)/updates/dkms/nvidia.ko")
