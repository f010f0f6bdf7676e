"""A profile written from a running SGLang server: what it reports (`/server_info`: its resolved server arguments
and `version`) and, where given, the command line it was started with.

Pure: the caller fetches the server's JSON and hands in the release's flag catalogue. Each typed knob
(flagmap.SERVER_KNOBS) is read from the server argument its first flag stores to (the catalogue's `dest`) and
written only where it differs from the release's default, so the profile says what this server does differently,
each with a why that says where the value came from. A flag of the command line that no typed knob covers goes
into `server.extra_args` as written. The API key is never copied: the profile names where it is kept instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from toolkit.core.profile.catalogue import Catalogue
from toolkit.core.profile.flagmap import SERVER_KNOBS
from toolkit.core.profile.model import RELEASE_PATTERN, REPO_ID, SCHEMA_VERSION

# Flags the profile holds elsewhere (model:, server.host/port) or must never hold (the key itself).
_NOT_EXTRA = {"--model-path", "--model", "--served-model-name", "--host", "--port", "--api-key",
              "--tokenizer-path", "--revision", "--quantization", "--trust-remote-code"}
_SECRET_FLAGS = {"--api-key"}


@dataclass(frozen=True)
class ImportedProfile:
    text: str
    knobs: dict[str, Any]  # "server.max_running_requests" -> value, every knob written
    notes: list[str] = field(default_factory=list)  # what could not be known from the server, to say once


def _field(flag: str, catalogue: Catalogue | None, args: dict[str, Any]) -> str | None:
    """The server argument a flag sets, as /server_info names it: ServerArgs' field, which is the flag's own
    name (`--tp-size`: tp_size), where argparse's dest may be an alias's (`tensor_parallel_size`)."""
    own = flag.lstrip("-").replace("-", "_")
    if own in args:
        return own
    info = catalogue.get(flag) if catalogue is not None else None
    return info.dest if info is not None and info.dest in args else None


def _default(flag: str, catalogue: Catalogue | None) -> Any:
    info = catalogue.get(flag) if catalogue is not None else None
    return info.default if info is not None else None


def _command_flags(command: Sequence[str]) -> list[list[str]]:
    """The command line's flags, each with the values that follow it (`--flag=value` split)."""
    out: list[list[str]] = []
    for token in command:
        if token.startswith("--"):
            name, sep, value = token.partition("=")
            out.append([name, value] if sep else [name])
        elif out:
            out[-1].append(token)
    return out


def server_args_of(info: dict[str, Any]) -> dict[str, Any]:
    """The server arguments of a /server_info answer: SGLang puts them at the top level (dataclasses.asdict of its
    ServerArgs, beside `version` and `internal_states`); some proxies nest them under `server_args`."""
    nested = info.get("server_args")
    return dict(nested) if isinstance(nested, dict) else dict(info)


def profile_from_server(info: dict[str, Any], *, name: str, source: str, date: str, version: str | None,
                        catalogue: Catalogue | None, command: Sequence[str] = (),
                        target: dict[str, Any] | None = None) -> ImportedProfile:
    """The profile text for a server that answered `info` at `source` (its URL) on `date`; `target`: the GPUs
    as the caller knows them (the server does not report them)."""
    args = server_args_of(info)
    release = version or str(info.get("version") or "")
    notes: list[str] = []
    if not re.fullmatch(RELEASE_PATTERN, release):
        notes.append(f"the server reports SGLang version {release or 'nothing'!r}: engine.sglang_version is left "
                     "out (give --sglang-version X.Y.Z to pin it)")
        release = ""
    said = f"read from {source} /server_info on {date}"
    why: dict[str, dict[str, str]] = {}
    knobs: dict[str, Any] = {}
    server: dict[str, Any] = {}
    for knob in SERVER_KNOBS:
        flag = knob.flag
        dest = _field(flag, catalogue, args)
        if dest is None:
            continue
        value = args[dest]
        if knob.kind == "value":
            if value is None or value == _default(flag, catalogue) or (knob.skip and knob.skip(value)):
                continue
            out: Any = value
        elif knob.kind == "true":
            if not value:
                continue
            out = True
        else:  # the flag turns the knob off (--disable-cuda-graph: cuda_graph false)
            if not value:
                continue
            out = False
        server[knob.field] = out
        knobs[f"server.{knob.field}"] = out
        why[f"server.{knob.field}"] = {"reason": f"{flag} {value} on the running server ({said})"
                                       if knob.kind == "value" else f"{flag} set on the running server ({said})"}
    for key in ("host", "port"):
        if args.get(key) is not None:
            server[key] = args[key]
    if args.get("api_key") or info.get("api_key_set"):
        server["api_key_secret"] = "env:SGLANG_API_KEY"
        notes.append("the server needs an API key: the profile reads it from $SGLANG_API_KEY (never written)")
    typed = {k.flag for k in SERVER_KNOBS}
    extra: list[str] = []
    for flag, *values in _command_flags(command):
        if flag in typed or flag in _NOT_EXTRA:
            continue
        extra += [flag, *values]
    if extra:
        server["extra_args"] = extra
        why["server.extra_args"] = {"reason": f"the server's command line as given to `toolkit profile import` "
                                    f"({date}), less what the typed knobs hold"}
    for flag in _SECRET_FLAGS:
        if any(t == flag or t.startswith(flag + "=") for t in command):
            notes.append(f"{flag} on the command line is not copied: a secret has no place in a profile")
    model_path = str(args.get("model_path") or "")
    model: dict[str, Any] = {}
    if re.fullmatch(REPO_ID, model_path) and not model_path.startswith(("/", ".")):
        model["repo_id"] = model_path
    elif model_path:
        model["local_path"] = model_path
    if args.get("served_model_name") and args.get("served_model_name") != model_path:
        model["served_model_name"] = args["served_model_name"]
    if args.get("quantization"):
        model["quantization"] = args["quantization"]
    target = {k: v for k, v in (target or {}).items() if v is not None}
    if not target.get("gpu_count") or not target.get("compute_capability"):
        notes.append("the server does not report its GPUs: give --gpu-count and --compute-capability (and "
                     "--gpu-model), or fill in target: by hand")
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "description": f"Imported from the SGLang server at {source} on {date}: the knobs it runs with that "
                       "differ from the release's defaults.",
    }
    if target:
        doc["target"] = target
    if release:
        doc["engine"] = {"sglang_version": release}
    if model:
        doc["model"] = model
    doc["server"] = server
    if release:
        why["engine.sglang_version"] = {"reason": f"the version the server reports ({said})" if version is None
                                        else "given to `toolkit profile import` (the server did not say)"}
    doc["why"] = why
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=110, allow_unicode=True)
    return ImportedProfile(text=text, knobs=knobs, notes=notes)
