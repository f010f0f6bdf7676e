"""The lab's pure parts: addresses, validation, conflicts, inventory, state file, stand-in logic."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
import yaml

from toolkit.core.errors import ToolkitError
from toolkit.lab import plan
from toolkit.lab.plan import LabConfig, LabState
from toolkit.lab.standins import labstandin

REPO = Path(__file__).resolve().parents[2]


# The default lab's networks, spelled out (a TOOLKIT_LAB_INSTANCE run has other defaults).
BASE = LabConfig(subnet="10.213.0.0/24", ct_subnet="10.213.1.0/24")


# A placeholder for the staged installer's sha256 (`up` hashes the real file), as the committed example shows it.
EXAMPLE_SHA256 = "0" * 64


def default_state() -> LabState:
    return LabState(config=BASE, inventory_path="inventory/lab.yml",
                    ssh_key_path="/var/lib/toolkit-lab/ssh/id_ed25519",
                    known_hosts_path="/var/lib/toolkit-lab/ssh/known_hosts",
                    installer_sha256={plan.DEFAULT_DRIVER_VERSION: EXAMPLE_SHA256})


def role_value(host_vars: dict[str, object], name: str, **extra: object) -> str:
    """A templated inventory value as a role sees it (the inventory's Jinja rendered over its variables)."""
    import jinja2

    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(str(host_vars[name])).render(
        **{**host_vars, **extra})


def test_addresses_follow_the_subnets() -> None:
    c = LabConfig(subnet="10.50.0.0/24", ct_subnet="10.50.7.0/24", ct_vmid=123)
    assert (c.controller_address, c.host_address, c.bridge_address, c.ct_address) == (
        "10.50.0.1", "10.50.0.2", "10.50.7.1", "10.50.7.123")


@pytest.mark.parametrize(("config", "field"), [
    (LabConfig(gpus=0), "--gpus"),
    (LabConfig(gpus=17), "--gpus"),
    (LabConfig(driver_version="latest"), "--driver-version"),
    (LabConfig(subnet="10.213.0.5/24", ct_subnet="10.213.1.0/24"), "--subnet"),
    (LabConfig(subnet="8.8.8.0/24"), "--subnet"),
    (LabConfig(subnet="10.213.0.0/24", ct_subnet="10.213.0.0/24"), "--ct-subnet"),
    (LabConfig(ct_vmid=99), "--ct-vmid"),
    (LabConfig(subnet="10.213.0.0/24", ct_subnet="10.213.1.0/26"), "--ct-subnet"),
])
def test_bad_options_name_the_option_and_a_fix(config: LabConfig, field: str) -> None:
    with pytest.raises(ToolkitError) as err:
        plan.validate(config)
    assert [p.field for p in err.value.problems] == [field]
    assert all(p.fix for p in err.value.problems)


def test_a_taken_network_is_refused_but_not_the_labs_own_veth() -> None:
    routes = [{"dst": "default", "dev": "eth0"}, {"dst": "192.0.2.0/24", "dev": "eth0"},
              {"dst": "10.213.0.0/24", "dev": plan.HOST_VETH}, {"dst": "10.213.1.0/24", "dev": plan.HOST_VETH},
              {"dst": "10.213.1.64/26", "dev": "docker0"}]
    problems = plan.address_conflicts(BASE, routes, our_links={plan.HOST_VETH})
    assert [(p.field, "docker0" in p.message) for p in problems] == [("--ct-subnet", True)]
    assert "--subnet" in (problems[0].fix or "")
    assert plan.address_conflicts(BASE, routes[:3], our_links={plan.HOST_VETH}) == []


def test_instances_default_networks_are_spread_so_names_in_use_do_not_clash() -> None:
    assert plan.instance_subnets("") == ("10.213.0.0/24", "10.213.1.0/24")
    # The sum of the characters put t1 and ci3 (and ci2 with 2ci, ...) on one 10.229; CI's seven instances and
    # the ones engineers name beside them must each get their own pair.
    names = ["", "t1", "ci2", "ci3", "ci4", "ci5", "ci6", "ci7", "2ci", "e1", "x2", "x3", "d1", "c1"]
    nets = [net for name in names for net in plan.instance_subnets(name)]
    assert len(set(nets)) == len(nets)
    for name in names[1:]:
        subnet, ct_subnet = plan.instance_subnets(name)
        plan.validate(LabConfig(subnet=subnet, ct_subnet=ct_subnet))  # private, /24, apart
        assert subnet.startswith("10.") and int(subnet.split(".")[1]) in range(214, 244)
    assert len({plan.pair_subnets(slot) for slot in range(plan.INSTANCE_NET_PAIRS)}) == plan.INSTANCE_NET_PAIRS


def test_another_lab_up_on_the_same_networks_is_named_with_a_free_pair_and_how_to_take_it_down() -> None:
    mine = LabConfig(subnet="10.229.0.0/24", ct_subnet="10.229.1.0/24")
    others = {"t1": LabConfig(subnet="10.229.0.0/24", ct_subnet="10.229.1.0/24"),
              "": BASE, "x9": LabConfig(subnet="10.230.0.0/24", ct_subnet="10.230.1.0/24")}
    routes = [{"dst": "10.229.0.0/24", "dev": "tklabt1"}, {"dst": "10.229.1.0/24", "dev": "tklabt1"}]
    problems = plan.other_lab_conflicts(mine, others, routes)
    assert [p.field for p in problems] == ["--subnet", "--ct-subnet"]
    assert "lab instance t1 (TOOLKIT_LAB_INSTANCE=t1), which is up on this machine" in problems[0].message
    fix = problems[0].fix or ""
    assert "`TOOLKIT_LAB_INSTANCE=t1 toolkit lab down`" in fix
    subnet, ct_subnet = fix.split("--subnet ")[1].split(" --ct-subnet ")[0], fix.split("--ct-subnet ")[1].split("`")[0]
    taken = plan.taken_networks(routes, others)
    free = LabConfig(subnet=subnet, ct_subnet=ct_subnet)
    assert plan.other_lab_conflicts(free, others, routes) == []
    assert not any(ipaddress.IPv4Network(cidr).overlaps(t) for cidr in (subnet, ct_subnet) for t in taken)
    # Several hosts: the second host's container network (the one after --ct-subnet) clashes too, and the pair
    # suggested leaves room for all of them.
    two = LabConfig(subnet="10.231.6.0/24", ct_subnet="10.231.7.0/24", hosts=2)
    beside = {"y7": LabConfig(subnet="10.231.8.0/24", ct_subnet="10.231.9.0/24")}
    clash = plan.other_lab_conflicts(two, beside, [])
    assert [(p.field, p.message.split(" overlaps ")[0]) for p in clash] == [("--ct-subnet", "10.231.8.0/24")]
    fix = clash[0].fix or ""
    suggested = LabConfig(subnet=fix.split("--subnet ")[1].split(" ")[0],
                          ct_subnet=fix.split("--ct-subnet ")[1].split("`")[0], hosts=2)
    assert plan.other_lab_conflicts(suggested, beside, []) == []
    # The default lab is named as such, with its own way down.
    on_default = plan.other_lab_conflicts(BASE, {"": BASE}, [])
    assert "the default lab (TOOLKIT_LAB_INSTANCE unset)" in on_default[0].message
    assert "(`toolkit lab down`)" in (on_default[0].fix or "")


def test_inventory_has_the_contract_groups_and_matches_the_committed_example() -> None:
    text = plan.render_inventory(default_state())
    inv = yaml.safe_load(text)
    children = inv["all"]["children"]
    assert set(children) == {"proxmox_hosts", "gpu_containers"}
    pve1 = children["proxmox_hosts"]["hosts"]["pve1"]
    assert pve1["ansible_host"] == "10.213.0.2"
    assert pve1["proxmox_gpu_host_proc_devices"] == "/run/lab-standin/proc-devices"
    assert pve1["proxmox_gpu_host_sys_module_dir"] == "/run/lab-standin/sys/module"
    assert children["gpu_containers"]["hosts"]["ct"]["ansible_host"] == "10.213.1.100"
    example = yaml.safe_load((REPO / "inventory/lab.example.yml").read_text())
    assert example == inv, "inventory/lab.example.yml no longer shows what `lab up` writes"
    assert plan.render_inventory(default_state()) == text  # deterministic


def test_the_lab_plugs_in_through_role_variables_and_says_so_once() -> None:
    """One answer to "is this the lab?" (toolkit_overlay), one note per substitution, and each difference a
    role variable a real host could set: no bare `lab` and no `lab_*` variable a role could branch on."""
    inv = yaml.safe_load(plan.render_inventory(default_state()))
    names: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            names.extend(str(k) for k in node)
            for v in node.values():
                walk(v)

    walk(inv)
    assert [n for n in names if n == "lab" or n.startswith("lab_")] == []
    assert inv["all"]["vars"]["toolkit_overlay"] == "lab"
    notes = inv["all"]["vars"]["toolkit_notes"]
    pve1 = inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    containers = inv["all"]["children"]["gpu_containers"]["vars"]
    assert pve1["proxmox_gpu_host_kernel_headers_required"] is False
    assert pve1["proxmox_gpu_host_build_packages_install"] is False
    assert containers == {"container_nvidia_userspace_cuda_install_method": "none", "sglang_venv_model_fetch": False,
                          "sglang_service_health_timeout_s": plan.LAB_HEALTH_TIMEOUT_S,
                          "lxc_gpu_container_ssh_timeout_s": plan.LAB_CT_SSH_TIMEOUT_S,
                          "lxc_gpu_container_guest_wait_s": plan.LAB_CT_SSH_TIMEOUT_S,
                          "sglang_venv_pip_compile": False}
    # Every variable the lab sets for the roles is named in a note, so a run never substitutes silently.
    told = " ".join(notes)
    for name in [*containers, "proxmox_gpu_host_kernel_headers_required", "proxmox_gpu_host_build_packages_install",
                 "proxmox_gpu_host_driver_checksum", "proxmox_gpu_host_lspci_command"]:
        assert name in told, name
    # The staged installer is checked against its real sha256, as a real host's is.
    assert role_value(pve1, "proxmox_gpu_host_driver_checksum") == f"sha256:{EXAMPLE_SHA256}"
    stock = plan.inventory_notes(LabConfig(flavour="stock-pve8"))
    assert stock[0].startswith("lab (stock-pve8): the real hosts' package and download servers are the lab's mirror")
    assert len(stock) == len(notes) - 1
    # Without a subscription the inventory lets the role switch the repositories, and says so.
    homelab = plan.inventory_notes(LabConfig(flavour="homelab"))
    assert len(homelab) == len(stock) + 1 and "proxmox_gpu_host_apt_no_subscription=true" in homelab[1]


def test_a_second_instance_gets_its_own_names_and_a_bad_name_is_refused() -> None:
    assert plan.instance_suffix("b") == "b" and plan.instance_suffix("") == ""
    with pytest.raises(ToolkitError) as err:
        plan.instance_suffix("Bad name")
    assert err.value.problems[0].field == "TOOLKIT_LAB_INSTANCE"


def test_a_long_instance_name_is_refused_with_the_limit_and_no_traceback() -> None:
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "toolkit", "lab", "status"], capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_LAB_INSTANCE": "optrip"}, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "TOOLKIT_LAB_INSTANCE='optrip' (6 characters): a lab instance's name is 1-4" in proc.stderr
    assert "fix: use e.g. TOOLKIT_LAB_INSTANCE=optr" in proc.stderr


