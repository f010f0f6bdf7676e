"""Filters for Proxmox container configs (role lxc_gpu_container). Pure functions of text and data.

Jinja cannot compare Proxmox property strings (`name=eth0,bridge=vmbr0,hwaddr=...`) by meaning, and
Proxmox rewrites them (adds hwaddr, reorders), so a string compare would report a change on every run.
"""

from __future__ import annotations

import re
from typing import Any

# Ansible runs from the toolkit's own environment, so the one /proc/devices parser (also used by doctor) is shared.
from toolkit.core.doctor import char_majors as proc_devices_majors
from toolkit.core.doctor import nvidia_majors

_DEV_KEY = re.compile(r"^dev(\d+)$")
_ALLOW = re.compile(r"^c (\d+):(\*|\d+) [rwm]+$")
# Keys whose value is a property string, with the name of the first, bare item.
_PROP_DEFAULT = {"net": "name", "mp": "volume", "dev": "path", "rootfs": "volume", "features": "", "startup": "order"}


def pve_config_parse(text: str) -> dict[str, Any]:
    """`pct config` output or /etc/pve/lxc/VMID.conf -> {"options": {key: value}, "raw": [[key, value]]}.

    Stops at the first `[section]` (snapshots, pending): those are not the running config.
    """
    options: dict[str, str] = {}
    raw: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("["):
            break
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key.startswith("lxc."):
            raw.append([key, value])
        else:
            options[key] = value
    return {"options": options, "raw": raw}


def pve_props(value: str, default_key: str = "") -> dict[str, str]:
    props: dict[str, str] = {}
    for i, part in enumerate(p for p in value.split(",") if p):
        if "=" in part:
            k, _, v = part.partition("=")
            props[k.strip()] = v.strip()
        elif i == 0:
            props[default_key] = part.strip()
    return props


def _family(key: str) -> str:
    return re.sub(r"\d+$", "", key)


def _same(key: str, current: str, desired: str) -> bool:
    family = _family(key)
    if family not in _PROP_DEFAULT:
        return current.strip() == desired.strip()
    cur, want = pve_props(current, _PROP_DEFAULT[family]), pve_props(desired, _PROP_DEFAULT[family])
    # Proxmox adds what the author left out (net: hwaddr, type=veth; dev: nothing): compare what was asked.
    return all(cur.get(k) == v for k, v in want.items())


def pve_config_changes(current: dict[str, Any], desired: dict[str, str], owned_dev_paths: str = r"^/dev/nvidia") -> dict[str, Any]:
    """What `pct set` must do: {"set": {key: value}, "delete": [key]}.

    Keys in `desired` that differ by meaning are set (a net's existing hwaddr is kept, so the MAC does
    not change). devN entries not desired whose path matches `owned_dev_paths` are deleted: the role
    owns the GPU nodes' entries, nothing else.
    """
    opts = current.get("options", {})
    to_set: dict[str, str] = {}
    for key, value in desired.items():
        value = str(value)
        if key in opts and _same(key, opts[key], value):
            continue
        if _family(key) == "net" and key in opts:
            hwaddr = pve_props(opts[key], "name").get("hwaddr")
            if hwaddr and "hwaddr=" not in value:
                value = f"{value},hwaddr={hwaddr}"
        to_set[key] = value
    owned = re.compile(owned_dev_paths)
    delete = sorted(
        (k for k, v in opts.items() if _DEV_KEY.match(k) and k not in desired and owned.search(pve_props(v, "path").get("path", ""))),
        key=lambda k: int(k[3:]),
    )
    return {"set": to_set, "delete": delete}


def stale_raw_lines(raw: list[list[str]], desired: list[list[str]], proc_devices: str) -> list[list[str]]:
    """Raw lxc lines to remove: GPU node bind mounts and device allow rules not in `desired` whose major
    is an NVIDIA major or registered by nothing at all (a stale hard-coded number from an older driver load)."""
    majors = proc_devices_majors(proc_devices)
    registered = set(majors.values())
    ours = set(nvidia_majors(proc_devices).values())
    want = {(k, v) for k, v in desired}
    stale: list[list[str]] = []
    for key, value in raw:
        if (key, value) in want:
            continue
        if key.endswith(".devices.allow"):
            m = _ALLOW.match(value)
            if m and (int(m.group(1)) in ours or int(m.group(1)) not in registered):
                stale.append([key, value])
        elif key == "lxc.mount.entry" and value.split(" ", 1)[0].startswith("/dev/nvidia"):
            stale.append([key, value])
    return stale


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "pve_config_parse": pve_config_parse,
            "pve_props": pve_props,
            "pve_config_changes": pve_config_changes,
            "proc_devices_majors": proc_devices_majors,
            "nvidia_majors": nvidia_majors,
            "stale_raw_lines": stale_raw_lines,
        }
