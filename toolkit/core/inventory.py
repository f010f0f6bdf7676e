"""An inventory written for the user: `toolkit inventory add pve1 --address ...` (pure: a document in, the
document with the host added out).

The shape is the playbooks' (inventory/lab.example.yml): the Proxmox hosts in `proxmox_hosts`, one inventory host
per GPU container in `gpu_containers`, tied to its Proxmox host by `lxc_gpu_container_proxmox_host`. A name or a
container id that is already there is refused rather than changed: the file may be the user's since.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from toolkit.core.errors import ToolkitError

HEADER = ("# Written by `toolkit inventory add`; edit it freely (Ansible's YAML inventory: the shape of\n"
          "# inventory/lab.example.yml without the lab's variables; docs/provision.md says what each variable does).\n")


@dataclass(frozen=True)
class NewHost:
    name: str
    address: str
    vmid: int | None = None
    ct_address: str | None = None  # IP/PREFIX
    gateway: str | None = None
    bridge: str = "vmbr0"
    ssh_key: str | None = None


def _groups(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    all_ = doc.setdefault("all", {}) or {}
    doc["all"] = all_
    children = all_.setdefault("children", {}) or {}
    all_["children"] = children
    hosts = children.setdefault("proxmox_hosts", {}) or {}
    children["proxmox_hosts"] = hosts
    cts = children.setdefault("gpu_containers", {}) or {}
    children["gpu_containers"] = cts
    return all_, hosts.setdefault("hosts", {}) or {}, cts.setdefault("hosts", {}) or {}


def container_name(new: NewHost) -> str:
    return f"{new.name}-ct{new.vmid}"


def add_host(doc: dict[str, Any] | None, new: NewHost, *, file: str) -> dict[str, Any]:
    """`doc` with the Proxmox host `new` (and its container, where a vmid is given) added."""
    doc = dict(doc or {})
    all_, hosts, cts = _groups(doc)
    doc["all"]["children"]["proxmox_hosts"]["hosts"] = hosts
    doc["all"]["children"]["gpu_containers"]["hosts"] = cts
    if new.name in hosts:
        raise ToolkitError.of(f"{new.name} is already in the inventory", file=file, field="NAME",
                              fix="give another name, or edit the file")
    try:
        ipaddress.ip_address(new.address)
    except ValueError:
        if not new.address or any(c.isspace() for c in new.address):
            raise ToolkitError.of(f"{new.address!r} is no address or host name", field="--address",
                                  fix="the address this machine reaches the Proxmox host at over SSH") from None
    vars_ = all_.setdefault("vars", {}) or {}
    all_["vars"] = vars_
    vars_.setdefault("ansible_user", "root")
    vars_.setdefault("ansible_python_interpreter", "/usr/bin/python3")
    host: dict[str, Any] = {"ansible_host": new.address}
    if new.ssh_key:
        host["ansible_ssh_private_key_file"] = new.ssh_key
    hosts[new.name] = host
    if new.vmid is None:
        return doc
    if not 100 <= new.vmid <= 999_999_999:
        raise ToolkitError.of(f"{new.vmid} is no Proxmox container id", field="--vmid",
                              fix="a free id from 100 up (`pvesh get /cluster/nextid` on the host gives one)")
    taken = [n for n, h in cts.items() if (h or {}).get("lxc_gpu_container_vmid") == new.vmid
             and (h or {}).get("lxc_gpu_container_proxmox_host") == new.name]
    if taken:
        raise ToolkitError.of(f"container id {new.vmid} on {new.name} is {taken[0]}'s already", file=file,
                              field="--vmid", fix="give a free id")
    ct: dict[str, Any] = {"lxc_gpu_container_proxmox_host": new.name, "lxc_gpu_container_vmid": new.vmid}
    if new.ct_address:
        try:
            iface = ipaddress.ip_interface(new.ct_address)
        except ValueError:
            raise ToolkitError.of(f"{new.ct_address!r} is not IP/PREFIX", field="--ct-address",
                                  fix="e.g. --ct-address 192.0.2.50/24 --gateway 192.0.2.1") from None
        if "/" not in new.ct_address:
            raise ToolkitError.of(f"{new.ct_address!r} has no prefix length", field="--ct-address",
                                  fix=f"e.g. --ct-address {new.ct_address}/24")
        if not new.gateway:
            raise ToolkitError.of("a static container address needs its gateway", field="--gateway",
                                  fix="e.g. --gateway 192.0.2.1 (the Proxmox bridge's router)")
        ct["ansible_host"] = str(iface.ip)
        ct["lxc_gpu_container_net0"] = (f"name=eth0,bridge={new.bridge},ip={iface.with_prefixlen},"
                                        f"gw={new.gateway},type=veth")
    else:
        raise ToolkitError.of("the container needs an address this machine reaches it at", field="--ct-address",
                              fix="give --ct-address IP/PREFIX --gateway IP (DHCP leaves its address unknown "
                              "to Ansible)")
    cts[container_name(new)] = ct
    return doc
