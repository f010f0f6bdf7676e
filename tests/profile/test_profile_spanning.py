"""What a profile that spans hosts must say before any host is asked: NCCL's and Gloo's interface, an init
address other nodes reach on a port of its own, replicas the router can reach."""

from __future__ import annotations

from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.core.profile import validate
from toolkit.core.profile.hashing import spec_hash

TWO_NODE = ("target:\n  nodes: 2\n  gpu_count: 8\nserver:\n  tp_size: 8\n  pp_size: 2\n  nnodes: 2\n"
            "env:\n  NCCL_SOCKET_IFNAME: eth0\n  GLOO_SOCKET_IFNAME: eth0\n")


def _errors(store, name: str) -> dict[str, str]:
    r = store.resolve(name)
    return {p.field: p.message for p in validate(r, load_catalogue(r.engine.sglang_version))
            if p.severity == "error"}


def _child(base_yaml: str, body: str) -> dict[str, str]:
    return {"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\n" + body}


def test_a_two_node_profile_with_its_interfaces_named_is_clean(write_profiles, base_yaml) -> None:
    assert _errors(write_profiles(_child(base_yaml, TWO_NODE)), "c") == {}


def test_each_unnamed_socket_interface_is_an_error_naming_the_variable(write_profiles, base_yaml) -> None:
    body = TWO_NODE.replace("  GLOO_SOCKET_IFNAME: eth0\n", "")
    errors = _errors(write_profiles(_child(base_yaml, body)), "c")
    assert list(errors) == ["env.GLOO_SOCKET_IFNAME"]
    assert "picks an interface itself" in errors["env.GLOO_SOCKET_IFNAME"]


def test_the_init_port_must_leave_the_http_port_alone(write_profiles, base_yaml) -> None:
    body = TWO_NODE.replace("  nnodes: 2\n", "  nnodes: 2\n  port: 30002\n  dist_init_addr: 10.0.0.1:30000\n")
    errors = _errors(write_profiles(_child(base_yaml, body)), "c")
    assert "server.port 30002 is among them" in errors["server.dist_init_addr"]


def test_a_loopback_init_address_is_refused_over_several_nodes(write_profiles, base_yaml) -> None:
    body = TWO_NODE.replace("  nnodes: 2\n", "  nnodes: 2\n  dist_init_addr: 127.0.0.1:50000\n")
    assert "loopback" in _errors(write_profiles(_child(base_yaml, body)), "c")["server.dist_init_addr"]


def test_a_host_listed_twice_is_refused(write_profiles, base_yaml) -> None:
    body = TWO_NODE.replace("  nodes: 2\n", "  nodes: 2\n  hosts: [gpu-a, gpu-a]\n")
    assert "gpu-a listed twice" in _errors(write_profiles(_child(base_yaml, body)), "c")["target.hosts"]


def test_replicas_need_an_address_the_router_reaches_and_ports_of_their_own(write_profiles, base_yaml) -> None:
    body = "replicas:\n  count: 2\n  router:\n    port: 30000\n"
    errors = _errors(write_profiles(_child(base_yaml, body)), "c")
    assert "cannot reach" in errors["server.host"]
    assert "the server's" in errors["replicas.router.port"]


def test_replicas_benchmarked_through_the_router_need_a_backend_it_accepts(write_profiles, base_yaml) -> None:
    """bench_serving's OpenAI completions carry best_of with stream, which the router answers with a 400."""
    body = "server:\n  host: 0.0.0.0\nreplicas:\n  count: 2\n"
    errors = _errors(write_profiles(_child(base_yaml, body + "bench:\n  backend: sglang-oai\n")), "c")
    assert "best_of" in errors["bench.backend"] and "sglang" in errors["bench.backend"]
    assert "bench.backend" not in _errors(write_profiles(_child(base_yaml, body + "bench:\n  backend: sglang\n")), "c")


def test_replicas_of_a_multi_node_server_are_refused(write_profiles, base_yaml) -> None:
    body = TWO_NODE + "replicas:\n  count: 2\n"
    assert "not supported" in _errors(write_profiles(_child(base_yaml, body)), "c")["replicas"]


def test_an_unknown_router_policy_names_the_choices(write_profiles, base_yaml) -> None:
    import pytest

    from toolkit.core.errors import ToolkitError

    store = write_profiles(_child(base_yaml, "replicas:\n  count: 2\n  router:\n    policy: fastest\n"))
    with pytest.raises(ToolkitError) as err:
        store.resolve("c")
    assert "cache_aware" in str(err.value)


def test_the_hosts_a_profile_names_leave_its_hash_and_no_replicas_keep_old_hashes(write_profiles, base_yaml) -> None:
    store = write_profiles({**_child(base_yaml, TWO_NODE),
                            "d": "schema_version: 1\nname: d\nextends: c\ntarget:\n  hosts: [a, b]\n"})
    assert spec_hash(store.resolve("c")) == spec_hash(store.resolve("d"))
    assert "replicas" not in store.resolve("base").spec.model_dump(exclude_none=True)


def test_the_shipped_spanning_profiles_validate(shipped) -> None:
    assert _errors(shipped, "glm5-2node") == {}
    assert _errors(shipped, "glm5-tp8-x2") == {}
    two = shipped.resolve("glm5-2node").spec
    assert (two.server.tp_size, two.server.pp_size, two.target.nodes, two.target.gpu_count) == (8, 2, 2, 8)
    x2 = shipped.resolve("glm5-tp8-x2").spec
    assert x2.replicas is not None and x2.replicas.count == 2 and x2.replicas.router.policy == "cache_aware"
