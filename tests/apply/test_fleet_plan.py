"""A deploy over several hosts, planned without a host: ranks and replicas from the inventory's order, node 0's
init address, the router's backends, the order of the plays, and the preflight's reports judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.core import fleet
from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]
A, B, C = fleet.Host("gpu-a", "10.0.0.11"), fleet.Host("gpu-b", "10.0.0.12"), fleet.Host("gpu-c", "10.0.0.13")


@pytest.fixture(scope="module")
def store() -> ProfileStore:
    return ProfileStore(REPO / "profiles")


def test_two_nodes_take_node_0s_inventory_address_for_init(store: ProfileStore) -> None:
    lay = fleet.layout(store.resolve("glm5-2node"), [A, B], inventory="inv.yml")
    assert lay.kind == fleet.NODES and lay.names == ["gpu-a", "gpu-b"]
    assert lay.dist_init_addr == "10.0.0.11:50000" and "node 0 (gpu-a)" in lay.notes[0]


def test_an_init_address_that_is_not_node_0s_is_refused_with_the_one_to_use(store: ProfileStore) -> None:
    import dataclasses

    resolved = store.resolve("glm5-2node")
    server = resolved.spec.server.model_copy(update={"dist_init_addr": "10.0.0.12:40000"})
    wrong = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"server": server}))
    with pytest.raises(ToolkitError) as err:
        fleet.layout(wrong, [A, B], inventory="inv.yml")
    (problem,) = err.value.problems
    assert problem.field == "server.dist_init_addr" and "10.0.0.11:40000" in (problem.fix or "")
    by_name = server.model_copy(update={"dist_init_addr": "gpu-a:40000"})
    named = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"server": by_name}))
    assert fleet.layout(named, [A, B], inventory="inv.yml").dist_init_addr == "10.0.0.11:40000"


def test_too_few_hosts_for_the_nodes_names_the_field(store: ProfileStore) -> None:
    with pytest.raises(ToolkitError) as err:
        fleet.layout(store.resolve("glm5-2node"), [A], inventory="inv.yml")
    assert err.value.problems[0].field == "server.nnodes"


def test_replicas_take_the_first_hosts_and_the_router_runs_on_the_first(store: ProfileStore) -> None:
    lay = fleet.layout(store.resolve("glm5-tp8-x2"), [A, B, C], inventory="inv.yml")
    assert lay.kind == fleet.REPLICAS and lay.names == ["gpu-a", "gpu-b"] and lay.router_host == "gpu-a"
    assert lay.worker_urls == ("http://10.0.0.11:8000", "http://10.0.0.12:8000")
    assert "gpu-c left as they are" in lay.notes[0]
    with pytest.raises(ToolkitError) as err:
        fleet.layout(store.resolve("glm5-tp8-x2"), [A], inventory="inv.yml")
    assert err.value.problems[0].field == "replicas.count"


def test_one_node_keeps_the_single_layout(store: ProfileStore) -> None:
    lay = fleet.layout(store.resolve("glm5-tp8"), [A, B], inventory="inv.yml")
    assert lay.kind == fleet.SINGLE and lay.dist_init_addr is None and lay.router_host is None


def test_the_order_is_preflight_then_ranks_at_once_then_the_router_last(store: ProfileStore) -> None:
    nodes = fleet.layout(store.resolve("glm5-2node"), [A, B], inventory="inv.yml")
    steps = fleet.order(nodes, preflight=True, rolls=False).steps
    assert [s.hosts for s in steps] == [("gpu-a", "gpu-b"), ("gpu-a", "gpu-b")]
    assert steps[0].what.startswith("fleet preflight") and steps[1].serial is None
    reps = fleet.layout(store.resolve("glm5-tp8-x2"), [A, B], inventory="inv.yml")
    first = fleet.order(reps, preflight=True, rolls=False)
    assert [s.serial for s in first.steps] == [None, None, None] and first.steps[-1].hosts == ("gpu-a",)
    assert "router" in first.steps[-1].what
    rolled = fleet.order(reps, preflight=True, rolls=True)
    assert rolled.steps[1].serial == 1 and "1 at a time" in rolled.text()[1]


def test_a_change_rolls_only_over_a_running_set_whose_unit_changes(store: ProfileStore) -> None:
    reps = fleet.layout(store.resolve("glm5-tp8-x2"), [A, B], inventory="inv.yml")
    new = {"gpu-a": "n", "gpu-b": "n"}
    fresh = {"gpu-a": fleet.HostReport(()), "gpu-b": fleet.HostReport(())}
    running = {"gpu-a": fleet.HostReport((), unit_sha1="old"), "gpu-b": fleet.HostReport((), unit_sha1="old")}
    same = {"gpu-a": fleet.HostReport((), unit_sha1="n"), "gpu-b": fleet.HostReport((), unit_sha1="n")}
    assert not fleet.rolling(reps, fresh, new, enabled=True)  # a first deploy starts both at once
    assert fleet.rolling(reps, running, new, enabled=True)
    assert not fleet.rolling(reps, running, new, enabled=False)
    assert not fleet.rolling(reps, same, new, enabled=True)  # nothing changes


def test_different_gpus_or_drivers_on_the_hosts_are_named(store: ProfileStore) -> None:
    resolved = store.resolve("glm5-2node")
    blackwell = ("NVIDIA RTX PRO 6000 Blackwell", "580.95.05")
    same = {"gpu-a": fleet.HostReport((blackwell,) * 8), "gpu-b": fleet.HostReport((blackwell,) * 8)}
    assert fleet.hardware_problems(resolved, same, inventory="inv.yml") == []
    other_driver = {**same, "gpu-b": fleet.HostReport((("NVIDIA RTX PRO 6000 Blackwell", "580.142"),) * 8)}
    (problem,) = fleet.hardware_problems(resolved, other_driver, inventory="inv.yml")
    assert "differ in their driver" in problem.message and "gpu-b: 580.142" in problem.message
    assert problem.file == "inv.yml" and problem.fix
    fewer = {**same, "gpu-b": fleet.HostReport((blackwell,) * 4)}
    (problem,) = fleet.hardware_problems(resolved, fewer, inventory="inv.yml")
    assert problem.field == "gpu-b.lxc_gpu_container_gpus" and "4 GPU(s), the profile 8" in problem.message


def test_the_init_port_taken_or_unreachable_is_named(store: ProfileStore) -> None:
    lay = fleet.layout(store.resolve("glm5-2node"), [A, B], inventory="inv.yml")
    free = {"gpu-a": fleet.HostReport((), port_free=True), "gpu-b": fleet.HostReport((), reached_node0=True)}
    assert fleet.init_port_problems(lay, free, file="p.yaml") == []
    ours = {**free, "gpu-a": fleet.HostReport((), port_free=False, port_holder_active=True)}
    assert fleet.init_port_problems(lay, ours, file="p.yaml") == []  # the running service holds it
    taken = {**free, "gpu-a": fleet.HostReport((), port_free=False)}
    (problem,) = fleet.init_port_problems(lay, taken, file="p.yaml")
    assert "port 50000 on node 0 (gpu-a) is taken" in problem.message
    cut = {**free, "gpu-b": fleet.HostReport((), reached_node0=False)}
    (problem,) = fleet.init_port_problems(lay, cut, file="p.yaml")
    assert "gpu-b cannot reach" in problem.message and "50008" in (problem.fix or "")


def test_the_router_unit_runs_its_argv_quoted() -> None:
    unit = fleet.router_unit("glm5-tp8-x2", ["/opt/r/bin/smg", "--worker-urls", "http://a:1", "--policy", "a b"])
    assert "ExecStart=/opt/r/bin/smg \\\n    --worker-urls" in unit and '"a b"' in unit


def test_the_plays_get_the_layouts_hosts_node_0s_smoke_and_the_router_last(store: ProfileStore) -> None:
    from toolkit.app import apply

    two = store.resolve("glm5-2node")
    lay = fleet.layout(two, [A, B], inventory="inv.yml")
    ev = apply.fleet_extravars(two, lay, {}, {})
    assert ev["deploy_hosts"] == ["gpu-a", "gpu-b"] and ev["deploy_probe_hosts"] == ["gpu-a"]
    assert ev["sglang_service_smoke_by_host"] == {"gpu-b": False} and "deploy_router_host" not in ev
    pre = apply.fleet_preflight_vars(two, lay, {"fleet_preflight_nccl_launcher": ["/x/standin"]})
    assert pre["fleet_preflight_node0"] == "gpu-a" and pre["fleet_preflight_init_port"] == 50000
    assert pre["fleet_preflight_nccl_argv"][:2] == ["/x/standin", "mpirun"]
    assert pre["fleet_preflight_nccl_env"] == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    x2 = store.resolve("glm5-tp8-x2")
    reps = fleet.layout(x2, [A, B], inventory="inv.yml")
    ev = apply.fleet_extravars(x2, reps, {}, {})
    assert ev["deploy_router_host"] == ["gpu-a"] and ev["deploy_probe_hosts"] == ["gpu-a"]
    argv = ev["sglang_router_argv"]
    assert argv[:2] == [f"{apply.ROUTER_VENV}/bin/smg", "launch"]
    assert argv[argv.index("--worker-urls") + 1: argv.index("--worker-urls") + 3] == list(reps.worker_urls)
    assert argv[argv.index("--policy") + 1] == "cache_aware" and argv[argv.index("--port") + 1] == "30080"
    assert ev["sglang_router_requirement"].startswith("smg==")
    assert ev["sglang_router_unit"].count("ExecStart=") == 1
    # Replicas share no init port and no NCCL group: their preflight reads the GPUs, driver and units only.
    assert "fleet_preflight_node0" not in apply.fleet_preflight_vars(x2, reps, {})


def test_which_probe_a_layout_gets_one_host_itself_several_the_fleet_probe(store: ProfileStore) -> None:
    single = fleet.probe_plan(fleet.layout(store.resolve("glm5-tp8"), [A, B], inventory="inv.yml"))
    assert single == fleet.ProbePlan(fleet=False)
    nodes = fleet.probe_plan(fleet.layout(store.resolve("glm5-2node"), [B, A], inventory="inv.yml"),
                             router_prometheus_port=29000)
    # every rank sampled, the benchmark against node 0's API, no router to scrape
    assert nodes == fleet.ProbePlan(fleet=True, sampled=("gpu-b", "gpu-a"), bench_host="gpu-b")
    import dataclasses

    resolved = store.resolve("glm5-tp8-x2")
    assert resolved.spec.replicas is not None
    router = resolved.spec.replicas.router.model_copy(update={"host": "gpu-b"})
    replicas = resolved.spec.replicas.model_copy(update={"router": router})
    on_b = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"replicas": replicas}))
    plan = fleet.probe_plan(fleet.layout(on_b, [A, B, C], inventory="inv.yml"), router_prometheus_port=29000)
    # the replicas sampled (not gpu-c, left as it is), the benchmark through the router, its exporter scraped
    assert plan == fleet.ProbePlan(fleet=True, sampled=("gpu-a", "gpu-b"), bench_host="gpu-b",
                                   router_metrics_url="http://10.0.0.12:29000/metrics")
