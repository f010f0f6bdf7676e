"""Host facts: what one read-only gathering (playbooks/facts.yml) saw on a Proxmox host, typed.

The playbook returns each command's raw output as the real tool prints it (`{name: {"rc": N, "stdout": "..."}}`);
`parse_facts` turns that into `HostFacts`. A command that was absent (rc 127) or failed leaves its fields `None`
(unknown) and its name in `HostFacts.unknown`, so the plan can tell "no GPU bound to nvidia" from "could not read
the bindings". Pure: every fixture of raw outputs replays through the same code a live host does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

FACTS_SCHEMA = 1
RC_ABSENT = 127

# The raw outputs playbooks/files/host_facts.py gathers, by name: the command (or file) each one is.
RAW_SOURCES: dict[str, str] = {
    "pveversion": "pveversion -v",
    "uname": "uname -r",
    "os_release": "/etc/os-release",
    "kernel_packages": "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' "
                       "'proxmox-kernel-*' 'pve-kernel-*' 'proxmox-headers-*' 'pve-headers-*' "
                       "'proxmox-default-kernel' 'proxmox-default-headers'",
    "boot_kernels": "proxmox-boot-tool kernel list",
    "default_kernel_depends": "apt-cache depends proxmox-default-kernel",
    "mokutil": "mokutil --sb-state",
    "efi_secure_boot": "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c (last byte)",
    "lspci": "lspci -nnk -D -d 10de:",
    "nvidia_gpus": "head -v -n 100 /proc/driver/nvidia/gpus/*/information",
    "nvidia_version": "/proc/driver/nvidia/version",
    "nvidia_smi": "nvidia-smi --query-gpu=index,pci.bus_id,driver_version,name --format=csv,noheader",
    "topo_p2p": "nvidia-smi topo -p2p r",
    "qemu_configs": "head -v -n 100000 /etc/pve/qemu-server/*.conf",
    "pci_mapping": "/etc/pve/mapping/pci.cfg",
    "driver_packages": "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' "
                       "'nvidia-*' 'cuda-drivers*' 'libnvidia-*' 'xserver-xorg-video-nvidia*'",
    "alternate_install": "test -e /usr/lib/nvidia/alternate-install-present",
    "runfile_uninstaller": "test -e /usr/bin/nvidia-uninstall",
    "pvesm": "pvesm status",
    "storage_cfg": "/etc/pve/storage.cfg",
    "root_mount": "findmnt -n -o SOURCE,FSTYPE,TARGET /",
    "zfs": "zfs list -H -p -o name,used,avail,mountpoint",
    "ha": "ha-manager config",
    "members": "/etc/pve/.members",
    "apt_sources": "head -v -n 10000 /etc/apt/sources.list /etc/apt/sources.list.d/*",
    "apt_policy": "apt-cache policy PACKAGES",
    "apt_proxy": "apt-config dump (Acquire::*::Proxy lines)",
    "env_proxy": "the environment's http_proxy, https_proxy, no_proxy (credentials removed)",
    "cmdline": "/proc/cmdline",
}


@dataclass(frozen=True)
class Raw:
    rc: int
    stdout: str


@dataclass(frozen=True)
class Kernel:
    release: str  # uname -r form: 6.8.12-9-pve
    headers: bool  # proxmox-headers-RELEASE (or pve-headers-) installed

    @property
    def series(self) -> str:
        return kernel_series(self.release)


@dataclass(frozen=True)
class Kernels:
    running: str | None
    installed: tuple[Kernel, ...]
    # The kernel the next boot takes: proxmox-boot-tool's pin, else the newest installed (what it and grub pick).
    default: str | None
    pinned: str | None
    # The series the installed proxmox-default-kernel's candidate pulls in (apt full-upgrade brings it).
    pending_series: str | None

    def series_to_build(self) -> tuple[str, ...]:
        """Every kernel series the driver must build on: running, next boot, installed, and the upgrade's."""
        names = [self.running, self.default, *(k.release for k in self.installed)]
        out = {kernel_series(n) for n in names if n}
        if self.pending_series:
            out.add(self.pending_series)
        return tuple(sorted(out, key=version_key))


