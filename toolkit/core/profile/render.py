"""Rendering a resolved profile into what runs: SGLang's argv, its environment, a systemd unit,
SGLang's own `--config` YAML, and the bench_serving argv. Pure functions, golden-tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.core.profile.catalogue import Catalogue
from toolkit.core.profile.flagmap import SERVER_KNOBS, Choice, knob_flags, spellings
from toolkit.core.profile.model import API_KEY_ENV, Server
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.rules import DISABLE_CUSTOM_AR_FLAG, custom_allreduce_unchecked

# The flags typed fields render besides SERVER_KNOBS (rendered_flags below), each with the field that owns it.
OWNED_FLAGS: tuple[tuple[str, str], ...] = (
    ("--model-path", "model.repo_id"),
    ("--revision", "model.revision"),
    ("--served-model-name", "model.served_model_name"),
    ("--quantization", "model.quantization"),
    ("--trust-remote-code", "model.trust_remote_code"),
    ("--host", "server.host"),
    ("--port", "server.port"),
    ("--api-key", "server.api_key_secret"),
)


def typed_flags(catalogue: Catalogue | None = None) -> dict[str, str]:
    """Every flag a typed field renders -> that field (server.tp_size, model.repo_id, ...): the flags whose
    settings extra_args may not touch. A knob owns each of its spellings (flagmap.py: the first, the renamed
    ones, those the catalogue's deprecations lead to), whichever its release renders."""
    out = dict(OWNED_FLAGS)
    for knob in SERVER_KNOBS:
        for spelling, _ in spellings(knob, catalogue):
            for flag, _value in spelling:
                out.setdefault(flag, f"server.{knob.field}")
    return out


@dataclass(frozen=True)
class RenderedFlag:
    """One flag as rendered, with the profile field it came from (for locating problems)."""

    path: str  # dotted profile path, e.g. server.max_running_requests, model.repo_id, server.extra_args.2
    flag: str
    value: str | None  # None for a switch


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def rendered_flags(resolved: ResolvedProfile) -> list[RenderedFlag]:
    """Every SGLang flag the launch argv carries, in order (the API key last), each knob spelled as the
    pinned release spells it (`resolved.catalogue`). A knob that release has no counterpart for is an
    error validate() reports first; here it raises."""
    flags, missing = knob_rendering(resolved)
    if missing:
        raise ValueError(f"{', '.join(c.knob.field for _, c in missing)}: no counterpart in the pinned SGLang; "
                         "validate() reports this before rendering")
    return flags


def knob_rendering(resolved: ResolvedProfile) -> tuple[list[RenderedFlag], list[tuple[str, Choice]]]:
    """(the rendered flags, the set knobs whose release has no spelling for them as (path, Choice))."""
    spec = resolved.spec
    model, server = spec.model, spec.server
    out = [RenderedFlag("model.repo_id", "--model-path", model.local_path or _require(model.repo_id, "model.repo_id"))]
    if model.revision and not model.local_path:
        out.append(RenderedFlag("model.revision", "--revision", model.revision))
    if model.served_model_name:
        out.append(RenderedFlag("model.served_model_name", "--served-model-name", model.served_model_name))
    if model.quantization:
        out.append(RenderedFlag("model.quantization", "--quantization", model.quantization))
    if model.trust_remote_code:
        out.append(RenderedFlag("model.trust_remote_code", "--trust-remote-code", None))
    out.append(RenderedFlag("server.host", "--host", server.host))
    out.append(RenderedFlag("server.port", "--port", str(server.port)))
    choices = knob_flags(resolved.catalogue)
    missing: list[tuple[str, Choice]] = []
    drops: set[str] = set()
    knob_flags_out: list[RenderedFlag] = []
    for knob in SERVER_KNOBS:
        value = getattr(server, knob.field)
        path = f"server.{knob.field}"
        if knob.kind == "value":
            if value is None or (knob.skip and knob.skip(value)):
                continue
        elif not ((knob.kind == "true" and value) or (knob.kind == "false" and not value)):
            continue
        choice = choices[knob.field]
        if choice.spelling is None:
            missing.append((path, choice))
            continue
        drops.update(choice.drops)
        for flag, template in choice.spelling:
            knob_flags_out.append(RenderedFlag(path, flag, _fill(template, value, server)))
    out += [rf for rf in knob_flags_out if rf.flag not in drops]
    if custom_allreduce_unchecked(resolved) and (resolved.catalogue is None
                                                 or resolved.catalogue.live(DISABLE_CUSTOM_AR_FLAG)):
        # No P2P, and SGLang would not test it: keep its custom allreduce off (rule no-p2p-custom-allreduce
        # refuses a release without the flag).
        out.append(RenderedFlag("target.p2p", DISABLE_CUSTOM_AR_FLAG, None))
    if server.api_key_secret:
        # systemd expands ${VAR} as one word from the EnvironmentFile written from the secret.
        out.append(RenderedFlag("server.api_key_secret", "--api-key", "${" + API_KEY_ENV + "}"))
    return out, missing


def _fill(template: str | None, value: Any, server: Server) -> str | None:
    """A spelling's value: the knob's own ({value}), another server knob's ({dp_size}), or a literal."""
    if template is None:
        return None
    if template == "{value}":
        return _fmt(value)
    if template.startswith("{") and template.endswith("}"):
        return _fmt(getattr(server, template[1:-1]))
    return template


def _require(value: str | None, path: str) -> str:
    if not value:
        raise ValueError(f"{path} is not set; validate() reports this before rendering")
    return value


def render_launch_argv(resolved: ResolvedProfile) -> list[str]:
    """The exact argv of the SGLang server, `<venv>/bin/python -m sglang.launch_server ...`:
    a list, never a shell string."""
    python = resolved.spec.engine.venv_path.rstrip("/") + "/bin/python"
    argv = [python, "-m", "sglang.launch_server"]
    for rf in rendered_flags(resolved):
        argv.append(rf.flag)
        if rf.value is not None:
            argv.append(rf.value)
    argv.extend(resolved.spec.server.extra_args)
    return argv


# The Hugging Face cache on the container's model-cache mount (lxc_gpu_container's mp0 at /models):
# the server, the download and the probe must agree on it, and weights of hundreds of GB belong on
# the host's mount, not the 64 GiB rootfs (where ~/.cache/huggingface would put them).
DEFAULT_HF_HOME = "/models/huggingface"


def render_env(resolved: ResolvedProfile) -> dict[str, str]:
    """The server's environment, sorted by name (the API key is not here: it comes from the EnvironmentFile).
    HF_HOME is DEFAULT_HF_HOME unless the profile's env sets it."""
    return dict(sorted({"HF_HOME": DEFAULT_HF_HOME, **resolved.spec.env}.items()))


def render_sglang_config_yaml(resolved: ResolvedProfile) -> str:
    """SGLang's own `--config` file: keys are long flags without `--` (server_args_config_parser.py);
    switches are `true`. The API key stays on the command line, expanded from the environment."""
    import yaml

    config: dict[str, Any] = {}
    for rf in rendered_flags(resolved):
        if rf.path == "server.api_key_secret":
            continue
        key = rf.flag[2:]
        config[key] = True if rf.value is None else _yaml_value(rf.value)
    extra = resolved.spec.server.extra_args
    i = 0
    while i < len(extra):
        token = extra[i]
        if token.startswith("--") and "=" in token:
            key, value = token[2:].split("=", 1)
            config[key] = _yaml_value(value)
            i += 1
        elif token.startswith("--"):
            values = []
            j = i + 1
            while j < len(extra) and not extra[j].startswith("--"):
                values.append(_yaml_value(extra[j]))
                j += 1
            config[token[2:]] = True if not values else values[0] if len(values) == 1 else values
            i = j
        else:
            i += 1
    header = f"# SGLang --config for profile {resolved.name}; generated by toolkit, edit the profile instead.\n"
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _yaml_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


# ---- systemd ----------------------------------------------------------------------------------

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,+-@")


def systemd_word(arg: str) -> str:
    """One ExecStart word that systemd reads back as exactly `arg` (systemd.service(5) "Command lines"):
    `%` is a specifier and `$` a variable, so both are doubled; anything else unusual is double-quoted
    with C-style escapes."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and all(c in _SAFE for c in text):
        return text
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def systemd_env_assignment(key: str, value: str) -> str:
    """An Environment= value: quoted, C escapes, `%` doubled (no `$` expansion happens there)."""
    text = f"{key}={value}".replace("%", "%%")
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    )
    return f'"{escaped}"'


_UNIT_TEMPLATE = """\
# Generated by toolkit from profile {{ name }} (server spec {{ server_hash[:12] }}); edit the profile, not this file.
[Unit]
Description=SGLang serving {{ model }} (toolkit profile {{ name }})
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
{% for assignment in environment -%}
Environment={{ assignment }}
{% endfor -%}
{% if environment_file -%}
# The API key lives only here, written by the deploy role from {{ secret_ref }}.
EnvironmentFile={{ environment_file }}
{% endif -%}
ExecStart={{ exec_start }}
Restart=on-failure
RestartSec=10
# Loading and capturing a large model takes minutes before /health answers.
TimeoutStartSec=1800
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
"""


def render_systemd_unit(resolved: ResolvedProfile, *, environment_file: str | None = None) -> str:
    """The systemd unit that runs the server. The API key never appears in it: with `api_key_secret`
    set, the argv carries `${SGLANG_API_KEY}` and the unit reads it from `environment_file`
    (default /etc/sglang/<name>.env, mode 0600, written by the deploy role)."""
    import jinja2

    from toolkit.core.profile.hashing import server_hash

    argv = render_launch_argv(resolved)
    api_token = "${" + API_KEY_ENV + "}"
    words = [api_token if arg == api_token else systemd_word(arg) for arg in argv]
    # Pair each flag with its value on one line, for a readable unit.
    lines: list[str] = [" ".join(words[:3])]
    i = 3
    while i < len(words):
        if i + 1 < len(words) and argv[i].startswith("--") and not argv[i + 1].startswith("--"):
            lines.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            lines.append(words[i])
            i += 1
    secret = resolved.spec.server.api_key_secret
    env_file = (environment_file or f"/etc/sglang/{resolved.name}.env") if secret else None
    template = jinja2.Environment(autoescape=False, keep_trailing_newline=True).from_string(_UNIT_TEMPLATE)
    return template.render(
        name=resolved.name,
        server_hash=server_hash(resolved),
        model=resolved.spec.model.served_model_name or resolved.spec.model.repo_id,
        environment=[systemd_env_assignment(k, v) for k, v in render_env(resolved).items()],
        environment_file=env_file,
        secret_ref=secret,
        exec_start=" \\\n    ".join(lines),
    )


# ---- bench_serving ----------------------------------------------------------------------------


def render_bench_argv(
    resolved: ResolvedProfile,
    *,
    base_url: str,
    output_file: str,
    python: str = "python3",
    max_concurrency: int | None = None,
) -> list[str]:
    """SGLang's bench_serving against a running server. With the defaults this is the GLM-5 story's command
    (docs/story.md, the benchmark) plus --output-file and --output-details. `max_concurrency` overrides
    bench.max_concurrency for one level of bench.concurrency_levels."""
    bench, model = resolved.spec.bench, resolved.spec.model
    served = model.served_model_name or _require(model.repo_id, "model.repo_id")
    tokenizer = bench.tokenizer or model.local_path or _require(model.repo_id, "model.repo_id")
    argv = [
        python, "-m", "sglang.bench_serving",
        "--backend", bench.backend,
        "--model", served,
        "--tokenizer", tokenizer,
        "--base-url", base_url,
        "--dataset-name", bench.dataset_name,
        "--num-prompts", str(bench.num_prompts),
        "--random-input-len", str(bench.random_input_len),
        "--random-output-len", str(bench.random_output_len),
        "--request-rate", _fmt(bench.request_rate),
    ]  # fmt: skip
    if bench.random_range_ratio is not None:
        argv += ["--random-range-ratio", _fmt(bench.random_range_ratio)]
    concurrency = max_concurrency if max_concurrency is not None else bench.max_concurrency
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    if bench.warmup_requests is not None:
        argv += ["--warmup-requests", str(bench.warmup_requests)]
    if bench.seed is not None:
        argv += ["--seed", str(bench.seed)]
    # --output-details adds bench_serving's per-request results (ttfts, itls, input_lens, output_lens, errors) to
    # its JSON line: the report's TTFT and ITL distributions, the latency percentiles and an SLO's verdict come from
    # them, not from its means.
    argv += ["--output-file", output_file, "--output-details"]
    return argv
