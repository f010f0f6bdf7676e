"""What `toolkit apply` hands the deploy roles: the extravars, computed from a resolved profile.

Pure: data in, data out. The launch argv, environment and systemd unit come from the profile's
renderer (toolkit.core.profile.render) unchanged, so what `toolkit profile render` prints is what
runs; the roles never re-render. This module only gathers those pieces, adds where things live
and, in the lab, the announced substitutions (the stand-in server, a smaller benchmark).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.render import (
    API_KEY_ENV,
    DEFAULT_HF_HOME,
    render_env,
    render_launch_argv,
    render_systemd_unit,
    systemd_word,
)
from toolkit.core.profile.resolve import ResolvedProfile

# Where the service listens when the profile says nothing: SGLang's own default host, and the
# port the seed's bench command used (DOMAIN.md section 1: --base-url http://localhost:8000).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000

# Server log lines that fail a deploy. The seed's first days were NaN crashes in decode; SGLang's
# sampler raises "Detected errors during sampling! NaN in the logits." and CUDA failures print
# "CUDA error" / "CUDA_ERROR_*" (DOMAIN.md section 4: cuInit returning CUDA_ERROR_NOT_INITIALIZED).
LOG_FAIL_PATTERNS: tuple[str, ...] = (
    r"NaN in the logits",
    r"\bnan\b.*(logits|probs)",
    r"CUDA error",
    r"CUDA_ERROR_[A-Z_]+",
    r"RuntimeError: CUDA",
    r"torch\.OutOfMemoryError|CUDA out of memory",
)

# A fixed, greedy, short smoke generation: it must return text before the deploy counts as done.
SMOKE_PROMPT = "The capital of France is"
SMOKE_MAX_TOKENS = 8

# SGLang's serving-side Python imports the lab venv installs from the wheelhouse (bench_serving's
# imports in sglang/bench_serving.py: aiohttp, numpy, pybase64, requests, datasets, PIL, tqdm,
# transformers) and what `import sglang` itself pulls in before bench_serving runs (sglang/utils.py:
# IPython; the frontend: pydantic), found by importing sglang.bench_serving in a bare venv. Everything
# else SGLang requires (torch, flashinfer, sgl-kernel, ...) is left out where no GPU exists; the
# wheelhouse writes the exact list it left out (LEFT_OUT.txt).
SERVING_REQUIREMENTS: tuple[str, ...] = (
    "aiohttp",
    "numpy",
    "pybase64",
    "requests",
    "datasets",
    "pillow",
    "tqdm",
    "transformers",
    "tokenizers",
    "huggingface_hub",
    "ipython",
    "pydantic",
)


@dataclass(frozen=True)
class PatchSpec:
    """One patch of the installed engine: the file it changes and the exact file it expects."""

    name: str
    target: str  # relative to site-packages
    patch_file: Path  # absolute, on the controller
    sha256: str  # of the unpatched target file the patch was written against


@dataclass(frozen=True)
class DeployInputs:
    """Everything the roles need, taken from the resolved profile and its render."""

    profile_name: str
    spec_hash: str
    sglang_version: str
    venv_path: str
    launch_argv: list[str]
    env: dict[str, str]
    unit_text: str
    patches: list[PatchSpec]
    model_repo_id: str | None
    model_revision: str | None
    model_local_path: str | None
    served_model_name: str | None
    host: str
    port: int
    api_key_secret: str | None  # a reference (env:NAME or vault:NAME), never the key
    api_key_env_file: str | None = None  # the unit's EnvironmentFile that holds the key (mode 0600)
    nnodes: int = 1
    bench_argv: list[str] = field(default_factory=list)
    service_name: str = "sglang"
    server_scrape_hz: float = 2.0  # the profile's probe.server_scrape_hz
    # The profile's target, for the lab stand-in's engine model (its simulated GPUs); unused on real hosts.
    target_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LabOptions:
    """Announced substitutions for the lab, where no GPU exists and SGLang's server cannot start."""

    standin_server: bool = False
    standin_fail_health: bool = False
    standin_nan_log: bool = False
    bench_num_prompts: int | None = None  # the profile's 1024 would take minutes against the stand-in
    tokenizer_dir: str | None = None  # a local tokenizer generated in the container: HF is unreachable
    dataset_path: str | None = None  # a local ShareGPT-format file: bench_serving's random set samples text from it


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def inputs_from_resolved(resolved: ResolvedProfile, *, repo_root: Path) -> DeployInputs:
    """Gather the deploy inputs from a resolved profile with the profile package's own renderers."""
    spec = resolved.spec
    problems: list[Problem] = []
    if not spec.engine.sglang_version:
        problems.append(Problem("the SGLang version is not pinned", file=resolved.file, field="engine.sglang_version",
                                fix="set engine.sglang_version to an exact release, e.g. 0.5.9"))
    patches: list[PatchSpec] = []
    for i, p in enumerate(spec.engine.patches):
        pfile = Path(p.patch)
        pfile = pfile if pfile.is_absolute() else repo_root / pfile
        if not pfile.is_file():
            problems.append(Problem(f"patch file not found: {pfile}", file=resolved.file,
                                    field=f"engine.patches[{i}].patch",
                                    fix="name a patch file relative to the repository root (profiles/patches/...)"))
        patches.append(PatchSpec(name=p.name, target=p.target, patch_file=pfile, sha256=p.target_sha256))
    if problems:
        raise ToolkitError(problems)
    argv = render_launch_argv(resolved)
    secret = spec.server.api_key_secret
    return DeployInputs(
        profile_name=resolved.name,
        spec_hash=spec_hash(resolved),
        sglang_version=str(spec.engine.sglang_version),
        venv_path=spec.engine.venv_path,
        launch_argv=argv,
        env=dict(render_env(resolved)),
        unit_text=render_systemd_unit(resolved),
        patches=patches,
        model_repo_id=spec.model.repo_id,
        model_revision=spec.model.revision,
        model_local_path=spec.model.local_path,
        served_model_name=spec.model.served_model_name,
        host=spec.server.host,
        port=spec.server.port,
        api_key_secret=secret,
        api_key_env_file=f"/etc/sglang/{resolved.name}.env" if secret else None,
        nnodes=spec.server.nnodes,
        server_scrape_hz=float(spec.probe.server_scrape_hz),
        target_env=standin_target_env(spec.target.model_dump()),
    )


