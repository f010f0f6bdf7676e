"""`toolkit host` / `toolkit doctor` refuse bad input before Ansible runs (exit 2, nothing touched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.cli.host_cmd import parse_extra_vars
from toolkit.cli.main import main

INVENTORY = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve-a: {ansible_host: 127.0.0.1, ansible_port: 1}
    gpu_containers:
      hosts:
        ct-a: {lxc_gpu_container_proxmox_host: pve-a, lxc_gpu_container_vmid: 101}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    return path


@pytest.mark.parametrize("command", [["host", "provision"], ["host", "reproduce", "--profile", "glm5-tp8"], ["doctor"]])
def test_unknown_host_exits_2_naming_the_known_ones(command: list[str], inv: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*command, "pve-b", "-i", str(inv)])
    err = capsys.readouterr().err
    assert code == 2
    assert "'pve-b' is not a host of the group proxmox_hosts" in err and "pve-a" in err and str(inv) in err


def test_a_container_is_not_a_proxmox_host(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["host", "provision", "ct-a", "-i", str(inv)]) == 2


def test_missing_inventory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["host", "provision", "pve-a", "-i", str(tmp_path / "none.yml")]) == 2
    assert "inventory not found" in capsys.readouterr().err


def test_extra_vars_are_yaml_values_and_malformed_ones_refused() -> None:
    assert parse_extra_vars(["a=1", "b=[0, 1]", "c=text", "d="]) == {"a": 1, "b": [0, 1], "c": "text", "d": ""}
    with pytest.raises(Exception, match="not KEY=VALUE"):
        parse_extra_vars(["no-equals"])


def test_unreachable_host_exits_1_naming_it(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLKIT_STATE_DIR", str(tmp_path / "state"))
    code = main(["host", "provision", "pve-a", "-i", str(inv), "--json"])
    assert code == 1
    out = capsys.readouterr().out
    assert '"unreachable": 1' in out and "pve-a" in out
