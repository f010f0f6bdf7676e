"""The extravars `toolkit apply` hands the roles, from the shipped profiles (pure code, no hosts)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from toolkit.adapters.ansible import InventoryHost
from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.apply import Amendment, OverlayContext
from toolkit.core import deploy
from toolkit.core.errors import ToolkitError
from toolkit.core.profile import ResolvedProfile
from toolkit.core.profile.render import render_bench_argv, render_launch_argv, render_systemd_unit
from toolkit.lab.deploy_overlay import DROPIN, LAB_NUM_PROMPTS, TOKENIZER_DIR, amend, standin_argv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store() -> ProfileStore:
    return ProfileStore(REPO / "profiles")


def _extravars(store: ProfileStore, name: str) -> dict:
    resolved = store.resolve(name)
    inputs = deploy.inputs_from_resolved(resolved, repo_root=REPO)
    bench = render_bench_argv(resolved, base_url="http://127.0.0.1:8000", output_file="/x/bench.jsonl")
    return deploy.build_extravars(inputs, run_id="r1", wheelhouse_dir="/wh", fetch_dir="/f", bench_argv=bench)


def _lab(store: ProfileStore, name: str, *, nodes: dict | None = None, num_prompts: int | None = None,
         host_vars: dict | None = None) -> Amendment:
    """The lab overlay's amendment of one apply (toolkit.app.apply calls it the same way)."""
    resolved = store.resolve(name)
    inputs = deploy.inputs_from_resolved(resolved, repo_root=REPO)
    bench = render_bench_argv(resolved, base_url="http://127.0.0.1:8000", output_file="/x/bench.jsonl")
    hosts = {h: InventoryHost(h, ("gpu_containers",), dict(host_vars or {})) for h in (nodes or {"ct": None})}
    return amend(OverlayContext(resolved=resolved, inputs=inputs, hosts=hosts, nodes=nodes or {}, bench_argv=bench,
                                num_prompts=num_prompts, toolkit_wheel=Path("/w/gpu_serving_toolkit-0.1.0.whl")))


def test_roles_get_exactly_what_profile_render_prints(store: ProfileStore) -> None:
    resolved = store.resolve("glm5-tp8")
    ev = _extravars(store, "glm5-tp8")
    assert ev["sglang_service_argv"] == render_launch_argv(resolved)
    assert ev["sglang_service_unit"] == render_systemd_unit(resolved)
    assert "sglang_venv_requirements" not in ev  # the lock is the whole engine (sglang_venv_lock_src)
    assert ev["sglang_service_base_url"] == "http://127.0.0.1:8000"
    # Nothing of the lab, and nothing an inventory may set (extravars would beat it).
    assert not [k for k in ev if "standin" in k or "lab" in k]
    assert "sglang_venv_model_fetch" not in ev and "sglang_service_health_timeout_s" not in ev
    (patch,) = ev["sglang_venv_patches"]
    assert patch["name"] == "sm120-cutlass-moe-autotune"
    assert patch["sha256"] == "be071c1567de4b63e82d070623f95aa4bb5f537698659526c68b1c7d05074640"
    assert Path(patch["patch_src"]).is_file()


def test_engine_imports_are_the_servers_and_the_backends_the_profile_names(store: ProfileStore) -> None:
    imports = deploy.engine_imports(store.resolve("glm5-tp8"))
    modules = [(i.module, i.distribution) for i in imports]
    assert modules[:4] == [("torch", "torch"), ("triton", "triton"), ("sgl_kernel", "sgl-kernel"),
                           ("sglang.srt.server_args", "sglang")]
    # prefill_attention_backend: flashinfer, moe_runner_backend: flashinfer_cutlass, nsa_decode_backend: trtllm:
    # one flashinfer import, asked for by the first field that names it.
    (fi,) = [i for i in imports if i.module == "flashinfer"]
    assert fi.distribution == "flashinfer-python" and fi.why == "server.prefill_attention_backend: flashinfer"
    assert len(modules) == len(set(modules))


