"""`toolkit profile ...`: list, show, validate, render, diff, textconv, migrate, lock, catalogue.

Thin: parse, call the profile library, print. Nothing here imports ansible_runner, pynvml or
matplotlib, and `validate` stays off rich and jinja2, so it starts fast (benchmarks/bench_cli_start.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toolkit.core.errors import EXIT_BAD_INPUT, EXIT_OK, ToolkitError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--profiles-dir",
            metavar="DIR",
            help="where profiles live (default: $TOOLKIT_PROFILES_DIR, else profiles/ of the git repository here)",
        )
        return p

    p = add("list", "list the profiles with what they extend and their pinned SGLang")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)

    p = add("show", "print a profile (its file, or with --resolved the merged spec and where each value is set)")
    p.add_argument("name", help="the profile")
    p.add_argument("--resolved", action="store_true", help="merge the extends: chain, defaults filled in")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_show)

    p = add("validate", "check profiles (types, parallelism, hardware rules, flags of the pinned SGLang)")
    p.add_argument("name", help="a profile name, or `all`")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")
    p.set_defaults(func=cmd_validate)

    p = add("render", "print the launch argv, environment, systemd unit, SGLang --config YAML and bench argv")
    p.add_argument("name", help="the profile")
    p.add_argument(
        "--only",
        choices=["argv", "env", "unit", "config", "bench"],
        help="print one of them only (raw, for scripts)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_render)

    p = add("diff", "semantic diff: knobs changed, added, removed through extends:, each with its why")
    p.add_argument("a", help="the profile to compare from")
    p.add_argument("b", help="the profile to compare to")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when a knob differs, 0 when none does (as `git diff --exit-code`)")
    p.set_defaults(func=cmd_diff)

    p = add("textconv", "a profile file as sorted knob lines with their why (git diff textconv)")
    p.add_argument("file", help="a profile file (git passes a temporary copy; `-`: standard input)")
    p.set_defaults(func=cmd_textconv)

    p = add(
        "migrate",
        "move a profile to another SGLang release: what changes and why, then (--write) the rewritten file",
    )
    p.add_argument("name", help="the profile to move")
    p.add_argument("--sglang-version", metavar="X.Y.Z", required=True, help="the release to move to")
    p.add_argument("--write", action="store_true", help="write the profile and the release's lock file")
    p.add_argument("--as", dest="new_name", metavar="NEW", help="write the migrated profile as NEW beside the old one")
    p.add_argument("--index-url", metavar="URL", default=None,
                   help="the index a release without committed locks is locked from (default: https://pypi.org/simple)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_migrate)

    p = add("lock", "lock a release's whole engine for the container Pythons (pip's resolver, exact versions and "
            "sha256): profiles/requirements/sglang-X-cpNN.lock, or the refusal naming what the index lacks")
    p.add_argument("name", nargs="?", help="the profile whose pinned release to lock")
    p.add_argument("--sglang-version", metavar="X.Y.Z", help="the release to lock (instead of a profile's)")
    p.add_argument("--python", metavar="3.11,3.13", default=None,
                   help="the container CPythons, comma-separated (default: 3.11,3.13, Proxmox's Debian 12 and 13)")
    p.add_argument("--index-url", metavar="URL", default=None,
                   help="the package index to resolve from (default: https://pypi.org/simple; this machine's pip "
                   "configuration is never used)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: re-resolve and compare with the committed lock (exit 1 on a difference)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_lock)

    p = sub.add_parser(
        "install-textconv",
        help="make `git diff` of profiles show knobs with their why, in any shell (writes the git config line)",
        description="Write `diff.toolkit-profile.textconv` into this clone's git config (or --global) as an "
        "absolute command (this toolkit's interpreter, `-m toolkit profile textconv`): `git diff` of a profile "
        "then works in a shell without the toolkit's venv. .gitattributes already routes profiles/*.yaml to it.",
    )
    p.add_argument("--global", dest="global_", action="store_true",
                   help="write it into your user's git config, for every repository")
    p.set_defaults(func=cmd_install_textconv)

    p = sub.add_parser(
        "catalogue",
        help="regenerate SGLang's flag catalogue for a version from that release itself",
        description="Download sglang==VERSION from PyPI (no deps, cached), read the files that declare its server "
        "arguments (server_args.py and the arg_groups package) and store every flag in "
        "toolkit/data/sglang_flags/VERSION.json. An extraction that lacks the core flags or finds implausibly few "
        "is refused (exit 2) and nothing is written.",
    )
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--sglang-version", metavar="X.Y.Z", help="the SGLang release to read (from PyPI)")
    group.add_argument("--from-installed", action="store_true", help="walk ServerArgs.add_cli_args of the SGLang here")
    p.add_argument("--wheel", metavar="PATH", help="use this downloaded wheel instead of pip download")
    p.add_argument("--out-dir", metavar="DIR", help="where to write VERSION.json (default: the toolkit's data)")
    p.set_defaults(func=cmd_catalogue)


def _store(args: argparse.Namespace) -> Any:
    from toolkit.app.profiles import open_store

    return open_store(args.profiles_dir)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = []
    for name in store.names():
        try:
            data = store.source(name).data
            rows.append(
                {
                    "name": name,
                    "extends": data.get("extends"),
                    "sglang_version": (data.get("engine") or {}).get("sglang_version"),
                    "description": " ".join(str(data.get("description") or "").split()),
                }
            )
        except ToolkitError as err:
            rows.append({"name": name, "error": err.problems[0].message if err.problems else str(err)})
    if args.json:
        _print_json(rows)
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table("profile", "extends", "sglang", "description", title=f"profiles in {store.dir}")
    for row in rows:
        if "error" in row:
            table.add_row(row["name"], "", "", f"[red]unreadable: {row['error']}[/red]")
        else:
            table.add_row(row["name"], row["extends"] or "", row["sglang_version"] or "(inherited)", row["description"])
    Console().print(table)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    if not args.resolved and not args.json:
        # The file as written, even when it does not load: an invalid profile must be readable to be fixed. It is
        # marked invalid on stderr (stdout stays the file's bytes) and the exit code says so.
        text = store.text(args.name)
        try:
            store.load(args.name)
        except ToolkitError as err:
            sys.stdout.write(text)
            print(f"INVALID: {store.path(args.name)} does not load; shown as written. What is wrong:",
                  file=sys.stderr)
            print(str(err), file=sys.stderr)
            return EXIT_BAD_INPUT
        sys.stdout.write(text)
        return EXIT_OK
    if not args.resolved:
        profile, _ = store.load(args.name)
        _print_json(profile.model_dump(mode="json", exclude_unset=True))
        return EXIT_OK
    resolved = store.resolve(args.name)
    data = resolved.spec.model_dump(mode="json")
    if args.json:
        _print_json(
            {
                "name": resolved.name,
                "file": resolved.file,
                "chain": resolved.chain,
                "spec": data,
                "origins": {k: f"{o.file}:{o.line}" for k, o in sorted(resolved.origins.items())},
            }
        )
        return EXIT_OK
    from toolkit.core.profile.diff import flatten
    from toolkit.core.profile.hashing import spec_hash

    print(f"# {resolved.name}: {' -> '.join(resolved.chain)} (spec {spec_hash(resolved)[:12]})")
    for path, value in flatten({k: v for k, v in data.items() if k not in ("why", "results")}).items():
        origin = resolved.origins.get(path)
        where = f"    # {origin.profile}:{origin.line}" if origin else "    # default"
        print(f"{path} = {json.dumps(value)}{where}")
    return EXIT_OK


SEVERITY_ORDER = ("error", "warning", "acknowledged", "info")


def cmd_validate(args: argparse.Namespace) -> int:
    store = _store(args)
    names = store.names() if args.name == "all" else [args.name]
    if not names:
        raise ToolkitError.of(f"no profiles in {store.dir}", fix="add a profile file (profiles/NAME.yaml)")
    from toolkit.app.profiles import check_profiles

    results = check_profiles(store, names)
    failing = {"error", "warning"} if args.strict else {"error"}
    bad = sorted(name for name, problems in results.items() if any(p.severity in failing for p in problems))
    if args.json:
        _print_json({name: [p.__dict__ for p in problems] for name, problems in results.items()})
        return EXIT_BAD_INPUT if bad else EXIT_OK
    # One line per profile on stdout; every problem once, on stderr, under the first profile that has it (a
    # parent's warning is not repeated for each child: the child's line says where it was shown).
    shown: dict[tuple[object, ...], str] = {}
    for name in _parents_first(store, names):
        problems = results[name]
        keys = [(p.file, p.line, p.field, p.message, p.rule_id, p.severity) for p in problems]
        counts = {s: sum(p.severity == s for p in problems) for s in SEVERITY_ORDER}
        summary = ", ".join(f"{n} {s}{'s' if n != 1 and s != 'acknowledged' else ''}" for s, n in counts.items()
                            if n)
        elsewhere = sorted({shown[k] for k in keys if k in shown})
        if elsewhere:
            summary += f"; {sum(k in shown for k in keys)} shown under {', '.join(elsewhere)}"
        print(f"{'FAIL' if name in bad else 'ok':4} {name}" + (f" ({summary})" if summary else ""), flush=True)
        own = sorted((p for p, k in zip(problems, keys, strict=True) if k not in shown),
                     key=lambda p: SEVERITY_ORDER.index(p.severity) if p.severity in SEVERITY_ORDER else 9)
        for p in own:
            print(p.render(), file=sys.stderr, flush=True)
        shown.update({k: name for k in keys if k not in shown})
    return EXIT_BAD_INPUT if bad else EXIT_OK


def _parents_first(store: Any, names: list[str]) -> list[str]:
    """Profiles ordered so that a parent comes before the profiles that extend it."""
    def depth(name: str) -> int:
        try:
            return len(store.resolve(name).chain)
        except ToolkitError:
            return 0

    return sorted(names, key=lambda n: (depth(n), n))


def _render_all(resolved: Any) -> dict[str, Any]:
    from toolkit.core.profile import render

    server = resolved.spec.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::") else server.host
    return {
        "argv": render.render_launch_argv(resolved),
        "env": render.render_env(resolved),
        "unit": render.render_systemd_unit(resolved),
        "config": render.render_sglang_config_yaml(resolved),
        "bench": render.render_bench_argv(
            resolved, base_url=f"http://{host}:{server.port}", output_file=f"{resolved.name}.bench.jsonl"
        ),
    }


def cmd_render(args: argparse.Namespace) -> int:
    import shlex

    store = _store(args)
    resolved = store.resolve(args.name)
    _refuse_errors(store, args.name)
    out = _render_all(resolved)
    if args.json:
        _print_json(out if args.only is None else out[args.only])
        return EXIT_OK
    if args.only in ("argv", "bench"):
        print(shlex.join(out[args.only]))
        return EXIT_OK
    if args.only == "env":
        for key, value in out["env"].items():
            print(f"{key}={shlex.quote(value)}")
        return EXIT_OK
    if args.only in ("unit", "config"):
        sys.stdout.write(out[args.only])
        return EXIT_OK
    print(f"# launch argv ({resolved.name}: {' -> '.join(resolved.chain)})")
    print(" \\\n    ".join(_flag_lines(out["argv"])))
    print("\n# environment")
    for key, value in out["env"].items():
        print(f"{key}={shlex.quote(value)}")
    if not out["env"]:
        print("(none)")
    print("\n# systemd unit")
    sys.stdout.write(out["unit"])
    print("\n# SGLang --config YAML")
    sys.stdout.write(out["config"])
    print("\n# benchmark (bench_serving)")
    print(shlex.join(out["bench"]))
    return EXIT_OK


def _flag_lines(argv: list[str]) -> list[str]:
    """argv for reading: the interpreter and module on the first line, then one flag (and its value) a line."""
    import shlex

    lines = [shlex.join(argv[:3])]
    i = 3
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(shlex.join(argv[i : i + 2]))
            i += 2
        else:
            lines.append(shlex.quote(argv[i]))
            i += 1
    return lines


def _refuse_errors(store: Any, name: str) -> None:
    from toolkit.app.profiles import check_profiles

    problems = check_profiles(store, [name])[name]
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ToolkitError(errors)


def cmd_diff(args: argparse.Namespace) -> int:
    from toolkit.core.results.profile_diff import profile_diff

    store = _store(args)
    result = profile_diff(store.resolve(args.a), store.resolve(args.b))
    if args.json:
        _print_json(result.to_json())
    else:
        sys.stdout.write(result.render())
    return 1 if args.exit_code and result.changes else EXIT_OK


def cmd_textconv(args: argparse.Namespace) -> int:
    """git runs this on old and new versions of a profile; it never fails (see toolkit.app.profiles.textconv)."""
    from toolkit.app.profiles import textconv

    stdin = sys.stdin.read() if args.file == "-" else None
    sys.stdout.write(textconv(args.file, getattr(args, "profiles_dir", None), text=stdin))
    return EXIT_OK


def cmd_install_textconv(args: argparse.Namespace) -> int:
    from toolkit.app.profiles import install_textconv

    key, command = install_textconv(global_=args.global_)
    print(f"git config{' --global' if args.global_ else ''} {key} {command!r}")
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    from toolkit.app.profile_migrate import migrate_profile

    def on_lock(label: str) -> None:
        print(f"locking the engine: {label} (pip's resolver, about a minute)", file=sys.stderr, flush=True)

    result = migrate_profile(_store(args), args.name, args.sglang_version, new_name=args.new_name, write=args.write,
                             on_lock=on_lock, **({"index_url": args.index_url} if args.index_url else {}))
    mig = result.migration
    if args.json:
        _print_json(
            {
                "profile": mig.name,
                "from": mig.from_version,
                "to": mig.to_version,
                "changes": [c.__dict__ for c in mig.changes],
                "refusals": [p.__dict__ for p in mig.refusals],
                "problems": {n: [p.__dict__ for p in ps] for n, ps in result.problems.items()},
                "written": result.written,
                "lock_files": result.lock_files,
                "locks_missing": result.locks_missing,
                "locks_written": result.locks_written,
                "lock_refusals": [r.__dict__ for r in result.lock_refusals],
            }
        )
        return EXIT_OK if result.ok else EXIT_BAD_INPUT
    print(f"# {args.name}: SGLang {mig.from_version} -> {mig.to_version}")
    for change in mig.changes:
        print(change.render())
    if mig.refusals:
        print(f"\nrefused: {len(mig.refusals)} thing(s) have no counterpart in SGLang {mig.to_version}")
        raise ToolkitError(mig.refusals)
    for i, (name, problems) in enumerate(result.problems.items()):
        errors = [p for p in problems if p.severity == "error"]
        others = len(problems) - len(errors)
        print(f"{'FAIL' if errors else 'ok':4} {name} on SGLang {mig.to_version}"
              + (f" ({others} warning(s){'' if i == 0 else ': toolkit profile validate ' + name})" if others else ""))
        for p in problems if i == 0 else []:  # the migrated profile's in full; those extending it share most
            if p.severity != "error":
                print("  " + p.render().replace("\n", "\n  "))
    for path in result.locks_written:
        print(f"wrote {path}")
    if not result.unlockable:
        for refusal in result.lock_refusals:
            print(f"note: {refusal.reason()} ({refusal.path}): containers with CPython {refusal.python} are refused")
    else:
        raise ToolkitError.of(
            "; ".join(r.reason() for r in result.lock_refusals) + f": {mig.name}.yaml is not moved",
            field="--sglang-version",
            fix="pin a release that locks, or lock this one from an index that has the missing requirement "
            f"(`{result.lock_refusals[0].command} --index-url URL`)")
    if not result.ok:
        raise ToolkitError([p for ps in result.problems.values() for p in ps if p.severity == "error"])
    kept = [f for f in result.lock_files if f not in result.locks_written and f not in result.locks_missing]
    if not args.write:
        sys.stdout.write("\n" + result.diff)
        print(f"\n(dry run: --write writes {mig.name}.yaml"
              + (f"; the engine locks {', '.join(kept)} are there" if kept else "")
              + (f"; it resolves and writes the missing engine locks first ({', '.join(result.locks_missing)})"
                 if result.locks_missing else "") + ")")
        return EXIT_OK
    print(f"wrote {mig.name}.yaml" + (f" ({', '.join(kept)} already there, kept)" if kept else ""))
    return EXIT_OK


def cmd_lock(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from toolkit.app.engine_lock import lock_for

    console = Console(stderr=True)
    status = console.status("resolving")
    found = [0]
    current = [""]

    def on_start(label: str) -> None:
        found[0] = 0
        current[0] = label
        status.update(f"{escape(label)}: pip's resolver starting")

    def on_line(line: str) -> None:
        if line.startswith("Collecting "):
            found[0] += 1
            status.update(f"{escape(current[0])}: {found[0]} packages so far, [cyan]{escape(line.split()[1])}[/]")

    with status:
        outcomes = lock_for(args.name, sglang_version=args.sglang_version, pythons=args.python,
                            index_url=args.index_url, check=args.check, profiles_dir=args.profiles_dir,
                            on_start=on_start, on_line=on_line)
    if args.json:
        _print_json([{"sglang_version": o.sglang_version, "python": o.python, "status": o.status, "path": o.path,
                      "packages": len(o.lock.entries) if o.lock else None, "duration_s": round(o.duration_s, 1),
                      "refusal": o.refusal.__dict__ if o.refusal else None, "difference": list(o.difference)}
                     for o in outcomes])
    else:
        for o in outcomes:
            size = f"{len(o.lock.entries)} packages" if o.lock else ""
            print(f"{o.status:9} {o.path}" + (f" ({size}, {o.duration_s:.0f} s)" if size else
                                              f" ({o.duration_s:.0f} s)"))
            if o.refusal is not None:
                print(f"  {o.refusal.reason()}")
            for line in o.difference:
                print(f"  {line}")
    from toolkit.app.engine_lock import DIFFERS, REFUSED

    if any(o.status == REFUSED for o in outcomes) and not args.check:
        refused = [o.refusal for o in outcomes if o.refusal is not None]
        raise ToolkitError.of(
            "; ".join(r.reason() for r in refused), field="--sglang-version",
            fix="pin a release that resolves, or name an index that has the missing requirement with --index-url "
            f"(the refusal is recorded in {', '.join(r.path for r in refused)})")
    return 1 if any(o.status == DIFFERS for o in outcomes) else EXIT_OK


def cmd_catalogue(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from toolkit.adapters import sglang_catalogue

    console = Console(stderr=True)
    if args.from_installed:
        catalogue = sglang_catalogue.from_installed()
        out_dir = Path(args.out_dir) if args.out_dir else sglang_catalogue.DATA_DIR
        path, catalogue = sglang_catalogue.store(catalogue, out_dir)
    else:
        with console.status(f"reading SGLang {args.sglang_version}'s argument declarations (pip download --no-deps)"):
            path, catalogue = sglang_catalogue.regenerate(
                args.sglang_version,
                wheel=Path(args.wheel) if args.wheel else None,
                out_dir=Path(args.out_dir) if args.out_dir else sglang_catalogue.DATA_DIR,
            )
    deprecated = sum(f.deprecated for f in catalogue.flags)
    print(f"{path}: {len(catalogue.flags)} flags of SGLang {catalogue.sglang_version} ({deprecated} deprecated)")
    return EXIT_OK
