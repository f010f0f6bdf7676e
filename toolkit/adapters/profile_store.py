"""Profiles on disk: find the profiles directory, read files (keeping line numbers), write atomically.

The only module of the profile layer that touches the filesystem; everything it returns is
handed to the pure toolkit.core.profile functions.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

from toolkit.adapters.files import write_atomic
from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.model import Profile
from toolkit.core.profile.resolve import ProfileNotFound, ResolvedProfile, check_file, resolve
from toolkit.core.profile.source import MAX_PROFILE_BYTES, ProfileSource, parse_profile_text, too_large

PROFILES_ENV = "TOOLKIT_PROFILES_DIR"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


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

    The lock is on the inode; a writer replaces the inode, so after acquiring we check that the path
    still names the inode we locked, and lock again if it moved on.
    """
    while True:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_text(path: str | Path) -> str:
    """One profile file's text, as UTF-8; a clear error naming the file otherwise."""
    p = Path(path)
    try:
        with p.open("rb") as handle:  # never more than the loader takes: a huge file (or /dev/zero) stops here
            raw = handle.read(MAX_PROFILE_BYTES + 1)
        if len(raw) > MAX_PROFILE_BYTES:
            raise too_large(str(p), len(raw))
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise ToolkitError.of(f"{p} does not exist", file=str(p), fix="check the name or path") from None
    except UnicodeDecodeError as err:
        raise ToolkitError.of(f"not UTF-8 text (byte {err.start})", file=str(p), fix="save the file as UTF-8") from None
    except OSError as err:
        raise ToolkitError.of(f"cannot read: {err.strerror}", file=str(p), fix="check permissions") from None


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

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.yaml") if not p.name.startswith("."))

    def path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise ToolkitError.of(
                f"{name!r} is not a profile name",
                fix="a profile name is its file name without .yaml: lower-case letters, digits, '.', '_', '-'",
            )
        return self.dir / f"{name}.yaml"

    def text(self, name: str) -> str:
        """The file's text, read once per store (the source, the results block and a rewrite all use it)."""
        if name not in self._texts:
            path = self.path(name)
            if path.exists() and not path.is_file():
                raise ToolkitError.of(f"{path} is not a regular file", file=str(path),
                                      fix="a profile is a YAML file (not a device, a pipe or a directory)")
            if not path.is_file():
                known = ", ".join(self.names()) or "none"
                raise ProfileNotFound.of(f"no profile {name!r} in {self.dir}", fix=f"use one of: {known}")
            self._texts[name] = read_text(path)
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
        return resolve(name, self.source, load_catalogue)

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
            path = (root / rel).resolve()
            if not path.is_relative_to(self.dir.resolve()):
                out.append(resolved.problem(
                    field,
                    f"{rel} resolves to {path}, outside the profiles' tree {self.dir.resolve()}",
                    "keep the file itself under the profiles directory (a symbolic link out of it is refused)",
                ))
            elif not path.is_file():
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
            touched = {
                line[6:].split("\t")[0].strip()
                for line in patch_file.read_text(encoding="utf-8", errors="replace").splitlines()
                if line.startswith("+++ b/")
            }
            if touched != {patch.target}:
                out.append(
                    resolved.problem(
                        f"engine.patches.{i}.target",
                        f"{patch.patch} changes {sorted(touched) or 'no file'}, not {patch.target}",
                        "make target the one file the patch changes (a/ b/ paths relative to site-packages)",
                    )
                )
        return out

    def forget(self, name: str) -> None:
        """Read the file afresh next time (another writer may have changed it: after taking its lock)."""
        self._cache.pop(name, None)
        self._texts.pop(name, None)

    def write_text(self, name: str, text: str) -> None:
        """Replace a profile's text atomically (the results writer keeps the author's part intact)."""
        write_atomic(self.path(name), text)
        self.forget(name)

