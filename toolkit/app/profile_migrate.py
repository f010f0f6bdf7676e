"""Migrate a profile to another SGLang release (`toolkit profile migrate`): plan, check, then write.

The plan is the pure core's (toolkit.core.profile.migrate); here are its inputs (the profile, both releases'
catalogues, the target release's wheel for the patch targets and the lock file) and what follows it: the
rewritten profile and every profile that extends it are validated against the target release before anything
is written, and then the lock file and the profile are written atomically, the profile last.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.adapters import sglang_catalogue
from toolkit.adapters.files import write_atomic
from toolkit.adapters.profile_store import ProfileStore
from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.app.engine_lock import lock_release, read_committed
from toolkit.app.profiles import check
from toolkit.core.engine_lock import CONTAINER_PYTHONS, PYPI_SIMPLE, LockRefusal, lock_path
from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.catalogue import release_key
from toolkit.core.profile.migrate import Migration, PatchTarget, plan_migration
from toolkit.core.profile.resolve import resolve
from toolkit.core.profile.rules import release_in
from toolkit.core.profile.source import ProfileSource, parse_profile_text


@dataclass
class MigrateResult:
    migration: Migration
    diff: str = ""  # unified diff of the profile's text
    problems: dict[str, list[Problem]] = field(default_factory=dict)  # profile -> problems on the target release
    lock_files: list[str] = field(default_factory=list)  # the release's locks (or refusals), one per Python
    locks_missing: list[str] = field(default_factory=list)  # neither lock nor refusal committed: --write resolves
    locks_written: list[str] = field(default_factory=list)  # those this run resolved and wrote
    lock_refusals: list[LockRefusal] = field(default_factory=list)  # the release cannot be locked: not written
    written: bool = False

    @property
    def unlockable(self) -> bool:
        """The release cannot be locked for any container Python: nothing could install it."""
        return len(self.lock_refusals) >= len(CONTAINER_PYTHONS)

    @property
    def ok(self) -> bool:
        return not self.migration.refusals and not self.unlockable and not any(
            p.severity == "error" for ps in self.problems.values() for p in ps
        )


def migrate_profile(
    store: ProfileStore, name: str, version: str, *, new_name: str | None = None, write: bool = False,
    on_lock: Callable[[str], None] | None = None, index_url: str = PYPI_SIMPLE,
) -> MigrateResult:
    new = load_catalogue(version)
    if new is None:
        raise ToolkitError.of(
            f"no flag catalogue for SGLang {version}",
            field="--sglang-version",
            fix=f"run `toolkit profile catalogue --sglang-version {version}` first, or pick one of "
            f"{', '.join(sglang_catalogue.available_versions())}",
        )
    if new_name is not None and store.path(new_name).exists():
        raise ToolkitError.of(f"{store.path(new_name)} exists", field="--as", fix="give a new profile name")
    resolved = store.resolve(name)
    source = store.source(name)
    root = store.dir.resolve().parent
    # The wheel (cached, else downloaded) is read for the lock file and for patches SGLang does not carry itself.
    upstream = {i for i, p in enumerate(resolved.spec.engine.patches)
                if p.upstream is not None and release_in(version, f">={p.upstream.release}")}
    to_check = [(i, p) for i, p in enumerate(resolved.spec.engine.patches) if i not in upstream]
    wheel = sglang_catalogue.ensure_wheel(version) if to_check else None
    targets: dict[int, PatchTarget] = {}
    for i, patch in to_check:
        assert wheel is not None
        data = sglang_catalogue.wheel_file(wheel, patch.target)
        targets[i] = PatchTarget(data is not None, hashlib.sha256(data).hexdigest() if data is not None else None)
    pinned = resolved.spec.engine.sglang_version
    between = [c for v in sglang_catalogue.available_versions()
               if pinned and release_key(pinned) < release_key(v) < release_key(version)
               and (c := load_catalogue(v)) is not None]
    migration = plan_migration(source, resolved, resolved.catalogue, new, patch_targets=targets, new_name=new_name,
                               history=between[::-1])
    committed = {py: read_committed(root, version, py) for py in CONTAINER_PYTHONS}
    result = MigrateResult(migration, lock_files=[
        c.path if isinstance(c, LockRefusal) else lock_path(version, py) for py, c in committed.items()])
    if migration.text is None:
        return result
    target_name = new_name or name
    target_file = str(store.path(target_name))
    before = "" if new_name else source.text
    result.diff = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), migration.text.splitlines(keepends=True),
            "/dev/null" if new_name else f"a/{store.path(name).name}", f"b/{Path(target_file).name}",
        )
    )
    new_source = parse_profile_text(target_name, target_file, migration.text)

    def loader(n: str) -> ProfileSource:
        return new_source if n == target_name else store.source(n)

    affected = [target_name] + ([] if new_name else _children(store, name))
    for profile in affected:
        migrated = resolve(profile, loader, load_catalogue)
        result.problems[profile] = check(migrated)
    result.lock_refusals = [c for c in committed.values() if isinstance(c, LockRefusal)]
    result.locks_missing = [lock_path(version, py) for py, c in committed.items() if c is None]
    if not write or not result.ok:
        return result
    # The release's engine is locked before the profile moves onto it: pip's resolver for each Python whose lock
    # is missing; a release it cannot lock keeps the profile where it is.
    missing = tuple(py for py, c in committed.items() if c is None)
    if missing:
        outcomes = lock_release(version, repo_root=root, pythons=missing, index_url=index_url, on_start=on_lock)
        result.locks_written = [o.path for o in outcomes]
        by_python = dict(zip(CONTAINER_PYTHONS, result.lock_files, strict=True))
        by_python.update({o.python: o.path for o in outcomes})
        result.lock_files = list(by_python.values())
        result.lock_refusals += [o.refusal for o in outcomes if o.refusal is not None]
        if result.unlockable:
            return result
    write_atomic(target_file, migration.text)
    result.written = True
    return result


def _children(store: ProfileStore, name: str) -> list[str]:
    """Profiles whose extends: chain passes through `name` (they move with it)."""
    out = []
    for other in store.names():
        if other == name:
            continue
        try:
            if name in store.resolve(other).chain:
                out.append(other)
        except ToolkitError:
            continue
    return out
