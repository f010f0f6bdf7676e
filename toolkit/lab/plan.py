"""The lab as data: what `lab up` builds, its addresses, the files it writes into pve1, the
inventory it writes for the roles. Pure: no I/O here, so every decision is testable in milliseconds.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import yaml

from toolkit.core.errors import Problem, ToolkitError
from toolkit.lab import template
from toolkit.lab.standins import labstandin

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# Bump when the way the userland is made changes (not only its package list).
ROOTFS_BUILD_REVISION = "4"
# pve1's userland (see rootfs.py; the CT template is built apart, as Proxmox's: template.py).
# pve1 needs lxc, bridge tools, kmod, systemd, dbus, sudo, sshd and python3 (Ansible); python3-venv
# and patch stay for the cached userland's key (changing the list rebuilds it for everyone).
# python3-apt: Ansible's apt module imports it even to check that a package is present.
# zstd: `pct create` unpacks the .tar.zst template. No gcc: the libcuda stand-in is compiled on
# the controller.
ROOTFS_PACKAGES: tuple[str, ...] = (
    "python3",
    "python3-venv",
    "python3-apt",
    "openssh-server",
    "lxc",
    "iproute2",
    "bridge-utils",
    "kmod",
    "procps",
    "systemd",
    "systemd-sysv",
    "dbus",
    "sudo",
    "curl",
    "ca-certificates",
    "patch",
    "zstd",
    "xz-utils",
    "rsync",
    "pciutils",
    "iputils-ping",
    "less",
)
TEMPLATE_DIR = "/var/lib/vz/template/cache"
# The CT template: built like Proxmox's own (toolkit.lab.template), served by the pveam stand-in.
TEMPLATE_NAME = template.APPLIANCES[template.DEFAULT_SUITE].file_name
DEFAULT_DRIVER_VERSION = "580.95.05"
DEFAULT_CT_VMID = 100
# Majors the driver would get from register_chrdev(0, ...): dynamic on a real host (docs/story.md,
# CUDA inside the container lists 234, 506, 508, 509, 511 seen in the wild); fixed here so the lab is repeatable,
# and deliberately not 195 so a role that hard-codes 195 for uvm fails in the lab as on a host.
UVM_MAJOR = 508
CAPS_MAJOR = 509
NVIDIA_MAJOR = 195
MAX_GPUS = 16
STATE_SCHEMA = 1
# Seconds the deploy waits for the stand-in server's /health (it answers in about one; a real model load
# takes minutes, the role's default).
LAB_HEALTH_TIMEOUT_S = 20
# Seconds the container role waits for a new container's sshd (the role's default is 120).
LAB_CT_SSH_TIMEOUT_S = 300

def instance_suffix(value: str) -> str:
    """A second lab on the same machine (developing the lab while tests use the first) is named by
    $TOOLKIT_LAB_INSTANCE: 1-4 lower-case letters or digits; '' is the default lab."""
    if value and not re.fullmatch(r"[a-z0-9]{1,4}", value):
        fits = re.sub(r"[^a-z0-9]", "", value.lower())[:4] or "b"
        raise ToolkitError.of(f"TOOLKIT_LAB_INSTANCE={value!r} ({len(value)} characters): a lab instance's name is "
                              "1-4 lower-case letters or digits", field="TOOLKIT_LAB_INSTANCE",
                              fix=f"use e.g. TOOLKIT_LAB_INSTANCE={fits}, or unset it for the default lab")
    return value


INSTANCE = instance_suffix(os.environ.get("TOOLKIT_LAB_INSTANCE", ""))
_SUFFIX = f"-{INSTANCE}" if INSTANCE else ""
NETNS = "toolkit-pve1" + _SUFFIX
HOST_VETH = f"tklab{INSTANCE or '0'}"  # controller side; the pve1 side is renamed eth0 in the namespace
PEER_VETH = HOST_VETH + "p"
BRIDGE = "vmbr0"
CGROUP_NAME = "toolkit-lab" + _SUFFIX
STATE_DIR_NAME = "toolkit-lab" + _SUFFIX
HOSTNAME = "pve1"
# `lab up --hosts N`: pve1..pveN on one LAN, each its own network namespace; the LAN is a bridge in a
# namespace of its own (a switch), so no bridge or forwarding is set up in the controller's namespace.
MAX_HOSTS = 4
LAN_NETNS = "toolkit-lan" + _SUFFIX
LAN_BRIDGE = "lan0"
# How far a host's clock may be set apart (`--clock-skew-ms`): far beyond any NTP-kept host, within what a
# probe's offset measurement must still handle.
MAX_CLOCK_SKEW_MS = 60_000
# A skewed host's clock shim (standins/clockskew.c), preloaded into every process there, and the offset it reads.
CLOCK_SKEW_LIBRARY = "/usr/lib/lab-standin/libclockskew.so"
CLOCK_SKEW_FILE = "/etc/lab-standin/clock-skew-ns"
# Where the instances' default networks go: pairs of /24s (pve1's, then its containers') in 10.214.0.0 to
# 10.243.255.0, 30 x 128 = 3840 pairs; the default lab keeps 10.213.0.0/24 and 10.213.1.0/24.
INSTANCE_NET_FIRST_OCTET = 214
INSTANCE_NET_OCTETS = 30
INSTANCE_NET_PAIRS = INSTANCE_NET_OCTETS * 128


def instance_subnets(instance: str) -> tuple[str, str]:
    """An instance's default (subnet, ct_subnet): a pair picked by the sha256 of its name. The sum of the name's
    characters picked among 30 and put t1 and ci3 on the same 10.229; a hash over 3840 pairs makes a clash of two
    names rare, and `up` refuses one naming the other lab (other_lab_conflicts)."""
    if not instance:
        return "10.213.0.0/24", "10.213.1.0/24"
    slot = int.from_bytes(hashlib.sha256(instance.encode()).digest()[:8], "big") % INSTANCE_NET_PAIRS
    return pair_subnets(slot)


def pair_subnets(slot: int) -> tuple[str, str]:
    """The pair of /24s numbered `slot` (0 to INSTANCE_NET_PAIRS - 1)."""
    second = INSTANCE_NET_FIRST_OCTET + slot % INSTANCE_NET_OCTETS
    third = 2 * (slot // INSTANCE_NET_OCTETS)
    return f"10.{second}.{third}.0/24", f"10.{second}.{third + 1}.0/24"


# A second instance gets its own default networks, so both can run at once.
DEFAULT_SUBNET, DEFAULT_CT_SUBNET = instance_subnets(INSTANCE)


# ---------------------------------------------------------------- flavours


@dataclass(frozen=True)
class Flavour:
    """What pve1 looks like before anything is installed. `lab`: the lab as it always was (GPU
    nodes made at boot, the installer staged, no nouveau, the controller's kernel). The stock
    flavours are a Proxmox VE host as its ISO installs it: no compiler, make, libc headers, kernel
    headers or dkms; nouveau bound to the GPUs; no /dev/nvidia* until something makes them; a
    stand-in Proxmox kernel (uname -r says it; pve1 still runs on the controller's kernel) with
    newer ones on the package mirror; apt sources as on a real host, served by the lab's mirror.
    `homelab` is the Proxmox VE host most people run: no subscription (the enterprise repositories
    the installer enables answer 401), a ZFS root, and a newer kernel installed but not booted."""

    name: str
    pve_version: str = ""
    debian_suite: str = DEBIAN_SUITE
    kernel: str = ""
    # Newer stand-in kernels on the mirror: `next_kernel` by its own package name, `latest_kernel` through
    # the series' meta packages (proxmox-kernel-6.8, proxmox-headers-6.8), as `apt dist-upgrade` brings it.
    next_kernel: str = ""
    latest_kernel: str = ""
    cuda_repo: str = "debian12"
    # The installer's disk layout (pve-installer Proxmox/Install/StorageConfig.pm): lvm (ext4 root of at most
    # 96 GiB, `local` on it, the rest a thin pool `local-lvm`) or zfs (one pool: `local` and `local-zfs`).
    storage: str = "lvm"
    # With a subscription the enterprise repositories answer (the key in /etc/apt/auth.conf.d/pve.conf);
    # without one they answer 401, as enterprise.proxmox.com does.
    subscription: bool = True
    # Installed (image and headers) but not booted: the next reboot boots it (the bootloader's newest).
    pending_kernel: str = ""
    # An opt-in kernel series on the mirror (PVE 8: 6.14, PVE 9: 6.17): its older and newest kernel.
    opt_in_kernels: tuple[str, ...] = ()
    ceph_release: str = "quincy"
    # Driver versions the mirror serves beyond the one asked (a newer kernel series needs a newer release).
    mirror_driver_versions: tuple[str, ...] = ()

    @property
    def stock(self) -> bool:
        return self.name != "lab"

    @property
    def pve_major(self) -> int:
        return int((self.pve_version or "8").split(".")[0])


FLAVOURS = {
    "lab": Flavour("lab"),
    "stock-pve8": Flavour("stock-pve8", pve_version="8.4.1", kernel="6.8.12-9-pve", next_kernel="6.8.12-11-pve",
                          latest_kernel="6.8.12-13-pve", opt_in_kernels=("6.14.8-2-bpo12-pve", "6.14.11-1-bpo12-pve")),
    # PVE 9 is trixie; the lab's userland stays Debian 12 (one cached userland): pveversion, the
    # deb822 sources' names and the 6.14 kernels are PVE 9's, the packages served are bookworm's.
    "stock-pve9": Flavour("stock-pve9", pve_version="9.0.10", debian_suite="trixie", kernel="6.14.8-2-pve",
                          next_kernel="6.14.11-1-pve", latest_kernel="6.14.11-4-pve", cuda_repo="debian13",
                          opt_in_kernels=("6.17.2-1-pve", "6.17.4-2-pve"), ceph_release="squid"),
    "homelab": Flavour("homelab", pve_version="8.4.1", kernel="6.8.12-9-pve", next_kernel="6.8.12-11-pve",
                       latest_kernel="6.8.12-13-pve", opt_in_kernels=("6.14.8-2-bpo12-pve", "6.14.11-1-bpo12-pve"),
                       storage="zfs", subscription=False, pending_kernel="6.8.12-11-pve"),
}
# `--kernel SERIES`: the flavour as the Proxmox VE release whose default kernel is of that series. PVE 9.2
# (pve-manager 9.2.0) moved to Linux 7.0 (pve-kernel master, proxmox-kernel-7.0 7.0.14-14), with 7.1 the next
# opt-in series. Its mirror also serves the 580 releases whose modules build there: 580.142 is the first that
# builds on 7.0 (void-linux/void-packages#60171), 580.159.04 the first on 7.1 (void-linux/void-packages#61087).
# The stand-in module's own build (standins/kernel-Makefile) refuses older ones; nothing here tells it.
KERNEL_SERIES: dict[str, dict[str, dict[str, Any]]] = {
    "stock-pve9": {
        "7.0": {"pve_version": "9.2.0", "kernel": "7.0.12-3-pve", "next_kernel": "7.0.14-1-pve",
                "latest_kernel": "7.0.14-14-pve", "opt_in_kernels": ("7.1.2-1-pve",),
                "mirror_driver_versions": ("580.142", "580.159.04")},
    },
}


def with_kernel(flavour: Flavour, series: str) -> Flavour:
    """The flavour booting a default kernel of `series` ('' keeps its own)."""
    if not series:
        return flavour
    return replace(flavour, **KERNEL_SERIES[flavour.name][series])


# The names the stock flavour's mirror answers for on pve1 (its /etc/hosts points them at it), over http and
# https (a certificate for all of them from the lab's own CA, which pve1 trusts).
MIRROR_ADDRESS = "127.0.0.2"
MIRROR_HOSTS = ("deb.debian.org", "security.debian.org", "download.proxmox.com", "enterprise.proxmox.com",
                "us.download.nvidia.com", "developer.download.nvidia.com")
# The subscription key a stock (subscribed) flavour's pve1 has in /etc/apt/auth.conf.d/pve.conf, as
# `pvesubscription set` writes it; the mirror's enterprise.proxmox.com answers 401 to anything else.
SUBSCRIPTION_SERVER_ID = "4C4B5354414E44494E5F4C4142000000"
SUBSCRIPTION_KEY = "pve4s-labstandin0"

# The stand-in GPUs, by model (lspci's ids, nvidia-smi's figures): toolkit/lab/standins/labstandin.py.
GPU_MODELS = labstandin.GPU_MODELS
DEFAULT_GPU_MODEL = "rtx-pro-6000"
# A 1.92 TB NVMe, the disk the stand-in storages are carved from (the installer's rules below).
DEFAULT_DISK_GIB = 1788


@dataclass(frozen=True)
class LabConfig:
    """What the user asked for (the spec)."""

    gpus: int = 8
    driver_version: str = DEFAULT_DRIVER_VERSION
    subnet: str = DEFAULT_SUBNET
    ct_subnet: str = DEFAULT_CT_SUBNET
    ct_vmid: int = DEFAULT_CT_VMID
    flavour: str = "lab"
    secure_boot: bool = False
    nvswitches: int = 0
    # More driver versions the mirror serves (an upgrade to test); the stock flavours only.
    extra_driver_versions: tuple[str, ...] = ()
    # The hardware (tests may change it later in pve1's /etc/lab-standin/lab.json and reboot, as one swaps a
    # card): the GPUs' model, how many of them (the last ones) are bound to vfio-pci for VMs, the disk size.
    gpu_model: str = DEFAULT_GPU_MODEL
    vfio_gpus: int = 0
    disk_gib: int = DEFAULT_DISK_GIB
    # The default kernel's series ('' the flavour's own): `--kernel 7.0` makes stock-pve9 a PVE 9.2 host.
    kernel_series: str = ""
    # A driver already installed from Debian's packages (dpkg lists them, their alternate-install marker is
    # there), as many Proxmox GPU guides leave a host.
    apt_driver: bool = False
    # How many GPUs (the last ones the host keeps) a stopped VM names in its hostpci lines while nvidia still
    # binds them: qemu-server takes them from the driver only when the VM starts.
    vm_gpus: int = 0
    # Several hosts (pve1..pveN) on one LAN; `cluster`: one Proxmox cluster (/etc/pve/nodes shared, vmids
    # unique across it); `clock_skew_ms`: (host, ms) pairs, that host's clock set ahead (or behind) on purpose.
    hosts: int = 1
    cluster: bool = False
    clock_skew_ms: tuple[tuple[str, int], ...] = ()

    @property
    def lab_hosts(self) -> list[LabHost]:
        """pve1..pveN with their names, addresses and containers (pve1's are the one-host lab's)."""
        skew = dict(self.clock_skew_ms)
        ct = _net(self.ct_subnet)
        out = []
        for index in range(1, self.hosts + 1):
            name = f"pve{index}"
            # Each host's container bridge is the next network of the --ct-subnet's size.
            ct_net = ipaddress.IPv4Network((int(ct.network_address) + (index - 1) * ct.num_addresses, ct.prefixlen))
            vmid = self.ct_vmid + index - 1
            out.append(LabHost(
                index=index, name=name, netns=NETNS if index == 1 else f"toolkit-{name}{_SUFFIX}",
                address=str(_net(self.subnet)[1 + index]), ct_subnet=str(ct_net), bridge_address=str(ct_net[1]),
                ct_name="ct" if index == 1 else f"ct{index}", ct_vmid=vmid,
                ct_address=str(ct_net[vmid]) if vmid < ct_net.num_addresses else "",
                ct_prefixlen=ct_net.prefixlen, cgroup_name=CGROUP_NAME if index == 1 else f"{CGROUP_NAME}-{name}",
                clock_skew_ms=skew.get(name, 0)))
        return out

    def lab_host(self, name: str) -> LabHost:
        """The host (pveN) or the host of the container (ct, ctN) called `name`."""
        for host in self.lab_hosts:
            if name in (host.name, host.ct_name):
                return host
        known = [n for h in self.lab_hosts for n in (h.name, h.ct_name)]
        raise ToolkitError.of(f"unknown lab host {name!r}", field="host", fix=f"use one of {', '.join(known)}")

    @property
    def flavour_spec(self) -> Flavour:
        return with_kernel(FLAVOURS[self.flavour], self.kernel_series)

    @property
    def mirror_driver_versions(self) -> tuple[str, ...]:
        """Every driver version the lab builds an installer for: the asked one first, no repeats."""
        asked = (self.driver_version, *self.extra_driver_versions, *self.flavour_spec.mirror_driver_versions)
        return tuple(dict.fromkeys(asked))

    @property
    def controller_address(self) -> str:
        return str(_net(self.subnet)[1])

    @property
    def host_address(self) -> str:
        return str(_net(self.subnet)[2])

    @property
    def bridge_address(self) -> str:
        return str(_net(self.ct_subnet)[1])

    @property
    def ct_address(self) -> str:
        return str(_net(self.ct_subnet)[self.ct_vmid])

    @property
    def prefixlen(self) -> int:
        return _net(self.subnet).prefixlen

    @property
    def ct_prefixlen(self) -> int:
        return _net(self.ct_subnet).prefixlen


def _net(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr, strict=True)


@dataclass(frozen=True)
class LabHost:
    """One Proxmox stand-in of the lab and its container: the names and addresses `up` gives them."""

    index: int
    name: str  # pve1, pve2, ...
    netns: str
    address: str  # on the LAN (the controller is .1)
    ct_subnet: str  # its vmbr0's network, routed through it
    bridge_address: str
    ct_name: str  # the container's inventory name: ct (pve1's), ct2, ...
    ct_vmid: int
    ct_address: str
    ct_prefixlen: int
    cgroup_name: str
    clock_skew_ms: int = 0

    @property
    def dir_name(self) -> str:
        return self.name


def host_names(config: LabConfig) -> list[str]:
    return [h.name for h in config.lab_hosts]


def clock_skew_files(skew_ms: int) -> dict[str, str]:
    """The files that set a host's wall clock `skew_ms` apart (none when 0): the offset the shim reads, and
    /etc/ld.so.preload naming the shim, so every process of the host (not its containers) reads it."""
    if not skew_ms:
        return {}
    return {CLOCK_SKEW_FILE: f"{skew_ms * 1_000_000}\n", "/etc/ld.so.preload": CLOCK_SKEW_LIBRARY + "\n"}


def parse_clock_skew(values: list[str]) -> tuple[tuple[str, int], ...]:
    """`--clock-skew-ms HOST=MS` (repeatable) as (host, ms) pairs, sorted by host."""
    out: dict[str, int] = {}
    for value in values:
        name, sep, ms = value.partition("=")
        if not sep or not re.fullmatch(r"[+-]?\d+", ms.strip()):
            raise ToolkitError.of(f"--clock-skew-ms {value!r} is not HOST=MS", field="--clock-skew-ms",
                                  fix="pass e.g. --clock-skew-ms pve2=250 (pve2's clock 250 ms ahead)")
        out[name.strip()] = int(ms)
    return tuple(sorted(out.items()))


def validate(config: LabConfig) -> LabConfig:
    problems: list[Problem] = []
    if not 1 <= config.gpus <= MAX_GPUS:
        problems.append(Problem(f"{config.gpus} GPUs asked; the lab makes 1 to {MAX_GPUS}", field="--gpus",
                                fix="pass --gpus between 1 and 16 (the story's host has 8)"))
    parts = config.driver_version.split(".")
    if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
        problems.append(Problem(f"driver version {config.driver_version!r} is not like 580.95.05",
                                field="--driver-version", fix="pass a version such as 580.95.05"))
    nets: list[ipaddress.IPv4Network] = []
    for name, cidr in (("--subnet", config.subnet), ("--ct-subnet", config.ct_subnet)):
        try:
            net = _net(cidr)
        except ValueError as err:
            problems.append(Problem(f"{cidr!r} is not an IPv4 network: {err}", field=name,
                                    fix="pass a network such as 10.213.0.0/24"))
            continue
        if net.num_addresses < 8 or not net.is_private:
            problems.append(Problem(f"{cidr} must be a private network of at least 8 addresses", field=name,
                                    fix="pick a /24 inside 10.0.0.0/8 that nothing here uses"))
        nets.append(net)
    if len(nets) == 2 and nets[0].overlaps(nets[1]):
        problems.append(Problem(f"{config.subnet} and {config.ct_subnet} overlap", field="--ct-subnet",
                                fix="give the container bridge its own network"))
    if not 100 <= config.ct_vmid <= 199:
        problems.append(Problem(f"vmid {config.ct_vmid} is outside 100-199, the lab's container range",
                                field="--ct-vmid", fix="pass a vmid between 100 and 199"))
    elif len(nets) == 2 and nets[1].num_addresses < 256:
        # The container's address is the ct subnet's host number `vmid` (10.213.1.100 for 100).
        problems.append(Problem(f"{config.ct_subnet} is smaller than a /24: no room for address .{config.ct_vmid}",
                                field="--ct-subnet", fix="give the container bridge a /24"))
    problems += _flavour_problems(config)
    if not problems:
        problems += _hosts_problems(config)
    if problems:
        raise ToolkitError(problems)
    return config


def _hosts_problems(config: LabConfig) -> list[Problem]:
    if not 1 <= config.hosts <= MAX_HOSTS:
        return [Problem(f"{config.hosts} hosts asked; the lab makes 1 to {MAX_HOSTS}", field="--hosts",
                        fix="pass --hosts 2 (two Proxmox hosts on one LAN)")]
    problems = []
    hosts = config.lab_hosts
    last = hosts[-1]
    if not last.ct_address or last.ct_vmid > 199:
        problems.append(Problem(f"vmid {last.ct_vmid} for {last.name}'s container is outside 100-199 (each host's "
                                "container takes the next vmid)", field="--ct-vmid",
                                fix=f"pass a vmid between 100 and {200 - config.hosts}"))
    lan = _net(config.subnet)
    if lan.num_addresses < config.hosts + 3:
        problems.append(Problem(f"{config.subnet} has no room for {config.hosts} hosts", field="--subnet",
                                fix="pass a /24"))
    for host in hosts[1:]:
        net = _net(host.ct_subnet)
        if net.overlaps(lan) or not net.is_private:
            problems.append(Problem(f"{host.name}'s container network {net} (the one after --ct-subnet) overlaps "
                                    f"{config.subnet} or is not private", field="--ct-subnet",
                                    fix=f"pick a --ct-subnet with {config.hosts} free networks of its size after it"))
    names = {h.name for h in hosts}
    for name, ms in config.clock_skew_ms:
        if name not in names:
            problems.append(Problem(f"--clock-skew-ms names {name!r}, not one of the lab's hosts {sorted(names)}",
                                    field="--clock-skew-ms",
                                    fix="name a host the lab makes, e.g. pve2=250 with --hosts 2"))
        elif abs(ms) > MAX_CLOCK_SKEW_MS:
            problems.append(Problem(f"{name}'s clock {ms} ms apart: more than the lab sets ({MAX_CLOCK_SKEW_MS} ms)",
                                    field="--clock-skew-ms", fix=f"pass at most {MAX_CLOCK_SKEW_MS} ms"))
    return problems


def _flavour_problems(config: LabConfig) -> list[Problem]:
    problems = []
    if config.flavour not in FLAVOURS:
        problems.append(Problem(f"flavour {config.flavour!r} is not one of {sorted(FLAVOURS)}", field="--flavour",
                                fix="pass --flavour homelab (Proxmox VE 8 without a subscription, ZFS root), "
                                    "stock-pve8 (a subscribed Proxmox VE 8 host as installed) or lab"))
    elif not FLAVOURS[config.flavour].stock and (config.secure_boot or config.nvswitches or config.vfio_gpus
                                                 or config.extra_driver_versions or config.apt_driver
                                                 or config.vm_gpus or config.gpu_model != DEFAULT_GPU_MODEL):
        problems.append(Problem("--secure-boot, --nvswitches, --vfio-gpus, --vm-gpus, --apt-driver, --gpu-model and "
                                "--extra-driver-version need a stock flavour", field="--flavour",
                                fix="add --flavour stock-pve8 or homelab"))
    if config.kernel_series and config.kernel_series not in KERNEL_SERIES.get(config.flavour, {}):
        offered = [f"--flavour {f} --kernel {k}" for f, series in KERNEL_SERIES.items() for k in series]
        problems.append(Problem(f"no kernel series {config.kernel_series!r} for flavour {config.flavour!r}",
                                field="--kernel", fix=f"pass one of: {', '.join(offered)}"))
    if config.gpu_model not in GPU_MODELS:
        problems.append(Problem(f"GPU model {config.gpu_model!r} is not one of {sorted(GPU_MODELS)}",
                                field="--gpu-model", fix=f"pass --gpu-model {DEFAULT_GPU_MODEL} (the story's)"))
    if not 0 <= config.vfio_gpus < max(config.gpus, 1):
        problems.append(Problem(f"{config.vfio_gpus} of {config.gpus} GPUs bound to vfio-pci: the host must keep one",
                                field="--vfio-gpus", fix=f"pass --vfio-gpus between 0 and {max(config.gpus - 1, 0)}"))
    if config.vm_gpus < 0 or config.vfio_gpus + config.vm_gpus >= max(config.gpus, 1):
        problems.append(Problem(f"{config.vm_gpus} GPUs for a VM and {config.vfio_gpus} on vfio-pci of {config.gpus}: "
                                "the host must keep one", field="--vm-gpus",
                                fix=f"pass --vm-gpus between 0 and {max(config.gpus - config.vfio_gpus - 1, 0)}"))
    if not 64 <= config.disk_gib <= 65536:
        problems.append(Problem(f"a disk of {config.disk_gib} GiB", field="--disk-gib",
                                fix=f"pass --disk-gib between 64 and 65536 (default {DEFAULT_DISK_GIB})"))
    if not 0 <= config.nvswitches <= 6:
        problems.append(Problem(f"{config.nvswitches} NVSwitches asked; HGX boards have 0 to 6", field="--nvswitches",
                                fix="pass --nvswitches 4 (an HGX H100/H200 board)"))
    return problems


def _route_net(dst: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(dst if "/" in dst else dst + "/32", strict=False)
    except ValueError:
        return None


def lab_networks(config: LabConfig) -> list[str]:
    """Every network a lab uses: its LAN (--subnet), then each host's container network (--ct-subnet and, with
    --hosts N, the N - 1 after it)."""
    return [config.subnet, *(h.ct_subnet for h in config.lab_hosts)]


def taken_networks(routes: list[dict[str, Any]], others: dict[str, LabConfig]) -> list[ipaddress.IPv4Network]:
    """Every network the controller's routes and the other labs up here use."""
    nets = [n for r in routes if r.get("dst", "") not in ("default", "") and (n := _route_net(r["dst"]))]
    return nets + [_net(cidr) for other in others.values() for cidr in lab_networks(other)]


def free_subnets(taken: list[ipaddress.IPv4Network], hosts: int = 1) -> tuple[str, str]:
    """The first instance pair, from this instance's own, whose networks (the container networks of `hosts`
    hosts included) overlap nothing taken: what a fix suggests."""
    start = int.from_bytes(hashlib.sha256(INSTANCE.encode()).digest()[:8], "big") % INSTANCE_NET_PAIRS
    for n in range(INSTANCE_NET_PAIRS):
        pair = pair_subnets((start + n) % INSTANCE_NET_PAIRS)
        nets = lab_networks(LabConfig(subnet=pair[0], ct_subnet=pair[1], hosts=hosts))
        if not any(_net(cidr).overlaps(t) for cidr in nets for t in taken):
            return pair
    return pair_subnets(start)  # all 3840 taken: the fix names a pair anyway


def _subnet_fix(taken: list[ipaddress.IPv4Network], hosts: int = 1) -> str:
    subnet, ct_subnet = free_subnets(taken, hosts)
    return f"`toolkit lab up --subnet {subnet} --ct-subnet {ct_subnet}` (free here)"


def instance_label(instance: str) -> str:
    return f"lab instance {instance} (TOOLKIT_LAB_INSTANCE={instance})" if instance else \
        "the default lab (TOOLKIT_LAB_INSTANCE unset)"


def other_lab_conflicts(config: LabConfig, others: dict[str, LabConfig],
                        routes: list[dict[str, Any]]) -> list[Problem]:
    """The other labs up on this machine (instance name -> config) whose networks overlap this one's: each named,
    with a free pair to pass instead and how to take that lab down."""
    problems = []
    taken = taken_networks(routes, others)
    for name, other in sorted(others.items()):
        for index, mine in enumerate(lab_networks(config)):
            clash = [theirs for theirs in lab_networks(other) if _net(theirs).overlaps(_net(mine))]
            if clash:
                down = f"TOOLKIT_LAB_INSTANCE={name} toolkit lab down" if name else "toolkit lab down"
                problems.append(Problem(
                    f"{mine} overlaps {clash[0]} of {instance_label(name)}, which is up on this machine",
                    field="--subnet" if index == 0 else "--ct-subnet",
                    fix=f"{_subnet_fix(taken, config.hosts)}, or take that lab down first (`{down}`)"))
    return problems


def address_conflicts(config: LabConfig, routes: list[dict[str, Any]], our_links: set[str]) -> list[Problem]:
    """Networks in `ip -j route` output (of the controller) that overlap the lab's, except on the
    lab's own links (a second `up` must not refuse its own veth)."""
    problems = []
    ours = [_net(config.subnet), *(_net(h.ct_subnet) for h in config.lab_hosts)]
    for route in routes:
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("dev") in our_links:
            continue
        net = _route_net(dst)
        if net is None:
            continue
        for mine in ours:
            if net.overlaps(mine):
                problems.append(Problem(
                    f"{mine} is already in use here: route {dst} dev {route.get('dev', '?')}",
                    field="--subnet" if mine == ours[0] else "--ct-subnet",
                    fix=f"pick a free network, e.g. {_subnet_fix(taken_networks(routes, {}), config.hosts)}, "
                        f"or remove the route to {dst}"))
    return problems


def storage_layout(config: LabConfig) -> dict[str, Any]:
    """The stand-in disk as Proxmox's installer carves it (pve-installer Proxmox/Install.pm): LVM: 8 GiB swap,
    a root of a quarter of the rest plus 12 GiB but at most 96 GiB, 16 GiB left free, the rest the thin pool
    `data` (local-lvm); ZFS: one pool, about 96 % of the disk usable, shared by every dataset (root, local,
    local-zfs). What pvesm's stand-in reports its totals from (/etc/pve/storage.cfg: STORAGE_CFG)."""
    disk = config.disk_gib
    if config.flavour_spec.storage == "zfs":
        return {"kind": "zfs", "pool_gib": round(disk * 0.96, 1), "root_used_gib": 2.6}
    swap = min(8, disk // 8)
    rest = disk - swap
    root = min(96, rest / 4 + 12) if rest >= 48 else rest / 2
    minfree = 16 if disk > 128 else disk / 8
    thin = max(rest - root - minfree, 0)
    return {"kind": "lvm", "root_gib": round(root, 1), "thin_gib": round(thin * 0.99, 1), "root_used_gib": 2.9}


# /etc/pve/storage.cfg as the installer writes it (pve-installer Proxmox/Install/StorageConfig.pm).
STORAGE_CFG = {
    "lvm": "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup,import\n\n"
           "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n",
    "zfs": "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup,import\n\n"
           "zfspool: local-zfs\n\tpool rpool/data\n\tsparse\n\tcontent images,rootdir\n",
}


@dataclass
class LabState:
    """What `up` made and observed (the status): one writer, `toolkit.lab.system`."""

    config: LabConfig
    inventory_path: str
    ssh_key_path: str
    known_hosts_path: str
    holder_pid: int = 0
    holder_start_ticks: int = 0  # /proc/PID/stat field 22: tells our pid from a reused one
    sshd_pid: int = 0
    made: list[str] = field(default_factory=list)  # what down undoes, in the order up made it
    schema: int = STATE_SCHEMA
    running: bool = False
    # sha256 of the driver installers the stock flavour's mirror serves (version -> hex).
    installer_sha256: dict[str, str] = field(default_factory=dict)
    # sha256 of NVIDIA's Fabric Manager archives the mirror serves (version -> hex), for hosts on Debian 13.
    fm_archive_sha256: dict[str, str] = field(default_factory=dict)
    mirror_dir: str = ""  # the stock flavour's package mirror on the controller (bound into pve1)
    # The launcher of each host after pve1 (pve1's is holder_pid): name -> [pid, start ticks].
    holders: dict[str, list[int]] = field(default_factory=dict)
    # The CT templates' build when `up` found them not cached: [pid, start ticks] of the process (its own
    # process group) that builds them beside the hosts' start and places them; empty when none was started.
    template_builder: list[int] = field(default_factory=list)

    def holder(self, host: str) -> tuple[int, int]:
        """(pid, start ticks) of `host`'s launcher: (0, 0) when it was never started."""
        if host == HOSTNAME:
            return self.holder_pid, self.holder_start_ticks
        pid, ticks = self.holders.get(host, [0, 0])
        return pid, ticks

    @property
    def host_address(self) -> str:
        return self.config.host_address

    @property
    def ct_address(self) -> str:
        return self.config.ct_address

    def ssh_args(self, host: str) -> list[str]:
        """argv prefix that reaches a host (`pve1`, `pve2`, ...) or a container (`ct`, `ct2`, ...) over real SSH
        with the lab's key."""
        lab_host = self.config.lab_host(host)
        common = ["ssh", "-i", self.ssh_key_path, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                  "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"]
        if host == lab_host.name:
            return [*common, "-o", f"UserKnownHostsFile={self.known_hosts_path}",
                    "-o", "StrictHostKeyChecking=yes", f"root@{lab_host.address}"]
        return [*common, *CT_HOSTKEY_OPTIONS, f"root@{lab_host.ct_address}"]

    def ssh(self, host: str, command: str, *, check: bool = False, timeout_s: float = 120) -> Any:
        import subprocess

        return subprocess.run([*self.ssh_args(host), command], capture_output=True, text=True,
                              check=check, timeout=timeout_s)

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str, *, tolerant: bool = False) -> LabState:
        """The state `to_json` wrote. A key this toolkit does not know is refused (a newer toolkit made the lab:
        its `down` knows what to undo); `tolerant` drops such keys instead, for reading another instance's state,
        of which only the addresses and launchers are wanted (its up may run another branch of the toolkit)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ToolkitError.of(f"lab state is not JSON: {err}", file=source, line=err.lineno,
                                  fix="run `toolkit lab down` (it cleans up by name), then `toolkit lab up`") from err
        schema = data.get("schema", 0)
        if schema > STATE_SCHEMA:
            raise ToolkitError.of(f"lab state schema {schema} is newer than this toolkit's {STATE_SCHEMA}",
                                  file=source, field="schema", fix="use the toolkit version that made the lab")
        data["config"]["extra_driver_versions"] = tuple(data["config"].get("extra_driver_versions", ()))
        data["config"]["clock_skew_ms"] = tuple(tuple(pair) for pair in data["config"].get("clock_skew_ms", ()))
        data.pop("schema", None)
        known = {f.name for f in fields(cls)}
        known_config = {f.name for f in fields(LabConfig)}
        unknown = sorted({*(k for k in data if k not in known), *(f"config.{k}" for k in data["config"]
                                                                    if k not in known_config)})
        if unknown and not tolerant:
            raise ToolkitError.of(f"lab state has keys this toolkit does not know: {', '.join(unknown)}",
                                  file=source, field=unknown[0],
                                  fix="use the toolkit version that made the lab (its `toolkit lab down`)")
        data["config"] = LabConfig(**{k: v for k, v in data["config"].items() if k in known_config})
        return cls(**{k: v for k, v in data.items() if k in known}, schema=STATE_SCHEMA)


# The container is re-created by the roles with fresh host keys each time (pct create makes new
# ones, as Proxmox does), so a pinned known_hosts would refuse every rebuild. Its address exists
# only inside the lab's own namespaces, so no other machine can answer as it.
CT_HOSTKEY_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")


# What the lab substitutes for the roles, one line each, printed before every run (`toolkit_notes` in the
# inventory). The flavour `lab` first; a stock flavour is a Proxmox VE host as installed, so the host role
# runs there as on a real one.
_NOTE_STANDINS = ("lab: the GPUs, /proc/devices, /proc/driver/nvidia, lspci and nvidia_uvm's parameters on pve1 are "
                  "stand-ins (proxmox_gpu_host_proc_devices, proxmox_gpu_host_proc_driver_dir, "
                  "proxmox_gpu_host_sys_module_dir, proxmox_gpu_host_lspci_command)")
_NOTE_CONTAINER = ("lab: no CUDA repository is reachable from the container "
                   "(container_nvidia_userspace_cuda_install_method=none); a new container's sshd is waited for "
                   f"longer than on a real host (lxc_gpu_container_ssh_timeout_s={LAB_CT_SSH_TIMEOUT_S}: the machine "
                   "runs other labs), and so are `pct start` and `stop` (lxc_gpu_container_guest_wait_s)")
_NOTE_DEPLOY = ("lab: no Hugging Face, so the model is not fetched (sglang_venv_model_fetch=false); the stand-in "
                "server answers /health within seconds (sglang_service_health_timeout_s=20); the engine's venv is "
                "installed without byte-compiling it (sglang_venv_pip_compile=false: the stand-ins and the bench "
                "import a fraction of it)")


def inventory_notes(config: LabConfig) -> list[str]:
    """`toolkit_notes`: one line per substitution the lab's inventory makes for the roles."""
    if not config.flavour_spec.stock:
        host = [
            "lab: pve1 has no kernel headers and no package mirror, and its stand-in installer builds nothing "
            "(proxmox_gpu_host_kernel_headers_required=false, proxmox_gpu_host_build_packages_install=false)",
            "lab: the driver installer is the stand-in staged on pve1, checked against its sha256 "
            "(proxmox_gpu_host_driver_installer, proxmox_gpu_host_driver_checksum)",
        ]
    else:
        host = [
            f"lab ({config.flavour}): the real hosts' package and download servers are the lab's mirror on pve1 "
            "(https with a certificate of the lab's own CA, which pve1 trusts); the installers and the Fabric Manager "
            "archives are checked against their sha256 (proxmox_gpu_host_driver_checksum, "
            "proxmox_gpu_host_fabricmanager_archive_checksum)",
        ]
        if not config.flavour_spec.subscription:
            host.append(f"lab ({config.flavour}): no subscription, so the inventory lets the host role switch pve1 to "
                        "pve-no-subscription, as its preflight's fix says (proxmox_gpu_host_apt_no_subscription=true)")
    return [*host, _NOTE_STANDINS, _NOTE_CONTAINER, _NOTE_DEPLOY]


# Ansible's own ssh_args less its -C: SSH's zlib over a veth on this machine only burns CPU, on both ends, and the
# wheelhouses it carries are zip archives already. Copying the lab lock's 301 MB wheelhouse tar into pve1 took
# 16.4 s of the client's CPU with -C and 1.1 s without (and 269 s against 17 s of wall at load 25).
LAB_SSH_ARGS = "-o ControlMaster=auto -o ControlPersist=60s"


def render_inventory(state: LabState) -> str:
    """`inventory/lab.yml`: the groups and variables the roles read, and `toolkit_overlay: lab`, the one
    answer to "is this the lab?". Production roles never ask it: every difference is a role variable set here.
    Deterministic."""
    c = state.config
    ct_ssh = " ".join(CT_HOSTKEY_OPTIONS)
    pve1: dict[str, Any] = {
        "ansible_host": c.host_address,
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={state.known_hosts_path} "
                                   "-o StrictHostKeyChecking=yes",
        "proxmox_gpu_host_proc_devices": "/run/lab-standin/proc-devices",
        "proxmox_gpu_host_sys_module_dir": "/run/lab-standin/sys/module",
        "proxmox_gpu_host_lspci_command": "/usr/local/bin/lspci-lab-standin -nnk -d 10de:",
        "proxmox_gpu_host_proc_driver_dir": labstandin.PROC_DRIVER_DIR,
        "proxmox_gpu_host_driver_installer": f"/opt/lab-standin/NVIDIA-Linux-x86_64-{c.driver_version}.run",
        "proxmox_gpu_host_driver_version": c.driver_version,
        "proxmox_gpu_host_kernel_headers_required": False,
        "proxmox_gpu_host_build_packages_install": False,
        # The lab's installers' sha256 by version (lab data: the roles read only the checksum of the version
        # asked, proxmox_gpu_host_driver_checksum, as on a real host; `-e proxmox_gpu_host_driver_version=`
        # picks another of them).
        "toolkit_lab_driver_checksums": {v: f"sha256:{h}" for v, h in sorted(state.installer_sha256.items())},
        "proxmox_gpu_host_driver_checksum":
            '{{ toolkit_lab_driver_checksums[proxmox_gpu_host_driver_version | string] | default("") }}',
    }
    hosts = {HOSTNAME: pve1}
    inventory = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": state.ssh_key_path,
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_args": LAB_SSH_ARGS,
                # Mitogen's SSH (the toolkit's Ansible strategy) compresses unless told: the same CPU on both ends
                # for nothing over the lab's veth as `-C` above.
                "mitogen_ssh_compression": False,
                "toolkit_overlay": "lab",
                "toolkit_notes": inventory_notes(c),
                # pve1's network namespace: gone when the lab is down or the machine rebooted, and with it the
                # hosts this file names (a command without -i refuses the file then).
                "toolkit_inventory_valid_while": f"/run/netns/{NETNS}",
            },
            "children": {
                "proxmox_hosts": {"hosts": hosts},
                "gpu_containers": {
                    "vars": {
                        "container_nvidia_userspace_cuda_install_method": "none",
                        "sglang_venv_model_fetch": False,
                        "sglang_service_health_timeout_s": LAB_HEALTH_TIMEOUT_S,
                        # A container's first boot waits on pve1's systemd and the machine's other labs: 120 s
                        # (the role's default, ample on a real host) ran out at load 25 on the 2-core machine.
                        "lxc_gpu_container_ssh_timeout_s": LAB_CT_SSH_TIMEOUT_S,
                        # `pct start` and `stop` wait the same way: a CI run's strict-container test saw "not
                        # running 180 s after pct start" (the role's default) at load 25.
                        "lxc_gpu_container_guest_wait_s": LAB_CT_SSH_TIMEOUT_S,
                        # pip's compile of the lock's 169 wheels was most of their install (42 s of a cold demo);
                        # the lab's venv is made afresh for each lock and imports a fraction of it.
                        "sglang_venv_pip_compile": False,
                    },
                    "hosts": {
                        h.ct_name: {
                            "ansible_host": h.ct_address,
                            "ansible_ssh_common_args": ct_ssh,
                            # Said to Ansible too, not only to ssh: Mitogen's SSH puts its own
                            # StrictHostKeyChecking before the inventory's ssh args, and the first wins.
                            "ansible_host_key_checking": False,
                            "lxc_gpu_container_proxmox_host": h.name,
                            "lxc_gpu_container_vmid": h.ct_vmid,
                            "lxc_gpu_container_net0":
                                f"name=eth0,bridge={BRIDGE},ip={h.ct_address}/{h.ct_prefixlen},"
                                f"gw={h.bridge_address},type=veth",
                            "lxc_gpu_container_address": h.ct_address,
                        } for h in c.lab_hosts
                    },
                },
            },
        }
    }
    if c.flavour_spec.stock:
        _stock_inventory(state, pve1)
    # Every host alike (the same flavour, driver and stand-ins), each at its own address.
    for h in c.lab_hosts[1:]:
        hosts[h.name] = {**copy.deepcopy(pve1), "ansible_host": h.address}
    header = (
        "# Generated by `toolkit lab up`: do not edit (it is rewritten on every up, removed by down).\n"
        "# The shape is shown by inventory/lab.example.yml; docs/lab.md says what each variable is.\n"
    )
    return header + yaml.safe_dump(inventory, sort_keys=False, default_flow_style=False, width=120)