def test_engine_check_inputs_from_the_lock_and_a_lock_without_a_backends_package_is_refused(
        store: ProfileStore) -> None:
    from toolkit.core.engine_lock import EngineLock, parse_lock

    name = "profiles/requirements/sglang-0.5.9-cp311.lock"
    lock = parse_lock((REPO / name).read_text(), name)
    imports = deploy.engine_imports(store.resolve("glm5-tp8"))
    inputs = deploy.engine_check_inputs(lock, name, imports)
    assert inputs["lock"] == name and inputs["lock_digest"] == lock.digest
    assert inputs["distributions"]["torch"] == lock.get("torch").version  # type: ignore[union-attr]
    assert len(inputs["distributions"]) == len(lock.entries)
    assert {"module": "flashinfer", "distribution": "flashinfer-python",
            "why": "server.prefill_attention_backend: flashinfer"} in inputs["imports"]
    without = EngineLock(lock.sglang_version, lock.python,
                         tuple(e for e in lock.entries if e.name != "flashinfer-python"))
    with pytest.raises(ToolkitError) as err:
        deploy.engine_check_inputs(without, name, imports)
    assert "has no flashinfer-python, which flashinfer (server.prefill_attention_backend: flashinfer) needs" in \
        str(err.value)


def test_a_bench_flag_asked_for_replaces_the_rendered_value_or_is_added() -> None:
    argv = ["/p", "-m", "sglang.bench_serving", "--num-prompts", "1024"]
    assert deploy.with_bench_flags(argv, {"--num-prompts": "160", "--tokenizer": "/t"}) == [
        "/p", "-m", "sglang.bench_serving", "--num-prompts", "160", "--tokenizer", "/t"]


def test_lab_overlay_runs_the_standin_with_the_same_flags(store: ProfileStore) -> None:
    resolved = store.resolve("glm5-tp8")
    argv = render_launch_argv(resolved)
    lab = _lab(store, "glm5-tp8")
    text = lab.extravars["sglang_service_dropins_by_host"]["ct"][DROPIN]
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart=/"))
    standin = shlex.split(exec_line.removeprefix("ExecStart="))
    assert standin[:3] == [argv[0], "-m", "toolkit.lab.standin_server.server"]
    assert argv[0] == "/opt/sglang/venv/bin/python"
    assert standin[3:] == argv[3:]  # every rendered flag, unchanged
    assert "--nsa-decode-backend" in standin and "--disable-cuda-graph" in standin
    assert "LAB STAND-IN" in text and "SGLANG_STANDIN_FAIL_HEALTH" not in text
    assert lab.extravars["sglang_venv_extra_wheels"] == ["/w/gpu_serving_toolkit-0.1.0.whl"]
    bench = lab.bench_argv
    assert bench is not None and bench[bench.index("--num-prompts") + 1] == str(LAB_NUM_PROMPTS)
    assert bench[bench.index("--tokenizer") + 1] == TOKENIZER_DIR
    assert lab.probe_args == ["--gpu-source", "simulated:http://127.0.0.1:8000"]
    assert any("lab stand-in" in n for n in lab.notes) and any("--num-prompts 160" in n for n in lab.notes)
    # --num-prompts asked for wins over the lab's default (and the lab does not announce a change it did not make).
    asked = _lab(store, "glm5-tp8", num_prompts=64)
    assert asked.bench_argv is not None and asked.bench_argv[asked.bench_argv.index("--num-prompts") + 1] == "64"
    assert not any("--num-prompts" in n for n in asked.notes)
    failing = _lab(store, "glm5-tp8", host_vars={"toolkit_lab_standin_fail_health": True})
    assert "SGLANG_STANDIN_FAIL_HEALTH=1" in failing.extravars["sglang_service_dropins_by_host"]["ct"][DROPIN]


