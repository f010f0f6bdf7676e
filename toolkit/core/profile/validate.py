"""Checks beyond types, before anything touches a host: required facts, parallelism against the
target, hardware rules, secrets, and every rendered flag against the pinned SGLang's own catalogue.
"""

from __future__ import annotations

from toolkit.core.errors import Problem
from toolkit.core.profile.catalogue import Catalogue
from toolkit.core.profile.flags import extra_args_problems, rendered_flag_problems
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.rules import (
    FIELD_RULES,
    RULES,
    FieldRule,
    Rule,
    field_rule_hits,
    is_loopback,
    matching_rules,
    release_in,
)

REQUIRED = (
    ("target.gpu_count", "the number of GPUs per node, e.g. 8"),
    ("target.compute_capability", "the GPUs' compute capability, e.g. SM120 for RTX PRO 6000 Blackwell"),
    ("engine.sglang_version", "the SGLang release the flags are checked against, e.g. 0.5.9"),
    ("model.repo_id", "the Hugging Face repo id, e.g. lukealonso/GLM-5-NVFP4"),
)

def validate(
    resolved: ResolvedProfile,
    catalogue: Catalogue | None,
    rules: tuple[Rule, ...] = RULES,
    field_rules: tuple[FieldRule, ...] = FIELD_RULES,
) -> list[Problem]:
    """Every problem found, errors and warnings, each located at the file and line that set the value.

    `catalogue` is the pinned version's flag catalogue; None reports that it is missing (an error:
    flags cannot be checked)."""
    problems: list[Problem] = []
    hits = field_rule_hits(resolved, field_rules)
    for frule, path, detail in hits:
        problems.append(
            resolved.problem(path, frule.message.format(detail=detail), frule.fix, frule.severity, frule.id)
        )
    later: list[Problem] = []
    later += _required(resolved)
    later += _parallelism(resolved)
    later += _spanning(resolved)
    later += _model_fit(resolved)
    later += _power_limit(resolved)
    later += _secrets(resolved)
    later += _confined(resolved)
    later += _whys(resolved)
    later += _inherited_whys(resolved)
    later += _patches_upstream(resolved)
    for rule in matching_rules(resolved, rules):
        later.append(
            resolved.problem(rule.field, f"{rule.message} (source: {rule.source})", rule.fix, rule.severity, rule.id)
        )
    if resolved.spec.engine.sglang_version:
        if catalogue is None:
            later.append(
                resolved.problem(
                    "engine.sglang_version",
                    f"no flag catalogue for SGLang {resolved.spec.engine.sglang_version}",
                    f"run `toolkit profile catalogue --sglang-version {resolved.spec.engine.sglang_version}` "
                    "or pin a version that has one (toolkit/data/sglang_flags/)",
                )
            )
        elif not any(p.severity == "error" and p.field == "model.repo_id" for p in later):
            later += rendered_flag_problems(resolved, catalogue)
            later += extra_args_problems(resolved, catalogue)
    # A value a field rule refused (a control character, a template marker, a bad path) is reported once: the
    # checks that read it as a flag value or a host would only repeat it in other words.
    flagged = {path for _, path, _ in hits}
    return acknowledged(resolved, problems + [p for p in later if p.field not in flagged],
                        {r.id for r in rules} | {r.id for r in field_rules})


