"""A container from Proxmox's other standard template, debian-13-standard (CPython 3.13, glibc 2.41), end
to end in the strict lab: `toolkit host reproduce` makes it from the template `pveam available` lists,
the userspace role brings trixie's python3-venv, patch and compiler from the controller's debhouse, and
apply refuses to install the engine there before it changes anything: SGLang 0.5.9's engine cannot be locked
for CPython 3.13 (outlines 0.1.11 pins outlines_core 0.1.26, which has no cp313 wheel on the index:
profiles/requirements/sglang-0.5.9-cp313.lock.refused), and the refusal says so. A second reproduce
changes nothing and refuses the same way. Its own container (vmid 152, host `ct-deb13`), so the lab's `ct`
is left alone. Its net0 is the role's default (ip=dhcp): trixie's dhcpcd gets the address the lab's DHCP server
keeps for `ct-deb13`.
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
    """The reproduce's report; its deploy refused the CPython 3.13 container, naming the lock's refusal."""
    proc = subprocess.run([sys.executable, "-m", "toolkit", "host", "reproduce", "pve1", "--profile", "glm5-tp8",
                           "-i", str(inv), "--json"], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 1, proc.stderr[-4000:]
    said = proc.stdout + proc.stderr
    assert "CPython 3.13" in said and "outlines_core==0.1.26" in said and "Nothing was changed" in said, said[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout)["data"]
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
    assert first["container.yml"] > 0, first

    # The role resolved the pattern against `pveam available` and downloaded that template (pct keeps no
    # ostemplate key in the config, as real pct does not).
    assert APPLIANCES["trixie"].file_name in pve(lab, "pveam list local")
    ct = f"pct exec {VMID} --"
    assert pve(lab, f"{ct} sh -c '. /etc/os-release; echo $VERSION_ID'").strip() == "13"
    assert "ip=dhcp" in pve(lab, f"pct config {VMID}")  # reached at its DHCP address, not one LXC set
    assert "inet dhcp" in pve(lab, f"{ct} cat /etc/network/interfaces")
    # The container's own interpreter is 3.13, and the refused deploy made no venv and no unit.
    assert pve(lab, f"{ct} python3 -c \"import sys; print('%d.%d' % sys.version_info[:2])\"").strip() == "3.13"
    assert pve(lab, f"{ct} sh -c 'ls /opt/sglang/venvs /opt/sglang/venv 2>&1 | head -3; true'").count(
        "No such file") == 2
    assert pve(lab, f"{ct} sh -c 'systemctl cat sglang >/dev/null 2>&1 && echo unit || echo none'").strip() == "none"
    # What the template lacks came from the debhouse built for trixie, not bookworm's packages.
    versions = pve(lab, f"{ct} dpkg-query -W -f '${{Package}} ${{Version}}\\n' python3.13-venv patch gcc")
    assert len(versions.splitlines()) == 3, versions
    assert "+deb12" not in versions, versions

    again = changed(reproduce(inv))
    assert again == {"facts.yml": 0, "containers_preflight.yml": 0, "host.yml": 0, "container.yml": 0,
                     "apply": 0}, again
