"""`toolkit inventory add` writes an inventory in the playbooks' shape, read back by Ansible's own parser; a command
without -i names the inventory it uses and refuses the lab's when the lab's hosts are gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.adapters.ansible import find_inventory, read_inventory
from toolkit.cli.main import main
from toolkit.core.errors import ToolkitError


def test_inventory_add_writes_a_host_and_its_container_that_ansible_reads(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["inventory", "add", "pve1", "--address", "192.0.2.10", "--vmid", "150", "--ct-address",
                 "192.0.2.50/24", "--gateway", "192.0.2.1"]) == 0
    assert main(["inventory", "add", "pve2", "--address", "pve2.example.org"]) == 0
    hosts = read_inventory(tmp_path / "inventory" / "hosts.yml")
    assert set(hosts) == {"pve1", "pve2", "pve1-ct150"}
    assert "proxmox_hosts" in hosts["pve1"].groups and "gpu_containers" in hosts["pve1-ct150"].groups
    ct = hosts["pve1-ct150"].vars
    assert (ct["lxc_gpu_container_proxmox_host"], ct["lxc_gpu_container_vmid"], ct["ansible_host"]) == (
        "pve1", 150, "192.0.2.50")
    assert ct["lxc_gpu_container_net0"] == "name=eth0,bridge=vmbr0,ip=192.0.2.50/24,gw=192.0.2.1,type=veth"
    assert hosts["pve2"].address == "pve2.example.org:22" and hosts["pve1"].vars["ansible_user"] == "root"
    before = (tmp_path / "inventory" / "hosts.yml").read_text()
    assert main(["inventory", "add", "pve1", "--address", "192.0.2.11"]) == 2  # already there: nothing changed
    assert main(["inventory", "add", "pve3", "--address", "192.0.2.12", "--vmid", "151"]) == 2  # no address
    assert (tmp_path / "inventory" / "hosts.yml").read_text() == before


def _lab_inventory(tmp_path: Path, valid_while: Path) -> None:
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "lab.yml").write_text(
        f"all:\n  vars:\n    toolkit_inventory_valid_while: {valid_while}\n"
        "  children:\n    proxmox_hosts:\n      hosts:\n        pve1:\n          ansible_host: 10.213.0.2\n")


def test_without_i_the_lab_inventory_is_named_and_refused_while_its_hosts_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOOLKIT_INVENTORY", raising=False)
    marker = tmp_path / "netns-of-pve1"
    _lab_inventory(tmp_path, marker)
    with pytest.raises(ToolkitError) as err:
        find_inventory(None)
    assert "the lab is down" in str(err.value) and "toolkit inventory add" in str(err.value)
    marker.touch()  # the lab is up
    assert find_inventory(None) == (tmp_path / "inventory" / "lab.yml").resolve()
    assert "no -i given: the lab's" in capsys.readouterr().err
    # -i is taken as given, and said by the user: nothing printed, the lab's state not asked.
    marker.unlink()
    assert find_inventory("inventory/lab.yml") == (tmp_path / "inventory" / "lab.yml").resolve()
    assert capsys.readouterr().err == ""
