"""Flags against the pinned SGLang's catalogue: the ones typed fields render, and extra_args as SGLang's own
parser reads them (argv.py), each judged by the destination it sets, so no spelling reaches a typed knob, a
secret or a file of flags the profile cannot check.
"""

from __future__ import annotations

import dataclasses
import re

from toolkit.core.errors import Problem
from toolkit.core.profile.argv import HELP_OPTIONS, ArgToken, read_argv
from toolkit.core.profile.catalogue import Catalogue, FlagInfo
from toolkit.core.profile.flagmap import renamed_flag
from toolkit.core.profile.render import knob_rendering, typed_flags
from toolkit.core.profile.resolve import ResolvedProfile

# Flag destinations that carry a secret: a key on a command line lands in the unit, `ps`, the journal and git.
_SECRET_DEST = re.compile(r"(^|_)(api_key|password|passwd|secret|credentials?|(hf|auth|access|bearer)_token)($|_)")

# SGLang's `--config FILE` reads flags from a YAML file on the host, after which none of them is checked here.
_CONFIG_DESTS = frozenset({"config"})


def rendered_flag_problems(resolved: ResolvedProfile, catalogue: Catalogue) -> list[Problem]:
    """Every flag the typed fields render on the pinned release (each knob spelled as that release spells it,
    flagmap.py), against its catalogue; a set knob the release has no spelling for is an error."""
    version = catalogue.sglang_version
    flags, missing = knob_rendering(dataclasses.replace(resolved, catalogue=catalogue))
    out = [
        resolved.problem(
            path,
            f"{path} has no counterpart in SGLang {version}: {choice.reason}",
            f"unset {path} (SGLang's default), or pin a release that has it (toolkit/data/sglang_flags/); "
            "`toolkit profile migrate` says what moved where",
        )
        for path, choice in missing
    ]
    for rf in flags:
        info = catalogue.get(rf.flag)
        if info is None:
            out.append(_unknown_flag(resolved, rf.path, rf.flag, catalogue))
            continue
        out += _deprecated_or_bad_choice(resolved, rf.path, rf.flag, info, rf.value, version)
    return out


def _unknown_flag(resolved: ResolvedProfile, path: str, flag: str, catalogue: Catalogue) -> Problem:
    version = catalogue.sglang_version
    moved = renamed_flag(flag, catalogue)
    close = catalogue.suggest(flag)
    if moved is not None:
        successor = moved.new[0][0]
        owner = typed_destinations(catalogue).get(_dest(successor, catalogue.get(successor)))
        hint = (f"set {owner}: it renders {successor} on SGLang {version}" if owner else f"use {successor}") + (
            f" ({moved.source})")
    else:
        hint = f"did you mean {', '.join(close)}?" if close else f"see toolkit/data/sglang_flags/{version}.json"
    return resolved.problem(
        path,
        f"SGLang {version} has no flag {flag}",
        f"{hint} (catalogue of SGLang {version}, read from its own argument declarations)",
    )


def _deprecated_or_bad_choice(
    resolved: ResolvedProfile, path: str, flag: str, info: FlagInfo, value: str | None, version: str
) -> list[Problem]:
    out = []
    if info.error is not None:
        return [resolved.problem(path, f"SGLang {version} refuses {flag}: {info.error}", "remove it")]
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


def typed_destinations(catalogue: Catalogue) -> dict[str, str]:
    """dest -> the profile field that owns it: the destination of every flag a typed field renders, and of the
    flag SGLang names as its replacement where it is deprecated (both set the same thing)."""
    out: dict[str, str] = {}
    for flag, field in typed_flags(catalogue).items():
        info = catalogue.get(flag)
        out.setdefault(_dest(flag, info), field)
        for name in _replacement_flags(info.replacement if info else None):
            replacement = catalogue.get(name)
            if replacement is not None:
                out.setdefault(_dest(name, replacement), field)
    return out


def _dest(flag: str, info: FlagInfo | None) -> str:
    return info.dest if info is not None and info.dest else flag.lstrip("-").replace("-", "_")


def _replacement_flags(text: str | None) -> list[str]:
    """The flags a catalogue's `replacement` names: `--new-flag`, `--new-flag=value` or
    `--cuda-graph-backend-{decode,prefill}=disabled` (two flags)."""
    if not text:
        return []
    m = re.match(r"(--[A-Za-z0-9-]*)(?:\{([A-Za-z0-9_,-]+)\})?([A-Za-z0-9-]*)", text)
    if m is None:
        return []
    head, alternatives, tail = m.groups()
    return [head + alt + tail for alt in alternatives.split(",")] if alternatives else [head + tail]


