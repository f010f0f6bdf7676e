"""Lock an SGLang release's engine (`toolkit profile lock`, and `profile migrate --write`): resolve, then write.

For each container CPython, pip's resolver (toolkit/adapters/pip_resolver.py) resolves `sglang==RELEASE` from the
index alone; the result is written atomically as the lock (toolkit/core/engine_lock.py), or, when the index lacks
a requirement, as the refusal record that names it. The two never stand side by side: writing one removes the
other. `check=True` writes nothing: it resolves under the committed lock's pins and compares (a refusal, or no
file, is compared with a fresh resolution).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolkit.adapters import pip_resolver
from toolkit.adapters.files import write_atomic
from toolkit.app.profiles import committed_lock_file, open_store
from toolkit.core.engine_lock import (
    CONTAINER_PYTHONS,
    PYPI_SIMPLE,
    EngineLock,
    LockDifference,
    LockRefusal,
    check_release,
    compare,
    format_lock,
    format_refusal,
    lock_path,
    parse_lock,
    parse_refusal,
    profile_lock_paths,
    python_tag,
    refusal_path,
)
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.resolve import ResolvedProfile

# What one release and Python came to.
WRITTEN, UNCHANGED, REFUSED, CLOSED, DIFFERS = "written", "unchanged", "refused", "closed", "differs"


@dataclass(frozen=True)
class LockOutcome:
    sglang_version: str
    python: str
    status: str  # written | unchanged | refused (written or checked) | closed | differs (--check)
    path: str  # repo-relative: the lock, or the refusal record when refused
    lock: EngineLock | None
    refusal: LockRefusal | None
    duration_s: float
    difference: tuple[str, ...] = ()  # --check: each line of the difference with the committed file

    @property
    def failed(self) -> bool:
        return self.status in (REFUSED, DIFFERS)


def parse_pythons(text: str) -> tuple[str, ...]:
    """`3.11,3.13` as a tuple, each checked."""
    out = tuple(p.strip() for p in text.split(",") if p.strip())
    for p in out:
        try:
            python_tag(p)
        except ToolkitError as err:
            raise ToolkitError.of(err.problems[0].message, field="--python", fix=err.problems[0].fix) from None
    if not out:
        raise ToolkitError.of("no CPython given", field="--python", fix="e.g. --python 3.11,3.13")
    return out


def read_committed(repo_root: Path, sglang_version: str, python: str) -> EngineLock | LockRefusal | None:
    """What the repository holds for this release and Python: its lock, its refusal, or nothing."""
    lock_file, refused_file = repo_root / lock_path(sglang_version, python), repo_root / refusal_path(
        sglang_version, python)
    if lock_file.is_file():
        return parse_lock(lock_file.read_text(encoding="utf-8"), lock_path(sglang_version, python))
    if refused_file.is_file():
        return parse_refusal(refused_file.read_text(encoding="utf-8"), refusal_path(sglang_version, python))
    return None


def lock_release(
    sglang_version: str,
    *,
    repo_root: Path,
    pythons: Sequence[str] = CONTAINER_PYTHONS,
    index_url: str = PYPI_SIMPLE,
    check: bool = False,
    on_start: Callable[[str], None] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> list[LockOutcome]:
    """Resolve the release for each Python; write the lock or the refusal (or, with check, compare)."""
    check_release(sglang_version)
    out = []
    for python in pythons:
        if on_start is not None:
            on_start(f"SGLang {sglang_version}, CPython {python}")
        committed = read_committed(repo_root, sglang_version, python) if check else None
        # A check resolves under the committed lock's own pins: it asks whether those versions are still a whole
        # engine on the index (closed, consistent, every file there), which holds until the lock is wrong. Asked
        # unpinned, it would fail whenever any of ~170 packages shipped a release: that is what a re-lock (and
        # its git diff) shows, not a fault of the committed file.
        pins = committed.pins if isinstance(committed, EngineLock) else ()
        res = pip_resolver.resolve(sglang_version, python, index_url=index_url, pins=pins, on_line=on_line)
        out.append(_compare(committed, sglang_version, python, res) if check
                   else _write(repo_root, sglang_version, python, res))
    return out


def _write(repo_root: Path, sglang_version: str, python: str, res: pip_resolver.Resolution) -> LockOutcome:
    lock_rel, refused_rel = lock_path(sglang_version, python), refusal_path(sglang_version, python)
    if res.lock is not None:
        text, path, other, status = format_lock(res.lock), lock_rel, refused_rel, WRITTEN
    else:
        assert res.refusal is not None
        text, path, other, status = format_refusal(res.refusal), refused_rel, lock_rel, REFUSED
    target = repo_root / path
    if status == WRITTEN and target.is_file() and _same_engine(target, res.lock):
        status = UNCHANGED  # another pip found the same engine: the file (and its header) stays, git sees nothing
    else:
        write_atomic(target, text)
    with contextlib.suppress(FileNotFoundError):
        (repo_root / other).unlink()
    return LockOutcome(sglang_version, python, status, path, res.lock, res.refusal, res.duration_s)


def _same_engine(path: Path, lock: EngineLock | None) -> bool:
    try:
        committed = parse_lock(path.read_text(encoding="utf-8"), str(path))
    except ToolkitError:
        return False  # a broken file is replaced
    return lock is not None and committed.entries == lock.entries and committed.index_url == lock.index_url


def _compare(committed: EngineLock | LockRefusal | None, sglang_version: str, python: str,
             res: pip_resolver.Resolution) -> LockOutcome:
    lock_rel = lock_path(sglang_version, python)
    if res.conflict:
        return LockOutcome(sglang_version, python, DIFFERS, lock_rel, None, None, res.duration_s,
                           ("the committed versions cannot all be installed together; pip says:", *res.conflict))
    if isinstance(committed, EngineLock) and res.lock is not None:
        diff: LockDifference = compare(committed, res.lock)
        return LockOutcome(sglang_version, python, DIFFERS if diff else CLOSED, lock_rel, res.lock, None,
                           res.duration_s, tuple(diff.lines()))
    if isinstance(committed, LockRefusal) and res.refusal is not None:
        same = committed.missing == res.refusal.missing
        lines = () if same else (f"the refusal names {committed.missing}; pip now misses {res.refusal.missing}",)
        return LockOutcome(sglang_version, python, REFUSED if same else DIFFERS, committed.path, None, res.refusal,
                           res.duration_s, lines)
    if committed is None:
        lines = (f"nothing committed: {lock_rel} (nor its refusal) does not exist",)
    elif isinstance(committed, EngineLock):
        assert res.refusal is not None
        lines = (f"the committed lock no longer resolves: {res.refusal.reason()}",)
    else:
        lines = (f"the committed refusal ({committed.missing}) is out of date: the release resolves now",)
    return LockOutcome(sglang_version, python, DIFFERS, lock_rel, res.lock, res.refusal, res.duration_s, lines)


def lock_for(
    name: str | None,
    *,
    sglang_version: str | None = None,
    pythons: str | None = None,
    index_url: str | None = None,
    check: bool = False,
    profiles_dir: str | None = None,
    on_start: Callable[[str], None] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> list[LockOutcome]:
    """`toolkit profile lock NAME | --sglang-version X`: the release of the profile (or the one given), locked in
    the repository that holds the profiles."""
    store = open_store(profiles_dir)
    if (name is None) == (sglang_version is None):
        raise ToolkitError.of("give a profile name or --sglang-version, not both or neither",
                              field="--sglang-version", fix="e.g. `toolkit profile lock glm5-tp8` or "
                              "`toolkit profile lock --sglang-version 0.5.9`")
    if name is not None:
        pinned = store.resolve(name).spec.engine.sglang_version
        if not pinned:
            raise ToolkitError.of(f"{name} pins no SGLang release", file=str(store.path(name)),
                                  field="engine.sglang_version", fix="pin one, e.g. engine.sglang_version: 0.5.9")
        sglang_version = str(pinned)
    assert sglang_version is not None
    return lock_release(sglang_version, repo_root=store.dir.resolve().parent,
                        pythons=parse_pythons(pythons) if pythons else CONTAINER_PYTHONS,
                        index_url=index_url or PYPI_SIMPLE, check=check, on_start=on_start, on_line=on_line)


def profile_locks(resolved: ResolvedProfile, repo_root: Path) -> dict[str, Path]:
    """CPython -> the controller path of the lock a profile's venv is installed from, for each container CPython
    whose lock is committed (a refused one is absent: the deploy refuses a container of that CPython). What
    `sglang_venv_lock_src` is chosen from once the container's CPython is known."""
    engine = resolved.spec.engine
    if not engine.sglang_version:
        return {}
    paths = profile_lock_paths(engine.sglang_version, engine.requirements) or {}
    found = {py: committed_lock_file(rel, repo_root) for py, rel in paths.items()}
    return {py: f for py, f in found.items() if f is not None}
