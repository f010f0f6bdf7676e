"""flock(2), the one way the toolkit's processes on the controller take turns: a host lock (host_lock), a profile
being recorded into (profile_store.profile_lock) and a cache entry being built (cache_lock).

The kernel drops an flock when its holder exits however it exits (kill -9 included), so no lock is ever left
behind to be guessed stale. filelock (the tox/virtualenv maintainers' library) was weighed: its Unix lock opens the
lock file with O_TRUNC on every attempt, which would wipe the holder record a host lock keeps in its lock file for
a waiter to read, and it locks a sidecar file only, where a profile is locked as itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def lock(fd: int, *, wait: bool = True) -> bool:
    """An exclusive flock on `fd`: True once held; with wait=False, False at once when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def held(path: Path, *, replaced: bool = False) -> Iterator[int]:
    """Hold an exclusive flock on `path` for the block (waiting for another holder); closing the descriptor at
    the end releases it.

    Without `replaced`, `path` is a lock file of its own, made when missing. With it, `path` is a file that
    writers replace whole (an atomic write makes a new inode): the lock is on the inode, so once it is granted
    the path must still name the inode locked, else the lock is taken again on the one it names now.
    """
    while True:
        fd = os.open(path, os.O_RDONLY) if replaced else os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            lock(fd)
            if not replaced or os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)
