"""Profiles on disk: find the profiles directory, read files (keeping line numbers), write atomically.

The only module of the profile layer that touches the filesystem; everything it returns is
handed to the pure toolkit.core.profile functions.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from toolkit.adapters import file_lock
from toolkit.adapters.files import os_fix, os_reason, read_capped, write_atomic
from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.model import Profile
from toolkit.core.profile.patchfile import MAX_PATCH_BYTES, OTHER_FILE, patch_problem
from toolkit.core.profile.resolve import ProfileNotFound, ResolvedProfile, ResolveMemo, check_file, resolve
from toolkit.core.profile.source import MAX_PROFILE_BYTES, ProfileSource, parse_profile_text, too_large
from toolkit.core.text import printable

PROFILES_ENV = "TOOLKIT_PROFILES_DIR"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# A file name is at most 255 bytes (NAME_MAX of every Linux file system); `<name>.yaml` must fit.
MAX_NAME_CHARS = 255 - len(".yaml")


def _shipped_profiles() -> Path:
    """The example profiles: the repository's profiles/ in a checkout, toolkit/_share/profiles in a wheel."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_share" / "profiles"
    return packaged if packaged.is_dir() else here.parent / "profiles"


def find_profiles_dir(explicit: str | None = None, *, cwd: str | Path | None = None) -> Path:
    """`--profiles-dir DIR`, else $TOOLKIT_PROFILES_DIR, else `profiles/` at the top of the git
    repository you stand in, else `./profiles`."""
    for given, origin in ((explicit, "--profiles-dir"), (os.environ.get(PROFILES_ENV) or None, PROFILES_ENV)):
        if given is not None:
            path = Path(given).expanduser()
            if not path.is_dir():
                raise ToolkitError.of(
                    f"profiles directory {str(path)!r} (from {origin}) does not exist",
                    fix=f"give an existing directory to {origin}",
                )
            return path.resolve()
    start = Path(cwd) if cwd is not None else Path.cwd()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            if (folder / "profiles").is_dir():
                return (folder / "profiles").resolve()
            break
    if (start / "profiles").is_dir():
        return (start / "profiles").resolve()
    raise ToolkitError.of(
        f"no profiles/ directory in the git repository or the current directory ({start})",
        fix=f"run from a repository with profiles/, pass --profiles-dir DIR or set {PROFILES_ENV} "
        f"(the shipped examples are in {_shipped_profiles()})",
    )


@contextlib.contextmanager
def profile_lock(path: Path) -> Iterator[None]:
    """Exclusive lock on the profile file itself, so two recorders (parallel sweeps, several hosts) never
    both read the old block and the second write drops the first entry.

    The lock is on the inode, and a writer replaces the inode: file_lock.held follows it.
    """
    with file_lock.held(path, replaced=True):
        yield


def _is_file(path: Path) -> bool:
    """Path.is_file, False for a name too long or a link loop rather than an OSError."""
    try:
        return path.is_file()
    except OSError:
        return False


def read_text(path: str | Path) -> str:
    """One profile file's text, as UTF-8; a clear error naming the file otherwise."""
    p = Path(path)
    raw = read_capped(p, MAX_PROFILE_BYTES, what="profile")
    if len(raw) > MAX_PROFILE_BYTES:
        raise too_large(printable(str(p)), len(raw))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ToolkitError.of(f"not UTF-8 text (byte {err.start})", file=printable(str(p)),
                              line=raw.count(b"\n", 0, err.start) + 1,
                              fix="save the file as UTF-8") from None


def read_source(path: str | Path, name: str | None = None) -> ProfileSource:
    """Read and parse one profile file (any path: textconv hands us git's temp files)."""
    p = Path(path)
    return parse_profile_text(name or p.stem, str(p), read_text(p))