def test_state_round_trips_and_a_newer_schema_is_refused() -> None:
    state = default_state()
    state.made = ["netns:toolkit-pve1", "link:tklab0"]
    state.holder_pid, state.holder_start_ticks = 123, 456
    back = LabState.from_json(state.to_json(), "state.json")
    assert back == state
    newer = state.to_json().replace('"schema": 1', '"schema": 99')
    with pytest.raises(ToolkitError) as err:
        LabState.from_json(newer, "/var/lib/toolkit-lab/state.json")
    assert err.value.problems[0].file == "/var/lib/toolkit-lab/state.json"
    assert err.value.problems[0].field == "schema"
    with pytest.raises(ToolkitError):
        LabState.from_json("{not json", "state.json")


def test_a_state_with_keys_this_toolkit_lacks_is_refused_as_its_own_and_read_as_anothers() -> None:
    # Another instance brought up by another branch of the toolkit (a key added since) must not stop this one's
    # `lab up` from reading which networks it holds; this lab's own such state is refused with the fix.
    state = default_state()
    data = json.loads(state.to_json())
    data["watchdog_pid"] = [4242, 17]
    data["config"]["gpu_fabric"] = "nvlink"
    text = json.dumps(data)
    with pytest.raises(ToolkitError) as err:
        LabState.from_json(text, "/var/lib/toolkit-lab/state.json")
    assert err.value.problems[0].field == "config.gpu_fabric"
    assert "watchdog_pid" in err.value.problems[0].message
    other = LabState.from_json(text, "/var/lib/toolkit-lab-q3/state.json", tolerant=True)
    assert other == state


