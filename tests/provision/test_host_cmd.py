"""`toolkit host` / `toolkit doctor` refuse bad input before Ansible runs (exit 2, nothing touched)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolkit.cli.host_cmd import parse_extra_vars
from toolkit.cli.main import main

REPO = Path(__file__).resolve().parents[2]

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
    # A driver release is a string: 580.140 as a float would be 580.14, another release.
    assert parse_extra_vars(["proxmox_gpu_host_driver_version=580.140", "v=580.142"]) == {
        "proxmox_gpu_host_driver_version": "580.140", "v": "580.142"}
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
    report = json.loads(out)["data"]
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


def _provision_extravars(inv: Path, **request: Any) -> tuple[dict[str, Any], str]:
    """What `provision` hands each playbook, and what it says about the model cache (the run recorded, not run;
    the facts run answers with a recorded PVE 9.2 host's raw outputs, so the plan resolves)."""
    import json

    from tests.hostplan.conftest import load_raw
    from toolkit.app.host import FACTS_TASK, HostRequest, host_plan, provision
    from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult

    given: list[dict[str, Any]] = []
    said: list[str] = []
    raw = load_raw("pve92-homelab")
    # Eight GPUs of its own, as the shipped profiles need: six more like the fixture's first.
    raw["lspci"]["stdout"] += "".join(
        f"0000:{bus:02x}:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA102 [GeForce RTX 3090] "
        f"[10de:2204] (rev a1)\n\tKernel driver in use: nouveau\n" for bus in range(4, 10))

    def run(book: str, title: str, **kw: Any) -> PlaybookResult:
        given.append(kw["extravars"])
        events = [PlaybookEvent("ok", task=FACTS_TASK, host="pve-a",
                                result={"stdout": json.dumps(raw)})] if book == "facts" else []
        return PlaybookResult(rc=0, status="successful", hosts={}, failures=[], artifacts_dir=None, events=events)

    request.setdefault("extravars", {})["lxc_gpu_container_rootfs_storage"] = "local-zfs"
    outcome = provision(HostRequest(host="pve-a", inventory=str(inv), containers=True, **request),
                        host_plan("pve-a", str(inv)), run, on_message=said.append)
    assert said == [outcome.model_cache] and len(given) == 4, outcome.plan
    return given[-1], outcome.model_cache


def test_the_model_cache_is_sized_from_the_profiles_that_will_run_there(inv: Path) -> None:
    extravars, note = _provision_extravars(inv, profiles=["glm5-tp8"])
    assert extravars["lxc_gpu_container_model_size_gib"] == 411
    assert extravars["lxc_gpu_container_model_name"] == "lukealonso/GLM-5-NVFP4"
    assert "ct-a: sized for lukealonso/GLM-5-NVFP4 (411 GiB" in note and "--profile glm5-tp8" in note
    # -e wins over the profile, and says so.
    extravars, note = _provision_extravars(inv, profiles=["glm5-tp8"],
                                           extravars={"lxc_gpu_container_model_cache_size_gib": 500})
    assert extravars["lxc_gpu_container_model_cache_size_gib"] == 500 and note.endswith("sized by -e")


def test_without_a_profile_the_default_size_is_said_with_how_to_size_it(inv: Path, tmp_path: Path) -> None:
    extravars, note = _provision_extravars(inv)
    assert "lxc_gpu_container_model_size_gib" not in extravars
    assert "ct-a: 128 GiB, the container role's default (no --profile given" in note
    assert "pass --profile NAME" in note and "lxc_gpu_container_model_cache_size_gib" in note
    sized = tmp_path / "sized.yml"
    sized.write_text(INVENTORY.replace("lxc_gpu_container_vmid: 101", "lxc_gpu_container_vmid: 101, "
                                       "lxc_gpu_container_model_cache_size_gib: 460"))
    assert _provision_extravars(sized)[1].endswith("sized by the inventory (lxc_gpu_container_model_cache_size_gib "
                                                    "or lxc_gpu_container_model_size_gib)")


def test_a_profile_without_containers_is_refused(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["host", "provision", "pve-a", "-i", str(inv), "--profile", "glm5-tp8"]) == 2
    assert "add --containers" in capsys.readouterr().err


def test_the_real_host_example_parses_has_no_lab_variable_and_marks_what_is_required() -> None:
    from toolkit.adapters.ansible import read_inventory
    from toolkit.app.host import host_plan

    example = REPO / "inventory" / "real-host.example.yml"
    hosts = read_inventory(example)
    assert host_plan("pve1", example).containers == ["sglang-ct"]
    variables = {k for h in hosts.values() for k in h.vars}
    # What only the lab sets (docs/lab.md, "The lab's inventory"): none of it on a real host.
    lab_only = {"toolkit_overlay", "toolkit_notes", "proxmox_gpu_host_proc_devices", "proxmox_gpu_host_sys_module_dir",
                "proxmox_gpu_host_lspci_command", "proxmox_gpu_host_kernel_headers_required",
                "proxmox_gpu_host_build_packages_install", "container_nvidia_userspace_cuda_install_method",
                "sglang_venv_model_fetch", "sglang_service_health_timeout_s"}
    assert not variables & lab_only and "lab-standin" not in example.read_text()
    # The driver checksum is marked required (a real host downloads the installer), with how to get it.
    text = example.read_text()
    line = next(i for i, t in enumerate(text.splitlines()) if t.strip().startswith("proxmox_gpu_host_driver_checksum"))
    assert "REQUIRED" in "\n".join(text.splitlines()[line - 3 : line]) and "sha256sum" in text
    # Host keys are checked for the host (no StrictHostKeyChecking=no anywhere).
    assert "StrictHostKeyChecking=no" not in text and "UserKnownHostsFile=/dev/null" not in text


def test_an_operators_own_inventory_is_git_ignored_and_the_examples_are_not() -> None:
    import subprocess

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0

    assert ignored("inventory/pve1.yml") and ignored("inventory/lab.yml")
    assert not ignored("inventory/real-host.example.yml") and not ignored("inventory/lab.example.yml")


def test_all_is_every_proxmox_host_in_order_and_the_first_failure_stops_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from toolkit.app.host import provision_targets

    monkeypatch.setenv("TOOLKIT_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "two.yml"
    path.write_text(INVENTORY.replace("        pve-a: {ansible_host: 127.0.0.1, ansible_port: 1}\n",
                                      "        pve-b: {ansible_host: 127.0.0.1, ansible_port: 1}\n"
                                      "        pve-a: {ansible_host: 127.0.0.1, ansible_port: 1}\n"))
    assert provision_targets("all", str(path)) == ["pve-b", "pve-a"]
    assert provision_targets("pve-a", str(path)) == ["pve-a"]
    assert main(["host", "provision", "all", "-i", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [h["host"] for h in out["data"]["hosts"]] == ["pve-b"]
