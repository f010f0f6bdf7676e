"""provision and reproduce read the host and plan before anything: a plan that does not resolve stops them before
any other playbook (nothing stopped, nothing installed); a resolved one's values reach the roles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.ansible import InventoryHost
from toolkit.app.host import FACTS_TASK, HostPlan, HostRequest, PlanRefused, provision
from toolkit.core.ansible_summary import HostStats, PlaybookEvent, PlaybookResult

from .conftest import load_raw


def _plan(tmp_path: Path, **host_vars: Any) -> HostPlan:
    host = InventoryHost("pve1", ("proxmox_hosts",), {"lxc_gpu_container_rootfs_storage": "local-zfs", **host_vars})
    return HostPlan(tmp_path / "inv.yml", host, ["ct"], [], {})


def _runner(raw: dict[str, Any], ran: list[tuple[str, dict[str, Any]]]) -> Any:
    def run(book: str, title: str, **kw: Any) -> PlaybookResult:
        ran.append((book, kw.get("extravars") or {}))
        events = []
        if book == "facts":
            events = [PlaybookEvent("ok", task=FACTS_TASK, host="pve1", result={"stdout": json.dumps(raw)})]
        return PlaybookResult(0, "successful", {"pve1": HostStats(ok=1)}, [], None, events)

    return run


def test_a_plan_that_does_not_resolve_stops_before_any_other_playbook(tmp_path: Path) -> None:
    raw = load_raw("pve92-homelab")
    raw["alternate_install"] = {"rc": 0, "stdout": ""}  # a driver from apt: the .run installer would abort
    ran: list[tuple[str, dict[str, Any]]] = []
    seen: list[Any] = []
    with pytest.raises(PlanRefused) as err:
        provision(HostRequest("pve1"), _plan(tmp_path), _runner(raw, ran), on_plan=seen.append)
    assert [book for book, _ in ran] == ["facts"]
    assert "apt-driver" in str(err.value) and err.value.exit_code == 2
    assert seen and not seen[0].resolved


def test_a_resolved_plan_passes_its_values_and_the_runs_own_on_top(tmp_path: Path) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    req = HostRequest("pve1", extravars={"proxmox_gpu_host_driver_version": "580.142"})
    outcome = provision(req, _plan(tmp_path), _runner(load_raw("pve92-homelab"), ran))
    assert [book for book, _ in ran] == ["facts", "host"]
    host_vars = ran[1][1]
    assert host_vars["proxmox_gpu_host_driver_version"] == "580.142"  # the -e pin, checked: builds on 7.0
    assert host_vars["proxmox_gpu_host_power_limit_gpus"] == ["0000:01:00.0", "0000:02:00.0"]
    assert host_vars["proxmox_gpu_host_driver_kernel_module_type"] == "open"
    assert outcome.plan is not None and outcome.plan["resolved"]
    assert [r["playbook"] for r in outcome.to_json()["runs"]] == ["facts.yml", "host.yml"]