@dataclass(frozen=True)
class Gpu:
    bus_id: str  # DDDD:BB:DD.F, lower case: the one identity of a GPU everywhere
    pci_id: str  # 10de:2204
    pci_class: str  # 0300 VGA, 0302 3D, 0680 bridge (NVSwitch)
    name: str  # lspci's text: "NVIDIA Corporation GA102 [GeForce RTX 3090]"
    chip: str | None  # GA102
    driver: str | None  # Kernel driver in use
    minor: int | None  # /proc/driver/nvidia/gpus/<bus>/information "Device Minor"
    vms: tuple[int, ...]  # VMs whose hostpciN names it (directly or through a mapping)

    @property
    def is_nvswitch(self) -> bool:
        return self.pci_class == "0680"


@dataclass(frozen=True)
class Driver:
    loaded_version: str | None  # /proc/driver/nvidia/version, else nvidia-smi's
    apt_packages: tuple[tuple[str, str], ...]  # installed (name, version) of nvidia-*/cuda-drivers*/libnvidia-*
    alternate_install_marker: bool | None  # /usr/lib/nvidia/alternate-install-present
    runfile: bool | None  # nvidia-uninstall present: a .run install

    @property
    def apt_installed(self) -> tuple[str, ...]:
        """The apt packages that make the .run installer abort (or mean a driver came from apt)."""
        return tuple(n for n, _ in self.apt_packages if APT_DRIVER_PACKAGE.match(n))


# nvidia-installer aborts on these (their nvidia-support/nvidia-kernel-common ship the marker).
APT_DRIVER_PACKAGE = re.compile(r"^(nvidia-driver(-\d+)?|nvidia-kernel-(open-)?dkms|nvidia-kernel-common(-\d+)?|"
                                r"cuda-drivers(-\d+)?|nvidia-open(-\d+)?|nvidia-support|nvidia-dkms-\d+.*)$")


@dataclass(frozen=True)
class Storage:
    name: str
    type: str  # zfspool, lvmthin, lvm, dir, btrfs, nfs, cifs, rbd, cephfs, ...
    active: bool
    total_kib: int | None
    avail_kib: int | None
    content: tuple[str, ...]  # from storage.cfg
    shared: bool  # network type, or `shared 1`
    pool: str | None  # zfspool: its dataset
    path: str | None  # dir/btrfs/nfs: its path
    shares_root: bool | None  # same ZFS pool as /, or a dir/btrfs on /'s filesystem; None: unknown

    @property
    def avail_gib(self) -> float | None:
        return None if self.avail_kib is None else self.avail_kib / 1024 ** 2


@dataclass(frozen=True)
class AptPolicy:
    package: str
    installed: str | None
    candidate: str | None


@dataclass(frozen=True)
class HostFacts:
    host: str
    schema: int
    pve_version: str | None  # pve-manager's
    debian_suite: str | None  # VERSION_CODENAME
    kernels: Kernels
    secure_boot: bool | None
    gpus: tuple[Gpu, ...]
    driver: Driver
    # nvidia-smi topo -p2p r: (bus_a, bus_b) -> status ("OK", "NS", "CNS", "GNS", "TNS", "U"); empty: unknown
    p2p: tuple[tuple[str, str, str], ...]
    vm_hostpci: tuple[tuple[int, str], ...]  # (vmid, hostpciN's value) as written
    storages: tuple[Storage, ...]
    root_source: str | None  # findmnt's SOURCE of /
    root_fstype: str | None
    ha_resources: tuple[tuple[str, str], ...]  # (sid, state)
    cluster_nodes: tuple[str, ...]
    apt_sources: tuple[str, ...]  # active source lines / deb822 URIs, each "file: line"
    apt_policy: tuple[AptPolicy, ...]
    proxies: tuple[tuple[str, str], ...]  # (where, url) with credentials removed
    kernel_cmdline: str | None
    unknown: tuple[str, ...] = field(default=())  # raw outputs that were absent or failed

    def gpu(self, bus_id: str) -> Gpu | None:
        key = normalize_bus_id(bus_id)
        return next((g for g in self.gpus if g.bus_id == key), None)

    def host_gpus(self) -> tuple[Gpu, ...]:
        """The host's own GPUs: no NVSwitch, none bound to vfio-pci, none a VM's hostpciN names."""
        return tuple(g for g in self.gpus if not g.is_nvswitch and g.driver != "vfio-pci" and not g.vms)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ helpers


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def kernel_series(release: str) -> str:
    m = re.match(r"(\d+)\.(\d+)", release)
    return f"{m.group(1)}.{m.group(2)}" if m else release


