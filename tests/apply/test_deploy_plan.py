"""The extravars `toolkit apply` hands the roles, from the shipped profiles (pure code, no hosts)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.core import deploy
from toolkit.core.errors import ToolkitError
from toolkit.core.profile import ResolvedProfile
from toolkit.core.profile.render import render_bench_argv, render_launch_argv, render_systemd_unit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store() -> ProfileStore:
    return ProfileStore(REPO / "profiles")


def _extravars(store: ProfileStore, name: str, lab: deploy.LabOptions | None = None) -> dict:
    resolved = store.resolve(name)
    inputs = deploy.inputs_from_resolved(resolved, repo_root=REPO)
    bench = render_bench_argv(resolved, base_url="http://127.0.0.1:8000", output_file="/x/bench.jsonl")
    return deploy.build_extravars(inputs, run_id="r1", wheelhouse_dir="/wh", fetch_dir="/f",
                                  standin_server_src="/s/server.py", lab=lab, bench_argv=bench)


def test_roles_get_exactly_what_profile_render_prints(store: ProfileStore) -> None:
    resolved = store.resolve("glm5-tp8")
    ev = _extravars(store, "glm5-tp8")
    assert ev["sglang_service_argv"] == render_launch_argv(resolved)
    assert ev["sglang_service_unit"] == render_systemd_unit(resolved)
    assert ev["sglang_venv_requirements"][0] == "sglang==0.5.9"
    assert ev["sglang_service_base_url"] == "http://127.0.0.1:8000"
    assert ev["sglang_service_standin"] is False and ev["sglang_service_standin_exec"] == ""
    # The role decides whether to fetch (no local path: it fetches lukealonso/GLM-5-NVFP4); an inventory may say
    # otherwise (the lab's does), which an extra var here would override.
    assert "sglang_venv_model_fetch" not in ev and ev["sglang_venv_model_local_path"] is None
    (patch,) = ev["sglang_venv_patches"]
    assert patch["name"] == "sm120-cutlass-moe-autotune"
    assert patch["sha256"] == "be071c1567de4b63e82d070623f95aa4bb5f537698659526c68b1c7d05074640"
    assert Path(patch["patch_src"]).is_file()


def test_lab_runs_the_standin_with_the_same_flags(store: ProfileStore) -> None:
    lab = deploy.LabOptions(standin_server=True, bench_num_prompts=64, tokenizer_dir="/t", dataset_path="/d.json")
    ev = _extravars(store, "glm5-tp8", lab)
    argv = ev["sglang_service_argv"]
    standin = shlex.split(ev["sglang_service_standin_exec"])
    assert standin[0] == argv[0] == "/opt/sglang/venv/bin/python"
    assert standin[1] == "/opt/sglang/standin/server.py"
    assert standin[2:] == argv[3:]  # every rendered flag, unchanged
    assert "--nsa-decode-backend" in standin and "--disable-cuda-graph" in standin
    bench = ev["bench_probe_bench_argv"]
    assert bench[bench.index("--num-prompts") + 1] == "64"
    assert bench[bench.index("--tokenizer") + 1] == "/t"
    assert bench[bench.index("--dataset-path") + 1] == "/d.json"
    assert "sglang_venv_model_fetch" not in ev  # the lab's inventory turns the fetch off
    assert any("lab stand-in" in n for n in ev["deploy_lab_notes"])
    assert any("--num-prompts 64" in n for n in ev["deploy_lab_notes"])


def test_standin_needs_a_launch_server_argv() -> None:
    with pytest.raises(ToolkitError, match=r"sglang\.launch_server"):
        deploy.standin_argv(["/venv/bin/python", "-m", "something.else", "--port", "1"], "/s.py")


def test_exec_line_keeps_the_api_key_variable_for_systemd() -> None:
    line = deploy.systemd_exec_line(["/p", "--api-key", "${SGLANG_API_KEY}", "--x", "a b$c%d"])
    assert "${SGLANG_API_KEY}" in line
    assert '"a b$$c%%d"' in line  # systemd would expand $ and % otherwise


def test_missing_patch_file_is_refused_before_anything_runs(store: ProfileStore, tmp_path: Path) -> None:
    resolved = store.resolve("glm5-tp8")
    with pytest.raises(ToolkitError) as err:
        deploy.inputs_from_resolved(resolved, repo_root=tmp_path)  # no profiles/patches/ there
    (problem,) = err.value.problems
    assert problem.field == "engine.patches[0].patch" and problem.fix


def _two_node(store: ProfileStore) -> ResolvedProfile:
    import dataclasses

    resolved = store.resolve("glm5-tp8")
    server = resolved.spec.server.model_copy(update={"nnodes": 2, "tp_size": 16, "dist_init_addr": "10.0.0.1:20000"})
    return dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"server": server}))


def test_multi_node_gives_each_host_its_rank_in_inventory_order(store: ProfileStore) -> None:
    nodes = deploy.per_node(_two_node(store), ["gpu-a", "gpu-b"])
    for rank, host in enumerate(["gpu-a", "gpu-b"]):
        argv, unit = nodes[host]
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:20000"
        assert f"--node-rank {rank}" in unit
    resolved = store.resolve("glm5-tp8")
    inputs = deploy.inputs_from_resolved(resolved, repo_root=REPO)
    ev = deploy.build_extravars(inputs, run_id="r", wheelhouse_dir="/w", fetch_dir="/f", standin_server_src="/s",
                                lab=deploy.LabOptions(standin_server=True), nodes=nodes)
    assert set(ev["sglang_service_unit_by_host"]) == {"gpu-a", "gpu-b"}
    assert "--node-rank 1" in ev["sglang_service_standin_exec_by_host"]["gpu-b"]
    assert deploy.per_node(resolved, ["only"]) == {}  # one node: every host runs the single unit


def test_multi_node_needs_as_many_hosts_as_nodes(store: ProfileStore) -> None:
    with pytest.raises(ToolkitError) as err:
        deploy.per_node(_two_node(store), ["gpu-a"])
    assert err.value.problems[0].field == "server.nnodes"
