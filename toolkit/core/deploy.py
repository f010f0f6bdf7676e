"""What `toolkit apply` hands the deploy roles: the extravars, computed from a resolved profile.

Pure: data in, data out. The launch argv, environment and systemd unit come from the profile's
renderer (toolkit.core.profile.render) unchanged, so what `toolkit profile render` prints is what
runs; the roles never re-render. This module only gathers those pieces and adds where things live; an overlay
(the lab's: toolkit.lab.deploy_overlay) amends the result through toolkit.app.apply, never through this module.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.core.engine_lock import EngineLock, normalize_name
from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.render import (
    API_KEY_ENV,
    DEFAULT_HF_HOME,
    client_url,
    render_env,
    render_launch_argv,
    render_systemd_unit,
    systemd_word,
)
from toolkit.core.profile.resolve import ResolvedProfile

# Where the service listens when the profile says nothing: SGLang's own default host, and the
# port the story's bench command used (docs/story.md, the benchmark: --base-url http://localhost:8000).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000

# Server log lines that fail a deploy. The story's first days were NaN crashes in decode; SGLang's
# sampler raises "Detected errors during sampling! NaN in the logits." and CUDA failures print
# "CUDA error" / "CUDA_ERROR_*" (docs/story.md, CUDA inside the container: cuInit returning CUDA_ERROR_NOT_INITIALIZED).
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

# What `python -m sglang.launch_server` imports before it serves, for any profile: torch, the server's own
# arguments module (sglang.srt.server_args, which pulls in most of SGLang's runtime), and the CUDA kernels
# SGLang's layers import at start (sgl_kernel, triton). (module, the distribution that brings it)
ENGINE_IMPORTS: tuple[tuple[str, str], ...] = (
    ("torch", "torch"),
    ("triton", "triton"),
    ("sgl_kernel", "sgl-kernel"),
    ("sglang.srt.server_args", "sglang"),
)
# A distribution renamed between releases, its module kept: the lock names whichever its release has (sgl_kernel
# is sgl-kernel up to 0.5.9's lock, sglang-kernel in 0.5.23's).
RENAMED: dict[str, tuple[str, ...]] = {"sgl-kernel": ("sglang-kernel",)}
# The package each backend name brings in when the profile chooses it (attention, NSA, MoE runner): a backend
# value containing the key imports the module. FlashInfer's TRT-LLM kernels (trtllm_mha, trtllm_mla, the NSA
# trtllm backends) come through flashinfer; FA3 through sgl_kernel's flash_attn; FlashMLA and CUTLASS MLA are
# sgl_kernel's own.
BACKEND_IMPORTS: tuple[tuple[str, str, str], ...] = (
    ("flashinfer", "flashinfer", "flashinfer-python"),
    ("trtllm", "flashinfer", "flashinfer-python"),
    ("fa3", "sgl_kernel.flash_attn", "sgl-kernel"),
    ("triton", "triton", "triton"),
)
ENGINE_CHECK_SCHEMA = 1


@dataclass(frozen=True)
class EngineImport:
    """One module the engine check imports, and the distribution whose lock line should bring it."""

    module: str
    distribution: str
    why: str  # what asks for it: "SGLang's server", or the profile field that names the backend

    def candidates(self) -> tuple[str, ...]:
        """The distribution and the names it has had (RENAMED), normalized."""
        name = normalize_name(self.distribution)
        return (name, *RENAMED.get(name, ()))

    def in_lock(self, names: Collection[str]) -> str | None:
        """The name under which these (normalized) distribution names hold it, or None."""
        return next((c for c in self.candidates() if c in names), None)


def engine_imports(resolved: ResolvedProfile) -> list[EngineImport]:
    """What `sglang.launch_server` imports for this profile: the server's own modules, then the backend packages
    the profile's attention, NSA and MoE backends (and FlashInfer's all-reduce fusion) name; each module once."""
    out = [EngineImport(m, d, "SGLang's server") for m, d in ENGINE_IMPORTS]
    server = resolved.spec.server
    chosen = {f: getattr(server, f) for f in ("attention_backend", "prefill_attention_backend",
                                              "decode_attention_backend", "nsa_prefill_backend",
                                              "nsa_decode_backend", "moe_runner_backend")}
    if server.allreduce_fusion:
        chosen["allreduce_fusion"] = "flashinfer"
    for field_name, value in chosen.items():
        for key, module, dist in BACKEND_IMPORTS:
            if value and key in str(value).lower():
                out.append(EngineImport(module, dist, f"server.{field_name}: {value}"))
    first: dict[str, EngineImport] = {}
    for i in out:
        first.setdefault(i.module, i)
    return list(first.values())


def engine_check_inputs(lock: EngineLock, lock_name: str, imports: Sequence[EngineImport],
                        notes: Sequence[str] = ()) -> dict[str, Any]:
    """The engine check's inputs (roles/sglang_venv/files/engine_check.py reads them on the host): the lock's
    distributions as this toolkit parsed them (the check never parses a lock), the modules to import with the
    distribution that brings each, and the notes of whoever narrowed them. Refuses an import whose distribution
    the lock lacks: that lock could never pass."""
    names = set(lock.names)
    missing = [i for i in imports if i.in_lock(names) is None]
    if missing:
        raise ToolkitError.of(
            f"{lock_name} has no {', '.join(sorted({i.distribution for i in missing}))}, which "
            + "; ".join(f"{i.module} ({i.why})" for i in missing) + " needs",
            file=lock_name, fix=f"lock the release again (`toolkit profile lock --sglang-version {lock.sglang_version} "
            f"--python {lock.python}`), or choose a backend the lock brings")
    return {
        "schema": ENGINE_CHECK_SCHEMA,
        "lock": lock_name,
        "lock_digest": lock.digest,
        "distributions": {e.name: e.version for e in lock.entries},
        "imports": [{"module": i.module, "distribution": i.in_lock(names), "why": i.why} for i in imports],
        "notes": list(notes),
    }


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
    model_size_gib: float | None = None  # the profile's model.size_gib: the cache must have room before a fetch



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
        model_size_gib=spec.model.size_gib,
        served_model_name=spec.model.served_model_name,
        host=spec.server.host,
        port=spec.server.port,
        api_key_secret=secret,
        api_key_env_file=f"/etc/sglang/{resolved.name}.env" if secret else None,
        nnodes=spec.server.nnodes,
        server_scrape_hz=float(spec.probe.server_scrape_hz),
    )


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


def systemd_exec_line(argv: Sequence[str]) -> str:
    """argv as one ExecStart= value, quoted as the unit is; `${SGLANG_API_KEY}` stays for systemd to expand."""
    token = "${" + API_KEY_ENV + "}"
    return " ".join(a if a == token else systemd_word(a) for a in argv)


def with_bench_flags(bench_argv: Sequence[str], flags: Mapping[str, str]) -> list[str]:
    """The rendered bench command with these flags' values set (replaced where present, else appended): a
    `--num-prompts` asked for on the command line, an overlay's local tokenizer."""
    argv = list(bench_argv)
    for flag, value in flags.items():
        for i, tok in enumerate(argv):
            if tok == flag and i + 1 < len(argv):
                argv[i + 1] = value
                break
        else:
            argv.extend([flag, value])
    return argv


