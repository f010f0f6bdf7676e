"""Record a probe run into a profile, read a profile's results, migrate its block.

The profile file is read once per recording, inside its lock: its text gives the spec (and its hash, which the
entry records), the results block, and the author's part that must stay byte for byte; the new text is
written atomically, and only when it changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolkit.adapters.probe_store import (
    read_clocks,
    read_fleet_run,
    read_fleet_verdict,
    read_judged,
    read_summary,
    read_topology,
)
from toolkit.adapters.profile_store import ProfileStore, profile_lock
from toolkit.app.profiles import open_store
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.results.block import block_problems
from toolkit.core.results.build import build_entry, build_fleet_entry
from toolkit.core.results.check import DEFAULT_EFFECT, CheckResult, check_entries
from toolkit.core.results.model import Gate, ResultsBlock, ResultsEntry
from toolkit.core.results.record import RecordChange, migrated, read_block, with_entry


@dataclass(frozen=True)
class ProfileResults:
    """A profile's results as read: the block (migrated), the current spec and its hash."""

    name: str
    file: Path
    block: ResultsBlock
    spec_hash: str
    resolved: ResolvedProfile


@dataclass(frozen=True)
class RecordOutcome:
    """What `record_run` did: the entry, and the change to the file (its action, what keep_last dropped)."""

    profile: str
    file: Path
    entry: ResultsEntry
    change: RecordChange

    @property
    def action(self) -> str:  # "added", "replaced" (same run, new figures) or "unchanged"
        return self.change.action

    @property
    def dropped(self) -> list[str]:
        return self.change.dropped

    @property
    def block(self) -> ResultsBlock:
        return self.change.block


def _store(profiles_dir: str | Path | None) -> ProfileStore:
    return open_store(str(profiles_dir) if profiles_dir is not None else None)


def _existing(store: ProfileStore, name: str) -> Path:
    path = store.path(name)
    if not path.is_file():
        known = ", ".join(store.names()) or "none"
        raise ToolkitError.of(f"no profile {name!r} in {store.dir}", file=str(path), field="--profile",
                              fix=f"use one of: {known} (or pass --profiles-dir)")
    return path


def _results_of(store: ProfileStore, name: str, path: Path) -> ProfileResults:
    """One read of the file gives the block (checked first: its errors name the block), the spec and its hash."""
    block = read_block(store.text(name), file=str(path))
    resolved = store.resolve(name)
    return ProfileResults(name, path, block, spec_hash(resolved), resolved)


def load_results(profile: str, profiles_dir: str | Path | None = None, *,
                 store: ProfileStore | None = None) -> ProfileResults:
    store = store or _store(profiles_dir)
    return _results_of(store, profile, _existing(store, profile))


def _artifacts_path(run_dir: Path, profiles_dir: Path) -> str:
    """The run directory relative to the repository (profiles_dir's parent) when inside it: the same
    string whichever directory the command ran from, so re-recording stays byte-identical."""
    run_abs = run_dir.resolve()
    try:
        return run_abs.relative_to(profiles_dir.resolve().parent).as_posix()
    except ValueError:
        return run_abs.as_posix()


