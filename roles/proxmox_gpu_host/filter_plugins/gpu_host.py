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


def host_gpus(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs the host keeps: not those vfio-pci holds for a VM (the NVIDIA driver never sees them)."""
    return [d for d in devices if d["gpu"] and d["driver"] != "vfio-pci"]


def open_module_fit(devices: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The host GPUs the open modules cannot drive (pre_turing) and those only they can (blackwell), by slot."""
    gpus = host_gpus(devices)
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
            "open_module_fit": open_module_fit,
            "kernel_sort": kernel_sort,
            "kernel_series": kernel_series,
            "apt_missing": apt_missing,
        }
