"""Results on disk: reading a profile's results block, recording a probe run into it, atomically.

`record_run(run_dir, profile_name, profiles_dir)` is the entry point (`toolkit results record`,
`toolkit probe run --record`, `toolkit apply --record`).

The write is toolkit.adapters.files.write_atomic: a reader (or a crash) sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.adapters.files import write_atomic
from toolkit.adapters.profile_store import ProfileStore
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.results_block import join_results_block, split_results_block
from toolkit.core.results.block import add_entry, parse_block, render_block
from toolkit.core.results.build import build_entry
from toolkit.core.results.model import ResultsBlock, ResultsEntry

# --- Recording a probe run into a profile -------------------------------------------------------------


@dataclass(frozen=True)
class RecordOutcome:
    """What `record_run` did. `action`: "added", "replaced" (same run, new figures) or "unchanged"."""

    profile: str
    file: Path
    entry: ResultsEntry
    action: str
    dropped: list[str]  # run_ids pruned by keep_last
    block: ResultsBlock

    @property
    def changed(self) -> bool:
        return self.action != "unchanged"


@dataclass(frozen=True)
class ProfileResults:
    """A profile's results as read: the block (migrated), and the current spec's hash."""

    name: str
    file: Path
    block: ResultsBlock
    spec_hash: str
    resolved: ResolvedProfile


def _artifacts_path(run_dir: Path, profiles_dir: Path) -> str:
    """The run directory relative to the repository (profiles_dir's parent) when inside it: the same
    string whichever directory the command ran from, so re-recording stays byte-identical."""
    run_abs = run_dir.resolve()
    try:
        return run_abs.relative_to(profiles_dir.resolve().parent).as_posix()
    except ValueError:
        return run_abs.as_posix()


def read_block(file: Path, text: str) -> tuple[str, ResultsBlock]:
    """(the author's text, the parsed results block) of one profile file's text."""
    author, block_text = split_results_block(text)
    first_line = author.count("\n") + 2  # the line after the marker
    return author, parse_block(block_text or "", file=str(file), first_line=first_line)


def load_profile_results(profile_name: str, profiles_dir: Path | str | None = None) -> ProfileResults:
    store = ProfileStore(profiles_dir)
    path = store.path(profile_name)
    if not path.is_file():
        known = ", ".join(store.names()) or "none"
        raise ToolkitError.of(f"no profile {profile_name!r} in {store.dir}", file=str(path), field="--profile",
                              fix=f"use one of: {known} (or pass --profiles-dir)")
    _, block = read_block(path, path.read_text(encoding="utf-8"))
    resolved = store.resolve(profile_name)
    return ProfileResults(profile_name, path, block, spec_hash(resolved), resolved)


def _run_artifacts(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any],
                                           dict[str, Any] | None]:
    """(run.json, summary.json, verdict.json, topology.json, bench result) of a run directory."""
    from toolkit.adapters.bench_process import read_bench_jsonl
    from toolkit.adapters.probe_store import read_json

    if not run_dir.is_dir():
        raise ToolkitError.of("not a directory", file=str(run_dir), field="DIR",
                              fix="give the --out directory of `toolkit probe run`")
    for name in ("run.json", "summary.json", "verdict.json"):
        if not (run_dir / name).is_file():
            raise ToolkitError.of(
                f"the run directory has no {name}", file=str(run_dir / name), field="DIR",
                fix=f"give a directory `toolkit probe run` finished; for one cut short, write it with "
                f"`toolkit probe replay {run_dir} --write`" if name != "run.json" else
                "give the --out directory of `toolkit probe run`")
    run = read_json(run_dir / "run.json")
    summary = read_json(run_dir / "summary.json")
    verdict = read_json(run_dir / "verdict.json")
    topology = read_json(run_dir / "topology.json", required=False) or {}
    assert run is not None and summary is not None and verdict is not None
    bench_raw = read_bench_jsonl(run_dir / "bench.jsonl")
    return run, summary, verdict, topology, bench_raw


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


def record_run(run_dir: Path | str, profile_name: str, profiles_dir: Path | str | None = None,
               *, keep_last: int | None = None) -> RecordOutcome:
    """Write the results entry of the probe run in `run_dir` into profile `profile_name`.

    Everything is read and checked first (profile exists and resolves, its block parses, the run has
    its summary); only then is the file replaced, atomically, and only when its text changed. The
    author's part above the marker is kept byte for byte (checked again before writing).
    """
    run_path = Path(run_dir)
    profiles = ProfileStore(profiles_dir)
    path = profiles.path(profile_name)
    if not path.is_file():
        load_profile_results(profile_name, profiles.dir)  # raises the not-found error with the known names
    with profile_lock(path):
        return _record_locked(run_path, profile_name, profiles, keep_last)


def _record_locked(run_path: Path, profile_name: str, profiles: ProfileStore, keep_last: int | None
                   ) -> RecordOutcome:
    current = load_profile_results(profile_name, profiles.dir)
    run, summary, verdict, topology, bench_raw = _run_artifacts(run_path)
    entry = build_entry(
        summary, verdict, run,
        run_id=run_path.resolve().name,
        spec_hash=current.spec_hash,
        artifacts=_artifacts_path(run_path, profiles.dir),
        topology=topology,
        bench_raw=bench_raw,
        profile_bench=current.resolved.spec.bench.model_dump(mode="python"),
        source_file=str(run_path / "summary.json"),
    )
    text = current.file.read_text(encoding="utf-8")
    author, _ = split_results_block(text)
    was_there = any((e.run_id, e.host) == (entry.run_id, entry.host) for e in current.block.entries)
    new_block = add_entry(current.block, entry, keep_last)
    kept = {(e.run_id, e.host) for e in new_block.entries}
    dropped = [e.run_id for e in (*current.block.entries, entry) if (e.run_id, e.host) not in kept]
    new_text = join_results_block(author, render_block(new_block))
    if split_results_block(new_text)[0] != author:  # never reflow the author's text
        raise ToolkitError.of("internal error: the author's part would change; nothing was written",
                              file=str(current.file), exit_code=1)
    if new_text == text:
        return RecordOutcome(profile_name, current.file, entry, "unchanged", [], new_block)
    write_atomic(current.file, new_text)
    return RecordOutcome(profile_name, current.file, entry, "replaced" if was_there else "added", dropped, new_block)


def migrate_profile(profile_name: str, profiles_dir: Path | str | None = None) -> bool:
    """Rewrite a profile's results block in the current schema (only the block; atomic). True if it changed."""
    current = load_profile_results(profile_name, profiles_dir)
    text = current.file.read_text(encoding="utf-8")
    author, block_text = split_results_block(text)
    if block_text is None:
        return False
    new_text = join_results_block(author, render_block(current.block))
    if new_text == text:
        return False
    write_atomic(current.file, new_text)
    return True
