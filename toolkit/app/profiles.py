"""Profiles as every use case needs them: found, resolved, and checked against the rules and the pinned SGLang.

One validation for all: `toolkit profile validate`, `apply` (an invalid profile touches no host), a sweep's
variants and a tune's steps, and a promotion before it is written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.adapters.ansible import share_dir
from toolkit.adapters.profile_store import ProfileStore, find_profiles_dir
from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.core.engine_lock import lock_problems, profile_lock_paths
from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.validate import validate
from toolkit.core.results.block import block_problems


def open_store(profiles_dir: str | None = None) -> ProfileStore:
    """The profiles of `--profiles-dir`, else $TOOLKIT_PROFILES_DIR, else profiles/ of the repository here."""
    return ProfileStore(find_profiles_dir(profiles_dir))


def check(resolved: ResolvedProfile) -> list[Problem]:
    """The rules and the flags of the profile's pinned SGLang (its catalogue, read once per process), and its
    results block as the recorder reads it (what it could not read, it could not add to)."""
    return [*validate(resolved, load_catalogue(resolved.spec.engine.sglang_version)), *block_problems(resolved)]


def check_profiles(store: ProfileStore, names: list[str]) -> dict[str, list[Problem]]:
    """name -> problems, the files a profile names included (a profile that fails to load: its load errors)."""
    out: dict[str, list[Problem]] = {}
    for name in names:
        try:
            resolved = store.resolve(name)
        except ToolkitError as err:
            out[name] = list(err.problems)
            continue
        out[name] = check(resolved)
        if not any(p.severity == "error" for p in out[name]):  # a path refused as written is not looked up
            out[name] += store.file_problems(resolved) + engine_lock_problems(store, resolved)
    return out


def committed_lock_file(rel: str, repo_root: Path) -> Path | None:
    """An engine lock (or, `rel` ending in .refused, its refusal) by its repository path: in the profiles' own
    repository where it holds the lock or its refusal, else in the toolkit's shipped one. A profile written outside
    the checkout (`toolkit profile import` in a directory of one's own) runs a release the toolkit ships a lock for:
    that lock is its engine, not a missing one; a repository's own lock or refusal always wins."""
    lock_rel = rel.removesuffix(".refused")
    roots = [repo_root]
    with contextlib.suppress(ToolkitError):
        roots.append(share_dir())
    root = next((r for r in roots if (r / lock_rel).is_file() or (r / (lock_rel + ".refused")).is_file()),
                repo_root)
    return root / rel if (root / rel).is_file() else None


def engine_lock_problems(store: ProfileStore, resolved: ResolvedProfile) -> list[Problem]:
    """The profile's engine locks (one per container CPython) as the repository holds them, judged by the core:
    a release without a complete lock, or with a refusal, is not deployed."""
    engine = resolved.spec.engine
    if not engine.sglang_version:
        return []  # the pin's own rule says so
    root = store.dir.resolve().parent
    files: dict[str, str | None] = {}
    for rel in (profile_lock_paths(engine.sglang_version, engine.requirements) or {}).values():
        for path in (rel, rel + ".refused"):
            f = committed_lock_file(path, root)
            files[path] = f.read_text(encoding="utf-8") if f is not None else None
    return lock_problems(engine.sglang_version, engine.requirements, files, profile_file=resolved.file)


@dataclass(frozen=True)
class CheckedProfile:
    """A profile that passed: no error (its warnings are kept, to be shown on every use)."""

    resolved: ResolvedProfile
    warnings: list[Problem]
    store: ProfileStore


def resolve_checked(name: str, profiles_dir: str | None = None, *, store: ProfileStore | None = None
                    ) -> CheckedProfile:
    """Resolve and check `name`; its errors raise ToolkitError (exit 2) before anything else happens."""
    store = store or open_store(profiles_dir)
    resolved = store.resolve(name)
    problems = check(resolved)
    if not any(p.severity == "error" for p in problems):  # the files it names go to every host: confined
        problems += store.file_problems(resolved) + engine_lock_problems(store, resolved)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ToolkitError(errors)
    return CheckedProfile(resolved, [p for p in problems if p.severity == "warning"], store)


def textconv(file: str | Path, profiles_dir: str | None = None, *, text: str | None = None) -> str:
    """A profile file as `git diff` should compare it: one line per set knob with its why, then its results.

    git runs this on old and new versions: the work tree's file by its path, an older version as a temporary copy
    of its blob. A profile's parents are resolved at the same revision: for a copy, the commit (or the index) that
    holds that blob, its parents read from there, and the view says which commit where a parent there is not
    today's; a version that is in no commit and not staged is shown as its text with the reason, and so is one
    that does not resolve. A copy beside other profiles (a copied profiles directory) takes its parents there.
    `text`: the file's text when it came on standard input (`-`): its parents are then today's. This never fails,
    so `git diff` never does."""
    from toolkit.adapters.profile_store import read_text
    from toolkit.core.profile.resolve import resolve
    from toolkit.core.profile.source import ProfileSource, parse_profile_text
    from toolkit.core.results.profile_diff import textconv_text

    path = Path(file)
    text = read_text(path) if text is None else text
    try:
        source = parse_profile_text(path.stem, str(path), text)
        name = source.data.get("name") if isinstance(source.data.get("name"), str) else source.name
        source.name = str(name)
        try:
            store = ProfileStore(find_profiles_dir(profiles_dir, cwd=path.parent))
        except ToolkitError:
            store = ProfileStore(find_profiles_dir(profiles_dir))
        header, parent_of = _revision_of(path, store, stdin=str(file) == "-")

        def loader(n: str) -> ProfileSource:
            return source if n == source.name else parent_of(n)

        body = textconv_text(resolve(source.name, loader))
        return header() + body
    except ToolkitError as err:
        return f"# toolkit textconv: shown as text ({err.problems[0].message if err.problems else err})\n" + text


def _at_revision(store: ProfileStore, revision: str) -> tuple[Path, str, str]:
    """(the work tree's top, the profiles directory relative to it, the commit) for profiles at `revision`."""
    from toolkit.adapters import git

    top = git.toplevel(store.dir)
    if top is None:
        raise ToolkitError.of(f"{store.dir} is not in a git repository: there is no revision {revision!r} to read",
                              field="REV", fix="run it inside your clone, or compare profile names")
    commit = git.verify(top, revision)
    if commit is None:
        raise ToolkitError.of(f"{revision!r} names no commit here", field="REV",
                              fix="a commit, branch or tag: HEAD~1, main, a hash")
    try:
        rel_dir = store.dir.resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        raise ToolkitError.of(f"{store.dir} is outside the repository {top}", field="--profiles-dir",
                              fix="use the profiles directory of the clone") from None
    return top, rel_dir, commit


def resolve_at(spec: str, store: ProfileStore) -> ResolvedProfile:
    """NAME, the profile as it is here; or REV:NAME (REV:profiles/NAME.yaml too), the profile and its parents as
    they were at git revision REV."""
    from toolkit.adapters import git
    from toolkit.adapters.sglang_catalogue import load_catalogue
    from toolkit.core.profile.resolve import resolve
    from toolkit.core.profile.source import ProfileSource, parse_profile_text

    if ":" not in spec:
        return store.resolve(spec)
    revision, name = spec.rsplit(":", 1)
    name = Path(name).stem if name.endswith(".yaml") else name
    top, rel_dir, commit = _at_revision(store, revision)

    def loader(n: str) -> ProfileSource:
        rel = f"{rel_dir}/{n}.yaml" if rel_dir != "." else f"{n}.yaml"
        text = git.show(top, commit, rel)
        if text is None:
            raise ToolkitError.of(f"{rel} does not exist at {revision}", field="REV:NAME",
                                  fix=f"`git ls-tree {revision} {rel_dir}/` lists the profiles there")
        return parse_profile_text(n, f"{revision}:{rel}", text)

    return resolve(name, loader, load_catalogue)


@dataclass(frozen=True)
class ProfileChange:
    name: str
    status: str  # "changed", "added", "removed", "unresolved"
    knobs: list[Any]  # KnobChange: what differs in the resolved spec
    render_changed: list[str]  # which renders differ: argv, env, unit, config
    note: str = ""  # why a side did not resolve


def changes_since(revision: str, store: ProfileStore) -> list[ProfileChange]:
    """Every profile whose resolved spec or rendered launch differs between `revision` and now, a child changed
    through its parent included."""
    from toolkit.adapters import git
    from toolkit.core.profile.diff import diff_profiles
    from toolkit.core.profile.render import render_env, render_launch_argv, render_sglang_config_yaml

    top, rel_dir, _ = _at_revision(store, revision)
    then_files = git.names_at(top, revision, rel_dir) or []
    then = {Path(n).stem for n in then_files if n.endswith(".yaml")}
    now = set(store.names())
    out: list[ProfileChange] = []
    renders = {"argv": render_launch_argv, "env": render_env, "config": render_sglang_config_yaml}
    for name in sorted(then | now):
        if name not in then:
            out.append(ProfileChange(name, "added", [], []))
            continue
        if name not in now:
            out.append(ProfileChange(name, "removed", [], []))
            continue
        try:
            old, new = resolve_at(f"{revision}:{name}", store), store.resolve(name)
        except ToolkitError as err:
            out.append(ProfileChange(name, "unresolved", [], [], err.problems[0].message if err.problems else
                                     str(err)))
            continue
        knob_changes = diff_profiles(old, new).changes
        differ = []
        for kind, render in renders.items():
            try:
                if render(old) != render(new):
                    differ.append(kind)
            except ToolkitError:
                differ.append(kind)
        if knob_changes or differ:
            out.append(ProfileChange(name, "changed", list(knob_changes), differ))
    return out


def _revision_of(path: Path, store: ProfileStore, *, stdin: bool) -> tuple[Callable[[], str], Any]:
    """(a header line saying where the parents come from, name -> ProfileSource of that revision)."""
    from toolkit.adapters import git
    from toolkit.core.profile.source import parse_profile_text

    if stdin or path.resolve().parent == store.dir.resolve():
        return lambda: "", store.source  # the work tree's file: its parents are the work tree's
    if any(p != path and p.suffix == ".yaml" for p in path.parent.iterdir()):
        beside = ProfileStore(path.parent)  # a directory of profiles (a copy of one): the parents beside it
        return lambda: "", beside.source
    top = git.toplevel(Path.cwd())
    try:
        rel_dir = store.dir.resolve().relative_to(top.resolve()) if top else None
    except ValueError:
        rel_dir = None
    blob = git.blob_id(path, top) if top is not None else None
    if top is None or rel_dir is None or blob is None:
        here = f"# parents as they are now in {store.dir.name}/ (this copy is not from a git revision here)\n"
        return lambda: here, store.source
    relpath = f"{rel_dir.as_posix()}/{path.name}"
    since: str | None = None  # the commit that made this version, where a later parent change can be seen from
    if git.index_blob(top, relpath) == blob:
        revision, where = "", "the index, where this version is staged"
    else:
        # The last commit in which this version stood: just before the commit that replaced it (the old side of
        # `git log -p`, `git show`, `git diff HEAD~1`), or HEAD when it stands there still.
        history = git.changes(top, relpath)
        made = next((i for i, (_, b) in enumerate(history) if b == blob), None)
        if made is not None:
            since = history[made][0]
            revision = f"{history[made - 1][0]}^1" if made > 0 else "HEAD"
            where = f"commit {git.short(top, revision)}, the last in which this version of {relpath} stood"
        else:
            others = [c for c, b in git.changes(top, relpath, all_refs=True) if b == blob]
            if not others:
                raise ToolkitError.of(f"this version of {relpath} is in no commit and not staged: its parents "
                                      "cannot be resolved at its revision")
            since = revision = others[0]
            where = f"commit {others[0][:12]} (another branch), where this version of {relpath} was committed"
    moved: list[str] = []
    differ: list[str] = []

    def parent_of(n: str) -> Any:
        rel = f"{rel_dir.as_posix()}/{n}.yaml"
        text = git.show(top, revision, rel)
        if text is None:
            raise ToolkitError.of(f"the parent {n} does not exist at {where.split(',')[0]}", file=rel)
        if since is not None and revision != since and git.changed_between(top, since, revision, rel):
            moved.append(n)
        try:
            if store.text(n) != text:
                differ.append(n)
        except ToolkitError:
            differ.append(n)
        return parse_profile_text(n, f"{revision[:12] or 'index'}:{rel}", text)

    def header() -> str:
        # Said only where it matters (a parent that is not today's, or one that changed while this version
        # stood), so the line does not show in every diff.
        if not differ and not moved:
            return ""
        note = (f" ({', '.join(moved)} changed while this version stood, after commit {since[:12] if since else ''}:"
                " an earlier revision's parent may differ)") if moved else ""
        return f"# parents as of {where}{note}\n"

    return header, parent_of


def textconv_command(python: str) -> str:
    """The git config line: `python -m toolkit profile textconv FILE`, and where that cannot start (the venv was
    rebuilt elsewhere, the clone moved) the file as text under one line saying how to fix it, so `git diff` shows
    something rather than dying (`fatal: unable to read files to diff`). git runs it with the shell and appends
    the file."""
    import shlex

    py = shlex.quote(python)
    note = (f"# toolkit textconv could not start ({python} -m toolkit): shown as text; run scripts/setup, or "
            "`toolkit profile install-textconv`, in the clone")
    return (f"tk_textconv() {{ out=$({py} -m toolkit profile textconv \"$1\" 2>/dev/null) && printf '%s\\n' "
            f"\"$out\" || {{ echo {shlex.quote(note)}; cat \"$1\"; }}; }}; tk_textconv")


def install_textconv(*, global_: bool = False, cwd: Path | None = None) -> tuple[str, str]:
    """Wire `git diff` of profiles to the textconv in this clone's git config (or the user's, `global_`), as an
    absolute command: this interpreter and `-m toolkit`, so it works in a shell without the venv. Returns the
    key and the command written."""
    import sys

    from toolkit.adapters import git

    top = git.toplevel(cwd or Path.cwd())
    if top is None and not global_:
        raise ToolkitError.of("not inside a git repository", field="install-textconv",
                              fix="run it inside your clone, or pass --global for every repository")
    key = "diff.toolkit-profile.textconv"
    command = textconv_command(sys.executable)
    if not git.set_config(top or Path.cwd(), key, command, global_=global_):
        raise ToolkitError.of(f"git config {key} failed", field="install-textconv",
                              fix="check that git is installed and the repository's config is writable")
    return key, command
