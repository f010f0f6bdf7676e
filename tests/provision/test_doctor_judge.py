"""toolkit.core.doctor: recorded readings in, checks with fixes out."""

from __future__ import annotations

from typing import Any

from toolkit.core.doctor import FAIL, PASS, WARN, judge, judge_kernel_module, topology_links

PROC = "Character devices:\n195 nvidia-frontend\n508 nvidia-uvm\n509 nvidia-caps\n\nBlock devices:\n  7 loop\n"
NODES_OK = {
    "/dev/nvidia0": {"major": 195, "minor": 0, "open": "ENXIO"},
    "/dev/nvidiactl": {"major": 195, "minor": 255, "open": "ENXIO"},
    "/dev/nvidia-uvm": {"major": 508, "minor": 0, "open": "ENXIO"},
}


def host_report(**over: Any) -> dict[str, Any]:
    r = {
        "smi_rc": "0", "smi": "0, 580.95.05, 00000000:01:00.0", "topo_rc": "1", "topo": "",
        "proc_devices": PROC, "hmm": "Y", "modprobe_conf": "options nvidia_uvm uvm_disable_hmm=1\n",
        "modprobe_conf_path": "/etc/modprobe.d/nvidia-uvm.conf", "unit_present": True,
        "nodes": NODES_OK, "containers": {"ct": "dev0: /dev/nvidia0,mode=0666\n"},
    }
    r.update(over)
    return r


def ct_report(**over: Any) -> dict[str, Any]:
    r = {"smi_rc": "0", "smi": "0, 580.95.05", "nodes": NODES_OK, "cuda": {"ok": True, "rc": 0, "device_count": 1}}
    r.update(over)
    return r


def statuses(checks: list[Any]) -> dict[tuple[str, str], str]:
    return {(c.subject, c.name): c.status for c in checks}


def test_healthy_host_and_container_pass() -> None:
    checks = judge("pve1", {"pve1": host_report(), "ct": ct_report()}, {})
    assert set(statuses(checks).values()) <= {PASS, "skip"}


def test_eperm_from_a_stale_major_fails_with_fix() -> None:
    nodes = dict(NODES_OK, **{"/dev/nvidia-uvm": {"major": 508, "minor": 0, "open": "EPERM"}})
    cfg = "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 234:* rwm\n"
    checks = judge("pve1", {"pve1": host_report(containers={"ct": cfg}),
                            "ct": ct_report(nodes=nodes, cuda={"ok": False, "rc": 0})}, {})
    rule = next(c for c in checks if c.name == "cgroup rules")
    assert rule.status == FAIL and "EPERM on /dev/nvidia-uvm" in rule.detail and "234" in rule.detail
    assert "toolkit host provision pve1 --containers" in rule.fix


def test_hmm_symptom_names_the_host_setting() -> None:
    checks = judge("pve1", {"pve1": host_report(hmm="N"), "ct": ct_report(cuda={"ok": False, "rc": 3})}, {})
    s = statuses(checks)
    assert s[("pve1", "HMM disabled")] == FAIL and s[("ct", "CUDA init")] == FAIL
    cuda = next(c for c in checks if c.name == "CUDA init")
    assert "uvm_disable_hmm=N" in cuda.detail and "uvm_disable_hmm=1" in cuda.fix


def test_version_mismatch_and_unpersisted_hmm() -> None:
    checks = judge("pve1", {"pve1": host_report(modprobe_conf=""), "ct": ct_report(smi="0, 570.133.20")}, {})
    s = statuses(checks)
    assert s[("ct", "driver versions")] == FAIL and s[("pve1", "HMM disabled")] == WARN


def test_unreachable_container_and_host() -> None:
    assert statuses(judge("pve1", {"pve1": host_report()}, {"ct": "timed out"}))[("ct", "reachable")] == FAIL
    assert statuses(judge("pve1", {}, {"pve1": "no route"})) == {("pve1", "reachable"): FAIL}


def test_topology_counts_pcie_and_nvlink() -> None:
    topo = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-31\nGPU1\tSYS\t X \t0-31\n"
    assert topology_links(topo) == {"SYS": 2}
    assert topology_links("GPU0 X NV18\nGPU1 NV18 X\n") == {"NVLink": 2}


