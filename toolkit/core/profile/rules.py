"""Hardware rules as data: each an id, a condition, a severity, a message, a fix and its source.

A condition is a list of clauses that must all hold. A clause names a fact (a dotted path into the
resolved spec, or a derived fact below) and a test. To add a rule, append a Rule to RULES; the
tests check every rule fires on a profile made to trip it.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from toolkit.core.profile.argv import read_option
from toolkit.core.profile.catalogue import release_key
from toolkit.core.profile.flagmap import SERVER_KNOBS
from toolkit.core.profile.model import SECRET_SCHEMES
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
    # The SGLang releases it applies to: "" all, else comma-separated bounds (">=0.5.17", ">=0.5.13,<0.5.20").
    releases: str = ""


def release_in(version: str | None, releases: str) -> bool:
    """Whether `version` is in `releases` (see Rule.releases); an unpinned profile is in every range."""
    if not releases or not version:
        return True
    for bound in releases.split(","):
        bound = bound.strip()
        op = bound[:2] if bound[:2] in (">=", "<=", "==") else bound[:1]
        edge, have = release_key(bound[len(op):]), release_key(version)
        ok = {">=": have >= edge, "<=": have <= edge, "==": have == edge, ">": have > edge, "<": have < edge}.get(op)
        if ok is None:
            raise ValueError(f"bad release bound {bound!r} (write >=0.5.17, <0.5.20, ...)")
        if not ok:
            return False
    return True


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
            Clause("server.attention_backend", "not_in", ("nsa", "dsa")),
        ),
        severity="warning",
        field="server.prefill_attention_backend",
        message="SGLang picks the nsa attention backend (dsa from 0.5.13) for an NSA model only while "
        "attention_backend, prefill_attention_backend and decode_attention_backend are all unset "
        "(is_attention_backend_not_set); with a per-phase backend set it does not choose it, so the "
        "nsa_*_backend settings may not take effect",
        fix="if NSA is wanted, set server.attention_backend: nsa (dsa from 0.5.13) and pick "
        "nsa_prefill_backend/nsa_decode_backend; else confirm on the hardware (SGLang logs 'Use nsa attention "
        "backend', or 'Use dsa attention backend', when it is on)",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L5114; "
        "0.5.23: arg_groups/model_overrides/deepseek_v2.py",
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
        id="sm120-dsa-trtllm-backend",
        when=(
            Clause("target.compute_capability", "eq", "SM120"),
            Clause("derived.nsa_attention", "truthy"),
            Clause("derived.dsa_trtllm", "truthy"),
        ),
        severity="warning",
        field="server.nsa_decode_backend",
        message="SGLang 0.5.17+ routes GLM DSA attention on SM120 to flashinfer_sparse_mla by itself "
        "(arg_groups/overrides.py, is_glm_sm12_fp8); the change's own test on 8x RTX PRO 6000 found explicit trtllm "
        "DSA backends failing with 'TllmGenFmhaRunner ... Unsupported architecture'. The story's trtllm was "
        "measured on 0.5.9 only",
        fix="unset server.nsa_decode_backend/nsa_prefill_backend (SGLang's SM120 choice) or set flashinfer_sparse_mla, "
        "and confirm on the hardware before trusting trtllm on this release",
        source="https://github.com/sgl-project/sglang/pull/29580",
        releases=">=0.5.17",
    ),
    Rule(
        id="sm120-dsa-full-decode-graph",
        when=(
            Clause("target.compute_capability", "eq", "SM120"),
            Clause("derived.nsa_attention", "truthy"),
            Clause("server.cuda_graph", "truthy"),
            Clause("derived.decode_graph_backend_set", "falsy"),
        ),
        severity="warning",
        field="server.cuda_graph",
        message="on SM120 with GLM DSA, capturing the default `full` decode CUDA graph can hang, while a "
        "piecewise decode graph captured (8x RTX PRO 6000, 96 GB)",
        fix="add --cuda-graph-backend-decode with a non-full backend this release offers to server.extra_args "
        "(tc_piecewise up to 0.5.21; see toolkit/data/sglang_flags/), or keep server.cuda_graph: false",
        source="https://github.com/sgl-project/sglang/pull/29580",
        releases=">=0.5.14",
    ),
    Rule(
        id="pcie-allreduce-fusion",
        when=(Clause("target.interconnect", "eq", "pcie"), Clause("server.allreduce_fusion", "truthy")),
        severity="warning",
        field="server.allreduce_fusion",
        message="FlashInfer's fused allreduce backends assume an NVLink or multicast fabric (trtllm single-node "
        "NVLink, mnnvl MNNVL); on a PCIe-only host every peer transfer crosses the root complex",
        fix="set server.allreduce_fusion: false on PCIe-only hosts, or measure it against NCCL first",
        source="https://github.com/flashinfer-ai/flashinfer/pull/4393 (the backends and what each assumes); "
        "SGLang 0.5.23 --flashinfer-allreduce-fusion-backend help",
    ),
    Rule(
        id="no-p2p-skip-p2p-check",
        when=(Clause("target.p2p", "eq", False), Clause("env.SGLANG_SKIP_P2P_CHECK", "eq", "1"),
              Clause("derived.p2p_check", "truthy")),
        severity="error",
        field="env.SGLANG_SKIP_P2P_CHECK",
        message="--enable-p2p-check is there to test P2P, and SGLANG_SKIP_P2P_CHECK=1 makes that test trust the "
        "driver's report instead (custom_all_reduce_utils.py gpu_p2p_access_check), which can say yes where P2P "
        "does not work; the target has no P2P",
        fix="remove SGLANG_SKIP_P2P_CHECK from env",
        source="https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/distributed/"
        "device_communicators/custom_all_reduce_utils.py",
    ),
    Rule(
        id="no-p2p-custom-allreduce",
        when=(Clause("derived.custom_allreduce_unchecked", "truthy"),
              Clause("derived.disable_custom_allreduce_flag", "falsy")),
        severity="error",
        field="target.p2p",
        message="without --enable-p2p-check SGLang patches its P2P check to say yes (utils.py "
        "monkey_patch_p2p_access_check, called from model_runner.py init_torch_distributed), so on a target "
        "without P2P its custom allreduce is built anyway (at TP 2, or over NVLink) and dies with 'peer access is "
        "not supported between these two devices'; this release's catalogue has no --disable-custom-all-reduce "
        "for the render to add",
        fix="add --enable-p2p-check to server.extra_args (SGLang then tests P2P and keeps the custom allreduce off)",
        source="https://github.com/sgl-project/sglang/issues/4814; sglang python/sglang/srt/utils.py "
        "monkey_patch_p2p_access_check",
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
# Unicode categories no rendered string may hold: control (Cc), format (Cf: bidirectional overrides, zero-width
# characters, the BOM), surrogates (Cs: no UTF-8 file can hold one), line and paragraph separators (Zl, Zp).
_FORBIDDEN_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Cs": "a lone surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# What a path the deploy role puts on a command line (`python -m venv --clear PATH`, `patch ... TARGET`) may
# hold: the POSIX portable file name characters and '/'. Ansible's command module splits such a line at spaces.
_PORTABLE_PATH = re.compile(r"[A-Za-z0-9._/+@-]+")
# Directories of the system (FHS) and of this toolkit's model mount; a venv is made with `--clear`, which empties
# its directory first, so none of these may be one.
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
    "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/models",
    "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local", "/usr/sbin",
    "/usr/share", "/usr/src", "/usr/local/bin", "/usr/local/lib", "/usr/local/sbin", "/usr/local/share",
    "/var/cache", "/var/lib", "/var/lock", "/var/log", "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp",
    "/models/huggingface",
})  # fmt: skip
# Kernel and runtime file systems: nothing the deploy makes belongs there.
_VIRTUAL_DIRS = ("/proc/", "/sys/", "/dev/", "/run/")
# A git ref or commit as `git check-ref-format` takes it (refs/pr/1, main, v1.0, a hash): no '..', no '//',
# no part starting with '.', no '@{', none of ~^:?*[\ and space.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]*")
# Something that looks like a key rather than a reference: long, no scheme, or a known key prefix.
_LITERAL_KEY = re.compile(r"^(sk-|hf_|[A-Za-z0-9_\-]{24,}$)")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def control_char_problem(value: str) -> str | None:
    for i, c in enumerate(value):
        kind = _FORBIDDEN_CATEGORIES.get(unicodedata.category(c))
        if kind is not None:
            name = _CONTROL_NAMES.get(c) or unicodedata.name(c, "") or "unnamed"
            return f"{kind}, U+{ord(c):04X} ({name}) at position {i}"
    return None


def prose_problem(value: str) -> str | None:
    """Prose may hold line breaks and tabs (folded YAML blocks end in one), nothing else that drives a terminal."""
    for i, c in enumerate(value):
        category = unicodedata.category(c)
        if (category == "Cc" and c not in "\n\t") or category in ("Zl", "Zp") or "\u202a" <= c <= "\u202e" \
                or "\u2066" <= c <= "\u2069":
            name = _CONTROL_NAMES.get(c) or unicodedata.name(c, "") or "control character"
            return f"U+{ord(c):04X} ({name}) at position {i}"
    return None


def template_problem(value: str) -> str | None:
    for marker in ("{{", "{%", "{#"):
        if marker in value:
            return f"{marker!r} at position {value.index(marker)}"
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
    if not sep or not port.isdigit() or not port.isascii() or not 1 <= int(port) <= 65535:
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


def relative_path_problem(value: str) -> str | None:
    """A path inside some root: relative, normalised, without '..', of portable characters."""
    if value.startswith(("/", "~")):
        return f"{value!r} is not relative"
    if ".." in value.split("/"):
        return f"{value!r} contains '..'"
    if posixpath.normpath(value) != value:
        return f"{value!r} is not normalised (it means {posixpath.normpath(value)!r})"
    if not _PORTABLE_PATH.fullmatch(value):
        return f"{value!r} holds characters other than letters, digits and ._/+@-"
    return None


def path_like_problem(value: str) -> str | None:
    """A tokenizer is a Hugging Face repo id (org/name) or a path; a path must be absolute."""
    if value.startswith(("/", ".", "~")) or value.count("/") > 1:
        return absolute_path_problem(value)
    return None


def venv_dir_problem(value: str) -> str | None:
    if not _PORTABLE_PATH.fullmatch(value):
        return f"{value!r} holds characters other than letters, digits and ._/+@-"
    if value in SYSTEM_DIRS:
        return f"{value!r} is a directory of the system"
    if value.startswith(_VIRTUAL_DIRS):
        return f"{value!r} is on a kernel or runtime file system"
    return None


def repo_file_problem(value: str, folder: str = "profiles/") -> str | None:
    problem = relative_path_problem(value)
    if problem is not None:
        return problem
    if not value.startswith(folder) or value == folder:
        return f"{value!r} is outside {folder}"
    return None


def patch_file_problem(value: str) -> str | None:
    return repo_file_problem(value, "profiles/patches/")


def revision_problem(value: str) -> str | None:
    parts = value.split("/")
    if (
        not _REVISION.fullmatch(value)
        or ".." in value
        or any(not p or p.startswith(".") or p.endswith(".lock") for p in parts)
        or value.endswith(".")
    ):
        return f"{value!r} is not a git branch, tag or commit"
    return None


def secret_ref_problem(value: str) -> str | None:
    scheme, sep, name = value.partition(":")
    if scheme not in SECRET_SCHEMES or not sep or not name:
        if _LITERAL_KEY.match(value):
            return "it must be a reference to a secret, not the key itself"
        return "it is not a secret reference (the value is not shown: it may be the key)"
    if scheme == "env" and not _IDENTIFIER.fullmatch(name):
        return f"{name!r} is not an environment variable name"
    if scheme == "vault" and not _IDENTIFIER.fullmatch(name):
        return f"{name!r} is not an Ansible variable name (the deploy reads the key as {{{{ {name} }}}})"
    if scheme == "file":
        problem = absolute_path_problem(name)
        if problem is not None:
            return f"the file: reference {problem}"
    return None


def served_name_problem(value: str) -> str | None:
    if ":" in value:
        return f"{value!r} holds ':'"
    return None


def argv_value_problem(value: str) -> str | None:
    """A value that argparse (SGLang's and bench_serving's parsers) would read as an option, not as a value."""
    if value == "--" or read_option(0, value, ()).kind != "value":
        return f"{value!r} starts with '-'"
    return None


CHECKS: dict[str, Callable[[str], str | None]] = {
    "control_chars": control_char_problem,
    "prose": prose_problem,
    "template": template_problem,
    "host": host_problem,
    "host_port": host_port_problem,
    "absolute_path": absolute_path_problem,
    "path_like": path_like_problem,
    "venv_dir": venv_dir_problem,
    "repo_file": repo_file_problem,
    "patch_file": patch_file_problem,
    "site_packages_path": relative_path_problem,
    "revision": revision_problem,
    "secret_ref": secret_ref_problem,
    "served_name": served_name_problem,
    "argv_value": argv_value_problem,
}

# Every string knob that becomes the value of a flag in SGLang's argv or bench_serving's.
ARGV_VALUE_PATHS = (
    "model.revision",
    "model.served_model_name",
    "model.quantization",
    *(f"server.{k.field}" for k in SERVER_KNOBS if k.kind == "value"),
    "bench.backend",
    "bench.dataset_name",
    "bench.tokenizer",
)

FIELD_RULES: tuple[FieldRule, ...] = (
    FieldRule(
        id="control-characters",
        paths=("*",),
        check="control_chars",
        severity="error",
        message="contains {detail}: it would end a line of the unit or the environment file (a new directive, "
        "a new variable), split an argument, or show a name other than the one that runs",
        fix="remove it (YAML turns \\n in a double-quoted string, and the end of a block scalar, into a newline; "
        "\\u escapes and pasted text can carry invisible characters)",
        source="systemd.syntax(7): a newline ends an assignment; Unicode TR9 (bidirectional overrides), CVE-2021-42574",
    ),
    FieldRule(
        id="prose-control-characters",
        paths=("description", "why.*.reason", "why.*.link", "engine.patches.*.reason", "engine.patches.*.link"),
        check="prose",
        severity="error",
        message="contains {detail}: prose reaches the terminal through `profile show`, `diff` and git's textconv, "
        "where an escape sequence or a bidirectional control rewrites what is shown",
        fix="remove it (a YAML \\e or \\x1b escape in a double-quoted string makes one)",
        source="ECMA-48 control sequences; Unicode TR9, CVE-2021-42574",
    ),
    FieldRule(
        id="ansible-template",
        paths=("*",),
        check="template",
        severity="error",
        message="contains the template marker {detail}: the deploy hands this value to Ansible, which would "
        "evaluate it as Jinja on the controller (a lookup there runs commands)",
        fix="remove the marker; profile values are literal text",
        source="Ansible: variables are templated when used, unless marked unsafe",
    ),
    FieldRule(
        id="host-address",
        paths=("server.host", "replicas.router.bind"),
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
        paths=("engine.venv_path", "model.local_path", "env.HF_HOME"),
        check="absolute_path",
        severity="error",
        message="{detail}: this path goes into the unit and the deploy tasks, which run from no fixed directory",
        fix="write an absolute, normalised path without '..', e.g. /opt/sglang/venv or /models/GLM-5-NVFP4",
        source="systemd.service(5): ExecStart= needs an absolute path",
    ),
    FieldRule(
        id="venv-directory",
        paths=("engine.venv_path",),
        check="venv_dir",
        severity="error",
        message="{detail}: the deploy makes the venv with `python -m venv --clear PATH` on a command line split "
        "at spaces, and --clear empties the directory first",
        fix="give the venv a directory of its own, e.g. /opt/sglang/venv",
        source="roles/sglang_venv/tasks/install.yml (Create the venv); python -m venv --help (--clear)",
    ),
    FieldRule(
        id="tokenizer-path",
        paths=("bench.tokenizer",),
        check="path_like",
        severity="error",
        message="{detail}: the benchmark runs on the host, from no fixed directory",
        fix="give a Hugging Face repo id (org/name) or an absolute, normalised path",
        source="bench_serving loads --tokenizer from the current directory when it is relative",
    ),
    FieldRule(
        id="secret-reference",
        paths=("server.api_key_secret",),
        check="secret_ref",
        severity="error",
        message="{detail}",
        fix="write env:SGLANG_API_KEY, vault:sglang_api_key or file:/etc/sglang/api-key, and keep the key there "
        "(a key written here would end up in git, units and logs; a file: path is read on the controller from "
        "no fixed directory)",
        source="toolkit apply resolves the reference on the controller",
    ),
    FieldRule(
        id="repo-file",
        paths=("engine.requirements",),
        check="repo_file",
        severity="error",
        message="{detail}: files a profile names are the repository's, under profiles/",
        fix="keep the lock file under profiles/ and give its path from the repository root, e.g. "
        "profiles/requirements/glm5-custom-cp311.lock (or delete it: the lock follows engine.sglang_version)",
        source="a path that climbs out of the profiles' tree reads (and ships) any file of the controller",
    ),
    FieldRule(
        id="patch-file",
        paths=("engine.patches.*.patch",),
        check="patch_file",
        severity="error",
        message="{detail}: patch files are the repository's, under profiles/patches/",
        fix="keep patch files in profiles/patches/ and give the repo-relative path",
        source="the deploy copies the patch file from the controller to every host",
    ),
    FieldRule(
        id="patch-target",
        paths=("engine.patches.*.target",),
        check="site_packages_path",
        severity="error",
        message="{detail}: target must be relative to site-packages",
        fix="write e.g. sglang/srt/model_executor/model_runner.py",
        source="roles/sglang_venv/tasks/patches.yml joins it to site-packages on a command line split at spaces",
    ),
    FieldRule(
        id="model-revision",
        paths=("model.revision",),
        check="revision",
        severity="error",
        message="{detail}: the revision names the download and a marker file in the model cache",
        fix="write a branch, a tag or a commit hash, e.g. main or 0123abcd",
        source="git check-ref-format(1); huggingface_hub snapshot_download(revision=...)",
    ),
    FieldRule(
        id="served-model-name",
        paths=("model.served_model_name",),
        check="served_name",
        severity="error",
        message="{detail}: SGLang refuses a served model name with a colon at start (it separates model:adapter)",
        fix="remove the ':' from served_model_name",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py (check_server_args)",
    ),
    FieldRule(
        id="argv-value",
        paths=ARGV_VALUE_PATHS,
        check="argv_value",
        severity="error",
        message="{detail}: SGLang's argument parser (argparse) would read it as a flag, not as this value, and "
        "stop at start",
        fix="remove the leading '-'",
        source="argparse: a token starting with '-' is an option unless it is a negative number",
    ),
)


def _path_matches(pattern: str, path: str) -> bool:
    """`*` in a pattern stands for one or more parts of the dotted path: an index (engine.patches.*.patch) or
    a key with dots in it (why.*.reason matches why.server.tp_size.reason)."""
    parts = (".+" if part == "*" else re.escape(part) for part in pattern.split("."))
    return re.fullmatch(r"\.".join(parts), path) is not None


def string_fields(resolved: ResolvedProfile, *, prose: bool = False) -> Iterator[tuple[str, str]]:
    """(dotted path, value) of every string of the spec that is rendered somewhere (not results); with
    `prose`, the prose too (description, why, reasons and links)."""

    def walk(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
        if isinstance(value, dict):
            for k, v in value.items():
                if prose or k not in PROSE_KEYS:
                    yield from walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from walk(f"{prefix}.{i}", v)
        elif isinstance(value, str):
            yield prefix, value

    exclude = {"results"} if prose else {"results", "why", "description"}
    yield from walk("", resolved.spec.model_dump(mode="json", exclude=exclude))


def field_rule_hits(
    resolved: ResolvedProfile, rules: tuple[FieldRule, ...] = FIELD_RULES
) -> list[tuple[FieldRule, str, str]]:
    """(rule, path, detail) for each field a rule finds wrong; one hit per field (the first rule wins), so a
    value with a newline is not also reported as a bad host."""
    rendered = dict(string_fields(resolved))
    strings = dict(string_fields(resolved, prose=True))
    hits: list[tuple[FieldRule, str, str]] = []
    seen: set[str] = set()
    for rule in rules:
        if rule.paths == ("*",):  # every rendered string; prose is named by its own rules
            paths = sorted(rendered)
        else:
            paths = [p for p in strings if any(_path_matches(pattern, p) for pattern in rule.paths)]
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
        or server.attention_backend in ("nsa", "dsa")
    )
    facts["derived.ep_1_or_tp"] = server.ep_size in (1, server.tp_size)
    facts["derived.nsa_architecture"] = resolved.spec.model.architecture in NSA_ARCHITECTURES
    facts["derived.phase_backend_set"] = bool(server.prefill_attention_backend or server.decode_attention_backend)
    # A host that is no address is its own error (host-address); it is not also called a public bind.
    facts["derived.bind_public"] = host_problem(server.host) is None and not is_loopback(server.host)
    facts["derived.allow_unauthenticated_why"] = "server.allow_unauthenticated" in resolved.spec.why
    facts["derived.dsa_trtllm"] = "trtllm" in (server.nsa_decode_backend, server.nsa_prefill_backend)
    facts["derived.decode_graph_backend_set"] = any(
        a.split("=", 1)[0] == "--cuda-graph-backend-decode" for a in server.extra_args
    )
    facts["derived.p2p_check"] = P2P_CHECK_FLAG in server.extra_args
    facts["derived.custom_allreduce_unchecked"] = custom_allreduce_unchecked(resolved)
    catalogue = resolved.catalogue
    facts["derived.disable_custom_allreduce_flag"] = catalogue is None or catalogue.live(DISABLE_CUSTOM_AR_FLAG)
    return facts


P2P_CHECK_FLAG = "--enable-p2p-check"
DISABLE_CUSTOM_AR_FLAG = "--disable-custom-all-reduce"


def custom_allreduce_unchecked(resolved: ResolvedProfile) -> bool:
    """A target without P2P on which SGLang would build its custom allreduce without testing P2P: without
    --enable-p2p-check its check is patched to say yes (utils.py monkey_patch_p2p_access_check), and
    custom_all_reduce.py then refuses only more than two GPUs that are not fully NVLinked (world sizes 2, 4, 6
    and 8 are supported). The render adds --disable-custom-all-reduce there."""
    spec = resolved.spec
    server, target = spec.server, spec.target
    if target.p2p is not False or P2P_CHECK_FLAG in server.extra_args or DISABLE_CUSTOM_AR_FLAG in server.extra_args:
        return False
    tp = server.tp_size // max(1, server.nnodes) if server.nnodes > 1 else server.tp_size
    return tp == 2 or (tp in (4, 6, 8) and target.interconnect != "pcie")


def matching_rules(resolved: ResolvedProfile, rules: tuple[Rule, ...] = RULES) -> list[Rule]:
    facts = facts_of(resolved)
    version = resolved.spec.engine.sglang_version
    return [
        rule
        for rule in rules
        if release_in(version, rule.releases) and all(clause.holds(facts) for clause in rule.when)
    ]
