"""git, for the profile textconv: which revision a blob git hands over belongs to, and the files of that revision;
and the clone's config line that wires the textconv in. Every call runs the `git` program; a missing git or a
failing call is None, never an exception (textconv must never make `git diff` fail).
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def toplevel(cwd: Path) -> Path | None:
    """The work tree's top directory holding `cwd` (git runs a textconv there), None outside a repository."""
    out = _git(["rev-parse", "--show-toplevel"], cwd if cwd.is_dir() else cwd.parent)
    return Path(out.strip()) if out and out.strip() else None


def blob_id(path: Path, top: Path) -> str | None:
    """The blob id of a file's bytes as they are (no filters: git hands a textconv the blob itself)."""
    out = _git(["hash-object", "--no-filters", "--", str(path.resolve())], top)
    return out.strip() if out else None


def index_blob(top: Path, relpath: str) -> str | None:
    out = _git(["ls-files", "--stage", "--", relpath], top)
    parts = out.split() if out else []
    return parts[1] if len(parts) >= 2 else None


def changes(top: Path, relpath: str, *, all_refs: bool = False) -> list[tuple[str, str]]:
    """(commit, the blob it made `relpath`), newest first: HEAD's history, or every ref's (`all_refs`). A merge
    commit counts as making what differs from its first parent: `--raw` alone lists nothing for merges, and a
    merge where both sides changed the file holds a blob no other commit has."""
    out = _git(["log", *(["--all"] if all_refs else []), "--format=commit %H", "--raw", "--no-abbrev",
                "--no-renames", "--diff-merges=first-parent", "--", relpath], top)
    found, commit = [], None
    for line in (out or "").splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
        elif line.startswith(":") and commit:
            fields = line.split("\t", 1)[0].split()
            if len(fields) >= 4:
                found.append((commit, fields[3]))
    return found


def changed_between(top: Path, older: str, newer: str, relpath: str) -> bool:
    """Whether a commit after `older`, up to `newer`, changed `relpath`."""
    out = _git(["log", "--format=%H", f"{older}..{newer}", "--", relpath], top)
    return bool(out and out.strip())


def short(top: Path, revision: str) -> str:
    out = _git(["rev-parse", "--short=12", revision], top)
    return out.strip() if out else revision[:12]


def show(top: Path, revision: str, relpath: str) -> str | None:
    """A file's text at a revision (`""` is the index), None when it has no such file."""
    return _git(["show", f"{revision}:{relpath}"], top)


def set_config(top: Path, key: str, value: str, *, global_: bool = False) -> bool:
    return _git(["config", *(["--global"] if global_ else []), key, value], top) is not None


def names_at(top: Path, revision: str, rel_dir: str) -> list[str] | None:
    """The files directly in `rel_dir` at a revision (names only), None when the revision is not one."""
    out = _git(["ls-tree", "--name-only", f"{revision}:{rel_dir}"], top) if rel_dir not in ("", ".") else \
        _git(["ls-tree", "--name-only", revision], top)
    return None if out is None else [line for line in out.splitlines() if line]


def verify(top: Path, revision: str) -> str | None:
    """The commit a revision names, None when it names none."""
    out = _git(["rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], top)
    return out.strip() if out else None
