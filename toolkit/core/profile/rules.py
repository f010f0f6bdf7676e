"""Hardware rules as data: each an id, a condition, a severity, a message, a fix and its source.

A condition is a list of clauses that must all hold. A clause names a fact (a dotted path into the
resolved spec, or a derived fact below) and a test. To add a rule, append a Rule to RULES; the
tests check every rule fires on a profile made to trip it.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from toolkit.core.profile.resolve import ResolvedProfile

# Architectures whose attention is NSA/DSA sparse attention (server_args.py: is_deepseek_nsa).
NSA_ARCHITECTURES = frozenset({"GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"})


@dataclass(frozen=True)
class Clause:
    fact: str
    op: str  # eq, ne, in, not_in, gt, truthy, falsy
    value: Any = None

    def holds(self, facts: dict[str, Any]) -> bool:
        got = facts.get(self.fact)
        if self.op == "eq":
            return bool(got == self.value)
        if self.op == "ne":
            return bool(got != self.value)
        if self.op == "in":
            return got in self.value
        if self.op == "not_in":
            return got not in self.value
        if self.op == "gt":
            return got is not None and got > self.value
        if self.op == "truthy":
            return bool(got)
        if self.op == "falsy":
            return not got
        raise ValueError(f"unknown clause op {self.op!r}")


@dataclass(frozen=True)
class Rule:
    id: str
    when: tuple[Clause, ...]
    severity: str  # "error" or "warning"
    field: str  # the knob the problem is reported on (its file and line)
    message: str
    fix: str
    source: str  # the thread or measurement that justifies the rule


RULES: tuple[Rule, ...] = (
    Rule(
        id="sm120-allreduce-fusion",
        when=(Clause("target.compute_capability", "eq", "SM120"), Clause("server.allreduce_fusion", "truthy")),
        severity="error",
        field="server.allreduce_fusion",
        message="FlashInfer allreduce fusion needs SM90 or SM10x; on SM120 its kernels are not built "
        "(flashinfer jit/comm.py allows archs 9 and 10 only). Forcing the arch gate measured 236 tok/s at 125 W "
        "against 3,740 tok/s without it (docs/story.md)",
        fix="set server.allreduce_fusion: false on SM120",
        source="https://github.com/sgl-project/sglang/issues/15650",
    ),
    Rule(
        id="sm120-nsa-cuda-graph",
        when=(
            Clause("target.compute_capability", "eq", "SM120"),
            Clause("derived.nsa_attention", "truthy"),
            Clause("server.cuda_graph", "truthy"),
        ),
        severity="warning",
        field="server.cuda_graph",
        message="CUDA graphs with NSA attention on SM120 hit the page_table_1_flattened bug in the NSA path "
        "(crashes in the GLM-5 story until graphs were disabled, docs/story.md); decode graph capture can also "
        "hang (sglang#29580)",
        fix="set server.cuda_graph: false until the fix is in your pinned SGLang",
        source="https://github.com/sgl-project/sglang/issues/12964",
    ),
    Rule(
        id="pp-radix-nsa",
        when=(
            Clause("server.pp_size", "gt", 1),
            Clause("server.radix_cache", "truthy"),
            Clause("derived.nsa_attention", "truthy"),
        ),
        severity="warning",
        field="server.radix_cache",
        message="pipeline parallel with radix cache and NSA attention trips an assert in the NSA path",
        fix="set server.radix_cache: false when pp_size > 1 on an NSA model",
        source="https://github.com/sgl-project/sglang/issues/15086",
    ),
    Rule(
        id="sm120-nsa-default-backends",
        when=(
            Clause("target.compute_capability", "eq", "SM120"),
            Clause("derived.nsa_attention", "truthy"),
            Clause("server.nsa_decode_backend", "falsy"),
        ),
        severity="warning",
        field="server.nsa_decode_backend",
        message="SGLang's automatic NSA backend choice on SM120 gave NaN crashes in decode in the GLM-5 story "
        "(docs/story.md), until the decode backend was chosen by hand (trtllm)",
        fix="set server.nsa_decode_backend (the working choice in docs/story.md: trtllm)",
        source="https://github.com/sgl-project/sglang/issues/26087",
    ),
    Rule(
        id="nsa-phase-backend-leaves-nsa",
        when=(
            Clause("derived.nsa_architecture", "truthy"),
            Clause("derived.phase_backend_set", "truthy"),
            Clause("server.attention_backend", "ne", "nsa"),
        ),
        severity="warning",
        field="server.prefill_attention_backend",
        message="SGLang picks the nsa attention backend for an NSA model only while attention_backend, "
        "prefill_attention_backend and decode_attention_backend are all unset (server_args.py "
        "is_attention_backend_not_set); with a per-phase backend set it does not choose nsa, so the "
        "nsa_*_backend settings may not take effect",
        fix="if NSA is wanted, set server.attention_backend: nsa and pick nsa_prefill_backend/nsa_decode_backend; "
        "else confirm on the hardware (SGLang logs 'Use nsa attention backend' when NSA is on)",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L5114",
    ),
    Rule(
        id="flashinfer-cutlass-ep",
        when=(Clause("server.moe_runner_backend", "eq", "flashinfer_cutlass"), Clause("derived.ep_1_or_tp", "falsy")),
        severity="error",
        field="server.ep_size",
        message="the flashinfer_cutlass MoE runner takes ep_size 1 or ep_size = tp_size only "
        "(SGLang asserts it at startup)",
        fix="set server.ep_size to 1 or to server.tp_size, or choose another moe_runner_backend",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L2136",
    ),
    Rule(
        id="flashinfer-cutlass-quantization",
        when=(
            Clause("server.moe_runner_backend", "eq", "flashinfer_cutlass"),
            Clause("model.quantization", "not_in", ("modelopt_fp4", "modelopt_fp8", None)),
        ),
        severity="error",
        field="server.moe_runner_backend",
        message="the flashinfer_cutlass MoE runner supports modelopt_fp4, modelopt_fp8 or unquantized bf16 "
        "only (SGLang asserts it at startup)",
        fix="use a ModelOpt FP4/FP8 checkpoint, or choose another moe_runner_backend",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L2136",
    ),
    Rule(
        id="no-p2p-allreduce-bound",
        when=(
            Clause("target.p2p", "falsy"),
            Clause("target.interconnect", "eq", "pcie"),
            Clause("server.tp_size", "gt", 4),
        ),
        severity="info",
        field="server.tp_size",
        message="tensor parallel across GPUs without P2P sends every allreduce through the host: expect a "
        "communication-bound run (docs/story.md: 100 % util at ~250 W of 600 W per GPU)",
        fix="compare against expert parallel or TP4+PP2 (glm5-ep8, glm5-tp4-pp2)",
        source="docs/story.md, the probe: nvidia-smi during the 3,740 tok/s run",
    ),
    Rule(
        id="public-bind-without-api-key",
        when=(
            Clause("derived.bind_public", "truthy"),
            Clause("server.api_key_secret", "falsy"),
            Clause("server.allow_unauthenticated", "falsy"),
        ),
        severity="error",
        field="server.host",
        message="the server would listen on a non-loopback address without an API key: SGLang serves every "
        "endpoint (generation, /flush_cache, weight updates) to anyone who can reach the port, and says nothing",
        fix="set server.api_key_secret (env:SGLANG_API_KEY, vault:NAME or file:PATH), or bind server.host: "
        "127.0.0.1; if the open bind is meant (a private network behind an authenticating proxy), set "
        "server.allow_unauthenticated: true with its own why.server.allow_unauthenticated",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py "
        "(host default 127.0.0.1, api_key default None: no check at all)",
    ),
    Rule(
        id="allow-unauthenticated-needs-why",
        when=(Clause("server.allow_unauthenticated", "truthy"), Clause("derived.allow_unauthenticated_why", "falsy")),
        severity="error",
        field="server.allow_unauthenticated",
        message="an unauthenticated server is allowed here without a reason",
        fix="add why.server.allow_unauthenticated: {reason: ...} saying who can reach the port and what guards "
        "it, or remove server.allow_unauthenticated and set server.api_key_secret",
        source="an open bind must be meant, and say so where the profile's reader looks",
    ),
    Rule(
        id="public-bind-acknowledged",
        when=(
            Clause("derived.bind_public", "truthy"),
            Clause("server.api_key_secret", "falsy"),
            Clause("server.allow_unauthenticated", "truthy"),
            Clause("derived.allow_unauthenticated_why", "truthy"),
        ),
        severity="warning",
        field="server.allow_unauthenticated",
        message="the server listens on a non-loopback address WITHOUT an API key (allowed by the profile): "
        "anyone who can reach the port can use it",
        fix="set server.api_key_secret when the network is not yours alone",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py",
    ),
)


# ---- Field rules: what each string that reaches an argv, a unit, an environment file or a task must be ------


@dataclass(frozen=True)
class FieldRule:
    """A check on the value of named fields. `paths` are dotted paths; `*` is every string of the spec that is
    rendered somewhere (prose is left out: PROSE_KEYS). `check` names a function in CHECKS that returns what is
    wrong (its detail goes into `message` as {detail}) or None."""

    id: str
    paths: tuple[str, ...]
    check: str
    severity: str
    message: str
    fix: str
    source: str


# Keys whose strings are prose for people: never rendered into an argv, a unit or a task.
PROSE_KEYS = frozenset({"reason", "link", "description"})

_CONTROL_NAMES = {"\n": "newline", "\r": "carriage return", "\x00": "NUL", "\x1b": "escape", "\t": "tab"}
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def control_char_problem(value: str) -> str | None:
    for i, c in enumerate(value):
        if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F:
            name = _CONTROL_NAMES.get(c, "control character")
            return f"U+{ord(c):04X} ({name}) at position {i}"
    return None


def host_problem(value: str) -> str | None:
    """None for an IP address or an RFC 1123 host name; else what it is not."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    # 300.1.2.3 is a bad address, not a name.
    if 0 < len(value) <= 253 and all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit():
        return None
    shown = repr(value)
    if ":" in value and host_problem(value.rsplit(":", 1)[0]) is None:
        return f"{shown} carries a port"
    return f"{shown} is neither an IP address nor a host name"


