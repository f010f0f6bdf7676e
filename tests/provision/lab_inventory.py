"""The lab's inventory with a test's own container in place of `ct` (its own vmid, address and model
cache), so provision tests leave the lab's `ct`, which the apply tests deploy into, alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


def own_container_inventory(lab: Any, directory: Path, vmid: int, name: str, **overrides: Any) -> Path:
    data = yaml.safe_load(Path(lab.inventory_path).read_text())
    cts = data["all"]["children"]["gpu_containers"]["hosts"]
    ct = dict(cts.pop("ct"))
    address = re.sub(r"\.\d+$", f".{vmid}", ct["ansible_host"])
    ct.update({"ansible_host": address, "lxc_gpu_container_vmid": vmid, "lxc_gpu_container_address": address,
               "lxc_gpu_container_net0": re.sub(r"ip=[\d.]+/", f"ip={address}/", ct["lxc_gpu_container_net0"]),
               **overrides})
    cts[name] = ct
    path = directory / f"lab-{name}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