def extra_args_problems(resolved: ResolvedProfile, catalogue: Catalogue) -> list[Problem]:
    """extra_args as SGLang's parser reads them (argv.py): each token is judged by the flag it sets, however
    it is spelt (an alias, `--flag=value`, an abbreviation). One problem per token at most."""
    version = catalogue.sglang_version
    extra = resolved.spec.server.extra_args
    options = [*(name for info in catalogue.flags for name in info.names), *HELP_OPTIONS]
    owned = typed_destinations(catalogue)
    out: list[Problem] = []
    # What came before extra_args in the argv is a typed flag with its value, or a switch: no value may follow.
    takes_value, before = False, "no flag of extra_args comes before it"
    tokens = read_argv(extra, options)
    for i, token in enumerate(tokens):
        path = f"server.extra_args.{token.index}"
        if token.kind == "end":
            out.append(resolved.problem(
                path,
                "`--` ends SGLang's options: every token after it is an argument SGLang does not take "
                "('unrecognized arguments' at start)",
                "remove it",
            ))
            break
        if token.kind == "value":
            if not takes_value:
                out.append(resolved.problem(
                    path,
                    f"{token.text!r} is a value where a flag belongs ({before}): SGLang stops at start "
                    "with 'unrecognized arguments'",
                    "remove it, or put it right after the flag it is for",
                ))
            continue
        if token.kind == "unknown":
            out.append(_unknown_flag(resolved, path, token.text.partition("=")[0], catalogue))
            takes_value, before = True, token.text
            continue
        token, ambiguous = _one_destination(token, catalogue)
        if ambiguous:
            out.append(resolved.problem(
                path,
                f"{token.text} abbreviates several flags ({', '.join(token.matches)}): SGLang stops at start "
                "with 'ambiguous option'",
                "write the one flag meant in full",
            ))
            takes_value, before = True, token.text
            continue
        assert token.option is not None
        info = catalogue.get(token.option)
        problem = _owned_or_forbidden(resolved, path, token, info, owned)
        if problem is not None:
            out.append(problem)
        elif token.abbreviated:
            out.append(resolved.problem(
                path,
                f"{token.text.partition('=')[0]} abbreviates {token.option}: SGLang reads it so today, but a "
                "release that adds a flag with the same beginning makes it ambiguous, or another flag",
                f"write {token.option} in full",
            ))
        elif info is not None and token.explicit is not None and not info.takes_value:
            out.append(resolved.problem(
                path,
                f"{token.option} is a switch and takes no value: SGLang stops at start with "
                "'ignored explicit argument'",
                f"write {token.option} alone (or leave it out to keep it off)",
            ))
        elif info is not None:
            value = token.explicit
            if value is None and i + 1 < len(tokens) and tokens[i + 1].kind == "value":
                value = tokens[i + 1].text
            out += _deprecated_or_bad_choice(resolved, path, token.option, info, value, version)
        takes_value = bool(info is None or (info.takes_value and token.explicit is None))
        before = f"{token.option} takes no value"
    return out


def _one_destination(token: ArgToken, catalogue: Catalogue) -> tuple[ArgToken, bool]:
    """An abbreviation of several names of one flag (--data-parallel-size and --dp-size) sets that flag; of
    several flags, it is ambiguous."""
    if token.kind != "ambiguous":
        return token, False
    dests = {_dest(m, catalogue.get(m)) for m in token.matches}
    if len(dests) == 1:
        return ArgToken(token.index, token.text, "option", option=token.matches[0],
                        explicit=token.text.partition("=")[2] if "=" in token.text else None), False
    return token, True


def _owned_or_forbidden(
    resolved: ResolvedProfile, path: str, token: ArgToken, info: FlagInfo | None, owned: dict[str, str]
) -> Problem | None:
    assert token.option is not None
    dest = _dest(token.option, info)
    spelt = token.text.partition("=")[0]
    reads = f" (SGLang reads {spelt} as {token.option})" if spelt != token.option else ""
    if token.option in HELP_OPTIONS:
        return resolved.problem(
            path, f"{spelt} prints SGLang's help and exits: the service would never serve", "remove it"
        )
    if owned.get(dest) == "server.api_key_secret" or _SECRET_DEST.search(dest):
        return resolved.problem(
            path,
            f"{spelt} carries a secret{reads}: in extra_args it would be written into the unit, the journal "
            "and git",
            "remove it and set server.api_key_secret to a reference (env:NAME, vault:NAME or file:PATH)"
            if dest == "api_key"
            else "remove it: the toolkit passes no other secret to SGLang yet",
        )
    if dest in owned:
        field = owned[dest]
        return resolved.problem(
            path,
            f"{spelt}{reads} would override {field} without its checks (it sets SGLang's {dest}, "
            "and SGLang keeps the last value given)",
            f"remove it from extra_args and set {field}",
        )
    if dest in _CONFIG_DESTS:
        return resolved.problem(
            path,
            f"{spelt}{reads} loads SGLang's flags from a file on the host, where none of them is checked "
            "(typed knobs and secrets included)",
            "set the knobs in the profile: `toolkit profile render --only config` shows the same file made "
            "from it",
        )
    return None
