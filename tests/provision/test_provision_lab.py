"""The provision roles for real against the lab: real Ansible over real SSH into pve1 and a real LXC
container (stand-ins only for the driver, the GPUs and pct). Each role runs, then runs again with
changed=0; the effects are read back from the hosts; bad input stops before anything changes.

The tests use their own container (vmid 150, host `ct-prov`) so the lab's `ct` (vmid 100), which
other tests deploy into, is left alone.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.provision.lab_inventory import own_container_inventory
from toolkit.adapters.ansible import PlaybookResult, run_playbook
from toolkit.cli.main import main as toolkit_main

REPO = Path(__file__).resolve().parents[2]
VMID = 150
CT = "ct-prov"
SECRET = "Pr0v-test-root-pw-4b1e"


def _fmt(result: PlaybookResult) -> list[str]:
    return [f"{f.host}: {f.task}: {f.message}" for f in result.failures]


@pytest.fixture(scope="module")
def inv(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's inventory with the test's own container in place of `ct`."""
    return own_container_inventory(lab, tmp_path_factory.mktemp("inv"), VMID, CT,
                                   lxc_gpu_container_model_cache_host_dir="/var/lib/toolkit/model-cache-test")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def pve(lab: Any, command: str) -> str:
    proc = lab.ssh("pve1", command)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return str(proc.stdout)


def run(book: str, inv: Path, runs: Path, **extravars: Any) -> PlaybookResult:
    return run_playbook(book, inventory=inv, extravars=extravars or None, private_data_dir=runs)


def test_host_role_from_scratch_then_no_change(lab: Any, inv: Path, runs: Path) -> None:
    # Back to a bare host as far as the role's effects go: HMM on in modprobe.d and live, no units.
    pve(lab, "rm -f /etc/systemd/system/nvidia-uvm-nodes.service /etc/systemd/system/nvidia-persistenced.service "
             "/etc/systemd/system/multi-user.target.wants/nvidia-*.service /etc/modprobe.d/blacklist-nouveau.conf; "
             "echo 'options nvidia_uvm uvm_disable_hmm=0' > /etc/modprobe.d/nvidia-uvm.conf; "
             "if [ -d /run/lab-standin/sys/module/nvidia ]; then modprobe -r nvidia_uvm; modprobe nvidia_uvm; fi")
    first = run("host", inv, runs)
    assert first.rc == 0, _fmt(first)
    assert first.hosts["pve1"].changed > 0
    second = run("host", inv, runs)
    assert second.rc == 0, _fmt(second)
    assert second.hosts["pve1"].changed == 0, [e.task for e in second.events if e.kind == "changed"]

    assert pve(lab, "cat /etc/modprobe.d/nvidia-uvm.conf").strip().endswith("options nvidia_uvm uvm_disable_hmm=1")
    assert pve(lab, "cat /run/lab-standin/sys/module/nvidia_uvm/parameters/uvm_disable_hmm").strip() == "Y"
    unit = pve(lab, "cat /etc/systemd/system/nvidia-uvm-nodes.service")
    assert "Before=pve-guests.service" in unit and "ExecStart=/usr/bin/nvidia-modprobe -u -c=0" in unit
    assert pve(lab, "readlink /etc/systemd/system/multi-user.target.wants/nvidia-uvm-nodes.service").strip() == (
        "/etc/systemd/system/nvidia-uvm-nodes.service")
    assert "blacklist nouveau" in pve(lab, "cat /etc/modprobe.d/blacklist-nouveau.conf")
    assert "crw" in pve(lab, "ls -l /dev/nvidia-uvm")


