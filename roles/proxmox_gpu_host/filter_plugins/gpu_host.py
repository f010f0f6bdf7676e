"""Filters for the Proxmox GPU host (role proxmox_gpu_host). Pure functions of text and data.

The role must run on a controller with only Ansible installed, so these parsers are the role's own.
"""

from __future__ import annotations

import re
from typing import Any

_SLOT = re.compile(r"^(?P<slot>\S+) .*\[(?P<class>[0-9a-f]{4})\]: .*\[10de:(?P<device>[0-9a-f]{4})\]", re.I)
# NVIDIA PCI device ids by architecture: everything below 0x1e00 is before Turing (Maxwell 0x13xx/0x17xx,
# Pascal 0x15xx-0x1dxx, Volta 0x1d81/0x1dbx), which the open kernel modules do not drive (no GSP); from
# 0x2900 on Blackwell (GB100 0x2901, GB202 0x2b85, GB203 0x2c02, GB206 0x2d04, GB207 0x2d83), which only the
# open modules drive. Turing (TU102 0x1e02), Ampere, Hopper (GH100 0x2330) and Ada (AD107 up to 0x28e3) work
# with both (open-gpu-kernel-modules README, "Compatible GPUs"; nvidia-installer kernel.c).
TURING_FIRST_DEVICE_ID = 0x1E00
BLACKWELL_FIRST_DEVICE_ID = 0x2900


def lspci_nvidia(text: str) -> list[dict[str, Any]]:
    """`lspci -nnk -d 10de:` -> one dict per NVIDIA function: slot, class ("0302"), device_id (int), driver
    (the `Kernel driver in use:` line, '' when none), gpu (a VGA or 3D controller), nvswitch (a bridge of
    class 0680). Plain `lspci -nn` output parses too, with no drivers."""
    devices: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            key, _, value = line.strip().partition(":")
            if devices and key == "Kernel driver in use":
                devices[-1]["driver"] = value.strip()
            continue
        m = _SLOT.match(line)
        if not m:
            continue
        cls = m.group("class").lower()
        devices.append({"slot": m.group("slot"), "class": cls, "device_id": int(m.group("device"), 16),
                        "driver": "", "gpu": cls in ("0300", "0302"), "nvswitch": cls == "0680"})
    return devices


def bus_id(slot: str) -> str:
    """A PCI address as `lspci -D` and /proc/driver/nvidia/gpus/ write it (0000:81:00.0, lower case), from lspci's
    slot (81:00.0), nvidia-smi's pci.bus_id (00000000:81:00.0) or a hostpci id (0000:81:00, every function)."""
    parts = slot.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2]}"


def vm_hostpci(grep_lines: list[str], mapping_cfg: str = "", node: str = "", more: list[str] | None = None
               ) -> dict[str, str]:
    """The PCI devices the node's VMs take when they start: bus id (or a device's `0000:81:00` for all its
    functions) -> "VM vmid", from `grep -rH ^hostpci /etc/pve/qemu-server/` lines (path:hostpciN: value, as
    qemu-server writes them: `0000:81:00.0,pcie=1`, ids joined by `;`, or `mapping=NAME`) and
    /etc/pve/mapping/pci.cfg (a NAME's `map` lines of this node, `path=` ids joined by `;`); `more`: bus ids
    known otherwise (the plan's)."""
    maps: dict[str, list[str]] = {}
    name = ""
    for line in mapping_cfg.splitlines():
        if line and not line[0].isspace():
            name = line.strip()
        elif line.strip().startswith("map ") and name:
            fields = dict(kv.split("=", 1) for kv in line.split()[1].split(",") if "=" in kv)
            if not node or fields.get("node") == node:
                maps.setdefault(name, []).extend(fields.get("path", "").split(";"))
    taken: dict[str, str] = {}
    for line in grep_lines:
        path, _, rest = line.partition(":")
        key, _, value = rest.partition(":")
        if not re.fullmatch(r"hostpci\d+", key.strip()):
            continue
        vmid = path.rsplit("/", 1)[-1].removesuffix(".conf")
        first = value.strip().split(",")[0]
        ids = maps.get(first.removeprefix("mapping="), []) if first.startswith("mapping=") else first.split(";")
        for pci in filter(None, (i.strip() for i in ids)):
            taken[pci.lower() if pci.count(":") == 2 else f"0000:{pci.lower()}"] = f"VM {vmid}"
    for pci in more or []:
        taken.setdefault(bus_id(pci), "a VM (the plan)")
    return taken


def in_vm(slot: str, vm_devices: dict[str, str] | list[str]) -> str:
    """The VM that names this GPU (by its function or its whole device), '' when none."""
    bus = bus_id(slot)
    for pci in vm_devices:
        if bus == pci or bus.rsplit(".", 1)[0] == pci:
            return vm_devices[pci] if isinstance(vm_devices, dict) else "a VM"
    return ""


