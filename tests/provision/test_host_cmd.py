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


def test_the_inventorys_notes_are_printed_and_no_lab_variable_is_passed(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Any inventory may say what it substitutes (`toolkit_notes`, as the lab's does); the command prints it
    before the run and passes the roles only the host it was asked for, never a `lab` switch."""
    import json

    path = tmp_path / "inv.yml"
    note = "somewhere: the GPUs are stand-ins (some_role_path=/run/x)"
    path.write_text(INVENTORY.replace("all:\n", f"all:\n  vars:\n    toolkit_notes: [{json.dumps(note)}]\n", 1))
    monkeypatch.setenv("TOOLKIT_STATE_DIR", str(tmp_path / "state"))
    assert main(["host", "provision", "pve-a", "-i", str(path), "--json"]) == 1  # unreachable: port 1
    out, err = capsys.readouterr()
    assert err.index(note) < err.index("Facts | the Proxmox host")  # before the run (the plan reads first)
    report = json.loads(out)
    assert report["notes"] == [note]
    assert [r["playbook"] for r in report["runs"]] == ["facts.yml"]  # unreachable: no plan, nothing else ran
    command = json.loads((Path(report["runs"][0]["artifacts_dir"]) / "command").read_text())["command"]
    extravars = json.loads(command[command.index("-e") + 1])
    assert extravars == {"toolkit_hosts": "pve-a", "toolkit_proxmox_host": "pve-a"}


@pytest.mark.parametrize("flag", ["--lab", "--no-lab"])
def test_there_is_no_lab_switch(flag: str, inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["host", "provision", "pve-a", "-i", str(inv), flag])
    assert exit_.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err