def test_ssh_args_pin_pve1s_host_key_and_refuse_unknown_hosts() -> None:
    state = default_state()
    args = state.ssh_args("pve1")
    assert args[-1] == "root@10.213.0.2"
    assert "StrictHostKeyChecking=yes" in args and "BatchMode=yes" in args
    assert state.ssh_args("ct")[-1] == "root@10.213.1.100"
    with pytest.raises(ToolkitError):
        state.ssh_args("pve2")


KERNEL_PROC_DEVICES = """Character devices:
  1 mem
  5 /dev/tty
 10 misc
226 drm
250 ttyDBC
511 rpmb

Block devices:
  7 loop
254 virtblk
"""


def test_proc_devices_lists_nvidia_majors_only_for_loaded_modules_in_major_order() -> None:
    cfg = labstandin.DEFAULT_CONFIG
    assert labstandin.render_proc_devices(KERNEL_PROC_DEVICES, set(), cfg) == KERNEL_PROC_DEVICES
    text = labstandin.render_proc_devices(KERNEL_PROC_DEVICES, {"nvidia", "nvidia_uvm"}, cfg)
    char = text.split("\n\n")[0].splitlines()[1:]
    majors = [int(line.split()[0]) for line in char]
    assert majors == sorted(majors)
    assert "195 nvidia-frontend" in char and "508 nvidia-uvm" in char and "509 nvidia-caps" in char
    assert "Block devices:\n  7 loop\n254 virtblk" in text
    only_nvidia = labstandin.render_proc_devices(KERNEL_PROC_DEVICES, {"nvidia"}, cfg)
    assert "nvidia-uvm" not in only_nvidia