def standin_target_env(target: Mapping[str, Any]) -> dict[str, str]:
    """SGLANG_STANDIN_GPU_* for the lab stand-in: the hardware its engine model simulates (set fields only)."""
    keys = {"gpu_model": "SGLANG_STANDIN_GPU_NAME", "gpu_memory_gib": "SGLANG_STANDIN_GPU_MEMORY_GIB",
            "gpu_power_limit_w": "SGLANG_STANDIN_GPU_POWER_LIMIT_W", "interconnect": "SGLANG_STANDIN_INTERCONNECT"}
    out = {env: str(target[k]) for k, env in keys.items() if target.get(k) not in (None, "")}
    if target.get("p2p") is not None:
        out["SGLANG_STANDIN_P2P"] = "1" if target["p2p"] else "0"
    return dict(sorted(out.items()))


def per_node(resolved: ResolvedProfile, hosts: Sequence[str]) -> dict[str, tuple[list[str], str]]:
    """Multi-node SGLang (server.nnodes > 1): each host's argv and unit, with its --node-rank.

    Node ranks follow the inventory's order of the deployed hosts (node 0 is the first, and the
    profile's dist_init_addr must be its address); `nnodes` hosts exactly, or nothing is deployed.
    """
    import dataclasses

    nnodes = resolved.spec.server.nnodes
    if nnodes <= 1:
        return {}
    if len(hosts) != nnodes:
        raise ToolkitError.of(
            f"server.nnodes is {nnodes} but the inventory deploys {len(hosts)} host(s): {', '.join(hosts) or 'none'}",
            file=resolved.file,
            field="server.nnodes",
            fix=f"list {nnodes} hosts in the inventory's gpu_containers group (node 0 first), or use --limit",
        )
    out = {}
    for rank, host in enumerate(hosts):
        server = resolved.spec.server.model_copy(update={"node_rank": rank})
        node = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"server": server}))
        out[host] = (render_launch_argv(node), render_systemd_unit(node))
    return out