class ProfileStore:
    """The profiles of one directory, by name (`<dir>/<name>.yaml`). No directory: find_profiles_dir(None)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.dir = Path(directory) if directory is not None else find_profiles_dir(None)
        self._cache: dict[str, ProfileSource] = {}
        self._texts: dict[str, str] = {}  # read once; parsed (and re-read) only when asked
        self._memo = ResolveMemo()  # each parent checked and merged once (validate all over a deep chain)
        self._patches: dict[tuple[str, str, object], str | None] = {}

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.yaml") if not p.name.startswith("."))

    def path(self, name: str) -> Path:
        if len(name) > MAX_NAME_CHARS or not _NAME.match(name):
            shown = printable(name if len(name) <= 80 else name[:60] + f"... ({len(name):,} characters)")
            raise ToolkitError.of(
                f"{shown!r} is not a profile name" + (f": longer than {MAX_NAME_CHARS} characters, more than a "
                                                      "file name may be" if len(name) > MAX_NAME_CHARS else ""),
                file=f"{printable(str(self.dir))}/{shown}.yaml",
                fix="a profile name is its file name without .yaml: lower-case letters, digits, '.', '_', '-', at "
                f"most {MAX_NAME_CHARS} characters",
            )
        return self.dir / f"{name}.yaml"

    def _not_found(self, name: str) -> ProfileNotFound:
        """A missing profile, with a few close names (a directory may hold thousands: never all of them)."""
        names = self.names()
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        if close:
            hint = "did you mean " + " or ".join(close) + "?"
        elif len(names) <= 5:
            hint = f"use one of: {', '.join(names) or 'none'}"
        else:
            hint = f"use one of the {len(names):,} profiles there (`toolkit profile list`), e.g. {', '.join(names[:3])}"
        return ProfileNotFound([Problem(f"no profile {name!r} in {printable(str(self.dir))}", fix=hint)])

    def confined_path(self, name: str) -> Path:
        """The file of `name`, refused unless it is inside the profiles directory once every symbolic link is
        followed: a link out of it is never opened, so its content is never parsed or shown."""
        path = self.path(name)
        shown = printable(str(path))
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise self._not_found(name) from None
        except OSError as err:
            raise ToolkitError.of(f"cannot read the profile: {os_reason(err)}", file=shown, fix=os_fix(err)) from None
        if stat.S_ISLNK(st.st_mode):
            try:
                real = path.resolve(strict=True)
            except FileNotFoundError:
                raise ToolkitError.of("the profile is a symbolic link to a file that does not exist", file=shown,
                                      fix="remove the link or point it at a profile in the same directory") from None
            except (OSError, RuntimeError) as err:
                reason = os_reason(err) if isinstance(err, OSError) else "a symbolic link loop"
                raise ToolkitError.of(f"cannot read the profile: {reason}", file=shown,
                                      fix="point the symbolic link at a profile file (it leads back to itself)"
                                      ) from None
            if not real.is_relative_to(self.dir.resolve()):
                raise ToolkitError.of(
                    "the profile is a symbolic link out of the profiles directory: it is not read",
                    file=shown,
                    fix=f"copy the profile into {printable(str(self.dir))}, or link only to files inside it",
                )
            return real
        return path

    def text(self, name: str) -> str:
        """The file's text, read once per store (the source, the results block and a rewrite all use it)."""
        if name not in self._texts:
            self._texts[name] = read_text(self.confined_path(name))
        return self._texts[name]

    def source(self, name: str) -> ProfileSource:
        if name not in self._cache:
            self._cache[name] = parse_profile_text(name, str(self.path(name)), self.text(name))
        return self._cache[name]

    def load(self, name: str) -> tuple[Profile, str]:
        """The file's own content, type-checked (not merged with its parents), and its text."""
        source = self.source(name)
        return check_file(source), source.text

    def resolve(self, name: str) -> ResolvedProfile:
        """The merged profile with its pinned release's flag catalogue attached (rendering follows it)."""
        return resolve(name, self.source, load_catalogue, self._memo)

    def file_problems(self, resolved: ResolvedProfile) -> list[Problem]:
        """Files a profile names (patches, requirements lock), relative to the repository holding the
        profiles dir: they must be regular files inside the profiles' tree once every symbolic link is
        followed (the deploy copies them to hosts), and a patch must change the file its entry says."""
        root = self.dir.resolve().parent
        out: list[Problem] = []
        engine = resolved.spec.engine
        # A requirements value that names no engine lock gets its one error from the lock check (the fix is to
        # delete the line), not a second one here about a file that is not there.
        named = [("engine.requirements", engine.requirements, "commit the lock file there")] \
            if engine.requirements and engine.requirements.endswith(".lock") else []
        named += [(f"engine.patches.{i}.patch", p.patch, "commit the patch file under profiles/patches/")
                  for i, p in enumerate(engine.patches)]
        confined: dict[str, Path] = {}
        for field, rel, commit in named:
            try:
                path = (root / rel).resolve()
            except (OSError, RuntimeError):  # a link loop (pathlib raises RuntimeError for one)
                out.append(resolved.problem(field, f"{rel} is a symbolic link loop",
                                            "point the link at a file under the profiles directory"))
                continue
            if not path.is_relative_to(self.dir.resolve()):
                out.append(resolved.problem(
                    field,
                    f"{rel} resolves to {path}, outside the profiles' tree {self.dir.resolve()}",
                    "keep the file itself under the profiles directory (a symbolic link out of it is refused)",
                ))
            elif not _is_file(path):
                out.append(resolved.problem(
                    field,
                    f"{rel} does not exist (looked in {root})",
                    f"{commit}, or fix the path (it is relative to the repository root)",
                ))
            else:
                confined[field] = path
        for i, patch in enumerate(engine.patches):
            patch_file = confined.get(f"engine.patches.{i}.patch")
            if patch_file is None:
                continue
            problem = self._patch_problem(patch_file, patch.target)
            if problem is not None:
                out.append(resolved.problem(
                    f"engine.patches.{i}.target" if problem.endswith(OTHER_FILE) else f"engine.patches.{i}.patch",
                    f"{patch.patch}: {problem}",
                    f"make the patch a unified diff of a/{patch.target} to b/{patch.target} alone (`git diff` of "
                    "that one file; one patch entry per file), as the deploy applies it to that file only",
                ))
        return out

    def _patch_problem(self, path: Path, target: str) -> str | None:
        """The patch check of one file, read once per store (capped: a sparse GiB is not read) however many
        profiles of a chain name it."""
        try:
            st = path.stat()
        except OSError:
            st = None
        # The file's identity and version: rewritten, it is checked again.
        key = (str(path), target, (st.st_ino, st.st_size, st.st_mtime_ns) if st else None)
        if key not in self._patches:
            try:
                raw = read_capped(path, MAX_PATCH_BYTES, what="patch")
            except ToolkitError as err:
                self._patches[key] = err.problems[0].message
            else:
                self._patches[key] = (
                    f"the patch is {len(raw):,} bytes or more, more than a patch may be ({MAX_PATCH_BYTES:,})"
                    if len(raw) > MAX_PATCH_BYTES else patch_problem(raw.decode("utf-8", errors="replace"), target))
        return self._patches[key]

    def forget(self, name: str) -> None:
        """Read the file afresh next time (another writer may have changed it: after taking its lock)."""
        self._cache.pop(name, None)
        self._texts.pop(name, None)
        self._memo = ResolveMemo()  # its children's merges hold its old values

    def write_text(self, name: str, text: str) -> None:
        """Replace a profile's text atomically (the results writer keeps the author's part intact)."""
        write_atomic(self.path(name), text)
        self.forget(name)