def acknowledged(resolved: ResolvedProfile, problems: list[Problem], rule_ids: set[str]) -> list[Problem]:
    """Warnings of the rules the profile's `acknowledge:` names become "acknowledged" lines that say why; an
    acknowledged error stays an error (a broken service is not a choice), and an acknowledgement of a rule that
    does not exist or no longer fires is reported, as a stale `noqa` is."""
    acks = resolved.spec.acknowledge
    if not acks:
        return problems
    out: list[Problem] = []
    fired = set()
    for p in problems:
        reason = acks.get(p.rule_id or "")
        if reason is None or p.severity not in ("warning", "info"):
            out.append(p)
            continue
        fired.add(p.rule_id)
        where = resolved.origin(f"acknowledge.{p.rule_id}")
        if where is not None and where.file not in (resolved.file, p.file):
            # An acknowledgement covers the profile that states it: a parent's reason was given for the value the
            # parent set, not for this profile setting it again.
            out.append(Problem(f"{p.message} (acknowledged by {where.profile} for its own setting; this profile "
                               "sets it again and states no acknowledgement of its own)", file=p.file, line=p.line,
                               field=p.field, fix=f"{p.fix}; or acknowledge {p.rule_id} here, with this profile's "
                               "reason" if p.fix else f"acknowledge {p.rule_id} here, with this profile's reason",
                               severity=p.severity, rule_id=p.rule_id))
            continue
        at = f" ({where.file}:{where.line})" if where and where.line else ""
        out.append(Problem(f"{p.message}; acknowledged{at}: {' '.join(reason.split())}", file=p.file, line=p.line,
                           field=p.field, fix=None, severity="acknowledged", rule_id=p.rule_id))
    for rule in sorted(set(acks) - fired):
        if any(p.rule_id == rule for p in problems):
            out.append(resolved.problem(f"acknowledge.{rule}", f"rule {rule} is an error here: an error cannot be "
                                        "acknowledged", "fix what the rule says", "error"))
        elif (resolved.origin(f"acknowledge.{rule}") or resolved).file != resolved.file:
            continue  # a parent's acknowledgement of a rule this child no longer breaks: the parent still does
        elif rule not in rule_ids:
            out.append(resolved.problem(f"acknowledge.{rule}", f"no rule is called {rule}",
                                        "use a rule id that validate prints in [brackets], or remove the line",
                                        "warning"))
        else:
            out.append(resolved.problem(f"acknowledge.{rule}", f"rule {rule} does not fire for this profile any "
                                        "more", "remove the acknowledgement", "warning"))
    return out


def _required(resolved: ResolvedProfile) -> list[Problem]:
    out = []
    for path, what in REQUIRED:
        section, key = path.split(".")
        if getattr(getattr(resolved.spec, section), key) is None:
            if path == "model.repo_id" and resolved.spec.model.local_path:
                continue
            chain = " or ".join(f"{n}.yaml" for n in resolved.chain)
            out.append(resolved.problem(path, "required and not set", f"set {path}: {what} (in {chain})"))
    return out


POWER_RULE = "gpu-power-limit-range"


def _power_limit(resolved: ResolvedProfile) -> list[Problem]:
    """gpu.power_limit_w inside the board's settable range, as `nvidia-smi -pl` would demand (it refuses a value
    outside [Min Power Limit, Max Power Limit]). The range is the profile's target; without it only the default
    limit bounds the value from above (a board's maximum is rarely above its default)."""
    t, limit = resolved.spec.target, resolved.spec.gpu.power_limit_w
    if limit is None:
        return []
    lo, hi = t.gpu_power_limit_min_w, t.gpu_power_limit_max_w or t.gpu_power_limit_w
    if lo is not None and hi is not None and lo > hi:
        return [resolved.problem("target.gpu_power_limit_min_w", f"the settable range is empty: min {lo:g} W > "
                                 f"max {hi:g} W", "copy Min and Max Power Limit from `nvidia-smi -q -d POWER`",
                                 rule_id=POWER_RULE)]
    if hi is not None and limit > hi:
        return [resolved.problem("gpu.power_limit_w", f"{limit:g} W is above the board's {hi:g} W "
                                 "(target.gpu_power_limit_max_w, else target.gpu_power_limit_w)",
                                 f"set gpu.power_limit_w at most {hi:g}", rule_id=POWER_RULE)]
    if lo is not None and limit < lo:
        return [resolved.problem("gpu.power_limit_w", f"{limit:g} W is below the board's lowest settable limit "
                                 f"{lo:g} W (target.gpu_power_limit_min_w)", f"set gpu.power_limit_w at least {lo:g}",
                                 rule_id=POWER_RULE)]
    if lo is None:
        return [resolved.problem("gpu.power_limit_w", f"{limit:g} W cannot be checked against the board's range: "
                                 "the target has no gpu_power_limit_min_w", "copy Min Power Limit from `nvidia-smi "
                                 "-q -d POWER` into target.gpu_power_limit_min_w (the host role checks it anyway)",
                                 severity="warning", rule_id=POWER_RULE)]
    return []


