"""The plan over recorded facts: one test per finding it decides (roles-review-3 1-5, 7-13; round-2 2 and 6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit.adapters.compat_store import read_matrix
from toolkit.core.hostplan.facts import HostFacts
from toolkit.core.hostplan.plan import Plan, ProfileNeeds, make_plan

FactsOf = Callable[..., HostFacts]
MATRIX = read_matrix()

NVIDIA_SMI_2 = ("0, 00000000:01:00.0, 580.142, NVIDIA GeForce RTX 3090\n"
                "1, 00000000:02:00.0, 580.142, NVIDIA GeForce RTX 3090\n")
GB202 = ("0000:01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GB202 [GeForce RTX 5090] [10de:2b85] "
         "(rev a1)\n\tKernel driver in use: nouveau\n"
         "0000:03:00.0 3D controller [0302]: NVIDIA Corporation GP102GL [Tesla P40] [10de:1b38] (rev a1)\n"
         "\tKernel driver in use: vfio-pci\n")


def needs(**kw: Any) -> ProfileNeeds:
    base: dict[str, Any] = {"name": "two-3090", "sglang_version": "0.5.23", "gpu_count": 2, "tp_size": 2,
                            "p2p": False, "nnodes": 1, "model_size_gib": 60.0, "power_limit_w": 300.0}
    return ProfileNeeds(**{**base, **kw})


def plan_of(facts: HostFacts, profile: ProfileNeeds | None = None, /, **variables: Any) -> Plan:
    return make_plan(facts, MATRIX, profile if profile is not None else needs(), variables,
                     {k: "-e" for k in variables})


def ids(plan: Plan) -> list[str]:
    return [r.finding for r in plan.refusals]


NAMED = {"lxc_gpu_container_rootfs_storage": "local-zfs"}  # the homelab's storage on the root's pool, named


def test_unpinned_resolves_a_driver_that_builds_on_every_kernel(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), **NAMED)
    assert plan.resolved, plan.refusals
    driver = plan.choice("driver")
    assert driver is not None and driver.value == "580.159.04" and "6.17, 7.0" in driver.reason
    assert plan.extravars()["proxmox_gpu_host_driver_version"] == "580.159.04"
    assert [c.what for c in plan.changes][:2] == ["install headers for 7.0.14-1-pve",
                                                   "install driver 580.159.04 (open modules) with DKMS for 6.17, 7.0"]


def test_finding_1_pinned_driver_older_than_the_next_boot_kernel(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), proxmox_gpu_host_driver_version="580.95.05", **NAMED)
    assert ids(plan) == ["driver-kernel"]
    r = plan.refusals[0]
    assert "580.95.05 does not build on 7.0.14-1-pve (next boot); 580.142 is the first 580 release" in r.reason
    assert "proxmox-boot-tool kernel pin 6.17.4-2-pve" in r.fix and "raise proxmox_gpu_host_driver_version" in r.fix
    assert "void-packages/issues/60171" in r.source
    assert plan.changes == []


def test_finding_1_pending_series_from_the_default_kernel_meta(facts_of: FactsOf) -> None:
    # PVE 9.1 on 6.17 with nothing newer installed: the next full-upgrade brings 7.0.
    facts = facts_of("pve92-homelab",
                     kernel_packages="proxmox-kernel-6.17.4-2-pve-signed\t6.17.4-2\tii \n"
                                     "proxmox-headers-6.17.4-2-pve\t6.17.4-2\tii \n",
                     boot_kernels="Automatically selected kernels:\n6.17.4-2-pve\n")
    plan = plan_of(facts, proxmox_gpu_host_driver_version="580.126.18", **NAMED)
    assert ids(plan) == ["driver-kernel"]
    assert "pulls in proxmox-kernel-7.0" in plan.refusals[0].reason
    assert "apt-mark hold proxmox-default-kernel" in plan.refusals[0].fix
    assert plan_of(facts, proxmox_gpu_host_driver_version="580.142", **NAMED).resolved


def test_a_templated_pin_is_refused_not_guessed(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), proxmox_gpu_host_driver_version="{{ site_driver }}", **NAMED)
    assert ids(plan) == ["driver-pin"] and "literal release" in plan.refusals[0].fix


def test_finding_1_running_kernel_too_new_and_unknown_series(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab", uname="7.1.2-1-pve\n", kernel_packages="", boot_kernels=None,
                     default_kernel_depends="proxmox-default-kernel\n  Depends: proxmox-kernel-7.1\n")
    plan = plan_of(facts, proxmox_gpu_host_driver_version="580.142", **NAMED)
    assert "(the running kernel itself needs it)" in plan.refusals[0].fix
    assert "580.159.04" in plan.refusals[0].reason
    newer = facts_of("pve92-homelab", uname="7.3.0-1-pve\n", kernel_packages="", boot_kernels=None)
    plan = plan_of(newer, **NAMED)
    assert ids(plan) and all(r.finding == "driver-kernel" for r in plan.refusals)
    assert "no matrix row says" in plan.refusals[0].reason


def test_finding_2_profile_claims_p2p_the_host_lacks(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab", nvidia_smi=NVIDIA_SMI_2,
                     topo_p2p=" \tGPU0\tGPU1\t\n GPU0\tX\tNS\t\n GPU1\tNS\tX\t\n")
    plan = plan_of(facts, needs(p2p=True), **NAMED)
    assert ids(plan) == ["p2p"] and "--disable-custom-all-reduce" in plan.refusals[0].fix
    ok = plan_of(facts, needs(p2p=False), **NAMED)
    assert ok.resolved and ok.choice("p2p") is not None and ok.choice("p2p").value is False  # type: ignore[union-attr]


def test_finding_3_apt_installed_driver_refused_with_two_ways_out(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab", alternate_install=(0, ""),
                     driver_packages="nvidia-driver\t550.163.01-2\tii \nnvidia-kernel-dkms\t550.163.01-2\tii \n")
    plan = plan_of(facts, **NAMED)
    assert ids(plan) == ["apt-driver"]
    fix = plan.refusals[0].fix
    assert "apt purge nvidia-driver nvidia-kernel-dkms" in fix and "install_method: package" in fix
    assert plan.changes == []  # nothing stopped, nothing installed
    assert plan_of(facts, proxmox_gpu_host_driver_install_method="package", **NAMED).resolved
    marker_only = facts_of("pve92-homelab", alternate_install=(0, ""))
    assert ids(plan_of(marker_only, **NAMED)) == ["apt-driver"]


def test_finding_4_container_cuda_follows_the_sglang_release(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab")
    new = plan_of(facts, needs(sglang_version="0.5.23"), **NAMED)
    assert new.extravars()["container_nvidia_userspace_cuda_version"] == "13.0"
    old = plan_of(facts, needs(sglang_version="0.5.9"), **NAMED)
    assert old.extravars()["container_nvidia_userspace_cuda_version"] == "12.8"
    # CUDA 13 needs driver 580.65.06+.
    low = plan_of(facts_of("pve92-homelab", kernel_packages="", boot_kernels=None, default_kernel_depends=None),
                  needs(sglang_version="0.5.23"), proxmox_gpu_host_driver_version="570.195.03", **NAMED)
    assert "driver-cuda" in ids(low)


def test_finding_5_vm_gpu_not_counted_and_bound_to_nvidia_refused(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), **NAMED)
    assert plan.extravars()["proxmox_gpu_host_vm_gpus"] == ["0000:03:00.0"]
    assert plan.choice("gpus").value == ["0000:01:00.0", "0000:02:00.0"]  # type: ignore[union-attr]
    bound = facts_of("pve92-homelab", lspci=(
        "0000:01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA102 [GeForce RTX 3090] [10de:2204]\n"
        "\tKernel driver in use: nvidia\n"
        "0000:02:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA102 [GeForce RTX 3090] [10de:2204]\n"
        "\tKernel driver in use: nvidia\n"
        "0000:03:00.0 3D controller [0302]: NVIDIA Corporation GP102GL [Tesla P40] [10de:1b38]\n"
        "\tKernel driver in use: nvidia\n"))
    plan = plan_of(bound, **NAMED)
    assert ids(plan) == ["vm-gpu-bound"]
    assert "bind it to vfio-pci at boot" in plan.refusals[0].fix and "10de:1b38" in plan.refusals[0].fix


def test_finding_7_identity_is_the_bus_id_and_minors_come_from_proc(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab", nvidia_gpus=(
        "==> /proc/driver/nvidia/gpus/0000:01:00.0/information <==\nDevice Minor: \t 1\n"
        "==> /proc/driver/nvidia/gpus/0000:02:00.0/information <==\nDevice Minor: \t 0\n"))
    plan = plan_of(facts, needs(gpu_count=1), **NAMED)
    gpus = plan.choice("gpus")
    assert gpus is not None and gpus.value == ["0000:01:00.0"] and "device minors {'0000:01:00.0': 1}" in gpus.reason
    named = plan_of(facts, needs(gpu_count=1), lxc_gpu_container_gpus=["02:00.0"], **NAMED)
    assert named.extravars()["proxmox_gpu_host_power_limit_gpus"] == ["0000:02:00.0"]
    wrong = plan_of(facts, needs(gpu_count=1), lxc_gpu_container_gpus=["0000:03:00.0"], **NAMED)
    assert "gpu-identity" in ids(wrong)


def test_finding_8_power_limit_only_on_the_profiles_gpus(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), needs(gpu_count=1), **NAMED)
    assert plan.extravars()["proxmox_gpu_host_power_limit_gpus"] == ["0000:01:00.0"]
    assert any(c.what == "power limit 300 W on ['0000:01:00.0']" for c in plan.changes)


def test_finding_9_network_share_never_by_default_and_old_2_root_pool(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab")
    plan = plan_of(facts)
    assert ids(plan) == ["storage-root-pool"]
    assert "-e lxc_gpu_container_rootfs_storage=local-zfs" in plan.refusals[0].fix
    assert "nas" not in plan.refusals[0].reason
    named = plan_of(facts, **NAMED)
    assert named.resolved and named.choice("rootfs_storage").value == "local-zfs"  # type: ignore[union-attr]
    lvm = facts_of("pve92-homelab", root_mount="/dev/mapper/pve-root ext4 /\n", zfs=(127, ""),
                   storage_cfg="dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl\n\n"
                               "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n\n"
                               "nfs: nas\n\tpath /mnt/pve/nas\n\tcontent rootdir\n",
                   pvesm="Name Type Status Total Used Available %\n"
                         "local dir active 98497780 10000000 88497780 10%\n"
                         "local-lvm lvmthin active 1800000000 100000 1799900000 0%\n"
                         "nas nfs active 15625000000 5000000000 10625000000 32%\n")
    picked = plan_of(lvm)
    assert picked.resolved and picked.choice("rootfs_storage").value == "local-lvm"  # type: ignore[union-attr]
    assert "never by default" in picked.choice("rootfs_storage").reason  # type: ignore[union-attr]
    only_nas = facts_of("pve92-homelab", storage_cfg="nfs: nas\n\tpath /mnt/pve/nas\n\tcontent rootdir\n",
                        pvesm="nas nfs active 15625000000 5000000000 10625000000 32%\n")
    assert ids(plan_of(only_nas)) == ["storage"]
    full = plan_of(lvm, needs(model_size_gib=1650.0))
    assert ids(full) == ["storage-room"]


def test_finding_10_downloads_and_the_proxy_they_use(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), **NAMED)
    downloads = plan.choice("downloads")
    assert downloads is not None and downloads.value[0].endswith("NVIDIA-Linux-x86_64-580.159.04.run")
    assert "none (direct)" in downloads.reason and "apt uses http://apt-cacher.lan:3142" in downloads.reason
    assert [w.finding for w in plan.warnings] == ["proxy"]
    with_env = plan_of(facts_of("pve92-homelab", env_proxy="https_proxy=http://proxy.lan:3128\n"), **NAMED)
    assert "proxy" not in [w.finding for w in with_env.warnings]


def test_finding_11_590_with_pre_turing_host_gpus(facts_of: FactsOf) -> None:
    facts = facts_of("pve92-homelab", kernel_packages="", boot_kernels=None, default_kernel_depends=None,
                     uname="6.8.12-9-pve\n",
                     lspci="0000:03:00.0 3D controller [0302]: NVIDIA Corporation GP102GL [Tesla P40] [10de:1b38]\n"
                           "\tKernel driver in use: nouveau\n",
                     qemu_configs="")
    plan = plan_of(facts, needs(gpu_count=1, sglang_version="0.5.9"), proxmox_gpu_host_driver_version="590.48.01",
                   **NAMED)
    assert "legacy-gpu-branch" in ids(plan)
    assert "580 is their last branch" in next(r.reason for r in plan.refusals if r.finding == "legacy-gpu-branch")
    module = plan_of(facts, needs(gpu_count=1, sglang_version="0.5.9"), **NAMED).choice("module_type")
    assert module is not None and module.value == "proprietary"


def test_finding_12_blackwell_host_gpu_with_a_pre_turing_vm_gpu_gets_open(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab", lspci=GB202), needs(gpu_count=1), **NAMED)
    assert plan.resolved, plan.refusals
    assert plan.extravars()["proxmox_gpu_host_driver_kernel_module_type"] == "open"
    assert "pci_device_scan" in plan.choice("module_type").reason  # type: ignore[union-attr]
    both = GB202.replace("vfio-pci", "nouveau")
    refused = plan_of(facts_of("pve92-homelab", lspci=both, qemu_configs=""), needs(gpu_count=1), **NAMED)
    assert ids(refused)[0] == "module-type"


def test_finding_13_multi_node_warns(facts_of: FactsOf) -> None:
    plan = plan_of(facts_of("pve92-homelab"), needs(nnodes=2), **NAMED)
    assert plan.resolved and "multi-node-tcp" in [w.finding for w in plan.warnings]


def test_old_6_fabricmanager_package_per_branch(facts_of: FactsOf) -> None:
    switch = ("0000:07:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)\n")
    facts = facts_of("pve92-homelab", lspci=(
        "0000:01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]\n" + switch))
    plan = plan_of(facts, needs(gpu_count=1), **NAMED)
    assert plan.extravars()["proxmox_gpu_host_fabricmanager_package"] == "nvidia-fabricmanager"
    fm = plan.choice("fabricmanager")
    assert fm is not None and "nvidia-fabricmanager-580 is only a virtual name" in fm.reason


def test_provision_without_a_profile(facts_of: FactsOf) -> None:
    plan = make_plan(facts_of("pve92-homelab"), MATRIX, None, NAMED, {})
    assert plan.resolved and plan.profile is None
    assert plan.choice("gpus").value == ["0000:01:00.0", "0000:02:00.0"]  # type: ignore[union-attr]
    assert "container_nvidia_userspace_cuda_version" not in plan.extravars()