def test_modprobe_options_later_files_win_and_dashes_equal_underscores() -> None:
    texts = ["options nvidia_uvm uvm_disable_hmm=0 other=1\n",
             "# comment\noptions nvidia-uvm uvm_disable_hmm=1  # why\noptions nvidia NVreg_X=2\n"]
    assert labstandin.parse_modprobe_options(texts, "nvidia_uvm") == {"uvm_disable_hmm": "1", "other": "1"}
    assert labstandin.parse_modprobe_options(texts, "nvidia") == {"NVreg_X": "2"}
    assert [labstandin.bool_param(v) for v in ("1", "Y", "on", "0", "N", "")] == ["Y", "Y", "Y", "N", "N", "N"]


@pytest.mark.parametrize(("config", "field"), [
    (LabConfig(flavour="stock-pve7"), "--flavour"),
    (LabConfig(secure_boot=True), "--flavour"),
    (LabConfig(flavour="stock-pve8", nvswitches=9), "--nvswitches"),
    (LabConfig(flavour="homelab", gpu_model="k80"), "--gpu-model"),
    (LabConfig(gpu_model="p40"), "--flavour"),
    (LabConfig(flavour="homelab", vfio_gpus=8), "--vfio-gpus"),
    (LabConfig(flavour="homelab", disk_gib=32), "--disk-gib"),
    (LabConfig(flavour="stock-pve8", kernel_series="7.0"), "--kernel"),
    (LabConfig(flavour="stock-pve9", kernel_series="6.2"), "--kernel"),
    (LabConfig(apt_driver=True), "--flavour"),
    (LabConfig(flavour="stock-pve9", gpus=4, vfio_gpus=2, vm_gpus=2), "--vm-gpus"),
])
def test_bad_flavour_options_name_the_option(config: LabConfig, field: str) -> None:
    with pytest.raises(ToolkitError) as err:
        plan.validate(config)
    assert err.value.problems[0].field == field and err.value.problems[0].fix