def _parallelism(resolved: ResolvedProfile) -> list[Problem]:
    t, s = resolved.spec.target, resolved.spec.server
    out = []
    if t.gpu_count is not None:
        gpus = t.gpu_count * t.nodes
        replicas = 1 if s.enable_dp_attention else s.dp_size
        used = s.tp_size * s.pp_size * replicas
        formula = f"tp_size {s.tp_size} x pp_size {s.pp_size}" + (
            "" if s.enable_dp_attention else f" x dp_size {s.dp_size}"
        )
        if used > gpus:
            out.append(
                resolved.problem(
                    "server.tp_size",
                    f"{formula} = {used} GPUs, but the target has {gpus} ({t.gpu_count} per node x {t.nodes} nodes)",
                    f"make tp_size x pp_size x dp_size = {gpus}, or raise target.gpu_count/nodes if the "
                    "hardware has more",
                )
            )
        elif used < gpus:
            out.append(
                resolved.problem(
                    "server.tp_size",
                    f"{formula} = {used} GPUs of the target's {gpus}: {gpus - used} would sit idle",
                    f"make tp_size x pp_size x dp_size = {gpus}, or lower target.gpu_count",
                    severity="warning",
                )
            )
    if s.ep_size > s.tp_size or s.tp_size % s.ep_size:
        out.append(
            resolved.problem(
                "server.ep_size",
                f"ep_size {s.ep_size} must divide tp_size {s.tp_size} (experts are spread over the TP group)",
                f"use an ep_size that divides {s.tp_size}, e.g. {s.tp_size}",
            )
        )
    if s.enable_dp_attention and (s.dp_size > s.tp_size or s.tp_size % s.dp_size):
        out.append(
            resolved.problem(
                "server.dp_size",
                f"with enable_dp_attention, dp_size {s.dp_size} must divide tp_size {s.tp_size}",
                f"use a dp_size that divides {s.tp_size}",
            )
        )
    if s.nnodes != t.nodes:
        out.append(
            resolved.problem(
                "server.nnodes",
                f"server.nnodes is {s.nnodes} but target.nodes is {t.nodes}",
                "make server.nnodes equal target.nodes",
            )
        )
    if (s.tp_size * s.pp_size) % s.nnodes:
        out.append(
            resolved.problem(
                "server.nnodes",
                f"tp_size {s.tp_size} x pp_size {s.pp_size} does not divide over {s.nnodes} nodes "
                "(SGLang asserts it at start)",
                "make tp_size x pp_size a multiple of server.nnodes",
            )
        )
    if s.dp_size > 1 and s.nnodes > 1 and not s.enable_dp_attention:
        out.append(
            resolved.problem(
                "server.dp_size",
                "data parallel over several nodes needs enable_dp_attention (SGLang asserts it at start)",
                "set server.enable_dp_attention: true, or dp_size: 1",
            )
        )
    if s.node_rank is not None and s.node_rank >= s.nnodes:
        out.append(
            resolved.problem(
                "server.node_rank",
                f"node_rank {s.node_rank} is not a node of {s.nnodes} (ranks count from 0)",
                f"use a node_rank from 0 to {s.nnodes - 1}",
            )
        )
    return out


# The variables that name the network NCCL and Gloo (torch.distributed's CPU side) talk over. Unset, each picks an
# interface itself, and on a host with a bridge, a VPN or docker0 that is often not the one the other node reaches
# (NCCL's "NET/Socket : Using [0]docker0"): the ranks then hang at init until SGLang's timeout.
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# The init port `toolkit apply` gives a multi-node profile that leaves dist_init_addr to the inventory.
DEFAULT_DIST_INIT_PORT = 50000
# SGLang opens its own sockets on the ports after dist_init_addr's (PortArgs.init_new: port_base =
# dist_init_port + 1, then the detokenizer, the RPC and the metrics ports and one scheduler input per DP rank).
DIST_PORT_SPAN = 8


def dist_port(addr: str | None) -> int | None:
    """The port of a HOST:PORT (IPv6 [addr]:port), None when it has none."""
    if not addr:
        return None
    _, sep, port = addr.rpartition(":")
    return int(port) if sep and port.isdigit() else None


