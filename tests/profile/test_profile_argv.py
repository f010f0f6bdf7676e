"""extra_args read as SGLang's argparse parser reads them (toolkit/core/profile/argv.py), checked against
argparse itself: a parser built from the pinned release's catalogue, with allow_abbrev on as SGLang has it."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.core.profile.argv import HELP_OPTIONS, read_argv, read_option

CATALOGUE = load_catalogue("0.5.9")
assert CATALOGUE is not None
OPTIONS = [*(n for f in CATALOGUE.flags for n in f.names), *HELP_OPTIONS]


def _parser() -> argparse.ArgumentParser:
    """SGLang's parser as far as option matching goes: ArgumentParser() (add_help, allow_abbrev), every flag."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for info in CATALOGUE.flags:
        if info.takes_value:
            parser.add_argument(*info.names, dest=info.dest)
        else:
            parser.add_argument(*info.names, dest=info.dest, action="store_true")
    return parser


PARSER = _parser()


def argparse_reads(token: str) -> tuple[str, str | None, str | None]:
    """(kind, option string, explicit value) as argparse's own _parse_optional says, in this toolkit's terms."""
    try:
        got = PARSER._parse_optional(token)
    except argparse.ArgumentError as err:  # 3.12.? and later raise where 3.11 calls error()
        assert "ambiguous option" in str(err)
        return "ambiguous", None, None
    except SystemExit:  # pragma: no cover - exit_on_error=False does not cover error() on 3.11
        return "ambiguous", None, None
    if got is None:
        return "value", None, None
    action, option = got[0], got[1]
    explicit = got[-1]
    if action is None:
        return "unknown", None, None
    return "option", option, explicit


@pytest.fixture(autouse=True)
def _no_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def error(message: str) -> None:
        raise argparse.ArgumentError(None, message)

    monkeypatch.setattr(PARSER, "error", error)


@pytest.mark.parametrize(
    ("token", "kind", "option"),
    [
        ("--tp-size", "option", "--tp-size"),
        ("--tensor-parallel-size", "option", "--tensor-parallel-size"),
        ("--tensor-par", "option", "--tensor-parallel-size"),
        ("--tensor-par=4", "option", "--tensor-parallel-size"),
        ("--ep", "option", "--ep"),
        ("--enable-dp", "ambiguous", None),
        ("--he", "option", "--help"),
        ("-h", "option", "-h"),
        ("-1", "value", None),
        ("-0.5", "value", None),
        ("-x", "unknown", None),
        ("--no-such-flag", "unknown", None),
        ("--tp-size 4", "value", None),  # a space: argparse takes it for a positional
        ("4", "value", None),
        ("", "value", None),
        ("-", "value", None),
    ],
)
def test_known_tokens(token: str, kind: str, option: str | None) -> None:
    got = read_option(0, token, OPTIONS)
    assert (got.kind, got.option) == (kind, option)
    assert argparse_reads(token)[:2] == (kind, option)


def test_double_dash_makes_the_rest_values() -> None:
    kinds = [t.kind for t in read_argv(["--log-level", "info", "--", "--tp-size", "4"], OPTIONS)]
    assert kinds == ["option", "value", "end", "value", "value"]


# Tokens near the flags: prefixes of real names, with '=' values, stray dashes, digits and odd characters.
_prefixes = st.sampled_from(OPTIONS).flatmap(lambda name: st.integers(1, len(name)).map(lambda n: name[:n]))
_tokens = st.one_of(
    _prefixes,
    st.tuples(_prefixes, st.text(max_size=5)).map(lambda t: f"{t[0]}={t[1]}"),
    st.tuples(st.sampled_from(["-", "--", "-h", "---"]), st.text(max_size=6)).map("".join),
    st.from_regex(r"-?[0-9]*\.?[0-9]+", fullmatch=True),
    st.text(max_size=8),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tokens)
def test_matches_argparse_on_any_token(token: str) -> None:
    got = read_option(0, token, OPTIONS)
    assert (got.kind, got.option, got.explicit if got.kind == "option" else None) == argparse_reads(token)
