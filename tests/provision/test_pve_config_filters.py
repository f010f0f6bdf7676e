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
    assert "hwaddr=BC:24:11:1C:BF:E4" in change["set"]["net0"].split(",")


def test_property_strings_are_merged_not_replaced() -> None:
    """`pct set --features nesting=1` alone would drop keyctl=1; `--net0 ...` the user's firewall, tag and mtu."""
    parsed = pve.pve_config_parse(
        "features: keyctl=1,fuse=1\n"
        "net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:00:00:01,ip=10.0.0.5/24,mtu=9000,tag=5,type=veth\n"
        "mp0: /srv/models,mp=/models,backup=0\n")
    change = pve.pve_config_changes(parsed, {
        "features": "nesting=1", "net0": "name=eth0,bridge=vmbr0,ip=10.0.0.6/24,type=veth",
        "mp0": "/srv/models,mp=/models"})["set"]
    assert sorted(change["features"].split(",")) == ["fuse=1", "keyctl=1", "nesting=1"]
    net = pve.pve_props(change["net0"], "name")
    assert net == {"name": "eth0", "bridge": "vmbr0", "ip": "10.0.0.6/24", "type": "veth", "firewall": "1",
                   "hwaddr": "BC:24:11:00:00:01", "mtu": "9000", "tag": "5"}
    assert change["net0"].startswith("name=eth0,")
    assert "mp0" not in change  # same volume and mount point, backup=0 is the user's: no change
    # Another volume at the same key is not merged with the old one's options.
    other = pve.pve_config_changes(parsed, {"mp0": "/var/lib/toolkit/model-cache,mp=/models"})["set"]
    assert other["mp0"] == "/var/lib/toolkit/model-cache,mp=/models"


def test_dev_entries_never_take_a_users_index() -> None:
    parsed = pve.pve_config_parse(
        "dev0: /dev/dri/renderD128,gid=44\ndev1: /dev/nvidia1,mode=0666\ndev3: /dev/ttyUSB0\n")
    nodes = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    got = pve.pve_dev_entries(parsed, nodes, ",mode=0666")
    assert got == {"dev2": "/dev/nvidia0,mode=0666", "dev1": "/dev/nvidia1,mode=0666",
                   "dev4": "/dev/nvidiactl,mode=0666", "dev5": "/dev/nvidia-uvm,mode=0666"}


def test_pending_and_newest_template() -> None:
    pending = pve.pve_pending("cur cores: 8\ncur dev0: /dev/nvidia0,mode=0666\nnew dev0: /dev/nvidia0,mode=0660\n"
                              "del dev3: /dev/nvidia3,mode=0666\n")
    assert pending == {"new": {"dev0": "/dev/nvidia0,mode=0660"}, "delete": ["dev3"]}
    available = ("system          debian-12-standard_12.7-1_amd64.tar.zst\n"
                 "system          debian-12-standard_12.12-1_amd64.tar.zst\n"
                 "system          debian-13-standard_13.1-2_amd64.tar.zst\n")
    pattern = r"^debian-12-standard_[0-9.]+-[0-9]+_amd64\.tar\.zst$"
    assert pve.pve_latest_template(available, pattern) == "debian-12-standard_12.12-1_amd64.tar.zst"
    assert pve.pve_latest_template("", pattern) == ""


def test_only_gpu_dev_entries_are_deleted() -> None:
    parsed = pve.pve_config_parse(PCT_CONFIG)
    change = pve.pve_config_changes(parsed, {"dev0": "/dev/nvidia0,mode=0666"})
    assert change["delete"] == ["dev1"]  # dev5 (a serial adapter) is not the role's


