"""The command surface: every command group is documented, help is fast to reach, errors exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli.main import GROUPS, main

REPO = Path(__file__).resolve().parents[1]


def test_every_command_group_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    documented = set(re.findall(r"`toolkit (\w+)", readme))
    missing = sorted(set(GROUPS) - documented)
    assert not missing, f"command groups missing from README.md: {missing}"


def test_help_lists_groups_without_heavy_imports() -> None:
    # Run in a fresh interpreter so earlier tests' imports do not hide a heavy import.
    code = (
        "import sys, contextlib, io\n"
        "from toolkit.cli.main import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "heavy = [m for m in ('ansible_runner', 'pynvml', 'matplotlib', 'pydantic') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "print(buf.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
    for name in GROUPS:
        assert name in out


def test_group_without_subcommand_exits_2(capsys: object) -> None:
    try:
        code = main([])
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    assert code == 2


def _parsers() -> list[tuple[str, object]]:
    """Every parser of every command group, with its command line: (`toolkit profile validate`, parser)."""
    import argparse

    from toolkit.cli.main import build_parser

    out: list[tuple[str, object]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(f"{name} {sub}", p)

    for group in GROUPS:
        root = build_parser(group)
        sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
        walk(f"toolkit {group}", sub.choices[group])
    return out


def test_every_command_and_option_has_help() -> None:
    import argparse

    missing = []
    for name, parser in _parsers():
        assert isinstance(parser, argparse.ArgumentParser)
        if not parser.description:
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{name} {c.dest}: no help" for c in action._choices_actions if not c.help]
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)


def test_no_option_can_be_abbreviated() -> None:
    import argparse

    for name, parser in _parsers():
        assert isinstance(parser, argparse.ArgumentParser)
        assert parser.allow_abbrev is False, f"{name} accepts abbreviated options"
    try:
        code = main(["report", "glm5-tp8", "--htm", "x.html"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2


OUTSIDE_WORDS = re.compile(r"DOMAIN\.md|issue #\d|shared/|\bseed\b(?!\s*\(|-)|SPEC-timelines", re.IGNORECASE)


def test_help_uses_no_words_from_outside_the_repository() -> None:
    """Help names only what is in the repository: no "seed", issue numbers or research-note paths (the GLM-5 story
    is docs/story.md)."""
    import argparse

    found = []
    for name, parser in _parsers():
        assert isinstance(parser, argparse.ArgumentParser)
        text = parser.format_help()
        # bench_serving's own `--seed` flag is a word of SGLang's, not of a note outside the repository.
        text = text.replace("--seed", "")
        for m in OUTSIDE_WORDS.finditer(text):
            found.append(f"{name}: ...{text[max(0, m.start() - 40):m.end() + 20]!r}")
    assert not found, "\n".join(found)


def test_typos_get_the_subcommands_own_usage_and_did_you_mean(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "show", "glm5-tp8", "--resolv"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: toolkit profile show ") and "did you mean --resolved?" in err
    with pytest.raises(SystemExit):
        main(["profile", "lst"])
    err = capsys.readouterr().err
    assert err.startswith("usage: toolkit profile ") and err.rstrip().endswith("(did you mean list?)")
    with pytest.raises(SystemExit):
        main(["profile", "show", "glm5-tp8", "--zzz"])
    assert "did you mean" not in capsys.readouterr().err  # nothing near: no guess


@pytest.mark.parametrize(("verb", "home"), [("validate", "toolkit profile validate"),
                                             ("provision", "toolkit host provision"),  # not `profile`, near in spelling
                                             ("run", "toolkit probe run")])
def test_a_verb_typed_alone_is_pointed_to_its_group(capsys, verb: str, home: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([verb])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.rstrip().endswith(f"(did you mean {home}?)")


def test_a_group_misspelt_still_gets_the_nearest_group(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["profle", "list"])
    assert capsys.readouterr().err.rstrip().endswith("(did you mean profile?)")


def test_a_usage_error_does_not_echo_a_secret_typed_as_an_unknown_option(capsys) -> None:
    # `toolkit probe run --api-key sk-...` (meant for bench_serving, after `--`) lands in the terminal's log.
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "show", "glm5-tp8", "--api-key", "sk-live-123", "--hf-token=hf_abcdef",
              "--resolv", "https://u:pw@example.com/x"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "sk-live-123" not in err and "hf_abcdef" not in err and "u:pw" not in err
    assert "unrecognized arguments: --api-key *** --hf-token=*** --resolv https://***@example.com/x" in err
    assert "did you mean --resolved?" in err