def record_run(run_dir: Path | str, profile: str, profiles_dir: str | Path | None = None,
               *, keep_last: int | None = None, gate: Gate | None = None) -> RecordOutcome:
    """Write the results entry of the probe run in `run_dir` into profile `profile`.

    Everything is read and checked first (the profile exists and resolves, its block parses, the run has its
    summary and verdict); only then is the file replaced, atomically, and only when its text changed. A fleet
    run's directory (its hosts' runs under hosts/) is recorded as one (record_fleet_run)."""
    run_path = Path(run_dir)
    if (run_path / "hosts").is_dir() and not (run_path / "summary.json").exists():
        if gate is not None:
            raise ToolkitError.of("an upgrade's gate is recorded on a one-host run", file=str(run_path),
                                  field="DIR", fix="gate on a one-host profile's run")
        return record_fleet_run(run_path, profile, profiles_dir, keep_last=keep_last)
    store = _store(profiles_dir)
    path = _existing(store, profile)
    run, summary, verdict, topology, bench_raw = read_judged(run_path)
    with profile_lock(path):  # two recorders (parallel sweeps, several hosts) never drop each other's entry
        store.forget(profile)
        current = _results_of(store, profile, path)
        unreadable = [p for p in block_problems(current.resolved) if p.severity == "error"]
        if unreadable:  # what it cannot read as its own block, it does not write over
            raise ToolkitError(unreadable)
        text = store.text(profile)
        entry = build_entry(
            summary, verdict, run,
            run_id=run_path.resolve().name,
            spec_hash=current.spec_hash,
            artifacts=_artifacts_path(run_path, store.dir),
            topology=topology,
            bench_raw=bench_raw,
            profile_bench=current.resolved.spec.bench.model_dump(mode="python"),
            source_file=str(run_path / "summary.json"),
        )
        if gate is not None:  # an upgrade's run: its side and the decision on all of them
            entry = entry.model_copy(update={"gate": gate})
        change = with_entry(text, entry, file=str(path), keep_last=keep_last)
        if change.changed:
            store.write_text(profile, change.text)
    return RecordOutcome(profile, path, entry, change)


def record_fleet_run(run_dir: Path | str, profile: str, profiles_dir: str | Path | None = None, *,
                     keep_last: int | None = None) -> RecordOutcome:
    """Write the results entry of the fleet run in `run_dir` (`toolkit probe run --fleet`'s directory, or apply's
    over several hosts) into profile `profile`: the benchmark's figures, the fleet's energy and verdict, each
    node's figures with its clock and bound (a profile with replicas: their layout; else its node ranks). Read and
    checked first, then written atomically, only when changed."""
    from toolkit.adapters.bench_process import read_bench_jsonl
    from toolkit.core.probe.bench import normalize_bench_result

    run_path = Path(run_dir)
    store = _store(profiles_dir)
    path = _existing(store, profile)
    manifest = read_fleet_run(run_path)
    fleet_verdict = read_fleet_verdict(run_path)
    host_dirs = {h: run_path / rel for h, rel in sorted((manifest.get("host_runs") or {}).items())}
    summaries = {h: s for h, d in host_dirs.items() if (s := read_summary(d)) is not None}
    bench_raw = read_bench_jsonl(run_path / "bench.jsonl")
    with profile_lock(path):
        store.forget(profile)
        current = _results_of(store, profile, path)
        unreadable = [p for p in block_problems(current.resolved) if p.severity == "error"]
        if unreadable:
            raise ToolkitError(unreadable)
        layout: Literal["nodes", "replicas"] = "replicas" if current.resolved.spec.replicas is not None else "nodes"
        entry = build_fleet_entry(
            manifest, fleet_verdict, summaries,
            layout=layout,
            run_id=run_path.resolve().name,
            spec_hash=current.spec_hash,
            artifacts=_artifacts_path(run_path, store.dir),
            clocks=read_clocks(manifest),
            topologies={h: read_topology(d) for h, d in host_dirs.items()},
            bench=normalize_bench_result(bench_raw),
            bench_raw=bench_raw,
            profile_bench=current.resolved.spec.bench.model_dump(mode="python"),
        )
        change = with_entry(store.text(profile), entry, file=str(path), keep_last=keep_last)
        if change.changed:
            store.write_text(profile, change.text)
    return RecordOutcome(profile, path, entry, change)


def migrate(profile: str, profiles_dir: str | Path | None = None) -> bool:
    """Rewrite a profile's results block in the current schema (only the block; atomic). True if it changed."""
    store = _store(profiles_dir)
    path = _existing(store, profile)
    with profile_lock(path):
        store.forget(profile)
        text = store.text(profile)
        new_text = migrated(text, file=str(path))
        if new_text == text:
            return False
        store.write_text(profile, new_text)
    return True


def check_results(profile: str, profiles_dir: str | Path | None = None, *, against: str | None = None,
                  objective: str = "throughput", effect: float = DEFAULT_EFFECT) -> CheckResult:
    """`results check`: the profile's newest entry against the reference (toolkit.core.results.check)."""
    pr = load_results(profile, profiles_dir)
    return check_entries(list(pr.block.entries), against=against, objective=objective, effect=effect,
                         profile=profile)