def standin_argv(launch_argv: Sequence[str], server_path: str) -> list[str]:
    """The stand-in's command: the rendered SGLang argv with `-m sglang.launch_server` swapped for the stand-in.

    The interpreter (the venv's python) and every flag stay as rendered, so the stand-in parses the
    same --host/--port/--api-key/--served-model-name/--model-path the real server would.
    """
    argv = list(launch_argv)
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1].startswith("sglang.launch_server"):
            return [*argv[:i], server_path, *argv[i + 2 :]]
    raise ToolkitError.of(
        "the rendered launch command does not run `-m sglang.launch_server`; the lab cannot stand in for it",
        field="launch argv",
        fix="render the profile (`toolkit profile render NAME`) and check its command",
    )


def systemd_exec_line(argv: Sequence[str]) -> str:
    """argv as one ExecStart= value, quoted as the unit is; `${SGLANG_API_KEY}` stays for systemd to expand."""
    token = "${" + API_KEY_ENV + "}"
    return " ".join(a if a == token else systemd_word(a) for a in argv)


def with_bench_overrides(bench_argv: Sequence[str], lab: LabOptions) -> list[str]:
    """The lab's announced changes to the rendered bench command (prompt count, local tokenizer and text)."""
    argv = list(bench_argv)

    def setflag(flag: str, value: str) -> None:
        for i, tok in enumerate(argv):
            if tok == flag and i + 1 < len(argv):
                argv[i + 1] = value
                return
        argv.extend([flag, value])

    if lab.bench_num_prompts is not None:
        setflag("--num-prompts", str(lab.bench_num_prompts))
    if lab.tokenizer_dir:
        setflag("--tokenizer", lab.tokenizer_dir)
    if lab.dataset_path:
        setflag("--dataset-path", lab.dataset_path)
    return argv


def lab_notes(inputs: DeployInputs, lab: LabOptions) -> list[str]:
    """One line per lab substitution; printed by `toolkit apply` and stored with the run."""
    notes = []
    if lab.standin_server:
        notes.append(
            "lab stand-in: the unit carries the rendered SGLang argv; a drop-in runs "
            "toolkit/lab/standin_server/server.py with the same flags instead of sglang.launch_server "
            "(no GPU, no torch)"
        )
    if lab.bench_num_prompts is not None:
        notes.append(f"lab: bench --num-prompts {lab.bench_num_prompts} instead of the profile's value")
    if lab.tokenizer_dir:
        notes.append(f"lab: bench --tokenizer {lab.tokenizer_dir} (generated locally: Hugging Face is unreachable)")
    if lab.dataset_path:
        notes.append(f"lab: bench --dataset-path {lab.dataset_path} (generated ShareGPT-format text: no download)")
    if inputs.model_local_path is None and lab.standin_server:
        notes.append("lab: the model is not fetched (no Hugging Face access, and the stand-in needs no weights)")
    return notes


