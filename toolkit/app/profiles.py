"""Profiles as every use case needs them: found, resolved, and checked against the rules and the pinned SGLang.

One validation for all: `toolkit profile validate`, `apply` (an invalid profile touches no host), a sweep's
variants and a tune's steps, and a promotion before it is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.adapters.profile_store import ProfileStore, find_profiles_dir
from toolkit.adapters.sglang_catalogue import load_catalogue
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
            out[name] += store.file_problems(resolved)
    return out


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
        problems += store.file_problems(resolved)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ToolkitError(errors)
    return CheckedProfile(resolved, [p for p in problems if p.severity == "warning"], store)


def textconv(file: str | Path, profiles_dir: str | None = None) -> str:
    """A profile file as `git diff` should compare it: one line per set knob with its why, then its results. git
    runs this on old and new versions; a version that does not resolve (a broken revision, a parent that no longer
    exists) is shown as its raw text, so `git diff` never fails. The parents come from the profiles directory of
    the repository the file is in (else the usual one)."""
    from toolkit.adapters.profile_store import read_source, read_text
    from toolkit.core.profile.resolve import resolve
    from toolkit.core.profile.source import ProfileSource
    from toolkit.core.results.profile_diff import textconv_text

    path = Path(file)
    text = read_text(path)
    try:
        source = read_source(path)
        name = source.data.get("name") if isinstance(source.data.get("name"), str) else source.name
        source.name = str(name)
        try:
            store = ProfileStore(find_profiles_dir(profiles_dir, cwd=path.parent))
        except ToolkitError:
            store = ProfileStore(find_profiles_dir(profiles_dir))

        def loader(n: str) -> ProfileSource:
            return source if n == source.name else store.source(n)

        return textconv_text(resolve(source.name, loader))
    except ToolkitError as err:
        return f"# toolkit textconv: shown as text ({err.problems[0].message if err.problems else err})\n" + text