def host_gpus(devices: list[dict[str, Any]], vm_devices: dict[str, str] | list[str] | None = None
              ) -> list[dict[str, Any]]:
    """The GPUs the host keeps: not those vfio-pci holds for a VM (the NVIDIA driver never sees them), nor those
    a VM's hostpci names (qemu-server takes them from whatever driver holds them when the VM starts)."""
    return [d for d in devices if d["gpu"] and d["driver"] != "vfio-pci" and not in_vm(d["slot"], vm_devices or {})]


def vm_gpus_not_on_vfio(devices: list[dict[str, Any]], vm_devices: dict[str, str] | list[str]) -> list[str]:
    """GPUs a VM names that a host driver holds (not vfio-pci), as "81:00.0 (VM 200, nvidia)"."""
    out = []
    for d in devices:
        vm = in_vm(d["slot"], vm_devices) if d["gpu"] else ""
        if vm and d["driver"] != "vfio-pci":
            out.append(f"{d['slot']} ({vm}, {d['driver'] or 'no driver'})")
    return out


def gpu_minors(grep_lines: list[str]) -> dict[int, str]:
    """device minor -> bus id, from `grep -r "^Device Minor:" /proc/driver/nvidia/gpus/` lines
    (.../gpus/0000:01:00.0/information:Device Minor: \t 0): the driver's minor of each GPU it drives, which is
    neither nvidia-smi's index (bus order) nor stable across a GPU unbound at run time."""
    out: dict[int, str] = {}
    for line in grep_lines:
        m = re.match(r"^.*/gpus/([0-9a-fA-F:.]+)/information:Device Minor:\s*(\d+)", line)
        if m:
            out[int(m.group(2))] = bus_id(m.group(1))
    return out


def container_gpu_buses(conf_lines: list[str], minor_lines: list[str]) -> list[str]:
    """The bus ids of the GPUs containers' configs pass (devN: /dev/nvidiaN, or raw `c 195:N` rules), from their
    lines and the driver's minors (gpu_minors)."""
    minors = gpu_minors(minor_lines)
    found = []
    for line in conf_lines:
        m = re.search(r"^dev\d+:\s*/dev/nvidia(\d+)\b", line.strip()) or \
            re.search(r"devices\.allow\s*[:=]\s*c\s+195:(\d+)\s", line)
        if m and int(m.group(1)) in minors:
            found.append(minors[int(m.group(1))])
    return sorted(set(found))


def power_kept(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs whose limit after this run is not their default: what the boot unit must set again."""
    return [g for g in gpus if abs(float(g["kept"]) - float(g["default"])) > 0.005]


def open_module_fit(devices: list[dict[str, Any]], vm_devices: dict[str, str] | list[str] | None = None
                    ) -> dict[str, list[str]]:
    """The host GPUs the open modules cannot drive (pre_turing) and those only they can (blackwell), by slot."""
    gpus = host_gpus(devices, vm_devices)
    return {"pre_turing": [d["slot"] for d in gpus if d["device_id"] < TURING_FIRST_DEVICE_ID],
            "blackwell": [d["slot"] for d in gpus if d["device_id"] >= BLACKWELL_FIRST_DEVICE_ID]}


def kernel_version_key(release: str) -> list[Any]:
    """Sort key for kernel releases (6.8.12-4-pve < 6.8.12-10-pve < 6.14.8-2-bpo12-pve), numbers as numbers,
    as the bootloader orders its entries (the newest boots by default)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.-]", release)]


def kernel_sort(releases: list[str]) -> list[str]:
    return sorted(releases, key=kernel_version_key)


def kernel_series(release: str) -> str:
    """6.8.12-9-pve -> 6.8: the series whose meta packages (proxmox-kernel-6.8, proxmox-headers-6.8) follow it."""
    return ".".join(release.split(".")[:2])


def apt_missing(dpkg_query: str, wanted: list[str]) -> list[str]:
    """The packages of `wanted` ("name" or "name=version") that are not installed at that version, from
    `dpkg-query -W -f '${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' NAMES` output."""
    installed: dict[str, str] = {}
    for line in dpkg_query.splitlines():
        parts = line.split("\t")
        # db:Status-Abbrev: the wanted state (i install, h hold, ...), then the current one: i is installed.
        if len(parts) >= 3 and len(parts[1]) >= 2 and parts[1][1] == "i" and parts[1][2:3] in ("", " "):
            installed[parts[0].strip()] = parts[2].strip()
    missing = []
    for item in wanted:
        name, _, version = item.partition("=")
        if name not in installed or (version and installed[name] != version):
            missing.append(item)
    return missing


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "lspci_nvidia": lspci_nvidia,
            "host_gpus": host_gpus,
            "bus_id": bus_id,
            "gpu_minors": gpu_minors,
            "container_gpu_buses": container_gpu_buses,
            "power_kept": power_kept,
            "vm_hostpci": vm_hostpci,
            "vm_gpus_not_on_vfio": vm_gpus_not_on_vfio,
            "open_module_fit": open_module_fit,
            "kernel_sort": kernel_sort,
            "kernel_series": kernel_series,
            "apt_missing": apt_missing,
        }