def normalize_bus_id(bus_id: str) -> str:
    """00000000:01:00.0 (nvidia-smi), 0000:01:00.0 (lspci -D, /proc) and 01:00.0 (lspci, hostpci) -> 0000:01:00.0."""
    text = bus_id.strip().lower()
    m = re.fullmatch(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", text)
    if not m:
        return text
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}"


def _ok(raw: Mapping[str, Raw], name: str) -> str | None:
    r = raw.get(name)
    return r.stdout if r is not None and r.rc == 0 else None


def _head_files(text: str) -> dict[str, str]:
    """`head -v` output: {path: content}."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        m = re.fullmatch(r"==> (.*) <==", line)
        if m:
            current = m.group(1)
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return out


def _dpkg_rows(text: str | None) -> list[tuple[str, str]]:
    """dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}': the installed ones (ii, hi)."""
    rows = []
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip()[1:2] == "i":
            rows.append((parts[0], parts[1]))
    return rows


# ------------------------------------------------------------------ parsers


def parse_pveversion(text: str) -> str | None:
    m = re.search(r"^pve-manager: (\S+)", text, re.M) or re.search(r"pve-manager/(\d[^/\s]*)", text)
    return m.group(1) if m else None


def parse_os_release(text: str) -> str | None:
    m = re.search(r'^VERSION_CODENAME="?([a-z]+)', text, re.M)
    return m.group(1) if m else None


_KERNEL_PKG = re.compile(r"^(?:proxmox|pve)-(kernel|headers)-(\d+\.\d+\.\d+-\d+-(?:bpo\d+-)?pve)(?:-signed)?$")


def parse_kernels(uname: str | None, packages: str | None, boot_list: str | None,
                  default_depends: str | None) -> Kernels:
    rows = _dpkg_rows(packages)
    kernels: set[str] = set()
    headers: set[str] = set()
    for name, _version in rows:
        m = _KERNEL_PKG.match(name)
        if m:
            (kernels if m.group(1) == "kernel" else headers).add(m.group(2))
    running = uname.strip() if uname else None
    pinned = None
    listed: list[str] = []
    if boot_list:
        # proxmox-boot-tool kernel list: "Manually selected kernels:", "Automatically selected kernels:",
        # then "Pinned kernel:" / "Kernel pinned on next-boot:" and one release per line.
        section = ""
        for line in boot_list.splitlines():
            s = line.strip()
            if s.endswith(":"):
                section = s.lower()
                continue
            if not s or s == "None.":
                continue
            if "pinned" in section:
                pinned = s
            elif re.match(r"\d+\.\d+", s):
                listed.append(s)
    candidates = sorted(kernels | set(listed), key=version_key)
    default = pinned or (candidates[-1] if candidates else running)
    pending = None
    if default_depends:
        m = re.search(r"Depends: (?:proxmox|pve)-kernel-(\d+\.\d+)\s*$", default_depends, re.M)
        pending = m.group(1) if m else None
    installed = tuple(Kernel(k, k in headers) for k in sorted(kernels, key=version_key))
    return Kernels(running=running, installed=installed, default=default, pinned=pinned, pending_series=pending)


def parse_secure_boot(mokutil: Raw | None, efi: Raw | None) -> bool | None:
    if mokutil is not None and mokutil.rc in (0, 1):
        text = mokutil.stdout.lower()
        if "secureboot enabled" in text:
            return True
        if "secureboot disabled" in text or "not supported" in text:
            return False
    if efi is not None and efi.rc == 0 and efi.stdout.strip() in ("0", "1"):
        return efi.stdout.strip() == "1"
    return None


# VGA, 3D controller, and the bridge class NVSwitches have; a GPU's audio function is not a GPU.
GPU_CLASSES = ("0300", "0302", "0680")
_LSPCI_DEV = re.compile(r"^([0-9a-fA-F:.]+) (.*?) \[([0-9a-f]{4})\]: (.*) \[(10de:[0-9a-f]{4})\]")


