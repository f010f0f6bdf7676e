"""The lab's deploy overlay: what `toolkit apply` changes when the inventory is the lab's (`toolkit_overlay: lab`,
written by `toolkit lab up`), each change announced.

The lab has no GPU and no torch, so SGLang's server cannot start there, and no Hugging Face, so bench_serving has
no tokenizer or text to sample. Through the roles' generic inputs, the same a real host's deploy uses:
- the toolkit's own wheel goes into the engine's venv (`sglang_venv_extra_wheels`), and a systemd drop-in
  (`sglang_service_dropins`) runs its stand-in server (toolkit/lab/standin_server) with the rendered flags
  unchanged, the profile's target GPUs for its engine model, and first makes a local tokenizer and text;
- the bench runs fewer prompts (160 unless `--num-prompts` says), with that tokenizer and text, and, for a pin
  past 0.5.9 (whose own client imports torch), through SGLang 0.5.9's client (standin_server/bench_client.py);
- the probe reads the stand-in's SIMULATED GPUs (`--gpu-source simulated:URL`, toolkit.lab.simulated_gpus).
- the engine lock is installed as on a real host, from a lab lock whose GPU-only lines (torch, triton, FlashInfer,
  sgl-kernel, nvidia-*, cuda-*: toolkit.lab.engine_standins) are stand-in wheels of the same name and version,
  the rest the lock's real wheels, hash-checked; the engine check's distribution check stays whole, its imports
  narrowed to the stand-ins' own modules (SGLang's server_args imports the real torch and triton).
The unit itself stays exactly what `toolkit profile render` prints. What the lab's inventory sets for the roles
(no model fetch, a short health timeout) is in toolkit.lab.plan.render_inventory, not here.

Test switches, as inventory variables of a container (tests write them): `toolkit_lab_standin_fail_health` (the
stand-in answers /health with 503), `toolkit_lab_standin_nan_log` (it logs SGLang's NaN line) and
`toolkit_lab_standin_exit_at_start` (it exits with status 1 at once, as a server missing a module does),
`toolkit_lab_standin_dist_timeout_s` (seconds a multi-node rank waits for the others when the profile gives no
--dist-timeout, in place of torch's 600 s: SGLANG_STANDIN_DIST_TIMEOUT_S) and `toolkit_lab_real_engine` (the real
lock installed whole, torch and the CUDA wheels included: no stand-ins).
Per release, so that an upgrade can be rehearsed against a release made faster, slower or broken on purpose:
`toolkit_lab_release_speed` (a mapping of SGLang release to a factor: {"0.5.23": 0.85} serves 0.5.23 at 85 % of
the engine model's pace) and `toolkit_lab_release_health` (a mapping of release to `fail`: that release's /health
answers 503, as SGLANG_STANDIN_FAIL_HEALTH). The release is the profile's being applied, so the same inventory
serves the old release as it is and the new one as told.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from toolkit.adapters.wheelhouse import lock_wheelhouse
from toolkit.app.apply import Amendment, OverlayContext
from toolkit.core.deploy import EngineImport, engine_imports, systemd_exec_line, with_bench_flags
from toolkit.core.engine_lock import parse_lock
from toolkit.core.errors import ToolkitError
from toolkit.lab import engine_standins

# 1024 prompts (the story's count) would take the stand-in's engine model 75 s for glm5-baseline (it runs in real
# time at the story's ~880 tok/s); 160 prompts of the profile's lengths keep a lab run to about 13 s for
# glm5-baseline (64 running, the rest queued for most of it) and 7 s for glm5-tp8 (all 160 at once), long
# enough for the steady-state rule's 5 s plateau. The lab says so in its notes and in the results entry.
LAB_NUM_PROMPTS = 160
STANDIN_DIR = "/opt/sglang/standin"
TOKENIZER_DIR = f"{STANDIN_DIR}/lab-tokenizer"
DATASET_PATH = f"{STANDIN_DIR}/lab-sharegpt.json"
DROPIN = "lab-standin.conf"
POWER_LIMITS_FILE = "/var/lib/lab-standin/host-sys-module/nvidia/power_limits.json"  # labstandin.power_limits_path
SERVER_MODULE = "toolkit.lab.standin_server.server"
# Where the fleet preflight installs the NCCL all-reduce stand-in on node 0 (toolkit/lab/standins/all_reduce_perf).
NCCL_STANDIN_DEST = "/usr/local/bin/all_reduce_perf-lab-standin"
# transformers' and datasets' own switch (USE_TORCH): with the lab lock's stand-in torch installed they would
# otherwise import it as the real one (safetensors.torch annotates with torch.Tensor at import) and fail; the lab
# has no torch to use, so the tokenizer and the bench run torch-less, as they did before the lock.
NO_TORCH = "USE_TORCH=0"
# A container variable (tests write it): install the real lock whole, no stand-ins (several GB; the opt-in test).
REAL_ENGINE_VAR = "toolkit_lab_real_engine"
BENCH_DATA_MODULE = "toolkit.lab.standin_server.make_bench_data"


def standin_argv(launch_argv: Sequence[str]) -> list[str]:
    """The stand-in's command: the rendered SGLang argv with `-m sglang.launch_server` swapped for the stand-in's
    module. The interpreter (the venv's python) and every flag stay as rendered, so the stand-in parses the same
    --host/--port/--api-key/--served-model-name/--model-path the real server would."""
    argv = list(launch_argv)
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1].startswith("sglang.launch_server"):
            return [*argv[:i], "-m", SERVER_MODULE, *argv[i + 2 :]]
    raise ToolkitError.of(
        "the rendered launch command does not run `-m sglang.launch_server`; the lab cannot stand in for it",
        field="launch argv",
        fix="render the profile (`toolkit profile render NAME`) and check its command",
    )


def target_env(target: Mapping[str, Any]) -> dict[str, str]:
    """SGLANG_STANDIN_GPU_* for the stand-in: the hardware its engine model simulates (set fields only)."""
    keys = {"gpu_model": "SGLANG_STANDIN_GPU_NAME", "gpu_memory_gib": "SGLANG_STANDIN_GPU_MEMORY_GIB",
            "gpu_power_limit_w": "SGLANG_STANDIN_GPU_POWER_LIMIT_W", "interconnect": "SGLANG_STANDIN_INTERCONNECT"}
    out = {env: str(target[k]) for k, env in keys.items() if target.get(k) not in (None, "")}
    if target.get("p2p") is not None:
        out["SGLANG_STANDIN_P2P"] = "1" if target["p2p"] else "0"
    return dict(sorted(out.items()))


RELEASE_SPEED_VAR, RELEASE_HEALTH_VAR = "toolkit_lab_release_speed", "toolkit_lab_release_health"


def release_switches(hostvars: Mapping[str, Any], release: str, host: str) -> tuple[float | None, bool]:
    """(the stand-in's speed factor, whether its health fails) for `release` from a host's inventory variables; a
    bad value is an error naming the variable and the host."""
    speeds = hostvars.get(RELEASE_SPEED_VAR) or {}
    health = hostvars.get(RELEASE_HEALTH_VAR) or {}
    for var, value in ((RELEASE_SPEED_VAR, speeds), (RELEASE_HEALTH_VAR, health)):
        if not isinstance(value, Mapping):
            raise ToolkitError.of(f"{var} of {host} is {type(value).__name__}, not a mapping of release to value",
                                  field=var, fix=f'e.g. {var}: {{"0.5.23": 0.85}}' if var == RELEASE_SPEED_VAR
                                  else f'e.g. {var}: {{"0.5.23": fail}}')
    speed = speeds.get(release)
    if speed is not None and (isinstance(speed, bool) or not isinstance(speed, int | float) or not speed > 0):
        raise ToolkitError.of(f"{RELEASE_SPEED_VAR}[{release!r}] of {host} is {speed!r}, not a positive factor",
                              field=RELEASE_SPEED_VAR, fix=f'e.g. {RELEASE_SPEED_VAR}: {{"{release}": 0.85}}')
    state = health.get(release)
    if state not in (None, "fail"):
        raise ToolkitError.of(f"{RELEASE_HEALTH_VAR}[{release!r}] of {host} is {state!r}; the one state is fail",
                              field=RELEASE_HEALTH_VAR, fix=f'e.g. {RELEASE_HEALTH_VAR}: {{"{release}": fail}}')
    return (None if speed is None else float(speed)), state == "fail"


DIST_TIMEOUT_VAR = "toolkit_lab_standin_dist_timeout_s"


def dist_timeout(hv: Mapping[str, Any], host: str) -> float | None:
    """The host's toolkit_lab_standin_dist_timeout_s, checked: a positive number of seconds, or None."""
    value = hv.get(DIST_TIMEOUT_VAR)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ToolkitError.of(f"{DIST_TIMEOUT_VAR} of {host} is {value!r}, not a positive number of seconds",
                              field=DIST_TIMEOUT_VAR, fix=f"e.g. {DIST_TIMEOUT_VAR}: 20")
    return float(value)


def dropin(launch_argv: Sequence[str], env: Mapping[str, str], *, fail_health: bool, nan_log: bool,
           exit_at_start: bool = False, speed: float | None = None, dist_timeout_s: float | None = None) -> str:
    """The drop-in that runs the stand-in in the rendered unit's place (announced in the file)."""
    python = launch_argv[0]
    lines = [
        "# LAB STAND-IN (toolkit lab): there is no GPU and no torch here, so SGLang's launch_server cannot run.",
        "# The unit keeps the rendered SGLang command; this drop-in runs the lab's stand-in server in its place,",
        f"# given the same flags ({SERVER_MODULE}, from the toolkit's wheel in this venv). Written by the",
        "# lab's deploy overlay (toolkit.lab.deploy_overlay); never on a real host.",
        "[Service]",
        # bench_serving's tokenizer and text: Hugging Face is unreachable from the lab (idempotent: made once).
        "ExecStartPre=" + systemd_exec_line([python, "-m", BENCH_DATA_MODULE, TOKENIZER_DIR, DATASET_PATH]),
        "ExecStart=",
        "ExecStart=" + systemd_exec_line(standin_argv(launch_argv)),
        "Environment=SGLANG_STANDIN=1",
        "Environment=HF_HUB_OFFLINE=1",
        # The venv's torch is the lab lock's stand-in: transformers and datasets must not take it for the real one.
        f"Environment={NO_TORCH}",
        # The GPUs' enforced power limit, as the lab's driver keeps it on the host (nvidia-smi -pl there).
        f"Environment=SGLANG_STANDIN_POWER_LIMITS_FILE={POWER_LIMITS_FILE}",
        *(f'Environment="{k}={v}"' for k, v in sorted(env.items())),
    ]
    if fail_health:
        lines.append("Environment=SGLANG_STANDIN_FAIL_HEALTH=1")
    if nan_log:
        lines.append("Environment=SGLANG_STANDIN_NAN_LOG=1")
    if exit_at_start:
        lines.append("Environment=SGLANG_STANDIN_EXIT_AT_START=1")
    if speed is not None:
        lines.append(f"Environment=SGLANG_STANDIN_SPEED={speed:g}")
    if dist_timeout_s is not None:
        lines.append(f"Environment=SGLANG_STANDIN_DIST_TIMEOUT_S={dist_timeout_s:g}")
    return "\n".join(lines) + "\n"


def bench_client_wheel(release: str) -> Path:
    """The lab's bench client wheel of SGLang `release` (standin_server/bench_client.py), built once beside that
    release's cached wheel."""
    from toolkit.adapters import cache_lock, sglang_catalogue
    from toolkit.lab.standin_server import bench_client

    wheel = sglang_catalogue.ensure_wheel(release)
    out = wheel.with_name(bench_client.wheel_name(release))
    cache_lock.build_once(out, out.exists, lambda: bench_client.build_wheel(wheel, out.parent, release))
    return out


def through_bench_client(bench_argv: Sequence[str]) -> list[str]:
    """The bench argv with `-m sglang.bench_serving` run through the lab's bench client (same interpreter, same
    arguments)."""
    from toolkit.lab.standin_server import bench_client

    argv = list(bench_argv)
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == "sglang.bench_serving":
            return [*argv[:i], "-m", bench_client.MODULE, *argv[i + 2 :]]
    raise ToolkitError.of("the bench command does not run `-m sglang.bench_serving`", field="bench argv",
                          fix="render the profile's bench command (`toolkit profile render NAME --only bench`)")


def narrowed_imports(imports: Sequence[EngineImport], standins: set[str]) -> tuple[list[EngineImport], list[str]]:
    """The engine check's imports the lab can pass: the stand-ins' own top-level modules (a submodule such as
    sgl_kernel.flash_attn is the stand-in's package); a module of a real distribution that imports the real torch
    (sglang.srt.server_args) is dropped. Returns the imports and the dropped modules."""
    kept: dict[str, EngineImport] = {}
    dropped = []
    for i in imports:
        dist = i.in_lock(standins)
        if dist is not None:
            top = i.module.split(".")[0]
            kept.setdefault(top, EngineImport(top, dist, i.why))
        else:
            dropped.append(i.module)
    return list(kept.values()), dropped


def lab_wheelhouse(lock_src: Path, also: Sequence[Path] = (), *, standins: bool = True,
                   importable: Sequence[EngineImport] = ()) -> tuple[Path, Path, engine_standins.LabLock | None]:
    """The lab lock of `lock_src` (beside its wheelhouse) and that wheelhouse
    (toolkit.adapters.wheelhouse.lock_wheelhouse: the lock's real wheels, hash-checked, the stand-ins in place of
    the GPU-only ones, the probe's wheels `also` names). The stand-ins of the distributions `importable` brings keep
    their real module names (the engine check imports them). Without `standins` (the opt-in real engine), the lock
    itself and every one of its real wheels, several GB."""
    from toolkit.adapters.files import write_atomic
    from toolkit.adapters.wheelhouse import cache_root

    real = parse_lock(lock_src.read_text(), str(lock_src))
    if not standins:
        return lock_src, lock_wheelhouse(real, f"sglang-{real.sglang_version}-{real.digest[:16]}", also), None
    lab = engine_standins.lab_lock(real, lock_src.name, cache_root() / "lab" / "standins" / real.digest[:16],
                                   {c for i in importable for c in i.candidates()})
    dest = lock_wheelhouse(lab.lock, f"lab-sglang-{real.sglang_version}-{lab.lock.digest[:16]}", also, lab.standins)
    lock_file = dest.with_name(dest.name + ".lock")
    if not lock_file.exists() or lock_file.read_text() != lab.text:
        write_atomic(lock_file, lab.text)
    return lock_file, dest, lab


def amend(ctx: OverlayContext) -> Amendment:
    """The lab's changes to one apply (toolkit.app.apply's overlay seam; registered as the entry point `lab`)."""
    from toolkit.lab.standin_server import bench_client

    env = target_env(ctx.resolved.spec.target.model_dump())

    def switches(host: str) -> dict[str, Any]:
        hv = ctx.hosts[host].vars if host in ctx.hosts else {}
        speed, release_fails = release_switches(hv, ctx.inputs.sglang_version, host)
        return {"fail_health": bool(hv.get("toolkit_lab_standin_fail_health")) or release_fails,
                "nan_log": bool(hv.get("toolkit_lab_standin_nan_log")),
                "exit_at_start": bool(hv.get("toolkit_lab_standin_exit_at_start")), "speed": speed,
                "dist_timeout_s": dist_timeout(hv, host)}

    argv_of = {h: a for h, (a, _) in ctx.nodes.items()}
    told = {h: switches(h) for h in ctx.hosts}
    by_host = {h: {DROPIN: dropin(argv_of.get(h, ctx.inputs.launch_argv), env, **told[h])} for h in ctx.hosts}
    num_prompts = ctx.num_prompts if ctx.num_prompts is not None else LAB_NUM_PROMPTS
    bench = with_bench_flags(ctx.bench_argv, {"--num-prompts": str(num_prompts), "--tokenizer": TOKENIZER_DIR,
                                              "--dataset-path": DATASET_PATH})
    notes = [
        "lab stand-in: the unit carries the rendered SGLang argv; a drop-in runs the lab's stand-in server "
        f"({SERVER_MODULE}) with the same flags instead of sglang.launch_server (no GPU, no torch)",
        f"lab: bench --tokenizer {TOKENIZER_DIR} (generated locally: Hugging Face is unreachable)",
        f"lab: bench --dataset-path {DATASET_PATH} (generated ShareGPT-format text: no download)",
        "lab: the probe reads the stand-in's SIMULATED GPUs (its engine model), not NVML",
    ]
    for h, t in sorted(told.items()):
        release = ctx.inputs.sglang_version
        if t["speed"] is not None:
            notes.append(f"lab: {h} serves SGLang {release} at {t['speed']:g} x the engine model's pace "
                         f"({RELEASE_SPEED_VAR}): a release made faster or slower on purpose")
        if release_switches(ctx.hosts[h].vars, release, h)[1]:
            notes.append(f"lab: {h}'s SGLang {release} fails its health check on purpose ({RELEASE_HEALTH_VAR})")
    if ctx.num_prompts is None:
        notes.insert(1, f"lab: bench --num-prompts {num_prompts} instead of the profile's value")
    wheels = [str(ctx.toolkit_wheel)]
    if ctx.inputs.sglang_version != bench_client.RELEASE:
        wheels.append(str(bench_client_wheel(bench_client.RELEASE)))
        bench = through_bench_client(bench)
        notes.append(
            f"lab: the benchmark client is SGLang {bench_client.RELEASE}'s bench_serving with the same flags "
            f"({bench_client.MODULE}): SGLang {ctx.inputs.sglang_version}'s imports torch, which the lab has not"
        )
    extravars: dict[str, Any] = {"sglang_venv_extra_wheels": wheels, "sglang_service_dropins_by_host": by_host}
    if ctx.nodes:
        # The fleet preflight's NCCL all-reduce: the lab has no GPU, NCCL or MPI; the stand-in takes the real
        # command line after it and prints nccl-tests' format, saying it is one.
        extravars |= {"fleet_preflight_nccl_launcher": [NCCL_STANDIN_DEST],
                      "fleet_preflight_nccl_tool_src": str(resources.files("toolkit.lab.standins")
                                                           .joinpath("all_reduce_perf"))}
        notes.append("lab: the NCCL preflight's all_reduce_perf is the lab's stand-in (a loopback TCP socket on "
                     "node 0, not the network between the hosts)")
    imports = None
    if ctx.lock_src is not None:
        from toolkit.adapters.wheelhouse import tarball_path

        real_engine = any(bool(h.vars.get(REAL_ENGINE_VAR)) for h in ctx.hosts.values())
        lock_file, dest, lab = lab_wheelhouse(ctx.lock_src, ctx.probe_wheels, standins=not real_engine,
                                              importable=engine_imports(ctx.resolved))
        extravars |= {"sglang_venv_lock_src": str(lock_file), "sglang_venv_wheelhouse_src": str(dest),
                      "sglang_venv_wheelhouse_tar": str(tarball_path(dest))}
        if lab is None:
            notes.append(f"lab: {REAL_ENGINE_VAR}: the engine lock {ctx.lock_src.name} installed whole, its real "
                         "wheels (torch and the CUDA wheels included); the engine check imports everything it would "
                         "on a GPU host (CUDA absent allowed)")
        else:
            imports, dropped = narrowed_imports(engine_imports(ctx.resolved), set(lab.standins))
            bench = ["env", NO_TORCH, *bench]
            notes.append(f"lab: the engine lock {ctx.lock_src.name} is installed from a lab lock ({lock_file}): "
                         f"{len(lab.standins)} GPU-only line(s) are lab stand-in wheels of the same name and version "
                         f"({', '.join(sorted(lab.standins))}), the other {len(lab.real)} the lock's real wheels")
            notes.append(f"lab: the engine check imports {', '.join(i.module for i in imports)} (the stand-ins) and "
                         f"not {', '.join(dropped)} (they import the real torch and triton); its distribution check "
                         "is whole")
            notes.append(f"lab: {NO_TORCH} for the stand-in server's unit and the bench (transformers and datasets "
                         "would take the stand-in torch for the real one)")
    return Amendment(
        extravars=extravars,
        bench_argv=bench,
        probe_args=["--gpu-source", f"simulated:http://127.0.0.1:{ctx.inputs.port}"],
        notes=notes,
        engine_imports=imports,
    )


def prefill(profile: str, profiles_dir: str | None = None) -> tuple[Path, engine_standins.LabLock | None]:
    """What a lab apply of `profile` builds on the controller before it touches a host, built now: the probe's
    wheels, the installer (the pinned uv) and the lab lock's wheelhouse (its real wheels downloaded into the cache,
    the stand-ins built), the same calls the apply and `amend` make, so the apply finds them done. The lab need not
    be up: `scripts/demo` runs this beside `lab up`, whose Debian builds wait mostly on dpkg while this waits on
    PyPI. The wheelhouse's locks let an apply that starts first wait for it instead of downloading the same files.
    Returns the lab lock file and the lab lock."""
    from toolkit.adapters.ansible import share_dir
    from toolkit.adapters.wheelhouse import installer_binary, probe_wheels
    from toolkit.app.apply import engine_lock_src
    from toolkit.app.profiles import resolve_checked
    from toolkit.core.deploy import inputs_from_resolved
    from toolkit.lab.standin_server import bench_client

    checked = resolve_checked(profile, profiles_dir)
    repo_root = checked.store.dir.resolve().parent
    lock_src = engine_lock_src(checked.resolved, repo_root)
    python = parse_lock(lock_src.read_text(), str(lock_src)).python
    probe = probe_wheels(python, repo_root=share_dir())
    installer_binary(python)
    if inputs_from_resolved(checked.resolved, repo_root=repo_root).sglang_version != bench_client.RELEASE:
        bench_client_wheel(bench_client.RELEASE)
    lock_file, _dest, lab = lab_wheelhouse(lock_src, probe.runtime, importable=engine_imports(checked.resolved))
    return lock_file, lab
