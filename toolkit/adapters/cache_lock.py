"""One builder at a time per cache entry on the controller (/var/cache/toolkit, /var/cache/toolkit-lab).

Two runs that need the same entry on a cold machine (CI's two test shards, each with its own lab; two
applies from two checkouts) would otherwise build it in the same `.building` path, and the second one's
clean start removes the first one's half-made files (seen in CI: the stand-in installer's tar "Cannot open"
its payload, whose directory the other shard had just removed). The lock is flock(2) on `.<entry>.lock`
beside the entry (toolkit.adapters.file_lock), so a builder killed however it is killed frees it at once.
`build_once` checks for a finished entry, takes the lock, and checks again before building: the waiter finds the
other's finished entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from toolkit.adapters import file_lock


@contextlib.contextmanager
def building(entry: Path) -> Iterator[None]:
    """Held while `entry` (a cache directory or file) is built; waits for another builder of it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with file_lock.held(entry.parent / f".{entry.name}.lock"):
        yield


def build_once(entry: Path, finished: Callable[[], bool], build: Callable[[], object]) -> bool:
    """Build `entry` unless `finished()` says it is there, waiting for whoever else is building it;
    True when this call built it. The first check takes no lock, so a warm cache costs one stat."""
    if finished():
        return False
    with building(entry):
        if finished():
            return False
        build()
        return True