def test_lab_overlay_runs_a_pin_past_0_5_9_through_the_0_5_9_bench_client(store: ProfileStore) -> None:
    """0.5.23's own bench_serving imports torch, which the lab has not: the bench goes through
    toolkit.lab.standin_server.bench_client with the same arguments, its wheel beside the pinned SGLang."""
    lab = _lab(store, "glm5-tp8-0.5.23")
    bench = lab.bench_argv
    assert bench is not None and bench[:3] == ["python3", "-m", "toolkit.lab.standin_server.bench_client"]
    assert bench[3:] == _lab(store, "glm5-tp8").bench_argv[3:]  # type: ignore[index]
    wheels = lab.extravars["sglang_venv_extra_wheels"]
    assert wheels[0] == "/w/gpu_serving_toolkit-0.1.0.whl"
    assert Path(wheels[1]).name == "toolkit_lab_bench_client-0.5.9-py3-none-any.whl" and Path(wheels[1]).is_file()
    (note,) = [n for n in lab.notes if "benchmark client" in n]
    assert "SGLang 0.5.9's bench_serving with the same flags" in note and "SGLang 0.5.23's imports torch" in note
    text = lab.extravars["sglang_service_dropins_by_host"]["ct"][DROPIN]
    assert "--dsa-decode-backend trtllm" in text and "--nsa-decode-backend" not in text
    # The seed's pin keeps its own client.
    assert _lab(store, "glm5-tp8").bench_argv[:3] == ["python3", "-m", "sglang.bench_serving"]  # type: ignore[index]


def test_the_bench_client_wheel_holds_the_release_package_and_installs(tmp_path: Path) -> None:
    """The wheel pip installs (a real venv, --no-deps) and the runner finds 0.5.9's sglang in it, ahead of any."""
    import subprocess
    import sys
    import zipfile

    from toolkit.lab.deploy_overlay import bench_client_wheel

    wheel = bench_client_wheel("0.5.9")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "toolkit_lab_bench_client/sglang/bench_serving.py" in names
    assert "toolkit_lab_bench_client-0.5.9.dist-info/RECORD" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True)
    probe = ("import importlib.util, sys; s = importlib.util.find_spec('toolkit_lab_bench_client'); "
             "sys.path.insert(0, next(iter(s.submodule_search_locations))); "
             "print(importlib.util.find_spec('sglang').origin)")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("toolkit_lab_bench_client/sglang/__init__.py")
    # SGLang's MoE tuning configs have commas in their file names ("E=128,N=384,device_name=...json"): RECORD must
    # quote them as the CSV it is, or every importlib.metadata.packages_distributions() in that venv (transformers
    # calls it on import, the stand-in's tokenizer step imports transformers) fails on the next field.
    assert any("," in name for name in names)
    files = ("import importlib.metadata as m; d = m.distribution('toolkit_lab_bench_client'); "
             "print(len(d.files), sum(',' in f.name for f in d.files)); m.packages_distributions()")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", files], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    count, with_comma = map(int, out.stdout.split())
    assert count >= len(names) and with_comma > 0  # pip adds the compiled .pyc files


def test_standin_needs_a_launch_server_argv() -> None:
    with pytest.raises(ToolkitError, match=r"sglang\.launch_server"):
        standin_argv(["/venv/bin/python", "-m", "something.else", "--port", "1"])


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
    ev = deploy.build_extravars(inputs, run_id="r", wheelhouse_dir="/w", fetch_dir="/f", nodes=nodes)
    assert set(ev["sglang_service_unit_by_host"]) == {"gpu-a", "gpu-b"}
    lab = _lab(store, "glm5-tp8", nodes=nodes)
    assert "--node-rank 1" in lab.extravars["sglang_service_dropins_by_host"]["gpu-b"][DROPIN]
    assert deploy.per_node(resolved, ["only"]) == {}  # one node: every host runs the single unit


def test_multi_node_needs_as_many_hosts_as_nodes(store: ProfileStore) -> None:
    with pytest.raises(ToolkitError) as err:
        deploy.per_node(_two_node(store), ["gpu-a"])
    assert err.value.problems[0].field == "server.nnodes"


def test_a_renamed_kernel_distribution_is_found_under_its_releases_name(store: ProfileStore) -> None:
    """0.5.23's lock names sgl_kernel's distribution sglang-kernel (0.5.9's: sgl-kernel)."""
    from toolkit.core.engine_lock import parse_lock

    name = "profiles/requirements/sglang-0.5.23-cp311.lock"
    lock = parse_lock((REPO / name).read_text(), name)
    inputs = deploy.engine_check_inputs(lock, name, deploy.engine_imports(store.resolve("glm5-tp8-0.5.23")))
    by_module = {i["module"]: i["distribution"] for i in inputs["imports"]}
    assert by_module["sgl_kernel"] == "sglang-kernel" and by_module["torch"] == "torch"