def dist_host(addr: str) -> str:
    host = addr.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _spanning(resolved: ResolvedProfile) -> list[Problem]:
    """What a profile that spans hosts needs before any host is asked: NCCL's and Gloo's interface named, an
    init address the other nodes can reach on a port SGLang's HTTP server does not take, and replicas the
    router can reach."""
    spec = resolved.spec
    t, s, replicas = spec.target, spec.server, spec.replicas
    out = []
    if s.nnodes > 1:
        for var in SOCKET_IFNAME_VARS:
            if not spec.env.get(var):
                out.append(resolved.problem(
                    f"env.{var}", f"a server over {s.nnodes} nodes needs {var}: unset, each rank picks an interface "
                    "itself, often one the other nodes cannot reach (a bridge, docker0), and init hangs",
                    f"set env.{var} to the interface of the hosts' shared network, e.g. eth0 (the same name on "
                    "every node; `ip -br addr` in the container shows it)"))
    port = dist_port(s.dist_init_addr)
    if s.nnodes > 1 and s.dist_init_addr and port is not None:
        if is_loopback(dist_host(s.dist_init_addr)):
            out.append(resolved.problem(
                "server.dist_init_addr", f"{s.dist_init_addr} is a loopback address: the other "
                f"{s.nnodes - 1} node(s) cannot reach node 0 there",
                "use node 0's address on the hosts' shared network, or leave dist_init_addr unset: `toolkit apply` "
                "then uses node 0's inventory address"))
        if port <= s.port <= port + DIST_PORT_SPAN:
            out.append(resolved.problem(
                "server.dist_init_addr", f"port {port} and the {DIST_PORT_SPAN} after it are SGLang's own "
                f"(init and its internal sockets), but server.port {s.port} is among them",
                f"use a dist_init_addr port away from the HTTP port, e.g. {DEFAULT_DIST_INIT_PORT}"))
    if t.hosts is not None:
        dupes = sorted({h for h in t.hosts if t.hosts.count(h) > 1})
        if dupes:
            out.append(resolved.problem("target.hosts", f"{', '.join(dupes)} listed twice: each node is one host",
                                        "list each inventory host or group once, node 0 first"))
        if t.nodes == 1 and replicas is None:
            out.append(resolved.problem("target.hosts", "target.hosts names where a multi-node server runs, but "
                                        "target.nodes is 1", "set target.nodes (and server.nnodes), or remove "
                                        "target.hosts (a one-node profile runs on the inventory's gpu_containers)",
                                        severity="warning"))
    if replicas is not None:
        out += _replicas(resolved)
    return out


# bench_serving's backends whose requests are OpenAI completions (async_request_openai_completions): it sends
# `best_of: 1` with `stream: true`, which smg's CompletionRequest validation refuses (seen in the lab: the pinned
# smg 1.4.0 answered 400 to SGLang 0.5.9's bench_serving warm-up through the router).
ROUTER_REFUSED_BENCH_BACKENDS = frozenset({"sglang-oai", "vllm", "lmdeploy"})


def _replicas(resolved: ResolvedProfile) -> list[Problem]:
    spec = resolved.spec
    s, replicas = spec.server, spec.replicas
    assert replicas is not None
    out = []
    if spec.target.nodes > 1:
        out.append(resolved.problem(
            "replicas", f"replicas of a server over {spec.target.nodes} nodes are not supported: each replica "
            "would be its own multi-node group", "use replicas of a one-node profile (target.nodes: 1), or one "
            "multi-node server without replicas"))
    if replicas.hosts is not None:
        dupes = sorted({h for h in replicas.hosts if replicas.hosts.count(h) > 1})
        if dupes:
            out.append(resolved.problem("replicas.hosts", f"{', '.join(dupes)} listed twice: one replica a host",
                                        "list each inventory host or group once"))
    if replicas.count > 1 and is_loopback(s.host):
        out.append(resolved.problem(
            "server.host", f"{replicas.count} replicas on their own hosts listen on {s.host}, which the router on "
            "another host cannot reach", "set server.host to 0.0.0.0 (or the hosts' address), with "
            "server.api_key_secret or server.allow_unauthenticated and its why"))
    if replicas.router.port == s.port:
        out.append(resolved.problem(
            "replicas.router.port", f"the router's port {replicas.router.port} is the server's: on the host that "
            "runs both, the second to start cannot bind", f"use another port for the router, e.g. {s.port + 80}"))
    dport = dist_port(s.dist_init_addr)
    if dport is not None and dport <= replicas.router.port <= dport + DIST_PORT_SPAN:
        out.append(resolved.problem(
            "replicas.router.port", f"the router's port {replicas.router.port} is one of SGLang's own after "
            f"dist_init_addr's {dport}", "use a router port away from dist_init_addr's"))
    if spec.bench.backend in ROUTER_REFUSED_BENCH_BACKENDS:
        out.append(resolved.problem(
            "bench.backend", f"bench_serving's {spec.bench.backend} backend sends every streamed completion with "
            "best_of: 1, and SGLang's router refuses that (400: best_of is not supported when stream is enabled): "
            "the benchmark through the router fails at its warm-up", "set bench.backend: sglang (SGLang's native "
            "/generate, which the router serves)"))
    return out


