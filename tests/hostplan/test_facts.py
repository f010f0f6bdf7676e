"""The facts parser over recorded raw outputs (the real tools' formats)."""

from __future__ import annotations

from collections.abc import Callable

from toolkit.core.hostplan.facts import HostFacts, kernel_series, normalize_bus_id

FactsOf = Callable[..., HostFacts]


def test_homelab_facts(facts_of: FactsOf) -> None:
    f = facts_of("pve92-homelab")
    assert f.pve_version == "9.2.0"
    assert f.debian_suite == "trixie"
    assert f.kernels.running == "6.17.4-2-pve"
    assert f.kernels.default == "7.0.14-1-pve"
    assert f.kernels.pending_series == "7.0"
    assert [(k.release, k.headers) for k in f.kernels.installed] == [("6.17.4-2-pve", True), ("7.0.14-1-pve", False)]
    assert f.kernels.series_to_build() == ("6.17", "7.0")
    assert f.secure_boot is False
    assert [g.bus_id for g in f.gpus] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    p40 = f.gpu("03:00.0")
    assert p40 is not None and p40.chip == "GP102GL" and p40.vms == (101,) and p40.driver == "vfio-pci"
    assert [g.bus_id for g in f.host_gpus()] == ["0000:01:00.0", "0000:02:00.0"]
    assert f.driver.loaded_version is None and f.driver.apt_installed == ()
    assert f.driver.alternate_install_marker is False
    zfs = {s.name: s for s in f.storages}
    assert zfs["local-zfs"].shares_root is True and zfs["local-zfs"].pool == "rpool/data"
    assert zfs["nas"].shared is True and zfs["nas"].shares_root is False
    assert zfs["local"].shares_root is True  # /var/lib/vz is a directory of rpool/ROOT/pve-1
    assert f.proxies == (("Acquire::http::Proxy", "http://apt-cacher.lan:3142"),)
    assert f.cluster_nodes == ("pve1",)
    assert "nvidia_smi" in f.unknown and "pvesm" not in f.unknown
    assert "nvidia_gpus" not in f.unknown


def test_minors_mapping_and_hostpci_through_a_mapping(facts_of: FactsOf) -> None:
    f = facts_of(
        "pve92-homelab",
        nvidia_gpus=("==> /proc/driver/nvidia/gpus/0000:01:00.0/information <==\n"
                     "Model: \t\t NVIDIA GeForce RTX 3090\nIRQ:   \t\t 180\nDevice Minor: \t 1\n\n"
                     "==> /proc/driver/nvidia/gpus/0000:02:00.0/information <==\n"
                     "Model: \t\t NVIDIA GeForce RTX 3090\nDevice Minor: \t 0\n"),
        qemu_configs="==> /etc/pve/qemu-server/102.conf <==\nhostpci0: mapping=gpu-b,pcie=1\nname: vm\n"
                     "[snap1]\nhostpci1: 0000:01:00.0\n",
        pci_mapping="gpu-b\n\tmap id=10de:2204,iommu-group=14,node=pve1,path=0000:02:00.0\n"
                    "\tmap id=10de:2204,node=pve2,path=0000:01:00.0\n",
    )
    by_bus = {g.bus_id: g for g in f.gpus}
    assert by_bus["0000:01:00.0"].minor == 1 and by_bus["0000:02:00.0"].minor == 0
    assert by_bus["0000:02:00.0"].vms == (102,)
    assert by_bus["0000:01:00.0"].vms == ()  # the snapshot's hostpci and pve2's mapping are not this host's now


def test_absent_commands_are_unknown(facts_of: FactsOf) -> None:
    f = facts_of("pve92-homelab", mokutil=(127, ""), efi_secure_boot=None, pvesm=None, root_mount=(1, ""))
    assert f.secure_boot is None
    assert {"mokutil", "efi_secure_boot", "pvesm", "root_mount"} <= set(f.unknown)
    assert all(s.shares_root is None for s in f.storages if s.type in ("zfspool", "dir"))


def test_apt_driver_and_topology(facts_of: FactsOf) -> None:
    f = facts_of(
        "pve92-homelab",
        driver_packages="nvidia-driver\t550.163.01-2\tii \nlibnvidia-ml1\t550.163.01-2\tii \n"
                        "nvidia-kernel-dkms\t550.163.01-2\tii \n",
        alternate_install=(0, ""),
        nvidia_smi="0, 00000000:01:00.0, 550.163.01, NVIDIA GeForce RTX 3090\n"
                   "1, 00000000:02:00.0, 550.163.01, NVIDIA GeForce RTX 3090\n",
        topo_p2p=" \tGPU0\tGPU1\t\n GPU0\tX\tNS\t\n GPU1\tNS\tX\t\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n",
    )
    assert f.driver.apt_installed == ("nvidia-driver", "nvidia-kernel-dkms")
    assert f.driver.alternate_install_marker is True
    assert f.driver.loaded_version == "550.163.01"
    assert f.p2p == (("0000:01:00.0", "0000:02:00.0", "NS"),)


def test_helpers() -> None:
    assert normalize_bus_id("00000000:0A:00.0") == "0000:0a:00.0"
    assert normalize_bus_id("01:00.0") == "0000:01:00.0"
    assert kernel_series("7.0.14-1-pve") == "7.0"


def test_the_gathering_script_returns_every_raw_output_the_parser_reads() -> None:
    """playbooks/files/host_facts.py run here (read-only; most Proxmox tools are absent on this machine): one entry
    per RAW_SOURCES name, each {rc, stdout}, and the parser takes what it returns."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from toolkit.core.hostplan.facts import RAW_SOURCES, parse_facts, raw_from_json

    script = Path(__file__).resolve().parents[2] / "playbooks" / "files" / "host_facts.py"
    done = subprocess.run([sys.executable, str(script), json.dumps({"apt_packages": ["dpkg"]})],
                          capture_output=True, text=True, timeout=120, check=True)
    raw = json.loads(done.stdout)
    assert set(raw) == set(RAW_SOURCES)
    assert all(set(v) == {"rc", "stdout"} for v in raw.values())
    facts = parse_facts("here", raw_from_json(raw))
    assert facts.kernels.running  # uname -r answers everywhere
    assert "pveversion" in facts.unknown  # no Proxmox here: unknown, not empty
