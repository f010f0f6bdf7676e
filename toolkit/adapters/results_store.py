"""Atomic file replacement: a reader (or a crash) sees the old file or the new one, never a mix.

The new text goes to a temporary file in the same directory (same filesystem, so the rename is
atomic), is flushed to disk, then `os.replace`d over the target; the directory is synced so the
rename itself survives a power cut. A process killed at any point before the rename leaves the
original untouched and at most a `.NAME.*.tmp` file beside it, which no profile loader reads
(it does not end in `.yaml`) and the next write of the same file removes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

_CHUNK_BYTES = 64 * 1024


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}."


def stale_temp_files(path: Path) -> list[Path]:
    """Temporary files an interrupted write of `path` left behind."""
    return sorted(p for p in path.parent.glob(_tmp_prefix(path) + "*.tmp") if p.is_file())


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically, keeping its permission bits."""
    data = text.encode("utf-8")
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    for leftover in stale_temp_files(path):
        with contextlib.suppress(OSError):
            leftover.unlink()
    tmp = path.parent / f"{_tmp_prefix(path)}{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view[:_CHUNK_BYTES])
                view = view[written:]
            os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask; the profile keeps its own
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
