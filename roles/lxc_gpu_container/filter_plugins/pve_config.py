"""Filters for Proxmox container configs (role lxc_gpu_container). Pure functions of text and data.

Jinja cannot compare Proxmox property strings (`name=eth0,bridge=vmbr0,hwaddr=...`) by meaning, and
Proxmox rewrites them (adds hwaddr, reorders), so a string compare would report a change on every run.
"""

from __future__ import annotations

import re
from typing import Any


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


def _merge(key: str, current: str, desired: str) -> str:
    """The desired property string with every key of the current one the role does not set kept:
    `pct set --features nesting=1` would drop `keyctl=1`, `--net0 ...` the user's firewall, tag, mtu
    and rate (Proxmox replaces the whole string)."""
    family = _family(key)
    if family not in _PROP_DEFAULT:
        return desired
    default = _PROP_DEFAULT[family]
    cur, want = pve_props(current, default), pve_props(desired, default)
    if default and cur.get(default, want.get(default)) != want.get(default):
        return desired  # another volume, path or interface name: not the same thing to merge with
    merged = dict(want)
    merged.update({k: v for k, v in cur.items() if k not in want})
    items = []
    for k, v in merged.items():
        bare = k == default and default and family != "net"  # net's first item is `name=eth0`
        items.insert(0, v) if bare else items.append(f"{k}={v}")
    return ",".join(items)


def pve_config_changes(current: dict[str, Any], desired: dict[str, str], owned_dev_paths: str = r"^/dev/nvidia") -> dict[str, Any]:
    """What `pct set` must do: {"set": {key: value}, "delete": [key]}.

    Keys in `desired` that differ by meaning are set, merged into what is there (a net's hwaddr,
    firewall or tag, other features are kept). devN entries not desired whose path matches
    `owned_dev_paths` are deleted: the role owns the GPU nodes' entries, nothing else.
    """
    opts = current.get("options", {})
    to_set: dict[str, str] = {}
    for key, value in desired.items():
        value = str(value)
        if key in opts and _same(key, opts[key], value):
            continue
        to_set[key] = _merge(key, opts[key], value) if key in opts else value
    owned = re.compile(owned_dev_paths)
    delete = sorted(
        (k for k, v in opts.items() if _DEV_KEY.match(k) and k not in desired and owned.search(pve_props(v, "path").get("path", ""))),
        key=lambda k: int(k[3:]),
    )
    return {"set": to_set, "delete": delete}


def pve_dev_entries(current: dict[str, Any], nodes: list[str], props: str, start: int = 0) -> dict[str, str]:
    """devN keys for the nodes to pass through: a node already passed through keeps its key; a new
    one takes the lowest free index from `start` up, so no user's own devN is overwritten."""
    opts = current.get("options", {})
    by_path = {pve_props(v, "path").get("path"): k for k, v in opts.items() if _DEV_KEY.match(k)}
    used = {int(m.group(1)) for k in opts if (m := _DEV_KEY.match(k))}
    out: dict[str, str] = {}
    index = start
    for node in nodes:
        key = by_path.get(node)
        if key is None:
            while index in used:
                index += 1
            key = f"dev{index}"
            used.add(index)
        out[key] = f"{node}{props}"
    return out


def pve_pending(text: str) -> dict[str, Any]:
    """`pct pending` (GuestHelpers format_pending): {"new": {key: value}, "delete": [key]}."""
    new: dict[str, str] = {}
    delete: list[str] = []
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        key, _, value = rest.partition(": ")
        if kind == "new":
            new[key] = value
        elif kind == "del":
            delete.append(key)
    return {"new": new, "delete": delete}


def proc_devices_majors(proc_devices: str) -> dict[str, int]:
    """/proc/devices -> {character device name: major} (the first major of a name that appears twice).

    The role must run on a controller without the toolkit installed, so the parser is the role's own;
    the toolkit's doctor keeps its own, and a test feeds both the same texts so they cannot drift."""
    majors: dict[str, int] = {}
    section = ""
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            section = line[:-1].strip()
            continue
        parts = line.split()
        if section == "Character devices" and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def nvidia_majors(proc_devices: str) -> dict[str, int]:
    """The NVIDIA majors a container's passthrough needs: {"nvidia", "uvm", "caps"}, those registered.
    `nvidia-frontend` is the name the driver registers when its multi-module frontend is loaded."""
    m = proc_devices_majors(proc_devices)
    out = {}
    nvidia = m.get("nvidia-frontend", m.get("nvidia"))
    if nvidia is not None:
        out["nvidia"] = nvidia
    if "nvidia-uvm" in m:
        out["uvm"] = m["nvidia-uvm"]
    if "nvidia-caps" in m:
        out["caps"] = m["nvidia-caps"]
    return out


def _version_key(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def pve_latest_template(available: str, pattern: str) -> str:
    """The newest template in `pveam available` output whose name matches `pattern` (versions
    compared as numbers: 12.12-1 is newer than 12.7-1); '' when none does."""
    names = [line.split()[-1] for line in available.splitlines() if line.split() and re.search(pattern, line.split()[-1])]
    return max(names, key=_version_key) if names else ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "pve_config_parse": pve_config_parse,
            "pve_props": pve_props,
            "pve_config_changes": pve_config_changes,
            "proc_devices_majors": proc_devices_majors,
            "nvidia_majors": nvidia_majors,
            "pve_dev_entries": pve_dev_entries,
            "pve_pending": pve_pending,
            "pve_latest_template": pve_latest_template,
        }
