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


def pvesm_status(text: str) -> list[dict[str, Any]]:
    """`pvesm status` -> [{name, type, status, total_gib, used_gib, avail_gib}]: the columns as pve-storage's
    pvesm prints them (KiB; PVE 9 says so in the headings, PVE 8 does not)."""
    rows = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 6 or not parts[3].isdigit():
            continue
        rows.append({"name": parts[0], "type": parts[1], "status": parts[2],
                     "total_gib": round(int(parts[3]) / 1024**2, 1), "used_gib": round(int(parts[4]) / 1024**2, 1),
                     "avail_gib": round(int(parts[5]) / 1024**2, 1)})
    return rows


def pve_rootfs_storage(storages: list[dict[str, Any]], wanted: str) -> str:
    """The storage for a new container's root filesystem: the one asked for, else the active one (of those
    `pvesm status --content rootdir` lists) with the most room; '' when there is none."""
    if wanted:
        return wanted
    active = [s for s in storages if s["status"] == "active"]
    return max(active, key=lambda s: s["avail_gib"])["name"] if active else ""


def pve_model_cache(current: dict[str, Any], key: str, mount_path: str, storage: str, size_gib: int,
                    host_dir: str) -> dict[str, Any]:
    """The model cache's mount point: {"value": KEY's property string, "new_storage": the storage a new volume
    is allocated on ('' for none), "host_dir": a bind mount's host directory ('' for none), "resize_gib": the
    size an existing volume must grow to (0: none)}.

    host_dir given: that directory, bind-mounted (kept across rebuilds). Otherwise a volume of size_gib on
    `storage` (`STORAGE:SIZE`, Proxmox allocates and names it). A cache already mounted at `mount_path` under
    KEY is kept when nothing else was asked for (storage empty: an upgrade never moves a cache full of weights)
    or when it is already a volume on `storage`; a smaller volume is grown, never shrunk."""
    opts = current.get("options", {})
    existing = pve_props(opts.get(key, ""), "volume") if key in opts else {}
    same_path = existing.get("mp") == mount_path
    volume = existing.get("volume", "")
    if host_dir:
        if same_path and volume == host_dir:
            return {"value": opts[key], "new_storage": "", "host_dir": "", "resize_gib": 0}
        return {"value": f"{host_dir},mp={mount_path}", "new_storage": "", "host_dir": host_dir, "resize_gib": 0}
    is_volume = bool(volume) and not volume.startswith("/")
    if same_path and (not storage or (is_volume and volume.split(":", 1)[0] == storage)):
        have = _size_gib(existing.get("size", ""))
        grow = size_gib if is_volume and have and have < size_gib else 0
        return {"value": opts[key], "new_storage": "", "host_dir": "", "resize_gib": grow}
    return {"value": f"{storage}:{size_gib},mp={mount_path},backup=0", "new_storage": storage, "host_dir": "",
            "resize_gib": 0}


def _size_gib(size: str) -> float:
    """A Proxmox size string (500G, 1T, 512M) in GiB; 0 when absent or unreadable."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", size.strip())
    if not m:
        return 0.0
    return float(m.group(1)) * {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1, "T": 1024, "": 1 / 1024**3}[m.group(2)]


def raw_allow_rules(node_numbers: str) -> list[str]:
    """`stat -c '%n %t %T' NODES` (name, major and minor in hex) -> one `c MAJ:MIN rwm` rule per node: a
    privileged container given `c 195:* rwm` may make and open every GPU's node (libcuda's setuid
    nvidia-modprobe makes missing ones), so a per-minor rule is what isolates `gpus: [0]`."""
    rules: list[str] = []
    for line in node_numbers.splitlines():
        parts = line.split()
        if len(parts) == 3:
            rule = f"c {int(parts[1], 16)}:{int(parts[2], 16)} rwm"
            if rule not in rules:
                rules.append(rule)
    return rules


_BUS = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _bus_id(text: str) -> str:
    parts = text.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2]}"


def gpu_selection(asked: Any, smi_lines: list[str], minor_lines: list[str], nodes: list[int] | None = None
                  ) -> dict[str, Any]:
    """Which host GPUs a container gets, as device minors (the /dev/nvidiaN to pass). `asked`: "all", or a list of
    PCI bus ids (0000:81:00.0, as lspci -D prints them) or nvidia-smi indices (0..n-1 in PCI bus order, what
    `nvidia-smi -i N` shows; CUDA_DEVICE_ORDER=PCI_BUS_ID gives CUDA the same order). A GPU's minor is neither: the
    driver's slot at probe, read from /proc/driver/nvidia/gpus/BUS/information ("Device Minor"), here as `grep -r
    "^Device Minor:"` lines; `smi_lines`: `nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`.
    Without the driver's list, `nodes` (the /dev/nvidiaN numbers) stand for the GPUs. Returns minors (sorted), buses
    (same order), missing (what was asked and is not a GPU the driver drives) and host (the driven GPUs, "index bus
    (/dev/nvidiaN)")."""
    minors: dict[str, int] = {}
    for line in minor_lines:
        m = re.match(r"^.*/gpus/([0-9a-fA-F:.]+)/information:Device Minor:\s*(\d+)", line)
        if m:
            minors[_bus_id(m.group(1))] = int(m.group(2))
    by_index: dict[str, str] = {}
    for line in smi_lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit() and _bus_id(cells[1]) in minors:
            by_index[cells[0]] = _bus_id(cells[1])
    if not minors and nodes:
        # No driver lists its GPUs (nodes made before it loads, as the lab's flavour `lab` has them): the nodes are
        # all there is to go by, numbered as they are.
        minors = {f"/dev/nvidia{n}": n for n in nodes}
        by_index = {str(n): f"/dev/nvidia{n}" for n in sorted(nodes)}
    if asked == "all":
        wanted = list(by_index.values())
        missing: list[str] = []
    else:
        wanted, missing = [], []
        for item in asked if isinstance(asked, list) else [asked]:
            text = str(item).strip()
            bus = by_index.get(text) if text.isdigit() else (_bus_id(text) if _BUS.match(text) else None)
            if bus is None or bus not in minors or bus not in by_index.values():
                missing.append(text)
            elif bus not in wanted:
                wanted.append(bus)
    chosen = sorted(wanted, key=lambda b: minors[b])
    return {"minors": [minors[b] for b in chosen], "buses": chosen, "missing": missing,
            "host": [f"{i} {b} (/dev/nvidia{minors[b]})" for i, b in sorted(by_index.items(), key=lambda x: int(x[0]))]}


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
            "pvesm_status": pvesm_status,
            "pve_rootfs_storage": pve_rootfs_storage,
            "pve_model_cache": pve_model_cache,
            "raw_allow_rules": raw_allow_rules,
            "gpu_selection": gpu_selection,
        }
