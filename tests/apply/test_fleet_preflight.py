"""The fleet preflight for real, with Ansible, on this machine (two inventory hosts reached locally, no lab):
one play over both reads the GPUs, the unit, node 0's init port (bound, then reached by the other) and NCCL's
all-reduce through the lab's stand-in; the apply's judgement names what is wrong before any model loads."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.app import apply
from toolkit.core import fleet
from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "toolkit/lab/standins/all_reduce_perf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        f"    ansible_python_interpreter: {sys.executable}\n"
        "  children:\n    gpu_containers:\n      hosts:\n"
        "        gpu-a: {ansible_host: 127.0.0.1}\n        gpu-b: {ansible_host: 127.0.0.1}\n")
    return inv


def test_the_preflight_reads_both_hosts_and_names_what_stops_the_deploy(tmp_path: Path) -> None:
    store = ProfileStore(REPO / "profiles")
    resolved = store.resolve("glm5-2node")
    port = _free_port()
    server = resolved.spec.server.model_copy(update={"dist_init_addr": f"127.0.0.1:{port}"})
    import dataclasses

    resolved = dataclasses.replace(resolved, spec=resolved.spec.model_copy(
        update={"server": server, "env": {**resolved.spec.env, "NCCL_SOCKET_IFNAME": "lo",
                                          "GLOO_SOCKET_IFNAME": "lo"}}))
    inventory = _inventory(tmp_path)
    hosts = apply.spanning_hosts(resolved, inventory, apply.read_inventory(inventory, "gpu_containers"), None)
    lay = fleet.layout(resolved, [fleet.Host(n, apply.inventory_address(h)) for n, h in hosts.items()],
                       inventory=str(inventory))
    tool = tmp_path / "all_reduce_perf-standin"
    extravars = {"sglang_service_unit": "[Unit]\n", "sglang_service_name": "toolkit-fleet-check",
                 "fleet_preflight_nccl_launcher": [sys.executable, str(tool)],
                 "fleet_preflight_nccl_tool_src": str(STANDIN), "fleet_preflight_listen_s": 6}
    pre = apply.fleet_preflight_vars(resolved, lay, extravars)
    # The launcher's first word is the interpreter: install the stand-in at the script path instead.
    pre["fleet_preflight_nccl_tool_src"] = ""
    tool.write_bytes(STANDIN.read_bytes())
    pre["fleet_preflight_nccl_argv"] = [*pre["fleet_preflight_nccl_argv"][:2], "mpirun",
                                        *pre["fleet_preflight_nccl_argv"][3:]]
    pre["fleet_preflight_nccl_argv"][pre["fleet_preflight_nccl_argv"].index("268435456")] = "65536"
    pre["fleet_preflight_nccl_argv"][pre["fleet_preflight_nccl_argv"].index("-H") + 1] = "127.0.0.1:8,127.0.0.1:8"
    plan = apply.DeployPlan("glm5-2node", inventory, extravars, {}, tmp_path / "runs", [], layout=lay,
                            preflight=pre)
    said: list[str] = []
    with pytest.raises(ToolkitError) as err:
        apply.preflight_fleet(plan, resolved, check=False, on_event=lambda e: None, on_message=said.append)
    messages = [p.message for p in err.value.problems]
    # No nvidia-smi here: each host reports no GPU, which the profile's 8 per node refuses, naming the host.
    assert any(m.startswith("gpu-a has 0 GPU(s), the profile 8") for m in messages), messages
    # The init port was free on node 0 and gpu-b reached it: no port problem.
    assert not [m for m in messages if "port" in m or "reach" in m], messages
    nccl_line = next(s for s in said if s.startswith("NCCL preflight"))
    assert nccl_line.startswith("NCCL preflight (tcp-only)") and "NET/Socket" in nccl_line
    assert any("stand-in" in s for s in said)


def test_a_taken_init_port_is_named_before_the_deploy(tmp_path: Path) -> None:
    store = ProfileStore(REPO / "profiles")
    import dataclasses

    resolved = store.resolve("glm5-2node")
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen(1)
    port = int(holder.getsockname()[1])
    try:
        server = resolved.spec.server.model_copy(update={"dist_init_addr": f"127.0.0.1:{port}"})
        resolved = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"server": server}))
        inventory = _inventory(tmp_path)
        hosts = apply.read_inventory(inventory, "gpu_containers")
        lay = fleet.layout(resolved, [fleet.Host(n, apply.inventory_address(h)) for n, h in hosts.items()],
                           inventory=str(inventory))
        pre = apply.fleet_preflight_vars(resolved, lay, {"sglang_service_name": "toolkit-fleet-check"})
        pre["fleet_preflight_nccl_argv"] = []
        plan = apply.DeployPlan("glm5-2node", inventory, {"sglang_service_unit": "x"}, {}, tmp_path, [],
                                layout=lay, preflight=pre)
        with pytest.raises(ToolkitError) as err:
            apply.preflight_fleet(plan, resolved, check=False, on_event=lambda e: None, on_message=lambda m: None)
    finally:
        holder.close()
    (taken,) = [p for p in err.value.problems if p.field == "server.dist_init_addr"]
    assert f"port {port} on node 0 (gpu-a) is taken" in taken.message and taken.fix