def _stock_inventory(state: LabState, host: dict[str, Any]) -> None:
    """A stock flavour's pve1 as a real host: the installer is downloaded from its real URL (the lab's mirror
    answers there, over TLS) and its checksum required; headers and build tools are installed by the role (its
    defaults); lspci and /proc/devices still come from the stand-ins (no GPU on this machine)."""
    c = state.config
    del host["proxmox_gpu_host_driver_installer"]
    del host["proxmox_gpu_host_kernel_headers_required"]
    del host["proxmox_gpu_host_build_packages_install"]
    host["toolkit_lab_fabricmanager_checksums"] = {v: f"sha256:{h}" for v, h in sorted(state.fm_archive_sha256.items())}
    host["proxmox_gpu_host_fabricmanager_archive_checksum"] = (
        '{{ toolkit_lab_fabricmanager_checksums[proxmox_gpu_host_driver_version | string] | default("") }}')
    if not c.flavour_spec.subscription:
        host["proxmox_gpu_host_apt_no_subscription"] = True
    if c.kernel_series:
        # As a real host's inventory that pins nothing: the role's default, or the plan's choice, is the driver.
        del host["proxmox_gpu_host_driver_version"]


def standin_config(config: LabConfig) -> str:
    """/etc/lab-standin/lab.json on pve1: read by the stand-ins (GPU count, driver version, majors)."""
    return json.dumps({
        "gpus": config.gpus,
        "driver_version": config.driver_version,
        "nvidia_major": NVIDIA_MAJOR,
        "uvm_major": UVM_MAJOR,
        "caps_major": CAPS_MAJOR,
        # The GPUs' figures (name, power, memory) follow the model (labstandin.load_config).
        "gpu_model": config.gpu_model,
        "vfio_gpus": config.vfio_gpus,
        "vm_gpus": config.vm_gpus,
        "storage": storage_layout(config),
        "flavour": config.flavour,
        "pve_version": config.flavour_spec.pve_version,
        "nouveau": config.flavour_spec.stock,
        "secure_boot": config.secure_boot,
        "nvswitches": config.nvswitches,
    }, indent=2, sort_keys=True) + "\n"