def _raw_helper() -> ModuleType:
    path = REPO / "roles/lxc_gpu_container/files/pve_conf_raw.py"
    spec = importlib.util.spec_from_file_location("pve_conf_raw", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_raw_edit_removes_only_the_toolkits_own_lines() -> None:
    raw = _raw_helper()
    text = ("arch: amd64\ncores: 8\nlxc.cgroup2.devices.allow: c 234:* rwm\nlxc.cgroup2.devices.allow: c 508:* rwm\n"
            "lxc.mount.entry = /dev/ttyUSB0 dev/ttyUSB0 none bind,optional,create=file\n"
            "\n[pve:pending]\nfeatures: nesting=1\n\n[snap1]\ncores: 2\nlxc.cgroup2.devices.allow: c 508:* rwm\n")
    owned = [["lxc.cgroup2.devices.allow", "c 508:* rwm"], ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind"]]
    desired = [["lxc.cgroup2.devices.allow", "c 510:* rwm"], ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind"]]
    new, added, removed = raw.edit(text, owned, desired)
    assert removed == ["lxc.cgroup2.devices.allow: c 508:* rwm"]
    assert added == ["lxc.cgroup2.devices.allow: c 510:* rwm", "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind"]
    # The user's 234 rule (not recorded as the toolkit's) and `=` line stay byte for byte; pending and snapshots too.
    assert new == ("arch: amd64\ncores: 8\nlxc.cgroup2.devices.allow: c 234:* rwm\n"
                   "lxc.mount.entry = /dev/ttyUSB0 dev/ttyUSB0 none bind,optional,create=file\n"
                   "lxc.cgroup2.devices.allow: c 510:* rwm\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind\n"
                   "\n[pve:pending]\nfeatures: nesting=1\n\n[snap1]\ncores: 2\n"
                   "lxc.cgroup2.devices.allow: c 508:* rwm\n")
    assert raw.edit(new, desired, desired) == (new, [], [])


def test_majors() -> None:
    assert pve.nvidia_majors(PROC_DEVICES) == {"nvidia": 195, "uvm": 508, "caps": 509}


# /proc/devices as hosts print it: the driver's own names, dynamic majors, a block device of the same name,
# a name registered twice, the multi-module frontend, nothing loaded, an empty file.
PROC_DEVICES_TEXTS = [
    PROC_DEVICES,
    "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-uvm\n237 nvidia-caps\n\nBlock devices:\n259 blkext\n",
    "Character devices:\n195 nvidia\n511 nvidia-uvm\n\nBlock devices:\n195 nvidia-uvm\n",
    "Character devices:\n506 nvidia-uvm\n507 nvidia-uvm\n195 nvidia-frontend\n195 nvidia\n",
    "Character devices:\n  1 mem\n  4 tty\n\nBlock devices:\n  8 sd\n",
    "",
]


def test_the_roles_majors_parser_and_the_doctors_agree() -> None:
    """The role's filter cannot import the toolkit (a controller may have only Ansible), so it parses
    /proc/devices itself; the doctor judges with its own parser. The same text must give the same majors."""
    from toolkit.core import doctor

    for text in PROC_DEVICES_TEXTS:
        assert pve.proc_devices_majors(text) == doctor.char_majors(text), text
        assert pve.nvidia_majors(text) == doctor.nvidia_majors(text), text
    assert pve.nvidia_majors(PROC_DEVICES_TEXTS[2]) == {"nvidia": 195, "uvm": 511}  # block devices never count
    assert pve.nvidia_majors(PROC_DEVICES_TEXTS[3]) == {"nvidia": 195, "uvm": 506}  # the first of a repeat


def test_the_filter_plugin_runs_without_the_toolkit(tmp_path: Path) -> None:
    """Loaded by a Python that cannot import `toolkit` (the plugin alone on its path, -I), it still works."""
    import subprocess
    import sys

    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('p', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "assert 'toolkit' not in sys.modules; print(sorted(m.FilterModule().filters()))")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code,
                           str(REPO / "roles/lxc_gpu_container/filter_plugins/pve_config.py")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "nvidia_majors" in proc.stdout
