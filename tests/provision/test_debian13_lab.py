"""A container from Proxmox's other standard template, debian-13-standard (CPython 3.13, glibc 2.41), end
to end in the strict lab: `toolkit host reproduce` makes it from the template `pveam available` lists,
the userspace role brings trixie's python3-venv, patch and compiler from the controller's debhouse, and
apply installs SGLang from the wheelhouse's cp313 wheels and starts the unit. A second reproduce changes
nothing. Its own container (vmid 152, host `ct-deb13`), so the lab's `ct` is left alone. Its net0 is the
role's default (ip=dhcp): trixie's dhcpcd gets the address the lab's DHCP server keeps for `ct-deb13`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.provision.lab_inventory import own_container_inventory
from toolkit.lab import system
from toolkit.lab.template import APPLIANCES

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VMID = 152
CT = "ct-deb13"
ROLE_DEFAULT_NET0 = yaml.safe_load((REPO / "roles/lxc_gpu_container/defaults/main.yml").read_text())[
    "lxc_gpu_container_net0"]
PATTERN = r"^debian-13-standard_[0-9.]+-[0-9]+_amd64\.tar\.zst$"


def pve(lab: Any, command: str) -> str:
    proc = lab.ssh("pve1", command, timeout_s=300)
    assert proc.returncode == 0, f"{command}: {proc.stdout}\n{proc.stderr}"
    return str(proc.stdout)


def reproduce(inv: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "toolkit", "host", "reproduce", "pve1", "--profile", "glm5-tp8",
                           "-i", str(inv), "--json"], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    print("reproduce from debian-13-standard:", report["duration_s"], "s;",
          ", ".join(f"{r.get('playbook', 'apply')} {r['duration_s']} s" for r in report["runs"]))
    return report


def changed(report: dict[str, Any]) -> dict[str, int]:
    """Changed tasks per run: facts.yml (the plan's read) and host.yml by pve1; containers_preflight.yml,
    container.yml and apply by the container."""
    out = {}
    for run in report["runs"]:
        if "playbook" in run:
            host = "pve1" if run["playbook"] in ("facts.yml", "host.yml") else CT
            out[run["playbook"]] = run["hosts"][host]["changed"]
        else:
            out["apply"] = run["summary"]["hosts"][CT]["changed"]
    return out


@pytest.fixture(scope="module")
def inv(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = own_container_inventory(lab, tmp_path_factory.mktemp("inv"), VMID, CT,
                                   lxc_gpu_container_template_pattern=PATTERN,
                                   lxc_gpu_container_net0=ROLE_DEFAULT_NET0)
    host = yaml.safe_load(path.read_text())["all"]["children"]["gpu_containers"]["hosts"][CT]
    system.reserve_dhcp_address(CT, host["lxc_gpu_container_address"])
    return path


def test_reproduce_from_debian_13_standard_then_no_change(lab: Any, inv: Path) -> None:
    pve(lab, f"if [ -f /etc/pve/lxc/{VMID}.conf ]; then pct destroy {VMID} --force 1; fi")
    first = changed(reproduce(inv))
    assert first["container.yml"] > 0 and first["apply"] > 0, first

    # The role resolved the pattern against `pveam available` and downloaded that template (pct keeps no
    # ostemplate key in the config, as real pct does not).
    assert APPLIANCES["trixie"].file_name in pve(lab, "pveam list local")
    ct = f"pct exec {VMID} --"
    assert pve(lab, f"{ct} sh -c '. /etc/os-release; echo $VERSION_ID'").strip() == "13"
    assert "ip=dhcp" in pve(lab, f"pct config {VMID}")  # reached at its DHCP address, not one LXC set
    assert "inet dhcp" in pve(lab, f"{ct} cat /etc/network/interfaces")
    # The venv is the container's own CPython 3.13 with the wheelhouse's cp313 wheels (numpy, pydantic-core).
    probe = ("import sys, numpy, pydantic_core, importlib.metadata as m; "
             "print('%d.%d' % sys.version_info[:2], m.version('sglang'))")
    assert pve(lab, f"{ct} /opt/sglang/venv/bin/python -c \"{probe}\"").split() == ["3.13", "0.5.9"]
    assert pve(lab, f"{ct} systemctl is-active sglang").strip() == "active"
    # What the template lacks came from the debhouse built for trixie, not bookworm's packages.
    versions = pve(lab, f"{ct} dpkg-query -W -f '${{Package}} ${{Version}}\\n' python3.13-venv patch gcc")
    assert len(versions.splitlines()) == 3, versions
    assert "+deb12" not in versions, versions

    again = changed(reproduce(inv))
    assert again == {"facts.yml": 0, "containers_preflight.yml": 0, "host.yml": 0, "container.yml": 0,
                     "apply": 0}, again