def test_stock_inventory_downloads_the_installer_with_its_checksum() -> None:
    config = LabConfig(flavour="stock-pve8", extra_driver_versions=("580.105.08",))
    state = LabState(config=config, inventory_path="/x/lab.yml", ssh_key_path="/k", known_hosts_path="/h",
                     installer_sha256={"580.95.05": "aa", "580.105.08": "bb"})
    inv = yaml.safe_load(plan.render_inventory(state))
    host = inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    assert "proxmox_gpu_host_driver_installer" not in host  # the role's default path: it downloads
    # The role's defaults: headers and the toolchain installed from the mirror, as on a real host.
    assert "proxmox_gpu_host_kernel_headers_required" not in host
    assert "proxmox_gpu_host_build_packages_install" not in host
    assert role_value(host, "proxmox_gpu_host_driver_checksum") == "sha256:aa"
    assert role_value(host, "proxmox_gpu_host_driver_checksum", proxmox_gpu_host_driver_version="580.105.08") == (
        "sha256:bb")
    assert role_value(host, "proxmox_gpu_host_driver_checksum", proxmox_gpu_host_driver_version="1.2.3") == ""
    # The real URLs (the mirror answers them over TLS), so no download URL is the lab's own.
    assert "proxmox_gpu_host_driver_url" not in host and "proxmox_gpu_host_cuda_repo_url" not in host
    assert inv["all"]["vars"]["toolkit_notes"][0].startswith("lab (stock-pve8):")
    assert "proxmox_gpu_host_apt_no_subscription" not in host  # stock-pve8 has a subscription
    assert LabState.from_json(state.to_json(), "x").config == config
    assert json_of(plan.standin_config(config))["nouveau"] is True
    assert json_of(plan.standin_config(LabConfig()))["nouveau"] is False


def json_of(text: str) -> dict[str, object]:
    import json

    return dict(json.loads(text))


def test_kernel_versions_sort_as_debian_does() -> None:
    kernels = ["6.8.12-11-pve", "6.8.12-9-pve", "6.14.8-2-pve", "6.8.12-13-pve"]
    assert max(kernels, key=labstandin.kernel_version_key) == "6.14.8-2-pve"
    assert sorted(kernels[:2] + kernels[3:], key=labstandin.kernel_version_key) == [
        "6.8.12-9-pve", "6.8.12-11-pve", "6.8.12-13-pve"]