def _model_fit(resolved: ResolvedProfile) -> list[Problem]:
    """The parallel layout against the model's own config (model.config): SGLang splits the attention heads over
    the tp ranks (each KV head to whole ranks, or replicated over them), the routed experts over the ep ranks and
    the layers over the pp stages; a layout that does not divide fails as the weights load, on the GPU host."""
    config, s = resolved.spec.model.config, resolved.spec.server
    if config is None:
        return []
    out = []
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads is not None and heads % s.tp_size:
        out.append(resolved.problem("server.tp_size", f"tp_size {s.tp_size} does not divide the model's {heads} "
                                    "attention heads (model.config.num_attention_heads)",
                                    f"use a tp_size that divides {heads}, e.g. {_divisor_near(heads, s.tp_size)}",
                                    rule_id="layout-fits-model"))
    elif kv is not None and (kv % s.tp_size if kv >= s.tp_size else s.tp_size % kv):
        out.append(resolved.problem("server.tp_size", f"tp_size {s.tp_size} and the model's {kv} KV heads "
                                    "(model.config.num_key_value_heads) do not split evenly: each rank needs whole "
                                    "KV heads, or each KV head whole ranks",
                                    f"use a tp_size that divides {kv} or is a multiple of it, e.g. "
                                    f"{_divisor_near(kv, s.tp_size)}",
                                    rule_id="layout-fits-model"))
    experts = config.experts
    if experts is not None and s.ep_size > 1 and experts % s.ep_size:
        out.append(resolved.problem("server.ep_size", f"ep_size {s.ep_size} does not divide the model's {experts} "
                                    "routed experts (model.config.n_routed_experts / num_experts)",
                                    f"use an ep_size that divides {experts}, e.g. {_divisor_near(experts, s.ep_size)}",
                                    rule_id="layout-fits-model"))
    layers = config.num_hidden_layers
    if layers is not None and layers % s.pp_size:
        out.append(resolved.problem("server.pp_size", f"pp_size {s.pp_size} does not divide the model's {layers} "
                                    "layers (model.config.num_hidden_layers)",
                                    f"use a pp_size that divides {layers}, e.g. {_divisor_near(layers, s.pp_size)}",
                                    rule_id="layout-fits-model"))
    return out


def _divisor_near(n: int, wanted: int) -> int:
    """The divisor of `n` nearest `wanted` (the smaller one on a tie)."""
    return min((d for d in range(1, min(n, 4 * wanted) + 1) if n % d == 0), key=lambda d: (abs(d - wanted), d))


def _secrets(resolved: ResolvedProfile) -> list[Problem]:
    """Secrets by name in env (the reference itself: rules.py, secret-reference; in extra_args: _extra_args)."""
    out = []
    for key in resolved.spec.env:
        if any(word in key.upper() for word in ("API_KEY", "TOKEN", "SECRET", "PASSWORD")):
            out.append(
                resolved.problem(
                    f"env.{key}",
                    "a secret in env would be written into the unit and logs",
                    "remove it; give secrets by reference (server.api_key_secret)",
                )
            )
    return out


# Where the API key file may be (`file:` references): the deploy's own directory and the secret mounts of systemd
# (LoadCredential) and container runtimes. The inventory may declare more roots (toolkit_secret_roots), which
# `toolkit apply` honours; a system location is never one.
SECRET_FILE_ROOTS = ("/etc/sglang/", "/run/secrets/", "/run/credentials/")
# Where no secret and no model is read from: the system's own files (/etc/shadow, /proc/self/environ, keys).
SYSTEM_PREFIXES = ("/etc/", "/proc/", "/sys/", "/dev/", "/boot/", "/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/",
                   "/root/", "/run/", "/var/lib/", "/var/log/", "/var/run/", "/var/spool/", "/var/mail/")
# The container's model cache (lxc_gpu_container mounts the host's model storage at /models): a model.local_path
# is read there, or under the profile's env.HF_HOME.
MODEL_ROOTS = ("/models/",)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path.startswith(root) and path != root for root in roots)


def system_path(path: str) -> bool:
    """Whether `path` is, or is inside, a location of the system (never a secret or a model)."""
    return path == "/" or (path.rstrip("/") + "/").startswith(SYSTEM_PREFIXES)