def test_kernel_update_without_dkms_names_dkms_and_the_kernel() -> None:
    r = host_report(kernel="6.8.12-11-pve", module_kernels=["6.8.12-9-pve"], dkms_rc="127", dkms="")
    checks = {c.name: c for c in judge("pve1", {"pve1": r}, {}) if c.subject == "pve1"}
    module = checks["kernel module"]
    assert module.status == FAIL
    assert "6.8.12-11-pve" in module.detail and "6.8.12-9-pve" in module.detail
    assert "dkms is not installed" in module.detail
    assert "apt install dkms" in module.fix and "proxmox-headers-6.8.12-11-pve" in module.fix


def test_module_present_without_dkms_warns_about_the_next_kernel() -> None:
    r = host_report(kernel="6.8.12-9-pve", module_kernels=["6.8.12-9-pve"], dkms_rc="127", dkms="")
    checks = {c.name: c for c in judge("pve1", {"pve1": r}, {}) if c.subject == "pve1"}
    assert checks["kernel module"].status == PASS
    assert checks["DKMS"].status == WARN and "next kernel update" in checks["DKMS"].detail


def test_dkms_built_for_the_running_kernel_passes_and_nvswitch_without_fabric_manager_fails() -> None:
    dkms = "nvidia/580.95.05, 6.8.12-9-pve, x86_64: installed\nnvidia/580.95.05, 6.8.12-13-pve, x86_64: installed"
    r = host_report(kernel="6.8.12-13-pve", module_kernels=["6.8.12-9-pve", "6.8.12-13-pve"], dkms_rc="0", dkms=dkms,
                    nvswitches="4", fabricmanager="inactive")
    checks = {c.name: c for c in judge("pve1", {"pve1": r}, {}) if c.subject == "pve1"}
    assert checks["kernel module"].status == PASS and "DKMS" in checks["kernel module"].detail
    assert checks["DKMS"].status == PASS
    assert checks["Fabric Manager"].status == FAIL and "802" in checks["Fabric Manager"].detail


def test_the_playbook_reports_every_reading_the_judgement_reads() -> None:
    # The readings above stand for what playbooks/doctor.yml reports; a key the playbook stops sending reads as
    # absent here (a missing /dev/nvidiactl, say), so the two must not drift apart.
    from pathlib import Path

    import yaml

    plays = yaml.safe_load((Path(__file__).parents[2] / "playbooks" / "doctor.yml").read_text())
    sent = {}
    for play in plays:
        for task in play.get("tasks", []):
            if task.get("name") == "Doctor | report":
                report = task["vars"]["doctor"]
                sent[report["role"]] = set(report)
    assert set(host_report()) <= sent["host"], set(host_report()) - sent["host"]
    assert set(ct_report()) <= sent["container"], set(ct_report()) - sent["container"]


def test_the_kernel_booted_next_must_have_the_module_too() -> None:
    """A newer kernel installed (with its headers) after the driver: the running one has the module, the one the
    next reboot boots does not, and the doctor says so before the reboot loses the GPUs."""
    base = {"kernel": "6.8.12-9-pve", "dkms_rc": "0",
            "dkms": "nvidia/580.95.05, 6.8.12-9-pve, x86_64: installed\n"}
    waiting = judge_kernel_module("pve1", host_report(**base, module_kernels=["6.8.12-9-pve"],
                                                      installed_kernels=["6.8.12-11-pve", "6.8.12-9-pve"]))
    nxt = next(c for c in waiting if c.name == "next boot")
    assert nxt.status == FAIL and "6.8.12-11-pve" in nxt.detail and "dkms autoinstall -k 6.8.12-11-pve" in nxt.fix
    ready = judge_kernel_module("pve1", host_report(**base, module_kernels=["6.8.12-9-pve", "6.8.12-11-pve"],
                                                    installed_kernels=["6.8.12-11-pve", "6.8.12-9-pve"]))
    assert next(c for c in ready if c.name == "next boot").status == PASS
    # Running the newest already: nothing to say; an older kernel left installed is not booted by default.
    newest = judge_kernel_module("pve1", host_report(**{**base, "kernel": "6.14.8-2-bpo12-pve"},
                                                     module_kernels=["6.14.8-2-bpo12-pve"],
                                                     installed_kernels=["6.8.12-13-pve", "6.14.8-2-bpo12-pve"]))
    assert [c for c in newest if c.name == "next boot"] == []