def build_extravars(
    inputs: DeployInputs,
    *,
    run_id: str,
    wheelhouse_dir: str,
    fetch_dir: str,
    wheelhouse_tar: str = "",
    toolkit_wheel: str = "",
    wheelhouse_pythons: Sequence[str] = (),  # the CPython versions the wheelhouse has wheels for; () = not checked
    standin_server_src: str,
    lab: LabOptions | None = None,
    bench_argv: Sequence[str] | None = None,
    probe_args: Sequence[str] = (),
    nodes: Mapping[str, tuple[list[str], str]] | None = None,
) -> dict[str, Any]:
    """The extravars of playbooks/deploy.yml. Keys carry the role prefix they belong to."""
    lab = lab or LabOptions()
    site_argv = list(inputs.launch_argv)
    standin = standin_argv(site_argv, "/opt/sglang/standin/server.py") if lab.standin_server else []
    base_url = f"http://{'127.0.0.1' if inputs.host in ('0.0.0.0', '::') else inputs.host}:{inputs.port}"
    requirements = [f"sglang=={inputs.sglang_version}", *SERVING_REQUIREMENTS]
    return {
        "deploy_profile_name": inputs.profile_name,
        "deploy_spec_hash": inputs.spec_hash,
        "deploy_run_id": run_id,
        "deploy_lab_notes": lab_notes(inputs, lab),
        "sglang_venv_path": inputs.venv_path,
        "sglang_venv_sglang_version": inputs.sglang_version,
        "sglang_venv_requirements": requirements,
        "sglang_venv_wheelhouse_src": wheelhouse_dir,
        "sglang_venv_wheelhouse_tar": wheelhouse_tar or f"{wheelhouse_dir.rstrip('/')}.tar",
        "sglang_venv_wheelhouse_pythons": list(wheelhouse_pythons),
        "sglang_venv_patches": [
            {"name": p.name, "target": p.target, "patch_src": str(p.patch_file), "sha256": p.sha256}
            for p in inputs.patches
        ],
        "sglang_venv_hf_home": inputs.env.get("HF_HOME", DEFAULT_HF_HOME),
        "sglang_venv_model_repo_id": inputs.model_repo_id,
        "sglang_venv_model_revision": inputs.model_revision,
        "sglang_venv_model_local_path": inputs.model_local_path,
        "sglang_service_name": inputs.service_name,
        "sglang_service_unit": inputs.unit_text,
        "sglang_service_argv": site_argv,
        "sglang_service_env": dict(sorted(inputs.env.items())),
        "sglang_service_base_url": base_url,
        "sglang_service_api_key_secret": inputs.api_key_secret,
        "sglang_service_api_key_env_file": inputs.api_key_env_file or "",
        "sglang_service_served_model_name": inputs.served_model_name or inputs.model_repo_id or "default",
        "sglang_service_smoke_prompt": SMOKE_PROMPT,
        "sglang_service_smoke_max_tokens": SMOKE_MAX_TOKENS,
        "sglang_service_log_fail_patterns": list(LOG_FAIL_PATTERNS),
        "sglang_service_fetch_dir": fetch_dir,
        "sglang_service_standin": lab.standin_server,
        "sglang_service_standin_src": standin_server_src,
        "sglang_service_standin_extra_src": [str(Path(standin_server_src).with_name("engine_model.py"))]
        if lab.standin_server else [],
        "sglang_service_standin_env": inputs.target_env if lab.standin_server else {},
        "sglang_service_standin_exec": systemd_exec_line(standin) if standin else "",
        # Multi-node: per host, the argv and unit with that host's --node-rank (empty for one node).
        "sglang_service_argv_by_host": {h: a for h, (a, _) in (nodes or {}).items()},
        "sglang_service_unit_by_host": {h: u for h, (_, u) in (nodes or {}).items()},
        "sglang_service_standin_exec_by_host": {
            h: systemd_exec_line(standin_argv(a, "/opt/sglang/standin/server.py"))
            for h, (a, _) in (nodes or {}).items()
        } if lab.standin_server else {},
        "sglang_service_standin_fail_health": lab.standin_fail_health,
        "sglang_service_standin_nan_log": lab.standin_nan_log,
        "bench_probe_bench_argv": with_bench_overrides(bench_argv or inputs.bench_argv, lab),
        # The probe scrapes the deployed server's /metrics (the server timeline); apply adds --server-unit (its
        # tree goes into host_trace.csv, its journal into a failed run's verdict); the caller's options come after.
        "bench_probe_probe_args": ["--server-url", base_url, "--server-hz", f"{inputs.server_scrape_hz:g}",
                                   *probe_args],
        "bench_probe_hf_home": inputs.env.get("HF_HOME", DEFAULT_HF_HOME),
        "bench_probe_fetch_dir": fetch_dir,
        "bench_probe_wheelhouse_src": wheelhouse_dir,
        "bench_probe_toolkit_wheel_src": toolkit_wheel,
        "bench_probe_tokenizer_dir": lab.tokenizer_dir or "",
        "bench_probe_dataset_path": lab.dataset_path or "",
    }


def shell_line(argv: Sequence[str]) -> str:
    """argv as one copy-pasteable shell line (for summaries and docs)."""
    return shlex.join(argv)