def build_extravars(
    inputs: DeployInputs,
    *,
    run_id: str,
    wheelhouse_dir: str,
    fetch_dir: str,
    wheelhouse_tar: str = "",
    toolkit_wheel: str = "",
    wheelhouse_pythons: Sequence[str] = (),  # the CPython versions the wheelhouse has wheels for; () = not checked
    bench_argv: Sequence[str] | None = None,
    probe_args: Sequence[str] = (),
    nodes: Mapping[str, tuple[list[str], str]] | None = None,
) -> dict[str, Any]:
    """The extravars of playbooks/deploy.yml. Keys carry the role prefix they belong to. What a role can derive
    or an inventory can set (the model fetch, the health timeout) is not passed: extravars beat the inventory."""
    base_url = client_url(inputs.host, inputs.port)
    return {
        "deploy_profile_name": inputs.profile_name,
        "deploy_spec_hash": inputs.spec_hash,
        "deploy_run_id": run_id,
        "sglang_venv_path": inputs.venv_path,
        "sglang_venv_sglang_version": inputs.sglang_version,
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
        "sglang_venv_model_size_gib": inputs.model_size_gib or 0,
        "sglang_service_name": inputs.service_name,
        "sglang_service_unit": inputs.unit_text,
        "sglang_service_argv": list(inputs.launch_argv),
        "sglang_service_env": dict(sorted(inputs.env.items())),
        "sglang_service_base_url": base_url,
        "sglang_service_api_key_secret": inputs.api_key_secret,
        "sglang_service_api_key_env_file": inputs.api_key_env_file or "",
        "sglang_service_served_model_name": inputs.served_model_name or inputs.model_repo_id or "default",
        "sglang_service_smoke_prompt": SMOKE_PROMPT,
        "sglang_service_smoke_max_tokens": SMOKE_MAX_TOKENS,
        "sglang_service_log_fail_patterns": list(LOG_FAIL_PATTERNS),
        "sglang_service_fetch_dir": fetch_dir,
        # Multi-node: per host, the argv and unit with that host's --node-rank (empty for one node).
        "sglang_service_argv_by_host": {h: a for h, (a, _) in (nodes or {}).items()},
        "sglang_service_unit_by_host": {h: u for h, (_, u) in (nodes or {}).items()},
        "bench_probe_bench_argv": list(bench_argv or inputs.bench_argv),
        # The probe scrapes the deployed server's /metrics (the server timeline); apply adds --server-unit (its
        # tree goes into host_trace.csv, its journal into a failed run's verdict); the caller's options come after.
        "bench_probe_probe_args": ["--server-url", base_url, "--server-hz", f"{inputs.server_scrape_hz:g}",
                                   *probe_args],
        "bench_probe_hf_home": inputs.env.get("HF_HOME", DEFAULT_HF_HOME),
        "bench_probe_fetch_dir": fetch_dir,
        "bench_probe_toolkit_wheel_src": toolkit_wheel,
    }


def shell_line(argv: Sequence[str]) -> str:
    """argv as one copy-pasteable shell line (for summaries and docs)."""
    return shlex.join(argv)