def test_a_locks_wheelhouse_holds_exactly_its_files_the_standins_and_the_probes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pypi: None) -> None:
    """toolkit.adapters.wheelhouse.lock_wheelhouse, what a host installs the lock from: two small real lines of the
    0.5.9 lock fetched from PyPI by their sha256, one line replaced by a stand-in, a probe wheel beside them; built
    once."""
    import tarfile

    from tests.apply.test_engine_check import make_wheel
    from toolkit.adapters.wheelhouse import lock_wheelhouse
    from toolkit.core.engine_lock import EngineLock, parse_lock

    monkeypatch.setenv("TOOLKIT_WHEELHOUSE_DIR", str(tmp_path / "cache"))
    name = "profiles/requirements/sglang-0.5.9-cp311.lock"
    real = parse_lock((REPO / name).read_text(), name)
    small = EngineLock(real.sglang_version, real.python,
                       tuple(e for e in real.entries if e.name in ("sniffio", "tqdm", "torch")))
    (tmp_path / "w").mkdir()
    standin = make_wheel(tmp_path / "w", "torch", "2.9.1")
    probe = make_wheel(tmp_path / "w", "rich", "13.0")
    dest = lock_wheelhouse(small, "test", [probe], {"torch": standin})
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    assert wheels == sorted([small.get("sniffio").wheel, small.get("tqdm").wheel,  # type: ignore[union-attr]
                             standin.name, probe.name]), wheels
    with tarfile.open(str(dest) + ".tar") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.name.endswith(".whl")) == wheels
    before = (Path(str(dest) + ".tar")).stat().st_mtime_ns
    assert lock_wheelhouse(small, "test", [probe], {"torch": standin}) == dest
    assert Path(str(dest) + ".tar").stat().st_mtime_ns == before  # complete: not built again


def test_the_lab_wheelhouse_filled_ahead_is_the_one_the_apply_installs_from(
        store: ProfileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolkit lab wheelhouse glm5-tp8` (scripts/demo runs it beside `lab up`) builds the lab lock's wheelhouse
    under the same name, from the same lab lock and probe wheels, as the apply's overlay asks for; else the apply
    would download it all again. Only the download is left out here (lock_wheelhouse records what it was asked)."""
    from toolkit.adapters import wheelhouse
    from toolkit.app.apply import engine_lock_src
    from toolkit.lab import deploy_overlay

    monkeypatch.setenv("TOOLKIT_WHEELHOUSE_DIR", str(tmp_path))
    asked: list[tuple[str, str, tuple[Path, ...], list[str]]] = []

    def lock_wheelhouse(lock, name, also=(), standins=None):  # type: ignore[no-untyped-def]
        asked.append((name, lock.digest, tuple(also), sorted(standins or {})))
        return wheelhouse.lock_directory(name)

    probe = (tmp_path / "rich-15.0.0-py3-none-any.whl",)
    monkeypatch.setattr(deploy_overlay, "lock_wheelhouse", lock_wheelhouse)
    monkeypatch.setattr(wheelhouse, "probe_wheels",
                        lambda python, **_: wheelhouse.ProbeWheels(Path("/w/tk.whl"), probe, python, built=False))
    lock_file, lab = deploy_overlay.prefill("glm5-tp8", str(REPO / "profiles"))
    resolved = store.resolve("glm5-tp8")
    inputs = deploy.inputs_from_resolved(resolved, repo_root=REPO)
    amendment = amend(OverlayContext(resolved=resolved, inputs=inputs, hosts={"ct": InventoryHost("ct", (), {})},
                                     nodes={}, bench_argv=render_bench_argv(resolved, base_url="http://x:8000",
                                                                            output_file="/x/b.jsonl"),
                                     num_prompts=None, toolkit_wheel=Path("/w/tk.whl"),
                                     lock_src=engine_lock_src(resolved, REPO), probe_wheels=probe))
    assert len(asked) == 2 and asked[0] == asked[1] and asked[0][0].startswith("lab-sglang-0.5.9-")
    assert lab is not None and "torch" in asked[0][3] and asked[0][2] == probe
    assert amendment.extravars["sglang_venv_lock_src"] == str(lock_file)