def host_port_problem(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{value!r} is not HOST:PORT"
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host_problem(host)


def absolute_path_problem(value: str) -> str | None:
    if not value.startswith("/"):
        return f"{value!r} is not an absolute path"
    if ".." in value.split("/"):
        return f"{value!r} contains '..'"
    if posixpath.normpath(value) != value:
        return f"{value!r} is not normalised (it means {posixpath.normpath(value)!r})"
    return None


def path_like_problem(value: str) -> str | None:
    """A tokenizer is a Hugging Face repo id (org/name) or a path; a path must be absolute."""
    if value.startswith(("/", ".", "~")) or value.count("/") > 1:
        return absolute_path_problem(value)
    return None


CHECKS: dict[str, Callable[[str], str | None]] = {
    "control_chars": control_char_problem,
    "host": host_problem,
    "host_port": host_port_problem,
    "absolute_path": absolute_path_problem,
    "path_like": path_like_problem,
}

FIELD_RULES: tuple[FieldRule, ...] = (
    FieldRule(
        id="control-characters",
        paths=("*",),
        check="control_chars",
        severity="error",
        message="contains a control character, {detail}: it would end a line of the unit or the environment "
        "file (a new directive, a new variable) or split an argument",
        fix="remove it (YAML turns \\n in a double-quoted string, and the end of a block scalar, into a newline)",
        source="systemd.syntax(7): a newline ends an assignment",
    ),
    FieldRule(
        id="host-address",
        paths=("server.host",),
        check="host",
        severity="error",
        message="{detail}: SGLang's --host must be an address or a name to bind",
        fix="write an IP address (127.0.0.1, 0.0.0.0, ::1) or a host name; the port goes in server.port",
        source="uvicorn binds --host with socket.getaddrinfo: anything else fails at start, after the deploy",
    ),
    FieldRule(
        id="dist-init-addr",
        paths=("server.dist_init_addr",),
        check="host_port",
        severity="error",
        message="{detail}: dist_init_addr is node 0's HOST:PORT",
        fix="write e.g. 10.0.0.1:50000 (IPv6: [fd00::1]:50000)",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py (--dist-init-addr)",
    ),
    FieldRule(
        id="absolute-path",
        paths=("engine.venv_path", "model.local_path"),
        check="absolute_path",
        severity="error",
        message="{detail}: this path goes into the unit and the deploy tasks, which run from no fixed directory",
        fix="write an absolute, normalised path without '..', e.g. /opt/sglang/venv or /models/GLM-5-NVFP4",
        source="systemd.service(5): ExecStart= needs an absolute path",
    ),
    FieldRule(
        id="tokenizer-path",
        paths=("bench.tokenizer",),
        check="path_like",
        severity="error",
        message="{detail}: the benchmark runs on the host, from no fixed directory",
        fix="give a Hugging Face repo id (org/name) or an absolute, normalised path",
        source="transformers' from_pretrained takes a repo id or a path, resolved from the current directory",
    ),
)


def string_fields(resolved: ResolvedProfile) -> Iterator[tuple[str, str]]:
    """(dotted path, value) of every string of the spec that is rendered somewhere (not prose, not results)."""

    def walk(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
        if isinstance(value, dict):
            for k, v in value.items():
                if k not in PROSE_KEYS:
                    yield from walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from walk(f"{prefix}.{i}", v)
        elif isinstance(value, str):
            yield prefix, value

    yield from walk("", resolved.spec.model_dump(mode="json", exclude={"results", "why", "description"}))


def field_rule_hits(
    resolved: ResolvedProfile, rules: tuple[FieldRule, ...] = FIELD_RULES
) -> list[tuple[FieldRule, str, str]]:
    """(rule, path, detail) for each field a rule finds wrong; one hit per field (the first rule wins), so a
    value with a newline is not also reported as a bad host."""
    strings = dict(string_fields(resolved))
    hits: list[tuple[FieldRule, str, str]] = []
    seen: set[str] = set()
    for rule in rules:
        paths = sorted(strings) if rule.paths == ("*",) else [p for p in rule.paths if p in strings]
        for path in paths:
            if path in seen:
                continue
            detail = CHECKS[rule.check](strings[path])
            if detail is not None:
                hits.append((rule, path, detail))
                seen.add(path)
    return hits


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def facts_of(resolved: ResolvedProfile) -> dict[str, Any]:
    """Flat facts the rules test: every dotted path of the spec, plus derived facts."""
    facts: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            facts[prefix] = value

    walk("", resolved.spec.model_dump(mode="json", exclude={"results", "why"}))
    server = resolved.spec.server
    facts["derived.nsa_attention"] = (
        resolved.spec.model.architecture in NSA_ARCHITECTURES
        or bool(server.nsa_decode_backend or server.nsa_prefill_backend)
        or server.attention_backend == "nsa"
    )
    facts["derived.ep_1_or_tp"] = server.ep_size in (1, server.tp_size)
    facts["derived.nsa_architecture"] = resolved.spec.model.architecture in NSA_ARCHITECTURES
    facts["derived.phase_backend_set"] = bool(server.prefill_attention_backend or server.decode_attention_backend)
    # A host that is no address is its own error (host-address); it is not also called a public bind.
    facts["derived.bind_public"] = host_problem(server.host) is None and not is_loopback(server.host)
    facts["derived.allow_unauthenticated_why"] = "server.allow_unauthenticated" in resolved.spec.why
    return facts


def matching_rules(resolved: ResolvedProfile, rules: tuple[Rule, ...] = RULES) -> list[Rule]:
    facts = facts_of(resolved)
    return [rule for rule in rules if all(clause.holds(facts) for clause in rule.when)]