# Debian 13's driver packages (non-free: nvidia-driver pulls nvidia-kernel-dkms and nvidia-support, whose
# /usr/lib/nvidia/alternate-install-present makes NVIDIA's .run installer abort).
APT_DRIVER_VERSION = "550.163.01-2"
APT_DRIVER_PACKAGES = ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-support")
ALTERNATE_INSTALL_MARKER = "/usr/lib/nvidia/alternate-install-present"
VM_VMID = 200


def apt_driver_status() -> str:
    """The stanzas dpkg's status file has for the apt-installed driver (appended to the userland's own)."""
    return "".join(
        f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: non-free/libs\n"
        f"Maintainer: Debian NVIDIA Maintainers <pkg-nvidia-devel@lists.alioth.debian.org>\nArchitecture: amd64\n"
        f"Version: {APT_DRIVER_VERSION}\nDescription: {name} (lab stand-in: no files of the real package)\n\n"
        for name in APT_DRIVER_PACKAGES)


def gpu_bus_ids(gpus: int) -> list[str]:
    """The stand-in GPUs' PCI addresses, in bus order (lab-init makes the same)."""
    return ["0000:%02x:00.0" % (0x01 + i * 0x20) for i in range(gpus)]


def vm_config(config: LabConfig) -> str:
    """/etc/pve/qemu-server/200.conf: a stopped VM that takes the last `vm_gpus` GPUs the host keeps (its
    hostpci lines as qemu-server writes them); nothing binds them to vfio-pci before it starts."""
    kept = gpu_bus_ids(config.gpus)[:config.gpus - config.vfio_gpus]
    lines = [f"hostpci{n}: {bus},pcie=1" for n, bus in enumerate(kept[len(kept) - config.vm_gpus:])]
    return ("boot: order=scsi0\ncores: 8\nmachine: q35\nmemory: 65536\nname: gpu-vm\n"
            + "\n".join(lines) + "\nostype: l26\nscsi0: local-lvm:vm-200-disk-0,size=64G\n")
