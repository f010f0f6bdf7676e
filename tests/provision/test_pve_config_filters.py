"""The lxc_gpu_container role's filters (pure): Proxmox property strings compared by meaning, stale rules found."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pve_config", REPO / "roles/lxc_gpu_container/filter_plugins/pve_config.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pve = _load()

PCT_CONFIG = """\
arch: amd64
cores: 8
dev0: /dev/nvidia0,mode=0666
dev1: /dev/nvidia1,mode=0666
dev5: /dev/ttyUSB0
hostname: ct
net0: name=eth0,bridge=vmbr0,gw=10.213.1.1,hwaddr=BC:24:11:1C:BF:E4,ip=10.213.1.100/24,type=veth
lxc.cgroup2.devices.allow: c 234:* rwm
lxc.cgroup2.devices.allow: c 188:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file

[snap1]
cores: 2
"""

PROC_DEVICES = """\
Character devices:
  1 mem
188 ttyUSB
195 nvidia-frontend
508 nvidia-uvm
509 nvidia-caps

Block devices:
  7 loop
"""


def test_parse_stops_at_snapshots_and_keeps_raw_lines_in_order() -> None:
    parsed = pve.pve_config_parse(PCT_CONFIG)
    assert parsed["options"]["cores"] == "8"
    assert parsed["raw"][0] == ["lxc.cgroup2.devices.allow", "c 234:* rwm"]
    assert len(parsed["raw"]) == 3


def test_net_compared_by_meaning_and_mac_kept() -> None:
    parsed = pve.pve_config_parse(PCT_CONFIG)
    same = {"net0": "name=eth0,bridge=vmbr0,ip=10.213.1.100/24,gw=10.213.1.1,type=veth", "cores": "8"}
    assert pve.pve_config_changes(parsed, same)["set"] == {}
    moved = {"net0": "name=eth0,bridge=vmbr0,ip=10.213.1.101/24,gw=10.213.1.1"}
    change = pve.pve_config_changes(parsed, moved)
    assert change["set"]["net0"].endswith(",hwaddr=BC:24:11:1C:BF:E4")


def test_only_gpu_dev_entries_are_deleted() -> None:
    parsed = pve.pve_config_parse(PCT_CONFIG)
    change = pve.pve_config_changes(parsed, {"dev0": "/dev/nvidia0,mode=0666"})
    assert change["delete"] == ["dev1"]  # dev5 (a serial adapter) is not the role's


def test_majors_and_stale_rules() -> None:
    assert pve.nvidia_majors(PROC_DEVICES) == {"nvidia": 195, "uvm": 508, "caps": 509}
    raw = pve.pve_config_parse(PCT_CONFIG)["raw"]
    desired = [["lxc.cgroup2.devices.allow", "c 508:* rwm"]]
    stale = pve.stale_raw_lines(raw, desired, PROC_DEVICES)
    # 234 is registered by nothing: stale. 188 belongs to ttyUSB: someone else's, kept.
    assert ["lxc.cgroup2.devices.allow", "c 234:* rwm"] in stale
    assert ["lxc.cgroup2.devices.allow", "c 188:* rwm"] not in stale
    assert ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"] in stale
