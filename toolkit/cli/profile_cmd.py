"""`toolkit profile ...`: list, show, validate, render, diff, textconv, migrate, lock, catalogue.

Thin: parse, call the profile library, print. Nothing here imports ansible_runner, pynvml or
matplotlib, and `validate` stays off rich and jinja2, so it starts fast (benchmarks/bench_cli_start.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toolkit.cli.envelope import emit
from toolkit.cli.options import profiles_dir_option
from toolkit.core.errors import EXIT_BAD_INPUT, EXIT_OK, ToolkitError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        profiles_dir_option(p)
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
    p.add_argument("--verbose", action="store_true",
                   help="print the acknowledged and info lines too (by default only counted on the status line)")
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
    p.add_argument("a", nargs="?", help="the profile to compare from: NAME, or REV:NAME as it was at git revision REV")
    p.add_argument("b", nargs="?", help="the profile to compare to: NAME, or REV:NAME")
    p.add_argument("--since", metavar="REV",
                   help="instead of A B: every profile whose resolved spec or launch render changed since REV, "
                   "a child changed through its parent included")
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
                   help="write nothing: resolve under the committed lock's pins and compare (exit 1 when pip adds, "
                   "drops or cannot reconcile anything, or a file is gone); a re-lock shows what newer releases "
                   "change")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_lock)
    p = add("import", "write a new profile from a running SGLang server (its /server_info, and its command line)")
    p.add_argument("--name", required=True,
                   help="the new profile's name (profiles/NAME.yaml; an existing file is never replaced)")
    p.add_argument("--server-url", metavar="URL", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--sglang-version", metavar="X.Y.Z",
                   help="the release, where the server does not report its own (default: its /server_info)")
    p.add_argument("--gpu-count", type=int, metavar="N", help="GPUs per node (target.gpu_count)")
    p.add_argument("--compute-capability", metavar="SMxx", help="the GPUs' compute capability, e.g. SM90 for H100")
    p.add_argument("--gpu-model", metavar="NAME", help="the GPU, as nvidia-smi names it (target.gpu_model)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- COMMAND...: the server's launch command; its flags no typed knob holds go to "
                   "server.extra_args")
    p.set_defaults(func=cmd_import)

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
        from toolkit.core.text import redact_data

        emit("profile.list", redact_data(rows))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    from toolkit.cli.render import shown

    table = Table("profile", "extends", "sglang", "description", title=shown(f"profiles in {store.dir}"))
    for row in rows:
        if "error" in row:
            table.add_row(shown(row["name"]), "", "", f"[red]unreadable: {shown(row['error'])}[/red]")
        else:
            table.add_row(shown(row["name"]), shown(str(row["extends"] or "")),
                          shown(str(row["sglang_version"] or "(inherited)")), shown(row["description"]))
    Console().print(table)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from toolkit.core.text import redact_data, safe

    store = _store(args)
    if not args.resolved and not args.json:
        # The file as written, even when it does not load: an invalid profile must be readable to be fixed. It is
        # marked invalid on stderr (stdout stays the file's bytes) and the exit code says so.
        # As written, less what must not be shown: secrets masked, terminal controls escaped.
        text = safe(store.text(args.name), keep_newlines=True)
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
        emit("profile.show", redact_data(profile.model_dump(mode="json", exclude_unset=True)))
        return EXIT_OK
    resolved = store.resolve(args.name)
    data = redact_data(resolved.spec.model_dump(mode="json"))
    assert isinstance(data, dict)
    if args.json:
        emit(
            "profile.resolved",
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
        print(safe(f"{path} = {json.dumps(value)}{where}"))
    return EXIT_OK


SEVERITY_ORDER = ("error", "warning", "acknowledged", "info")
QUIET_SEVERITIES = ("acknowledged", "info")


def cmd_validate(args: argparse.Namespace) -> int:
    from toolkit.core.text import printable

    store = _store(args)
    names = store.names() if args.name == "all" else [args.name]
    if not names:
        raise ToolkitError.of(f"no profiles in {store.dir}", fix="add a profile file (profiles/NAME.yaml)")
    from toolkit.app.profiles import check_profiles

    results = check_profiles(store, names)
    failing = {"error", "warning"} if args.strict else {"error"}
    bad = sorted(name for name, problems in results.items() if any(p.severity in failing for p in problems))
    if args.json:
        emit("profile.validate", {name: [p.__dict__ for p in problems] for name, problems in results.items()})
        return EXIT_BAD_INPUT if bad else EXIT_OK
    # One line per profile on stdout; every problem once, on stderr, under the first profile that has it (a
    # parent's warning is not repeated for each child: the child's line says where it was shown).
    shown: dict[tuple[object, ...], str] = {}
    hidden = 0
    for name in _parents_first(store, names):
        problems = results[name]
        keys = [(p.file, p.line, p.field, p.message, p.rule_id, p.severity) for p in problems]
        counts = {s: sum(p.severity == s for p in problems) for s in SEVERITY_ORDER}
        summary = ", ".join(f"{n} {s}{'s' if n != 1 and s != 'acknowledged' else ''}" for s, n in counts.items()
                            if n)
        loud = [k for k, p in zip(keys, problems, strict=True) if args.verbose or p.severity not in QUIET_SEVERITIES]
        elsewhere = sorted({shown[k] for k in loud if k in shown})
        if elsewhere:
            summary += f"; {sum(k in shown for k in loud)} shown under {', '.join(elsewhere)}"
        print(f"{'FAIL' if name in bad else 'ok':4} {printable(name)}" + (f" ({summary})" if summary else ""),
              flush=True)
        own = sorted((p for p, k in zip(problems, keys, strict=True) if k not in shown),
                     key=lambda p: SEVERITY_ORDER.index(p.severity) if p.severity in SEVERITY_ORDER else 9)
        for p in own:
            # Acknowledged and info lines are the profile's own record, not news: as ansible-lint keeps skipped
            # rules quiet, they are a count on the status line unless asked for.
            if p.severity in QUIET_SEVERITIES and not args.verbose:
                hidden += 1
                continue
            print(p.render(), file=sys.stderr, flush=True)
        shown.update({k: name for k in keys if k not in shown})
    if hidden:
        print(f"({hidden} acknowledged/info line(s) not shown: --verbose prints them)", file=sys.stderr)
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
    return {
        "argv": render.render_launch_argv(resolved),
        "env": render.render_env(resolved),
        "unit": render.render_systemd_unit(resolved),
        "config": render.render_sglang_config_yaml(resolved),
        "bench": render.render_bench_argv(
            resolved, base_url=render.client_url(server.host, server.port),
            output_file=f"{resolved.name}.bench.jsonl",
        ),
    }


def cmd_render(args: argparse.Namespace) -> int:
    import shlex

    from toolkit.core.text import redact_data, safe

    store = _store(args)
    resolved = store.resolve(args.name)
    _refuse_errors(store, args.name)
    out = _render_all(resolved)
    if args.json:
        emit("profile.render", redact_data(out if args.only is None else out[args.only]))
        return EXIT_OK

    def show(text: str) -> None:  # what is shown, not what runs: no secret, no terminal control
        sys.stdout.write(safe(text, keep_newlines=True))

    if args.only in ("argv", "bench"):
        show(shlex.join(out[args.only]) + "\n")
        return EXIT_OK
    if args.only == "env":
        for key, value in out["env"].items():
            show(f"{key}={shlex.quote(value)}\n")
        return EXIT_OK
    if args.only in ("unit", "config"):
        show(out[args.only])
        return EXIT_OK
    show(f"# launch argv ({resolved.name}: {' -> '.join(resolved.chain)})\n")
    show(" \\\n    ".join(_flag_lines(out["argv"])) + "\n")
    show("\n# environment\n")
    for key, value in out["env"].items():
        show(f"{key}={shlex.quote(value)}\n")
    if not out["env"]:
        show("(none)\n")
    show("\n# systemd unit\n")
    show(out["unit"])
    show("\n# SGLang --config YAML\n")
    show(out["config"])
    show("\n# benchmark (bench_serving)\n")
    show(shlex.join(out["bench"]) + "\n")
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


def cmd_import(args: argparse.Namespace) -> int:
    from toolkit.app.profile_import import import_profile

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    outcome = import_profile(args.server_url, args.name, profiles_dir=args.profiles_dir, command=command,
                             sglang_version=args.sglang_version,
                             target={"gpu_model": args.gpu_model, "gpu_count": args.gpu_count,
                                     "compute_capability": args.compute_capability})
    print(f"wrote {outcome.file}: {len(outcome.knobs)} knob(s) that differ from SGLang's defaults"
          + (f" ({', '.join(f'{k}={v}' for k, v in outcome.knobs.items())})" if outcome.knobs else ""))
    for note in outcome.notes:
        print(f"note: {note}")
    for problem in outcome.problems:
        print(problem.render(), file=sys.stderr)
    print(f"next: toolkit probe run --profile {args.name} --server-url {args.server_url} --record, then "
          f"toolkit report {args.name} --html report/{args.name}.html")
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from toolkit.app.profiles import resolve_at
    from toolkit.core.results.profile_diff import profile_diff
    from toolkit.core.text import redact_data, safe

    store = _store(args)
    if args.since is not None:
        return _diff_since(args, store)
    if args.a is None or args.b is None:
        raise ToolkitError.of("give two profiles (A B), or --since REV", field="profile diff",
                              fix="e.g. toolkit profile diff HEAD~1:glm5-tp8 glm5-tp8, or --since main")
    result = profile_diff(resolve_at(args.a, store), resolve_at(args.b, store))
    if args.json:
        emit("profile.diff", redact_data(result.to_json()))
    else:
        sys.stdout.write(safe(result.render(), keep_newlines=True))
    return 1 if args.exit_code and result.changes else EXIT_OK


def _diff_since(args: argparse.Namespace, store: Any) -> int:
    from toolkit.app.profiles import changes_since

    if args.a is not None or args.b is not None:
        raise ToolkitError.of("--since compares every profile: give no names with it", field="--since",
                              fix=f"toolkit profile diff --since {args.since}, or toolkit profile diff "
                              f"{args.since}:NAME NAME")
    changes = changes_since(args.since, store)
    if args.json:
        emit("profile.changes", [{**c.__dict__, "knobs": [k.__dict__ for k in c.knobs]} for c in changes])
    else:
        print(f"profiles changed since {args.since}: {len(changes)}")
        for c in changes:
            detail = (f"{len(c.knobs)} knob(s)" + (f"; renders {', '.join(c.render_changed)}" if c.render_changed
                                                   else "") if c.status == "changed" else c.note)
            print(f"{c.status:10} {c.name}" + (f" ({detail})" if detail else ""))
            for k in c.knobs:
                print("  " + k.render().replace("\n", "\n  "))
    return 1 if args.exit_code and changes else EXIT_OK


def cmd_textconv(args: argparse.Namespace) -> int:
    """git runs this on old and new versions of a profile; it never fails (see toolkit.app.profiles.textconv)."""
    from toolkit.app.profiles import textconv
    from toolkit.core.text import safe

    stdin = sys.stdin.read() if args.file == "-" else None
    sys.stdout.write(safe(textconv(args.file, getattr(args, "profiles_dir", None), text=stdin), keep_newlines=True))
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
        emit(
            "profile.migrate",
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
        emit("profile.lock", [
            {"sglang_version": o.sglang_version, "python": o.python, "status": o.status, "path": o.path,
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

    from toolkit.app.catalogue import regenerate

    wheel = Path(args.wheel) if args.wheel else None
    out_dir = Path(args.out_dir) if args.out_dir else None
    if args.from_installed:
        path, catalogue = regenerate(None, from_installed=True, out_dir=out_dir)
    else:
        with Console(stderr=True).status(f"reading SGLang {args.sglang_version}'s argument declarations "
                                         "(pip download --no-deps)"):
            path, catalogue = regenerate(args.sglang_version, wheel=wheel, out_dir=out_dir)
    deprecated = sum(f.deprecated for f in catalogue.flags)
    print(f"{path}: {len(catalogue.flags)} flags of SGLang {catalogue.sglang_version} ({deprecated} deprecated)")
    return EXIT_OK
