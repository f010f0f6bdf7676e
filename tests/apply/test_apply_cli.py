"""`toolkit apply profile` refuses bad input before any host is touched (exit 2, file:line, a fix)."""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from pathlib import Path

import pytest

from toolkit.adapters.ansible import read_inventory
from toolkit.app.apply import _limit_with_power_hosts, _overlay
from toolkit.cli.main import main
from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]


def _apply(tmp: Path, profiles: Path, *extra: str) -> tuple[int, str]:
    """`toolkit apply profile glm5-tp8` in this process (what it prints is what the command prints): its exit code
    and stderr."""
    inventory = tmp / "inventory.ini"
    # A host that would leave a mark if anything ran against it.
    host = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}"
    inventory.write_text(f"[gpu_containers]\n{host}\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOOLKIT_STATE_DIR", str(tmp / "state"))
        env.setenv("TOOLKIT_WHEELHOUSE_DIR", str(tmp / "wheels"))
        env.chdir(REPO)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["apply", "profile", "glm5-tp8", "-i", str(inventory), "--profiles-dir", str(profiles),
                       "--runs-dir", str(tmp / "runs"), *extra])
    return rc, err.getvalue()


def test_invalid_profile_touches_no_host(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    tp8 = profiles / "glm5-tp8.yaml"
    text = tp8.read_text()
    tp8.write_text(text.replace("  max_running_requests: 1024", "  max_running_requests: -3"))
    line = next(i for i, t in enumerate(tp8.read_text().splitlines(), 1) if "max_running_requests: -3" in t)
    rc, stderr = _apply(tmp_path, profiles)
    assert rc == 2, stderr
    assert f"glm5-tp8.yaml:{line}" in stderr and "max_running_requests" in stderr
    # Nothing ran: no Ansible run directory, no wheelhouse, no fetched artifacts.
    assert not (tmp_path / "state").exists() and not (tmp_path / "wheels").exists()
    assert not (tmp_path / "runs").exists()


def test_record_needs_probe(tmp_path: Path) -> None:
    rc, stderr = _apply(tmp_path, REPO / "profiles", "--record")
    assert rc == 2 and "--probe" in stderr
    assert not (tmp_path / "state").exists()


def test_the_inventory_names_the_overlay_once_for_all_its_hosts(tmp_path: Path) -> None:
    """One answer to "is this the lab?": the inventory's toolkit_overlay, the same for every target host."""
    from toolkit.lab.deploy_overlay import amend

    def hosts(text: str) -> tuple[dict, Path]:
        path = tmp_path / "inv.yml"
        path.write_text(text)
        return read_inventory(path, "gpu_containers"), path

    assert _overlay(*hosts("all:\n  children:\n    gpu_containers:\n      hosts: {gpu1: {ansible_host: 192.0.2.1}}\n"
                           )) is None
    assert _overlay(*hosts("all:\n  vars: {toolkit_overlay: lab}\n  children:\n    gpu_containers:\n"
                           "      hosts: {ct: {}}\n")) is amend
    with pytest.raises(ToolkitError) as err:
        _overlay(*hosts("all:\n  vars: {toolkit_overlay: nosuch}\n  children:\n    gpu_containers:\n"
                        "      hosts: {ct: {}}\n"))
    assert err.value.problems[0].field == "toolkit_overlay" and "lab" in err.value.problems[0].message
    with pytest.raises(ToolkitError, match="different deploy overlays"):
        _overlay(*hosts("all:\n  children:\n    gpu_containers:\n      hosts: {ct: {toolkit_overlay: lab}, "
                        "gpu1: {ansible_host: 192.0.2.1}}\n"))


def test_an_allowed_open_bind_is_a_warning_on_every_apply(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    tp8 = profiles / "glm5-tp8.yaml"
    open_bind = "\nserver:\n  host: 0.0.0.0\n  allow_unauthenticated: true\n"
    tp8.write_text(tp8.read_text().replace("\nserver:\n", open_bind, 1))
    rc, stderr = _apply(tmp_path, profiles, "--record")
    assert rc == 2 and "allow-unauthenticated-needs-why" in stderr  # no why: an error
    why = "\nwhy:\n  server.allow_unauthenticated: {reason: lab network only}\n"
    tp8.write_text(tp8.read_text().replace("\nwhy:\n", why, 1))
    rc, stderr = _apply(tmp_path, profiles, "--record")  # refused (no --probe), after the warning
    assert rc == 2 and "--probe" in stderr and not (tmp_path / "state").exists()
    assert "public-bind-acknowledged" in stderr and "WITHOUT an API key" in stderr


def test_a_limit_to_containers_brings_their_proxmox_host_for_the_power_limit(tmp_path: Path) -> None:
    """deploy.yml's first play sets the power limit on the Proxmox host: a --limit naming only a container would
    match no host there, and Ansible would skip the play with the deploy reporting success."""
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all:\n  children:\n    proxmox_hosts:\n      hosts: {pve1: {}, pve2: {}}\n"
                         "    gpu_containers:\n      hosts:\n        ct-a: {lxc_gpu_container_proxmox_host: pve1}\n"
                         "        ct-b: {lxc_gpu_container_proxmox_host: pve2}\n")
    limit, note = _limit_with_power_hosts("ct-a", ["pve1"], inventory)
    assert limit == "ct-a,pve1"
    assert "pve1 joined the limit" in note and "--limit ct-a" in note
    # The widened limit is what deploy.yml's plays run on: the host for the first, the container for the rest.
    assert list(read_inventory(inventory, "proxmox_hosts", limit)) == ["pve1"]
    assert list(read_inventory(inventory, "gpu_containers", limit)) == ["ct-a"]
    # Already covered by the limit, no limit at all, or no power limit in the profile: nothing added, nothing said.
    assert _limit_with_power_hosts("ct-a,pve1", ["pve1"], inventory) == ("ct-a,pve1", "")
    assert _limit_with_power_hosts("all", ["pve1"], inventory) == ("all", "")
    assert _limit_with_power_hosts(None, ["pve1"], inventory) == (None, "")
    assert _limit_with_power_hosts("ct-a", [], inventory) == ("ct-a", "")


def test_the_recorded_line_reads_as_text_not_a_python_dict() -> None:
    from rich.console import Console

    from toolkit.app.apply import ApplyOutcome
    from toolkit.cli.render import print_apply_summary
    from toolkit.core.ansible_summary import PlaybookResult

    console = Console(record=True, width=200)
    outcome = ApplyOutcome("glm5-tp8", False, PlaybookResult(0, "successful", {}, [], None), [], Path("/tmp/a"),
                           record={"recorded": {"sglang-ct": "added in profiles/glm5-tp8.yaml",
                                                "ct-b": "skipped: the probe wrote no verdict"}})
    print_apply_summary(console, outcome, as_json=False)
    text = console.export_text()
    assert ("recorded: ct-b: skipped: the probe wrote no verdict; sglang-ct: added in profiles/glm5-tp8.yaml"
            in text)
    assert "{" not in text