def test_homelab_inventory_switches_the_repositories_and_checks_the_fabric_manager_archive() -> None:
    config = LabConfig(flavour="homelab")
    state = LabState(config=config, inventory_path="/x/lab.yml", ssh_key_path="/k", known_hosts_path="/h",
                     installer_sha256={"580.95.05": "aa"}, fm_archive_sha256={"580.95.05": "cc"})
    host = yaml.safe_load(plan.render_inventory(state))["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    assert host["proxmox_gpu_host_apt_no_subscription"] is True
    assert role_value(host, "proxmox_gpu_host_fabricmanager_archive_checksum") == "sha256:cc"
    assert host["proxmox_gpu_host_lspci_command"] == "/usr/local/bin/lspci-lab-standin -nnk -d 10de:"
    assert LabState.from_json(state.to_json(), "x") == state


@pytest.mark.parametrize(("config", "layout"), [
    # A 1.92 TB disk: the installer's 96 GiB root cap, 8 GiB swap, 16 GiB left free, the rest the thin pool.
    (LabConfig(), {"kind": "lvm", "root_gib": 96, "thin_gib": 1651.3}),
    # A 200 GiB disk: a quarter of the rest plus 12 GiB of root.
    (LabConfig(disk_gib=200), {"kind": "lvm", "root_gib": 60.0, "thin_gib": 114.8}),
    (LabConfig(flavour="homelab"), {"kind": "zfs", "pool_gib": 1716.5}),
])
def test_storage_layout_is_the_installers(config: LabConfig, layout: dict[str, object]) -> None:
    got = plan.storage_layout(config)
    assert {k: got[k] for k in layout} == layout


def test_storage_cfg_parses_as_pve_storage_writes_it() -> None:
    zfs = labstandin.parse_storage_cfg(plan.STORAGE_CFG["zfs"])
    assert {k: (v["type"], sorted(v["content"])) for k, v in zfs.items()} == {
        "local": ("dir", ["backup", "import", "iso", "vztmpl"]), "local-zfs": ("zfspool", ["images", "rootdir"])}
    assert zfs["local-zfs"]["pool"] == "rpool/data" and zfs["local-zfs"]["sparse"] is True
    lvm = labstandin.parse_storage_cfg(plan.STORAGE_CFG["lvm"])
    assert lvm["local-lvm"] == {"type": "lvmthin", "content": {"rootdir", "images"}, "thinpool": "data",
                                "vgname": "pve"}


@pytest.mark.parametrize(("arch", "module_type", "refused"), [
    ("pascal", "open", "not supported by open nvidia.ko"),
    ("pascal", "proprietary", ""),
    ("blackwell", "proprietary", "requires use of the NVIDIA open kernel modules"),
    ("blackwell", "open", ""),
    ("hopper", "proprietary", ""),
])
def test_the_module_probe_refuses_a_gpu_its_type_does_not_drive(arch: str, module_type: str, refused: str) -> None:
    why = labstandin.probe_refusal(arch, module_type)
    assert (refused in why) if refused else why == ""


def test_kernel_70_is_a_pve_92_host_whose_mirror_serves_drivers_that_build_there() -> None:
    config = plan.validate(LabConfig(flavour="stock-pve9", kernel_series="7.0"))
    f = config.flavour_spec
    assert f.pve_version.startswith("9.2") and f.kernel.startswith("7.0.") and f.kernel.endswith("-pve")
    assert all(k.startswith("7.0.") for k in (f.next_kernel, f.latest_kernel))
    assert config.mirror_driver_versions == ("580.95.05", "580.142", "580.159.04")
    assert LabConfig(flavour="stock-pve9").flavour_spec.kernel.startswith("6.14")
    state = LabState(config=config, inventory_path="/x/lab.yml", ssh_key_path="/k", known_hosts_path="/h",
                     installer_sha256={"580.95.05": "aa", "580.142": "cc"})
    host = yaml.safe_load(plan.render_inventory(state))["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    # No pin: the role's default (or the plan's choice) is the driver, its checksum known to the inventory.
    assert "proxmox_gpu_host_driver_version" not in host
    assert role_value(host, "proxmox_gpu_host_driver_checksum", proxmox_gpu_host_driver_version="580.142") == (
        "sha256:cc")
    assert LabState.from_json(state.to_json(), "x").config == config


@pytest.mark.parametrize(("driver", "kernel", "builds"), [
    ("580.95.05", "6.14.8-2-pve", True),
    ("580.95.05", "7.0.12-3-pve", False),
    ("580.126.18", "7.0.14-1-pve", False),
    ("580.142", "7.0.12-3-pve", True),
    ("580.142", "7.1.2-1-pve", False),
    ("580.159.04", "7.1.2-1-pve", True),
    ("590.48.01", "7.1.2-1-pve", True),
])
def test_the_standin_module_builds_only_where_the_real_source_does(tmp_path: Path, driver: str, kernel: str,
                                                                    builds: bool) -> None:
    import shutil
    import subprocess

    standins = Path(labstandin.__file__).parent
    shutil.copy(standins / "kernel-Makefile", tmp_path / "Makefile")
    shutil.copy(standins / "kernel-conftest.c", tmp_path / "conftest.c")
    (tmp_path / "dkms.conf").write_text(f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{driver}"\n')
    (tmp_path / "headers").mkdir()
    (tmp_path / "headers/Makefile").write_text("")
    proc = subprocess.run(["make", "-C", str(tmp_path), f"KERNELRELEASE={kernel}",
                           f"KERNEL_SOURCES={tmp_path / 'headers'}"], capture_output=True, text=True)
    assert (proc.returncode == 0) is builds, proc.stdout + proc.stderr
    if builds:
        assert f"version: {driver}\nkernel: {kernel}" in (tmp_path / "nvidia.ko").read_text()
    else:
        assert "error: implicit declaration of function 'del_timer_sync'" in proc.stdout
        assert "make: *** [Makefile:82: modules] Error 2" in proc.stdout


def test_a_vm_names_the_last_kept_gpus_and_the_apt_driver_is_in_dpkgs_status() -> None:
    config = plan.validate(LabConfig(flavour="stock-pve9", gpus=8, vfio_gpus=1, vm_gpus=2, apt_driver=True))
    hostpci = [line for line in plan.vm_config(config).splitlines() if line.startswith("hostpci")]
    assert hostpci == ["hostpci0: 0000:a1:00.0,pcie=1", "hostpci1: 0000:c1:00.0,pcie=1"]
    status = plan.apt_driver_status()
    assert status.count("Status: install ok installed") == len(plan.APT_DRIVER_PACKAGES)
    assert "Package: nvidia-driver\n" in status and f"Version: {plan.APT_DRIVER_VERSION}" in status


def test_lab_up_builds_the_default_template_unless_more_are_named() -> None:
    from toolkit.core.errors import ToolkitError
    from toolkit.lab import template

    assert template.suites_wanted(None) == template.suites_wanted("") == ("bookworm",)
    assert template.suites_wanted("all") == template.suites_wanted("trixie") == ("bookworm", "trixie")
    with pytest.raises(ToolkitError) as err:
        template.suites_wanted("bookworm,sid")
    assert "sid" in str(err.value) and "bookworm, trixie" in str(err.value)


# ---------------------------------------------------------------- several hosts


TWO = LabConfig(subnet="10.213.0.0/24", ct_subnet="10.213.1.0/24", hosts=2, cluster=True,
                clock_skew_ms=(("pve2", 250),))


def test_two_hosts_have_their_own_names_addresses_and_containers_and_pve1_keeps_the_one_host_ones() -> None:
    one, (pve1, pve2) = BASE.lab_hosts[0], TWO.lab_hosts
    assert pve1 == one
    assert (pve1.name, pve1.netns, pve1.address, pve1.ct_name, pve1.ct_vmid, pve1.ct_address) == (
        "pve1", plan.NETNS, BASE.host_address, "ct", 100, BASE.ct_address)
    assert (pve2.name, pve2.address, pve2.ct_subnet, pve2.bridge_address, pve2.ct_name, pve2.ct_vmid,
            pve2.ct_address) == ("pve2", "10.213.0.3", "10.213.2.0/24", "10.213.2.1", "ct2", 101, "10.213.2.101")
    assert pve2.netns != pve1.netns and pve2.cgroup_name != pve1.cgroup_name
    assert (pve1.clock_skew_ms, pve2.clock_skew_ms) == (0, 250)
    assert TWO.lab_host("ct2") == pve2 and TWO.lab_host("pve1") == pve1
    assert plan.clock_skew_files(250)[plan.CLOCK_SKEW_FILE] == "250000000\n"
    assert plan.clock_skew_files(-40)[plan.CLOCK_SKEW_FILE] == "-40000000\n"
    assert plan.clock_skew_files(0) == {}


def test_the_inventory_of_two_hosts_lists_both_hosts_and_both_containers_in_the_playbooks_groups() -> None:
    state = default_state()
    state.config = TWO
    text = plan.render_inventory(state)
    assert "&id" not in text, "each host's variables are written out, not a YAML alias"
    children = yaml.safe_load(text)["all"]["children"]
    hosts, cts = children["proxmox_hosts"]["hosts"], children["gpu_containers"]["hosts"]
    assert list(hosts) == ["pve1", "pve2"] and list(cts) == ["ct", "ct2"]
    assert (hosts["pve1"]["ansible_host"], hosts["pve2"]["ansible_host"]) == ("10.213.0.2", "10.213.0.3")
    assert {k: v for k, v in hosts["pve2"].items() if k != "ansible_host"} == {
        k: v for k, v in hosts["pve1"].items() if k != "ansible_host"}
    assert cts["ct2"]["lxc_gpu_container_proxmox_host"] == "pve2" and cts["ct2"]["lxc_gpu_container_vmid"] == 101
    assert cts["ct2"]["lxc_gpu_container_net0"] == "name=eth0,bridge=vmbr0,ip=10.213.2.101/24,gw=10.213.2.1,type=veth"
    assert state.ssh_args("pve2")[-1] == "root@10.213.0.3" and state.ssh_args("ct2")[-1] == "root@10.213.2.101"
    with pytest.raises(ToolkitError):
        state.ssh_args("pve3")


@pytest.mark.parametrize(("config", "field"), [
    (LabConfig(hosts=0), "--hosts"),
    (LabConfig(hosts=plan.MAX_HOSTS + 1), "--hosts"),
    (LabConfig(hosts=2, ct_vmid=199), "--ct-vmid"),
    (LabConfig(hosts=2, subnet="10.213.1.0/24", ct_subnet="10.213.0.0/24"), "--ct-subnet"),
    (LabConfig(hosts=2, clock_skew_ms=(("pve3", 250),)), "--clock-skew-ms"),
    (LabConfig(hosts=2, clock_skew_ms=(("pve2", 3_600_000),)), "--clock-skew-ms"),
])
def test_bad_host_options_name_the_option_and_a_fix(config: LabConfig, field: str) -> None:
    with pytest.raises(ToolkitError) as err:
        plan.validate(config)
    assert [p.field for p in err.value.problems] == [field]
    assert all(p.fix for p in err.value.problems)


def test_clock_skew_is_parsed_per_host_and_a_bad_one_refused() -> None:
    assert plan.parse_clock_skew(["pve2=250", "pve1=-5"]) == (("pve1", -5), ("pve2", 250))
    with pytest.raises(ToolkitError) as err:
        plan.parse_clock_skew(["pve2:250"])
    assert err.value.problems[0].field == "--clock-skew-ms"


def test_the_second_hosts_container_network_is_checked_against_the_machines_routes() -> None:
    problems = plan.address_conflicts(TWO, [{"dst": "10.213.2.0/24", "dev": "docker0"}], our_links=set())
    assert [p.field for p in problems] == ["--ct-subnet"]


def test_state_of_two_hosts_round_trips() -> None:
    state = default_state()
    state.config = TWO
    state.holders = {"pve2": [321, 654]}
    back = LabState.from_json(state.to_json(), "state.json")
    assert back == state and back.holder("pve2") == (321, 654) and back.holder("pve3") == (0, 0)
