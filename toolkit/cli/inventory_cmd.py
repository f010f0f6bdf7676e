"""`toolkit inventory add NAME --address ...`: an inventory of one's own Proxmox hosts, written for the user.

Thin: parse, call toolkit.app.inventory, print what was written and the next commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="inventory_cmd", metavar="SUBCOMMAND")
    p = sub.add_parser("add", help="add a Proxmox host (and its GPU container) to an inventory, creating it",
                       description="Add a Proxmox host, reached over SSH as root, and with --vmid its GPU container, "
                       "to a YAML inventory in the playbooks' shape (default inventory/hosts.yml; created if "
                       "missing). A name or container id already there is refused.")
    p.add_argument("name", help="the Proxmox host's inventory name, e.g. pve1")
    p.add_argument("--address", required=True, help="where this machine reaches it over SSH (IP or host name)")
    p.add_argument("--vmid", type=int, help="the GPU container's id on that host (a free one)")
    p.add_argument("--ct-address", metavar="IP/PREFIX", help="the container's static address")
    p.add_argument("--gateway", metavar="IP", help="the container's gateway")
    p.add_argument("--bridge", default="vmbr0", help="the Proxmox bridge for the container (default vmbr0)")
    p.add_argument("--ssh-key", metavar="FILE", help="private key for root on the host (default: ssh's own)")
    p.add_argument("-i", "--inventory", type=Path, default=None,
                   help="the inventory file (default inventory/hosts.yml)")
    p.set_defaults(func=cmd_add)


def cmd_add(args: argparse.Namespace) -> int:
    from toolkit.app.inventory import add
    from toolkit.core.inventory import NewHost

    path, names = add(NewHost(name=args.name, address=args.address, vmid=args.vmid, ct_address=args.ct_address,
                              gateway=args.gateway, bridge=args.bridge, ssh_key=args.ssh_key), args.inventory)
    print(f"wrote {path}: added {', '.join(names)}")
    print(f"next: toolkit host provision {args.name} --containers -i {path}   (--check --diff first shows what "
          "would change)")
    return 0
