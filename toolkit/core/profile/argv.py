"""How SGLang's own command-line parser reads an argv: which flag each token sets (pure).

SGLang builds its server parser with a plain `argparse.ArgumentParser()` (server_args.py,
prepare_server_args), so `allow_abbrev` is on: a long option may be written as any prefix that names one
option string only, `--flag=value` carries its value in the same token, and `-h`/`--help` are there too.
`read_option` repeats argparse's `_parse_optional` and `_get_option_tuples` (CPython 3.11 to 3.13 agree on
everything that matters here), so that extra_args are judged by the flag SGLang will actually set, not by
how the token is spelt. tests/profile/test_profile_argv.py checks it against argparse itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# argparse's own pattern (the same in 3.11, 3.12 and 3.13): a token like this is a value, not an option,
# as long as no option string of the parser looks like a negative number (none of SGLang's does).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")

# Every ArgumentParser() has these (add_help=True): --help prints the usage and exits 0.
HELP_OPTIONS = ("-h", "--help")


@dataclass(frozen=True)
class ArgToken:
    """One token of an argv as argparse reads it.

    kind: "option" (sets `option`), "value" (an argument of the option before it), "end" (`--`: every
    token after it is a value), "unknown" (read as an option the parser does not have) or "ambiguous"
    (a prefix of several option strings: `matches`)."""

    index: int
    text: str
    kind: str
    option: str | None = None  # the full option string argparse picks
    explicit: str | None = None  # the value glued on with `=` (or to a one-letter option)
    matches: tuple[str, ...] = ()

    @property
    def abbreviated(self) -> bool:
        return self.kind == "option" and self.option is not None and self.text.partition("=")[0] != self.option


def read_option(index: int, token: str, options: Sequence[str]) -> ArgToken:
    """What argparse makes of one token, given the parser's option strings (`_parse_optional`)."""
    value = ArgToken(index, token, "value")
    if not token or token[0] != "-":
        return value
    known = set(options)
    if token in known:
        return ArgToken(index, token, "option", option=token)
    if len(token) == 1:
        return value
    head, sep, tail = token.partition("=")
    if sep and head in known:
        return ArgToken(index, token, "option", option=head, explicit=tail)
    found = _option_tuples(token, options)
    if len(found) > 1:
        return ArgToken(index, token, "ambiguous", matches=tuple(name for name, _ in found))
    if len(found) == 1:
        ((name, explicit),) = found
        return ArgToken(index, token, "option", option=name, explicit=explicit)
    if _NEGATIVE_NUMBER.match(token) or " " in token:
        return value
    return ArgToken(index, token, "unknown")


def _option_tuples(token: str, options: Sequence[str]) -> list[tuple[str, str | None]]:
    """argparse's `_get_option_tuples` with allow_abbrev=True: (option string, explicit value) per match."""
    out: list[tuple[str, str | None]] = []
    if token[1] == "-":
        prefix, sep, explicit = token.partition("=")
        for name in options:
            if name.startswith(prefix):
                out.append((name, explicit if sep else None))
    else:
        short, glued = token[:2], token[2:]
        for name in options:
            if name == short:
                out.append((name, glued))
            elif name.startswith(token):
                out.append((name, None))
    return out


def read_argv(tokens: Sequence[str], options: Iterable[str]) -> list[ArgToken]:
    """Every token of `tokens` as argparse reads it (a `--` makes all that follow values)."""
    names = list(dict.fromkeys(options))
    out: list[ArgToken] = []
    ended = False
    for i, token in enumerate(tokens):
        if ended:
            out.append(ArgToken(i, token, "value"))
        elif token == "--":
            out.append(ArgToken(i, token, "end"))
            ended = True
        else:
            out.append(read_option(i, token, names))
    return out