def _open_nodes(lab: Any) -> dict[str, Any]:
    script = (REPO / "roles/container_nvidia_userspace/files/open_device_nodes.py").read_text()
    out = pve(lab, f"pct exec {VMID} -- python3 -c {shlex.quote(script)}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_container_roles_then_no_change(lab: Any, inv: Path, runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pve(lab, f"if [ -f /etc/pve/lxc/{VMID}.conf ]; then pct destroy {VMID} --force 1; fi")
    monkeypatch.setenv("TOOLKIT_SECRET_LXC_GPU_CONTAINER_ROOT_PASSWORD", SECRET)
    first = run("container", inv, runs)
    assert first.rc == 0, _fmt(first)
    assert first.hosts[CT].changed > 0
    monkeypatch.delenv("TOOLKIT_SECRET_LXC_GPU_CONTAINER_ROOT_PASSWORD")
    second = run("container", inv, runs)
    assert second.rc == 0, _fmt(second)
    assert second.hosts[CT].changed == 0, [e.task for e in second.events if e.kind == "changed"]

    config = pve(lab, f"pct config {VMID}")
    gpus = sorted(int(n) for n in re.findall(r"^/dev/nvidia(\d+)$", pve(lab, "ls -1 /dev/nvidia*"), re.M))
    for node in [f"/dev/nvidia{i}" for i in gpus] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]:
        assert re.search(rf"^dev\d+: {re.escape(node)},mode=0666$", config, re.M), (node, config)
    assert f"hostname: {CT}" in config
    # Privileged (the default): no nesting, which would mount /proc and /sys read-write (roles review 21)
    assert not re.search(r"^features:.*nesting=1", config, re.M), config
    assert "mp0: /var/lib/toolkit/model-cache-test,mp=/models" in config
    assert "status: running" in pve(lab, f"pct status {VMID}")

    nodes = _open_nodes(lab)
    assert nodes and {n["open"] for n in nodes.values()} == {"ENXIO"}, nodes
    assert {f"/dev/nvidia{i}" for i in gpus} | {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(nodes)

    # The root password was set (a hash, not the template's locked entry) and is nowhere in the run's files.
    shadow = pve(lab, f"pct exec {VMID} -- getent shadow root")
    assert shadow.split(":")[1].startswith("$"), "root password not set"
    leaks = [str(p) for p in runs.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []


def _doctor(inv: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]]]:
    capsys.readouterr()
    code = toolkit_main(["doctor", "pve1", "-i", str(inv), "--json"])
    return code, json.loads(capsys.readouterr().out)["data"]


