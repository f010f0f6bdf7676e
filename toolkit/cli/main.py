"""`toolkit`: parse, dispatch to one command group, turn toolkit errors into text and exit codes.

Each group lives in its own module and is imported only when it is asked for, so that
`toolkit --help` and the profile commands never pay for ansible_runner, pynvml or matplotlib.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from toolkit import __version__
from toolkit.cli.envelope import emit_error, wants_json
from toolkit.core.errors import EXIT_BAD_INPUT, ToolkitError
from toolkit.core.text import redact_argv, secret_name

# group name -> (module, one-line help). The module exposes `configure(parser)`, which adds the
# group's subcommands; each subcommand sets `func(args) -> int` with `parser.set_defaults`.
GROUPS: dict[str, tuple[str, str]] = {
    "profile": ("toolkit.cli.profile_cmd", "read, validate, render and compare tuning profiles"),
    "probe": ("toolkit.cli.probe_cmd", "benchmark plus NVML power sampling, and a verdict on the bottleneck"),
    "results": ("toolkit.cli.results_cmd", "record measured results into a profile, compare them"),
    "report": ("toolkit.cli.report_cmd", "Markdown and HTML report with plots for a profile's results"),
    "lab": ("toolkit.cli.lab_cmd", "local test hosts that stand in for a Proxmox host and its GPU container"),
    "inventory": ("toolkit.cli.inventory_cmd", "write an inventory of your own Proxmox hosts and GPU containers"),
    "host": ("toolkit.cli.host_cmd", "provision a Proxmox GPU host and its container through Ansible"),
    "doctor": ("toolkit.cli.doctor_cmd", "read-only checks of a host and its container"),
    "apply": ("toolkit.cli.apply_cmd", "deploy a profile as a service, then measure and record it"),
    "sweep": ("toolkit.cli.sweep_cmd", "vary knobs, measure each variant, rank and promote the best"),
    "tune": ("toolkit.cli.tune_cmd", "measure, follow the verdict's knob steps, keep the best, repeat; promote it"),
    "upgrade": ("toolkit.cli.upgrade_cmd", "move a profile to a new SGLang release, kept only on a significant "
                "result, the old one restored otherwise"),
}


class Parser(argparse.ArgumentParser):
    """Every parser of the toolkit, its subcommands' included (argparse makes them of the parent's class): no
    abbreviated options (`--htm` is not `--html`), so a later option can never change what an old command line
    means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse's, except that an unknown option is reported by the subcommand it was given to, with its usage
        and the nearest of its own options (`--resolv`: did you mean --resolved?)."""
        tokens = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(tokens, namespace)
        if extras:
            target = self._deepest(tokens)
            options = sorted({o for a in target._actions for o in a.option_strings if o.startswith("--")})
            nearest = {x.split("=", 1)[0]: m[0] for x in extras if x.startswith("--")
                       for m in [difflib.get_close_matches(x.split("=", 1)[0], options, n=1, cutoff=0.6)] if m}
            hints = list(dict.fromkeys(nearest.values()))

            # The message goes to stderr and terminal logs: a secret typed after a mistyped flag (`--api-kye sk-..`)
            # is hidden when the flag's name, or the option it was nearest to, says secret.
            def secret(flag: str) -> bool:
                return secret_name(flag) or secret_name(nearest.get(flag, ""))

            target.error(f"unrecognized arguments: {' '.join(redact_argv(extras, secret=secret))}"
                         + (f" (did you mean {' '.join(hints)}?)" if hints else ""))
        return parsed

    def _deepest(self, tokens: list[str]) -> argparse.ArgumentParser:
        """The subcommand's parser the tokens reach (`profile show` for `profile show x --resolv`)."""
        parser: argparse.ArgumentParser = self
        for token in tokens:
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is None:
                break
            if token in sub.choices:
                parser = sub.choices[token]
        return parser

    # The last usage error, for the --json envelope (argparse prints it and exits; subparsers are other instances).
    last_error = ""

    def error(self, message: str) -> NoReturn:
        """argparse's, with the nearest choice for a mistyped command (`profile lst`: did you mean list?)."""
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = [c.strip().strip("'") for c in match.group(2).split(",")]  # quoted up to Python 3.11
            # A newcomer types the verb alone (`toolkit validate`, `toolkit provision`): the group that has it as its
            # own subcommand comes before a spelling near a group's name (`provision` is not `profile`).
            homes = ([f"toolkit {g} {match.group(1)}" for g in groups_with_subcommand(match.group(1))]
                     if self.prog == "toolkit" else [])
            near = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.5)
            if homes:
                message += f" (did you mean {' or '.join(homes)}?)"
            elif near:
                message += f" (did you mean {near[0]}?)"
        Parser.last_error = message
        super().error(message)


def groups_with_subcommand(name: str) -> list[str]:
    """The command groups that have `name` as a subcommand (`validate`: profile). Loads every group's module: only
    on the way to a usage error."""
    out = []
    for group, (module_name, _help) in GROUPS.items():
        probe = Parser(prog=f"toolkit {group}")
        try:
            importlib.import_module(module_name).configure(probe)
        except ToolkitError:  # a group that refuses this environment as it loads (the lab's instance name)
            continue
        sub = next((a for a in probe._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is not None and name in sub.choices:
            out.append(group)
    return out


def build_parser(group: str | None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="toolkit",
        description="Declarative, measured SGLang tuning profiles for your own GPU servers.",
        # The three ways in (docs/start.md), for someone whose first command is the bare `toolkit`.
        epilog="Start: docs/start.md. Try it: scripts/demo (the lab). Measure a server you run: toolkit profile "
               "import --server-url URL, then toolkit probe run --profile NAME. Your Proxmox host: toolkit "
               "inventory add NAME --address ADDR, then toolkit host plan NAME --profile PROFILE.",
    )
    parser.add_argument("--version", action="version", version=f"toolkit {__version__}")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND")
    for name, (module_name, help_text) in GROUPS.items():
        group_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == group:
            importlib.import_module(module_name).configure(group_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    group = next((a for a in args_list if not a.startswith("-")), None)
    as_json = wants_json(args_list)
    try:
        # A command's module may refuse its environment as it loads (the lab's TOOLKIT_LAB_INSTANCE).
        parser = build_parser(group if group in GROUPS else None)
    except ToolkitError as err:
        if as_json:
            emit_error(err)
        print(str(err), file=sys.stderr)
        return err.exit_code
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exit_:
        if as_json and exit_.code == EXIT_BAD_INPUT:
            emit_error(code="usage", message=Parser.last_error)
        raise
    func = getattr(args, "func", None)
    if func is None:
        # A group with no subcommand, or nothing at all: show what can be done.
        if args.group:
            parser.parse_args([args.group, "--help"])
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(func(args) or 0)
    except ToolkitError as err:
        # With --json a script reads the refusal on stdout, in the envelope; people still read it on stderr.
        if as_json:
            emit_error(err)
        print(str(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        if as_json:
            emit_error(code="interrupted", message="interrupted", exit_code=130)
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `toolkit ... | head` closed the pipe: stop quietly, and keep Python from reporting the
        # same error again when it flushes stdout at exit.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
