"""`toolkit`: parse, dispatch to one command group, turn toolkit errors into text and exit codes.

Each group lives in its own module and is imported only when it is asked for, so that
`toolkit --help` and the profile commands never pay for ansible_runner, pynvml or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from toolkit import __version__
from toolkit.core.errors import EXIT_BAD_INPUT, ToolkitError

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
}


class Parser(argparse.ArgumentParser):
    """Every parser of the toolkit, its subcommands' included (argparse makes them of the parent's class): no
    abbreviated options (`--htm` is not `--html`), so a later option can never change what an old command line
    means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser(group: str | None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="toolkit",
        description="Declarative, measured SGLang tuning profiles for your own GPU servers.",
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
    parser = build_parser(group if group in GROUPS else None)
    args = parser.parse_args(args_list)
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
        print(str(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
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
