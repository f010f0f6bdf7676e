"""The proxmox_gpu_host role's filters and the container role's storage decisions (pure): lspci with drivers,
which module type fits the GPUs, kernels in the bootloader's order, what apt must install, pvesm's table, the
model cache's mount, raw passthrough rules."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


host = _load("gpu_host", "roles/proxmox_gpu_host/filter_plugins/gpu_host.py")
pve = _load("pve_config", "roles/lxc_gpu_container/filter_plugins/pve_config.py")

LSPCI = """\
01:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] [10de:2bb5] (rev a1)
\tSubsystem: NVIDIA Corporation Device [10de:204e]
\tKernel driver in use: nvidia
\tKernel modules: nouveau, nvidia_drm, nvidia
21:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] [10de:2bb5] (rev a1)
\tSubsystem: NVIDIA Corporation Device [10de:204e]
\tKernel driver in use: vfio-pci
\tKernel modules: nouveau, nvidia_drm, nvidia
41:00.0 VGA compatible controller [0300]: NVIDIA Corporation GP102GL [Tesla P40] [10de:1b38] (rev a1)
\tKernel modules: nouveau
c0:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
"""


def test_lspci_with_drivers_keeps_the_gpus_the_host_owns() -> None:
    devices = host.lspci_nvidia(LSPCI)
    assert [(d["slot"], d["driver"], d["gpu"], d["nvswitch"]) for d in devices] == [
        ("01:00.0", "nvidia", True, False), ("21:00.0", "vfio-pci", True, False), ("41:00.0", "", True, False),
        ("c0:00.0", "", False, True)]
    assert [d["slot"] for d in host.host_gpus(devices)] == ["01:00.0", "41:00.0"]  # vfio-pci's is a VM's
    # Plain `lspci -nn` (no drivers) parses too: every GPU counts then.
    plain = "\n".join(line for line in LSPCI.splitlines() if not line.startswith("\t"))
    assert len(host.host_gpus(host.lspci_nvidia(plain))) == 3


def test_open_module_fit_by_device_id() -> None:
    fit = host.open_module_fit(host.lspci_nvidia(LSPCI))
    assert fit == {"pre_turing": ["41:00.0"], "blackwell": ["01:00.0"]}  # the vfio-pci one is not the host's
    hopper = "01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 80GB HBM3] [10de:2330] (rev a1)\n"
    assert host.open_module_fit(host.lspci_nvidia(hopper)) == {"pre_turing": [], "blackwell": []}
    turing = "01:00.0 3D controller [0302]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8] (rev a1)\n"
    volta = "01:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 16GB] [10de:1db1] (rev a1)\n"
    assert host.open_module_fit(host.lspci_nvidia(turing))["pre_turing"] == []
    assert host.open_module_fit(host.lspci_nvidia(volta))["pre_turing"] == ["01:00.0"]


def test_kernels_sort_as_the_bootloader_orders_them() -> None:
    kernels = ["6.8.12-11-pve", "6.14.8-2-bpo12-pve", "6.8.12-9-pve", "6.8.12-13-pve", "6.14.11-1-bpo12-pve"]
    assert host.kernel_sort(kernels) == ["6.8.12-9-pve", "6.8.12-11-pve", "6.8.12-13-pve", "6.14.8-2-bpo12-pve",
                                         "6.14.11-1-bpo12-pve"]
    assert [host.kernel_series(k) for k in ("6.8.12-9-pve", "6.14.8-2-bpo12-pve")] == ["6.8", "6.14"]


def test_apt_missing_reads_dpkg_query_and_versions() -> None:
    # A held package (`hi `) is installed; a removed one with its conffiles (`rc `) is not.
    out = ("build-essential\tii \t12.9\ndkms\trc \t3.0.10-8\nnvidia-fabricmanager-580\thi \t580.95.05-1\n"
           "proxmox-default-headers\tii \t1.1.0\n")
    wanted = ["build-essential", "dkms", "proxmox-default-headers", "proxmox-headers-6.8",
              "nvidia-fabricmanager-580=580.105.08-1", "cuda-keyring"]
    assert host.apt_missing(out, wanted) == ["dkms", "proxmox-headers-6.8", "nvidia-fabricmanager-580=580.105.08-1",
                                             "cuda-keyring"]
    assert host.apt_missing(out, ["build-essential", "nvidia-fabricmanager-580=580.95.05-1"]) == []


PVESM_8 = """\
Name             Type     Status           Total            Used       Available        %
local             dir     active        98497780         3014960        90432420    3.06%
local-lvm     lvmthin     active      1731549184        67108864      1664440320    3.88%
"""
PVESM_9 = """\
Name             Type     Status     Total (KiB)      Used (KiB) Available (KiB)        %
local-zfs     zfspool     active      1797019351       542113792      1254905559   30.17%
nfs-models        nfs   inactive               0               0               0    0.00%
"""


def test_pvesm_status_parses_with_and_without_units_in_the_headings() -> None:
    assert pve.pvesm_status(PVESM_8) == [
        {"name": "local", "type": "dir", "status": "active", "total_gib": 93.9, "used_gib": 2.9, "avail_gib": 86.2},
        {"name": "local-lvm", "type": "lvmthin", "status": "active", "total_gib": 1651.3, "used_gib": 64.0,
         "avail_gib": 1587.3}]
    rows = pve.pvesm_status(PVESM_9)
    assert [(r["name"], r["status"], r["avail_gib"]) for r in rows] == [("local-zfs", "active", 1196.8),
                                                                        ("nfs-models", "inactive", 0.0)]
    # The root filesystem's storage: the one asked, else the active one with the most room.
    assert pve.pve_rootfs_storage(rows, "") == "local-zfs"
    assert pve.pve_rootfs_storage(pve.pvesm_status(PVESM_8)[1:], "") == "local-lvm"
    assert pve.pve_rootfs_storage(rows, "nfs-models") == "nfs-models"
    assert pve.pve_rootfs_storage([], "") == ""


def _conf(text: str) -> dict[str, object]:
    return dict(pve.pve_config_parse(text))


@pytest.mark.parametrize(("config", "args", "want"), [
    # A new container: a volume on the storage asked (the root filesystem's by default), sized for the model.
    ("", ("local-zfs", 453, ""), {"value": "local-zfs:453,mp=/models,backup=0", "new_storage": "local-zfs",
                                  "host_dir": "", "resize_gib": 0}),
    # A volume already there on that storage: kept; grown when smaller than asked, never shrunk.
    ("mp0: local-zfs:subvol-100-disk-1,mp=/models,backup=0,size=128G\n", ("local-zfs", 453, ""),
     {"value": "local-zfs:subvol-100-disk-1,mp=/models,backup=0,size=128G", "new_storage": "", "host_dir": "",
      "resize_gib": 453}),
    ("mp0: local-zfs:subvol-100-disk-1,mp=/models,backup=0,size=500G\n", ("local-zfs", 453, ""),
     {"value": "local-zfs:subvol-100-disk-1,mp=/models,backup=0,size=500G", "new_storage": "", "host_dir": "",
      "resize_gib": 0}),
    # An older cache (a host directory) is kept when nothing else is asked: an upgrade never moves the weights.
    ("mp0: /var/lib/toolkit/model-cache,mp=/models\n", ("", 453, ""),
     {"value": "/var/lib/toolkit/model-cache,mp=/models", "new_storage": "", "host_dir": "", "resize_gib": 0}),
    # ... and moved when another storage is asked.
    ("mp0: /var/lib/toolkit/model-cache,mp=/models\n", ("local-lvm", 453, ""),
     {"value": "local-lvm:453,mp=/models,backup=0", "new_storage": "local-lvm", "host_dir": "", "resize_gib": 0}),
    # A host directory asked: a bind mount, checked as one.
    ("", ("", 453, "/srv/models"), {"value": "/srv/models,mp=/models", "new_storage": "", "host_dir": "/srv/models",
                                     "resize_gib": 0}),
    ("mp0: /srv/models,mp=/models\n", ("local-zfs", 453, "/srv/models"),
     {"value": "/srv/models,mp=/models", "new_storage": "", "host_dir": "", "resize_gib": 0}),
])
def test_the_model_cache_mount(config: str, args: tuple[str, int, str], want: dict[str, object]) -> None:
    storage, size_gib, host_dir = args
    assert pve.pve_model_cache(_conf(config), "mp0", "/models", storage, size_gib, host_dir) == want


def test_raw_rules_are_one_per_node() -> None:
    numbers = ("/dev/nvidia0 c3 0\n/dev/nvidiactl c3 ff\n/dev/nvidia-uvm 1fc 0\n/dev/nvidia-uvm-tools 1fc 1\n"
               "/dev/nvidia-caps/nvidia-cap1 1fd 1\n/dev/nvidia0 c3 0\n")
    assert pve.raw_allow_rules(numbers) == ["c 195:0 rwm", "c 195:255 rwm", "c 508:0 rwm", "c 508:1 rwm",
                                            "c 509:1 rwm"]


def test_a_vms_hostpci_gpus_are_not_the_hosts_and_one_a_host_driver_holds_is_named() -> None:
    grep = ["/etc/pve/qemu-server/200.conf:hostpci0: 0000:01:00.0,pcie=1,x-vga=1",
            "/etc/pve/qemu-server/201.conf:hostpci1: mapping=p40,pcie=1",
            "/etc/pve/qemu-server/202.conf:hostpci0: 21:00;0000:e1:00.0"]
    mapping = "p40\n\tmap id=10de:1b38,node=pve1,path=0000:41:00.0\n\tmap id=10de:1b38,node=pve2,path=0000:81:00.0\n"
    vm = host.vm_hostpci(grep, mapping, "pve1", ["00000000:A1:00.0"])
    assert vm == {"0000:01:00.0": "VM 200", "0000:41:00.0": "VM 201", "0000:21:00": "VM 202",
                  "0000:e1:00.0": "VM 202", "0000:a1:00.0": "a VM (the plan)"}
    devices = host.lspci_nvidia(LSPCI)
    assert host.host_gpus(devices, vm) == []  # 01 and 41 are VMs', 21 is vfio-pci's
    assert host.host_gpus(devices, {}) == host.host_gpus(devices)
    # 01:00.0 is still nvidia's and 41:00.0 nothing's: a VM start would take them; 21:00.0 is on vfio-pci.
    assert host.vm_gpus_not_on_vfio(devices, vm) == ["01:00.0 (VM 200, nvidia)", "41:00.0 (VM 201, no driver)"]
    assert host.open_module_fit(devices, vm) == {"pre_turing": [], "blackwell": []}
    assert [host.bus_id(s) for s in ("81:00.0", "00000000:81:00.0", "0000:81:00.0")] == ["0000:81:00.0"] * 3


MINORS = ["/proc/driver/nvidia/gpus/0000:01:00.0/information:Device Minor: \t 0",
          "/proc/driver/nvidia/gpus/0000:21:00.0/information:Device Minor: \t 1",
          "/proc/driver/nvidia/gpus/0000:61:00.0/information:Device Minor: \t 3"]
# 41:00.0 (minor 2) was unbound at run time: nvidia-smi numbers the rest 0..2 in bus order.
SMI = ["0, 00000000:01:00.0", "1, 00000000:21:00.0", "2, 00000000:61:00.0"]


def test_a_containers_gpus_by_bus_id_or_index_map_to_the_drivers_minors() -> None:
    assert pve.gpu_selection("all", SMI, MINORS)["minors"] == [0, 1, 3]
    by_index = pve.gpu_selection([2], SMI, MINORS)
    assert by_index["minors"] == [3] and by_index["buses"] == ["0000:61:00.0"]  # index 2 is minor 3
    assert pve.gpu_selection(["0000:61:00.0", "21:00.0"], SMI, MINORS)["minors"] == [1, 3]
    gone = pve.gpu_selection(["0000:41:00.0", 3], SMI, MINORS)
    assert gone["missing"] == ["0000:41:00.0", "3"] and gone["minors"] == []
    assert pve.gpu_selection("all", SMI, MINORS)["host"][2] == "2 0000:61:00.0 (/dev/nvidia3)"


def test_the_power_limit_is_for_the_containers_gpus_by_bus_id() -> None:
    conf = ["dev0: /dev/nvidia3,mode=0666", "dev1: /dev/nvidiactl,mode=0666", "lxc.cgroup2.devices.allow: c 195:1 rwm"]
    assert host.container_gpu_buses(conf, MINORS) == ["0000:21:00.0", "0000:61:00.0"]
    assert host.gpu_minors(MINORS) == {0: "0000:01:00.0", 1: "0000:21:00.0", 3: "0000:61:00.0"}
    gpus = [{"bus": "0000:01:00.0", "kept": 450.0, "default": 600.0}, {"bus": "0000:21:00.0", "kept": 600.0,
                                                                         "default": 600.0}]
    assert [g["bus"] for g in host.power_kept(gpus)] == ["0000:01:00.0"]


def test_without_the_drivers_list_the_nodes_stand_for_the_gpus() -> None:
    chosen = pve.gpu_selection("all", [], [], [0, 1, 2])
    assert chosen["minors"] == [0, 1, 2] and chosen["missing"] == []
    assert pve.gpu_selection([1, 5], [], [], [0, 1, 2])["missing"] == ["5"]