def parse_lspci(text: str) -> list[dict[str, Any]]:
    """`lspci -nnk -D -d 10de:`: one device a line, then tab-indented Subsystem/driver/modules lines."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _LSPCI_DEV.match(line)
        if m:
            name = re.sub(r"\s*\(rev [0-9a-f]+\)$", "", m.group(4))
            chip = re.search(r"\b(G[A-Z]\d{3}[A-Z]*)\b", name)
            out.append({"bus_id": normalize_bus_id(m.group(1)), "pci_class": m.group(3), "name": name,
                        "pci_id": m.group(5), "chip": chip.group(1) if chip else None, "driver": None})
        elif out and line.startswith("\t") and "Kernel driver in use:" in line:
            out[-1]["driver"] = line.split(":", 1)[1].strip()
    return out


def parse_gpu_minors(text: str) -> dict[str, int]:
    """/proc/driver/nvidia/gpus/<bus>/information ("Device Minor: N"), read with head -v."""
    out: dict[str, int] = {}
    for path, body in _head_files(text).items():
        bus = re.search(r"/gpus/([^/]+)/information", path)
        minor = re.search(r"^Device Minor:\s*(\d+)", body, re.M)
        if bus and minor:
            out[normalize_bus_id(bus.group(1))] = int(minor.group(1))
    return out


def parse_qemu_hostpci(text: str) -> list[tuple[int, str]]:
    """hostpciN lines of the current config of every VM (snapshot sections [name] are not the VM's now)."""
    out: list[tuple[int, str]] = []
    for path, body in _head_files(text).items():
        m = re.search(r"/(\d+)\.conf$", path)
        if not m:
            continue
        for line in body.splitlines():
            if line.startswith("["):
                break
            h = re.match(r"hostpci\d+:\s*(.+)$", line)
            if h:
                out.append((int(m.group(1)), h.group(1).strip()))
    return out


def parse_pci_mapping(text: str) -> dict[str, list[tuple[str, str]]]:
    """/etc/pve/mapping/pci.cfg: `name` then tab-indented `map id=...,node=...,path=0000:01:00.0[;...]`."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            current = line.strip()
            out[current] = []
        elif current and line.strip().startswith("map "):
            kv = dict(p.split("=", 1) for p in line.strip()[4:].split(",") if "=" in p)
            for path in kv.get("path", "").split(";"):
                if path:
                    out[current].append((kv.get("node", ""), path))
    return out


def vm_bus_ids(hostpci: list[tuple[int, str]], mapping: dict[str, list[tuple[str, str]]],
               node: str) -> dict[str, set[int]]:
    """Bus id (function .0 for a whole device) -> VMs that take it when they start (qemu-server PCI.pm)."""
    out: dict[str, set[int]] = {}
    for vmid, value in hostpci:
        first = value.split(",")[0]
        kv = dict(p.split("=", 1) for p in value.split(",") if "=" in p)
        targets: list[str] = []
        if "mapping" in kv:
            targets = [p for n, p in mapping.get(kv["mapping"], []) if n in ("", node)]
        else:
            host = kv.get("host", first if "=" not in first else "")
            targets = host.split(";")
        for t in targets:
            t = t.strip()
            if not t:
                continue
            # "01:00" (no function) passes every function of the device.
            bus = normalize_bus_id(t if "." in t else t + ".0")
            out.setdefault(bus, set()).add(vmid)
    return out


def parse_nvidia_smi(text: str) -> list[tuple[int, str, str, str]]:
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            out.append((int(parts[0]), normalize_bus_id(parts[1]), parts[2], parts[3]))
    return out


def parse_topo_p2p(text: str, index_to_bus: dict[int, str]) -> list[tuple[str, str, str]]:
    """`nvidia-smi topo -p2p r`: a matrix of GPUi rows/columns with X, OK, NS, CNS, GNS, TNS, U."""
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("GPU")]
    if not rows:
        return []
    header, body = rows[0], rows[1:]
    cols = [int(c[3:]) for c in header if c.startswith("GPU") and c[3:].isdigit()]
    out = []
    for row in body:
        if not row[0][3:].isdigit():
            continue
        i = int(row[0][3:])
        for j, status in zip(cols, row[1:], strict=False):
            if i < j and i in index_to_bus and j in index_to_bus:
                out.append((index_to_bus[i], index_to_bus[j], status))
    return out


_PVESM_LINE = re.compile(r"^(\S+)\s+(\S+)\s+(\S+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+|N/A)")
NETWORK_TYPES = ("nfs", "cifs", "rbd", "cephfs", "glusterfs", "iscsi", "iscsidirect", "pbs", "esxi")


def parse_storage_cfg(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\w+):\s*(\S+)", line)
        if m and not line[0].isspace():
            current = m.group(2)
            out[current] = {"type": m.group(1)}
        elif current:
            key, _, value = line.strip().partition(" ")
            out[current][key] = value.strip()
    return out


def _zfs_pool(dataset: str | None) -> str | None:
    return dataset.split("/")[0] if dataset else None


def parse_storages(pvesm: str | None, cfg_text: str | None, root_source: str | None,
                   root_fstype: str | None, zfs_text: str | None) -> tuple[Storage, ...]:
    cfg = parse_storage_cfg(cfg_text or "")
    status: dict[str, tuple[str, bool, int | None, int | None]] = {}
    for line in (pvesm or "").splitlines():
        m = _PVESM_LINE.match(line)
        if m and m.group(1) != "Name":
            total = int(m.group(4)) if m.group(4).isdigit() else None
            avail = int(m.group(6)) if m.group(6).isdigit() else None
            status[m.group(1)] = (m.group(2), m.group(3) == "active", total, avail)
    root_pool = _zfs_pool(root_source) if root_fstype == "zfs" else None
    # The ZFS datasets' mountpoints, for a dir storage on a dataset of the root's pool.
    mounts = {}
    for line in (zfs_text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 4:
            mounts[parts[3]] = parts[0]
    out = []
    for name in sorted(set(status) | set(cfg)):
        c = cfg.get(name, {})
        typ, active, total, avail = status.get(name, (c.get("type", "?"), False, None, None))
        typ = c.get("type", typ)
        pool = c.get("pool")
        path = c.get("path")
        shared = typ in NETWORK_TYPES or c.get("shared") == "1"
        shares: bool | None
        if typ == "zfspool":
            shares = None if root_fstype is None else (root_pool is not None and _zfs_pool(pool) == root_pool)
        elif typ == "btrfs":
            shares = root_fstype == "btrfs" if root_fstype else None
        elif typ == "dir" and not shared:
            if root_fstype is None:
                shares = None
            else:
                # A dir on / itself, or on a dataset of the root's pool, takes the root's room.
                under = max((m for m in mounts if path and (path == m or path.startswith(m.rstrip("/") + "/"))),
                            key=len, default=None)
                shares = (under is not None and _zfs_pool(mounts[under]) == root_pool) if root_pool \
                    else _on_root_fs(path)
        elif typ in ("lvmthin", "lvm"):
            shares = False  # a volume group's thin pool beside the root LV, not the root's filesystem
        else:
            shares = False
        content = tuple(sorted(x for x in c.get("content", "").split(",") if x))
        out.append(Storage(name, typ, active, total, avail, content, shared, pool, path, shares))
    return tuple(out)


def _on_root_fs(path: str | None) -> bool | None:
    """A dir storage without a mount of its own below it is on /'s filesystem (the facts carry no mount table
    beyond ZFS's, so a path under /mnt/ or /srv/ is taken as a separate disk)."""
    if not path:
        return None
    return not path.startswith(("/mnt/", "/media/", "/srv/"))


def parse_ha(text: str) -> list[tuple[str, str]]:
    """`ha-manager config`: `ct:100` / `vm:101` lines, tab-indented keys; state defaults to started."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        m = re.match(r"^((?:ct|vm):\d+)\s*$", line)
        if m:
            out.append((m.group(1), "started"))
        elif out and line.startswith(("\t", " ")):
            key, _, value = line.strip().partition(" ")
            if key == "state":
                out[-1] = (out[-1][0], value.strip())
    return out


def parse_members(text: str) -> tuple[str, ...]:
    try:
        data = json.loads(text)
    except ValueError:
        return ()
    return tuple(sorted((data.get("nodelist") or {}).keys()))


def parse_apt_sources(text: str) -> tuple[str, ...]:
    out = []
    for path, body in _head_files(text).items():
        for line in body.splitlines():
            s = line.strip()
            if s.startswith(("deb ", "deb-src ", "URIs:", "Suites:", "Enabled:")):
                out.append(f"{path}: {s}")
    return tuple(out)


def parse_apt_policy(text: str) -> tuple[AptPolicy, ...]:
    out = []
    current: dict[str, str | None] | None = None
    name = ""
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            if current is not None:
                out.append(AptPolicy(name, current.get("installed"), current.get("candidate")))
            name, current = line[:-1], {}
        elif current is not None:
            m = re.match(r"\s+(Installed|Candidate): (\S+)", line)
            if m:
                value = None if m.group(2) == "(none)" else m.group(2)
                current[m.group(1).lower()] = value
    if current is not None:
        out.append(AptPolicy(name, current.get("installed"), current.get("candidate")))
    return tuple(out)


def parse_apt_proxy(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        m = re.match(r'^(Acquire::\w+::Proxy(?:::[^ ]+)?) "(.*)";', line)
        if m and m.group(2) and m.group(2) != "DIRECT":
            out.append((m.group(1), m.group(2)))
    return out


def parse_env_proxy(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and value:
            out.append((key, value))
    return out


# rc 1 is an answer here (the file is absent: no marker, no .run install, no driver loaded, no PCI mapping,
# no EFI Secure Boot variable), not an unknown.
_ABSENT_IS_ANSWER = ("alternate_install", "runfile_uninstaller", "nvidia_version", "pci_mapping", "efi_secure_boot")


def raw_from_json(data: Mapping[str, Any]) -> dict[str, Raw]:
    return {k: Raw(int(v.get("rc", RC_ABSENT)), str(v.get("stdout", ""))) for k, v in data.items()
            if isinstance(v, Mapping)}


def parse_facts(host: str, raw: Mapping[str, Raw]) -> HostFacts:
    unknown = tuple(sorted(n for n in RAW_SOURCES if n not in raw
                           or (raw[n].rc != 0 and not (n in _ABSENT_IS_ANSWER and raw[n].rc == 1))))
    root = (_ok(raw, "root_mount") or "").split()
    root_source, root_fstype = (root[0], root[1]) if len(root) >= 2 else (None, None)
    lspci = parse_lspci(_ok(raw, "lspci") or "")
    minors = parse_gpu_minors(_ok(raw, "nvidia_gpus") or "")
    node = host
    hostpci = parse_qemu_hostpci(_ok(raw, "qemu_configs") or "")
    vm_map = vm_bus_ids(hostpci, parse_pci_mapping(_ok(raw, "pci_mapping") or ""), node)
    gpus = tuple(Gpu(bus_id=d["bus_id"], pci_id=d["pci_id"], pci_class=d["pci_class"], name=d["name"],
                     chip=d["chip"], driver=d["driver"], minor=minors.get(d["bus_id"]),
                     vms=tuple(sorted(vm_map.get(d["bus_id"], ()))))
                 for d in lspci if d["pci_class"] in GPU_CLASSES)
    smi = parse_nvidia_smi(_ok(raw, "nvidia_smi") or "")
    version_text = _ok(raw, "nvidia_version")
    loaded = None
    if version_text:
        m = re.search(r"Kernel Module(?: for [\w ]+)?\s+(\d+\.\d+(?:\.\d+)?)", version_text)
        loaded = m.group(1) if m else None
    if loaded is None and smi:
        loaded = smi[0][2]

    def flag(name: str) -> bool | None:
        r = raw.get(name)
        return None if r is None or r.rc not in (0, 1) else r.rc == 0



    driver = Driver(loaded_version=loaded, apt_packages=tuple(_dpkg_rows(_ok(raw, "driver_packages"))),
                    alternate_install_marker=flag("alternate_install"), runfile=flag("runfile_uninstaller"))
    proxies = [*parse_env_proxy(_ok(raw, "env_proxy") or ""), *parse_apt_proxy(_ok(raw, "apt_proxy") or "")]
    cmdline = _ok(raw, "cmdline")
    return HostFacts(
        host=host,
        schema=FACTS_SCHEMA,
        pve_version=parse_pveversion(_ok(raw, "pveversion") or ""),
        debian_suite=parse_os_release(_ok(raw, "os_release") or ""),
        kernels=parse_kernels(_ok(raw, "uname"), _ok(raw, "kernel_packages"), _ok(raw, "boot_kernels"),
                              _ok(raw, "default_kernel_depends")),
        secure_boot=parse_secure_boot(raw.get("mokutil"), raw.get("efi_secure_boot")),
        gpus=gpus,
        driver=driver,
        p2p=tuple(parse_topo_p2p(_ok(raw, "topo_p2p") or "", {i: b for i, b, _v, _n in smi})),
        vm_hostpci=tuple(hostpci),
        storages=parse_storages(_ok(raw, "pvesm"), _ok(raw, "storage_cfg"), root_source, root_fstype,
                                _ok(raw, "zfs")),
        root_source=root_source,
        root_fstype=root_fstype,
        ha_resources=tuple(parse_ha(_ok(raw, "ha") or "")),
        cluster_nodes=parse_members(_ok(raw, "members") or "{}"),
        apt_sources=parse_apt_sources(_ok(raw, "apt_sources") or ""),
        apt_policy=parse_apt_policy(_ok(raw, "apt_policy") or ""),
        proxies=tuple(proxies),
        kernel_cmdline=cmdline.strip() if cmdline else None,
        unknown=unknown,
    )
