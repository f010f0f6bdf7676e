"""Checks beyond types, before anything touches a host: required facts, parallelism against the
target, hardware rules, secrets, and every rendered flag against the pinned SGLang's own catalogue.
"""

from __future__ import annotations

import re

from toolkit.core.errors import Problem
from toolkit.core.profile.catalogue import Catalogue
from toolkit.core.profile.model import SECRET_SCHEMES
from toolkit.core.profile.render import extra_arg_flags, rendered_flags
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.rules import FIELD_RULES, RULES, FieldRule, Rule, field_rule_hits, matching_rules

REQUIRED = (
    ("target.gpu_count", "the number of GPUs per node, e.g. 8"),
    ("target.compute_capability", "the GPUs' compute capability, e.g. SM120 for RTX PRO 6000 Blackwell"),
    ("engine.sglang_version", "the SGLang release the flags are checked against, e.g. 0.5.9"),
    ("model.repo_id", "the Hugging Face repo id, e.g. lukealonso/GLM-5-NVFP4"),
)

# Something that looks like a key rather than a reference: long, no scheme, or a known key prefix.
_LITERAL_KEY = re.compile(r"^(sk-|hf_|[A-Za-z0-9_\-]{24,}$)")


# Flags that typed fields render and rules check (host, port, model path): in extra_args they would override
# the checked value unchecked (argparse: the last one wins).
TYPED_ONLY_FLAGS = {
    "--host": "server.host",
    "--port": "server.port",
    "--model-path": "model.local_path or model.repo_id",
}


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
    for frule, path, detail in field_rule_hits(resolved, field_rules):
        problems.append(
            resolved.problem(path, frule.message.format(detail=detail), frule.fix, frule.severity, frule.id)
        )
    problems += _required(resolved)
    problems += _parallelism(resolved)
    problems += _power_limit(resolved)
    problems += _secrets(resolved)
    problems += _patches(resolved)
    problems += _whys(resolved)
    for rule in matching_rules(resolved, rules):
        problems.append(
            resolved.problem(rule.field, f"{rule.message} (source: {rule.source})", rule.fix, rule.severity, rule.id)
        )
    if resolved.spec.engine.sglang_version:
        if catalogue is None:
            problems.append(
                resolved.problem(
                    "engine.sglang_version",
                    f"no flag catalogue for SGLang {resolved.spec.engine.sglang_version}",
                    f"run `toolkit profile catalogue --sglang-version {resolved.spec.engine.sglang_version}` "
                    "or pin a version that has one (toolkit/data/sglang_flags/)",
                )
            )
        elif not any(p.severity == "error" and p.field == "model.repo_id" for p in problems):
            problems += _flags(resolved, catalogue)
    return problems


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
    if s.nnodes > 1 and not s.dist_init_addr:
        out.append(
            resolved.problem(
                "server.dist_init_addr",
                "a multi-node server needs dist_init_addr (host:port of node 0)",
                "set server.dist_init_addr, e.g. 10.0.0.1:50000",
            )
        )
    return out


def _secrets(resolved: ResolvedProfile) -> list[Problem]:
    out = []
    ref = resolved.spec.server.api_key_secret
    if ref is not None:
        scheme, _, name = ref.partition(":")
        if scheme not in SECRET_SCHEMES or not name:
            out.append(
                resolved.problem(
                    "server.api_key_secret",
                    "must be a reference to a secret, not the key itself"
                    if _LITERAL_KEY.match(ref)
                    else f"{ref!r} is not a secret reference",
                    "write env:SGLANG_API_KEY, vault:sglang_api_key or file:/etc/sglang/api-key, and keep the key "
                    "there (a key written here would end up in git, units and logs)",
                )
            )
    for i, token in enumerate(resolved.spec.server.extra_args):
        flag = token.split("=", 1)[0]
        if flag == "--api-key":
            out.append(
                resolved.problem(
                    f"server.extra_args.{i}",
                    "the API key may not be passed in extra_args",
                    "remove it and set server.api_key_secret to a reference (env:NAME or vault:NAME)",
                )
            )
        elif flag in TYPED_ONLY_FLAGS:
            out.append(
                resolved.problem(
                    f"server.extra_args.{i}",
                    f"{flag} in extra_args would override {TYPED_ONLY_FLAGS[flag]} without its checks",
                    f"remove it from extra_args and set {TYPED_ONLY_FLAGS[flag]}",
                )
            )
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


def _patches(resolved: ResolvedProfile) -> list[Problem]:
    out = []
    for i, patch in enumerate(resolved.spec.engine.patches):
        if not patch.patch.startswith("profiles/patches/") or ".." in patch.patch.split("/"):
            out.append(
                resolved.problem(
                    f"engine.patches.{i}.patch",
                    f"{patch.patch!r} is outside profiles/patches/",
                    "keep patch files in profiles/patches/ and give the repo-relative path",
                )
            )
        if patch.target.startswith("/") or ".." in patch.target.split("/"):
            out.append(
                resolved.problem(
                    f"engine.patches.{i}.target",
                    "target must be relative to site-packages",
                    "write e.g. sglang/srt/model_executor/model_runner.py",
                )
            )
    return out


def _flags(resolved: ResolvedProfile, catalogue: Catalogue) -> list[Problem]:
    version = catalogue.sglang_version
    out = []
    checks = [(rf.path, rf.flag, rf.value) for rf in rendered_flags(resolved)]
    extra = resolved.spec.server.extra_args
    for i, flag in extra_arg_flags(resolved.spec.server):
        token = extra[i]
        value = (
            token.split("=", 1)[1]
            if "=" in token
            else (extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("--") else None)
        )
        checks.append((f"server.extra_args.{i}", flag, value))
    for path, flag, value in checks:
        info = catalogue.get(flag)
        if info is None:
            close = catalogue.suggest(flag)
            hint = f"did you mean {', '.join(close)}?" if close else f"see toolkit/data/sglang_flags/{version}.json"
            out.append(
                resolved.problem(
                    path,
                    f"SGLang {version} has no flag {flag}",
                    f"{hint} (catalogue of SGLang {version}, read from its server_args.py)",
                )
            )
            continue
        if info.deprecated:
            instead = f"use {info.replacement}" if info.replacement else "see SGLang's release notes"
            out.append(
                resolved.problem(
                    path,
                    f"{flag} is deprecated in SGLang {version}",
                    f"{instead}; the old name still works for now",
                    severity="warning",
                )
            )
        if info.choices and value is not None and not value.startswith("${"):  # noqa: SIM102
            if value not in [str(c) for c in info.choices]:
                out.append(
                    resolved.problem(
                        path,
                        f"{value!r} is not a value SGLang {version} accepts for {flag}",
                        f"choose one of: {', '.join(str(c) for c in info.choices)}",
                    )
                )
    return out