def test_doctor_catches_a_stale_hard_coded_major(lab: Any, inv: Path, runs: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    raw = run("container", inv, runs, lxc_gpu_container_passthrough="raw")
    assert raw.rc == 0, _fmt(raw)
    conf = pve(lab, f"cat /etc/pve/lxc/{VMID}.conf")
    uvm = re.search(r"^(\d+) nvidia-uvm$", pve(lab, "cat /run/lab-standin/proc-devices"), re.M)
    # One rule per node (roles review 2, finding 13): the uvm pair is minors 0 and 1 of its dynamic major.
    assert uvm and f"lxc.cgroup2.devices.allow: c {uvm.group(1)}:0 rwm" in conf
    assert f"lxc.cgroup2.devices.allow: c {uvm.group(1)}:1 rwm" in conf and f"c {uvm.group(1)}:* rwm" not in conf
    assert not re.search(r"^dev\d+:", conf, re.M)
    assert {n["open"] for n in _open_nodes(lab).values()} == {"ENXIO"}
    code, checks = _doctor(inv, capsys)
    assert code == 0, [c for c in checks if c["status"] != "pass"]

    # A number copied from an old how-to (234, seen in the wild): the uvm nodes are no longer allowed.
    pve(lab, f"sed -i 's/c {uvm.group(1)}:\\([01]\\) rwm/c 234:\\1 rwm/' /etc/pve/lxc/{VMID}.conf && "
             f"pct shutdown {VMID} --timeout 30 --forceStop 1 && pct start {VMID}")
    nodes = _open_nodes(lab)
    assert nodes["/dev/nvidia-uvm"]["open"] == "EPERM" and nodes["/dev/nvidiactl"]["open"] == "ENXIO"
    code, checks = _doctor(inv, capsys)
    assert code == 1
    failed = {(c["subject"], c["name"]): c for c in checks if c["status"] == "fail"}
    rule = failed[(CT, "cgroup rules")]
    assert "EPERM on /dev/nvidia-uvm" in rule["detail"] and "234" in rule["detail"] and rule["fix"]
    # (The lab's libcuda stand-in only stats /dev/nvidia-uvm, so its cuInit still passes here; a real one fails.)

    # The role puts its own line back (the live major). The 234 line is not one it wrote (its record on
    # the host says which are): it is reported and left for the user, never deleted (roles review 16).
    fixed = run("container", inv, runs, lxc_gpu_container_passthrough="raw")
    assert fixed.rc == 0, _fmt(fixed)
    conf = pve(lab, f"cat /etc/pve/lxc/{VMID}.conf")
    assert f"lxc.cgroup2.devices.allow: c {uvm.group(1)}:0 rwm" in conf and "c 234:0 rwm" in conf
    left = [e for e in fixed.events if e.kind == "ok" and e.task.startswith("Configure | say which device rules")]
    assert left and "c 234:0 rwm" in str(left[0].result.get("msg", ""))
    code, checks = _doctor(inv, capsys)
    assert code == 0, [c for c in checks if c["status"] == "fail"]
    pve(lab, f"sed -i '/c 234:[01] rwm/d' /etc/pve/lxc/{VMID}.conf")  # what the message tells the user to do

    back = run("container", inv, runs)  # back to devN entries for the tests after this one
    assert back.rc == 0, _fmt(back)


def _unchanged(lab: Any, result: PlaybookResult, before: str) -> None:
    assert result.rc != 0
    assert all(s.changed == 0 for s in result.hosts.values()), result.hosts
    assert pve(lab, f"pct config {VMID}") == before


def test_bad_input_stops_before_any_change(lab: Any, inv: Path, runs: Path, tmp_path: Path) -> None:
    before = pve(lab, f"pct config {VMID}")

    missing_gpu = run("container", inv, runs, lxc_gpu_container_gpus=[0, 99])
    _unchanged(lab, missing_gpu, before)
    assert "GPU(s) 99" in missing_gpu.failures[0].message and "Fix:" in missing_gpu.failures[0].message

    taken = run("container", inv, runs, lxc_gpu_container_hostname="another-ct")
    _unchanged(lab, taken, before)
    message = taken.failures[0].message
    assert f"vmid {VMID}" in message and f'already the container "{CT}"' in message

    mismatch = run("container", inv, runs, container_nvidia_userspace_driver_version="570.133.20")
    _unchanged(lab, mismatch, before)
    assert "570.133.20" in mismatch.failures[0].message and "Nothing was changed" in mismatch.failures[0].message

    # The apt method in a container with no NVIDIA repository (a fresh CT; roles review 17): cuda-keyring is
    # fetched on the controller first, so a controller that cannot reach it stops before any change.
    dead_url = "http://" + lab.config.subnet.replace(".0/24", ".99") + "/cuda-keyring_1.1-1_all.deb"
    no_repo = run("container", inv, runs, container_nvidia_userspace_cuda_install_method="apt",
                  container_nvidia_userspace_cuda_keyring_url=dead_url)
    _unchanged(lab, no_repo, before)
    message = no_repo.failures[0].message
    assert "cuda-toolkit-12-8 is not offered" in message and dead_url in message and "Nothing was changed" in message
    assert "container_nvidia_userspace_cuda_install_method: none" in message
    assert any(e.task.startswith("Preflight | NVIDIA's repository is to be added") for e in no_repo.events)

    # The lab gives its staged installer's real sha256, and the host role's preflight checks the file against it
    # as on a real host (another version asked, so the driver counts as needed and the check runs).
    pve1 = yaml.safe_load(inv.read_text())["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    installer = pve1["proxmox_gpu_host_driver_installer"]
    given = pve1["toolkit_lab_driver_checksums"][pve1["proxmox_gpu_host_driver_version"]]
    assert given == "sha256:" + pve(lab, f"sha256sum {installer}").split()[0]
    staged = run_playbook("host", inventory=inv, private_data_dir=runs, tags=["proxmox_gpu_host_preflight"],
                          extravars={"proxmox_gpu_host_driver_version": "580.105.08",
                                     "proxmox_gpu_host_driver_checksum": given})
    assert staged.rc == 0, _fmt(staged)
    assert [e.kind for e in staged.events if e.task == "Preflight | assert the installer on the host is the one the "
            "checksum names" and e.kind in ("ok", "skipped")] == ["ok"]

    # Another version asked while the installer on the host is 580.95.05's (the lab's, whose real sha256 the
    # inventory gives for its own version only): the checksum given does not match the file, so nothing is run.
    modules = pve(lab, "cat /proc/modules /run/lab-standin/proc-devices 2>/dev/null; nvidia-smi -L")
    swapped = run("host", inv, runs, proxmox_gpu_host_driver_version="580.105.08",
                  proxmox_gpu_host_driver_checksum="sha256:" + "0" * 64)
    assert swapped.rc != 0 and all(s.changed == 0 for s in swapped.hosts.values()), swapped.hosts
    message = swapped.failures[0].message
    assert "NVIDIA-Linux-x86_64-580.95.05.run" in message and "0" * 64 in message and "Nothing was changed" in message
    assert pve(lab, "cat /proc/modules /run/lab-standin/proc-devices 2>/dev/null; nvidia-smi -L") == modules

    data = yaml.safe_load(inv.read_text())
    data["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]["ansible_host"] = "10.213.0.99"  # inside the lab's net
    dead = tmp_path / "dead.yml"
    dead.write_text(yaml.safe_dump(data))
    gone = run("site", dead, runs)
    _unchanged(lab, gone, before)
    assert gone.failures[0].unreachable and gone.failures[0].host == "pve1"
    assert not [e for e in gone.events if e.kind == "task_start" and e.task.startswith("Create |")]
    assert any("did not answer the preflight" in f.message for f in gone.failures)


def test_an_unknown_host_key_is_refused_with_the_fix_and_the_labs_pinned_key_passes(lab: Any, tmp_path: Path) -> None:
    import subprocess

    book = tmp_path / "ping.yml"
    book.write_text("- hosts: proxmox_hosts\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n")
    data = yaml.safe_load(Path(lab.inventory_path).read_text())
    known = tmp_path / "known_hosts"
    # pve1 as an operator's own inventory names it: no key of the lab's pinned, this test's own (empty) known_hosts.
    # ControlPath=none: no SSH master another run opened (and checked the key for) is reused.
    data["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]["ansible_ssh_common_args"] = (
        f"-o UserKnownHostsFile={known} -o ControlPath=none")
    own = tmp_path / "own.yml"
    own.write_text(yaml.safe_dump(data))

    refused = run_playbook(str(book), inventory=own, private_data_dir=tmp_path / "runs")
    assert refused.rc != 0 and [f.unreachable for f in refused.failures] == [True], _fmt(refused)
    message = refused.failures[0].message
    # ansible-core's SSH says the first, Mitogen's (the toolkit's strategy) the second.
    assert "Host key verification failed" in message or "unrecognized or mismatching host key" in message
    assert f"ssh-keyscan -H {lab.host_address} >> ~/.ssh/known_hosts" in message
    assert "ansible_ssh_common_args: '-o StrictHostKeyChecking=accept-new'" in message
    assert not known.exists()  # nothing was trusted on the way

    # The fix the message names, into this test's file: the key known, the run passes.
    scanned = subprocess.run(["ssh-keyscan", "-H", lab.host_address], capture_output=True, text=True, timeout=30)
    known.write_text(scanned.stdout)
    assert run_playbook(str(book), inventory=own, private_data_dir=tmp_path / "runs").rc == 0

    # The lab's own inventory pins pve1's key (its known_hosts, StrictHostKeyChecking=yes) and keeps passing.
    assert run_playbook(str(book), inventory=Path(lab.inventory_path), private_data_dir=tmp_path / "runs").rc == 0