def _confined(resolved: ResolvedProfile) -> list[Problem]:
    """Paths on the hosts a profile reads from stay in their place: the API key file under a secret root (never a
    system file), the model's local path under the model cache."""
    out = []
    ref = resolved.spec.server.api_key_secret or ""
    scheme, _, path = ref.partition(":")
    if scheme == "file" and path.startswith("/") and ".." not in path.split("/") \
            and not _under(path, SECRET_FILE_ROOTS):
        system = system_path(path)
        out.append(resolved.problem(
            "server.api_key_secret",
            f"the key file {path} is " + ("a file of the system, never a secret source" if system else
                                          f"outside the secret roots ({', '.join(SECRET_FILE_ROOTS)})"),
            f"keep the key in a file of its own under {SECRET_FILE_ROOTS[0]} (mode 0600)"
            + ("" if system else ", or declare its directory in the inventory's toolkit_secret_roots"),
            "error" if system else "warning",
            "secret-file-root",
        ))
    local = resolved.spec.model.local_path
    if local and local.startswith("/") and ".." not in local.split("/"):
        hf_home = resolved.spec.env.get("HF_HOME")
        roots = MODEL_ROOTS + ((hf_home.rstrip("/") + "/",) if hf_home and hf_home.startswith("/")
                               and not system_path(hf_home) else ())
        if not _under(local, roots):
            system = system_path(local)
            out.append(resolved.problem(
                "model.local_path",
                f"{local} is " + ("a directory of the system, never a model" if system else
                                  f"outside the model cache ({', '.join(roots)})")
                + ": the server would load whatever is there",
                "put the checkpoint under /models/ (the container's model-cache mount), e.g. /models/GLM-5-NVFP4, "
                "or under the profile's env.HF_HOME",
                "error" if system else "warning",
                "model-path-root",
            ))
    return out


def _patches_upstream(resolved: ResolvedProfile) -> list[Problem]:
    """A patch whose change the pinned release makes itself (engine.patches[].upstream) would not apply there."""
    out = []
    version = resolved.spec.engine.sglang_version
    for i, patch in enumerate(resolved.spec.engine.patches):
        if patch.upstream is not None and version and release_in(version, f">={patch.upstream.release}"):
            out.append(
                resolved.problem(
                    f"engine.patches.{i}",
                    f"patch {patch.name} is not needed on SGLang {version}: SGLang makes the change itself since "
                    f"{patch.upstream.release} ({patch.upstream.link})",
                    "remove the patch for this release (`toolkit profile migrate` drops it)",
                )
            )
    return out


INHERITED_WHY_RULE = "why-inherited"


def _inherited_whys(resolved: ResolvedProfile) -> list[Problem]:
    """A knob this profile changes from its parent's value, whose only why is a parent's: that reason was given
    for the parent's value, so the change has none (a warning; `validate --strict` fails on it)."""
    from toolkit.core.profile.diff import changed_here, knobs, why_entry

    if resolved.parent_data is None:
        return []
    out = []
    for path in knobs(resolved):
        if not changed_here(resolved, path):
            continue
        key, origin = why_entry(resolved, path)
        if key is None or origin is None or origin.file == resolved.file:
            continue
        out.append(resolved.problem(
            path,
            f"changed here, but its only why is {origin.profile}'s (why.{key}), given for the parent's value",
            f"add why.{path} to this profile saying why it changes the value",
            severity="warning",
            rule_id=INHERITED_WHY_RULE,
        ))
    return out


def _whys(resolved: ResolvedProfile) -> list[Problem]:
    """A `why` for a path that is no knob (a typo, or a knob renamed) explains nothing: say so."""
    import difflib

    from toolkit.core.profile.diff import knobs

    paths = set(knobs(resolved))
    prefixes = {".".join(p.split(".")[:i]) for p in paths for i in range(1, p.count(".") + 1)}
    prefixes |= set(type(resolved.spec).model_fields)  # a whole section (env: "left at defaults")
    out = []
    for key in resolved.spec.why:
        if key in paths or key in prefixes:
            continue
        close = difflib.get_close_matches(key, sorted(paths), n=1, cutoff=0.7)
        out.append(
            resolved.problem(
                f"why.{key}",
                f"why names {key!r}, which is not a knob",
                f"did you mean {close[0]!r}?" if close else "use a dotted knob path such as server.tp_size",
                severity="warning",
            )
        )
    return out


