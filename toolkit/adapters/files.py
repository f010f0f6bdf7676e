"""Files the toolkit writes on this machine: the one atomic writer, and its one file mode policy; and the one
capped reader of files it is handed (profiles, patches, key files, catalogues).

Atomic: a reader (or a crash) sees the old file or the new one, never a mix. The new bytes go to a temporary
file in the same directory (same filesystem, so the rename is atomic), are flushed to disk, then `os.replace`d
over the target; the directory is synced so the rename itself survives a power cut. A process killed at any
point before the rename leaves the original untouched and at most a `.NAME.*.tmp` file beside it, which no
loader reads (no profile, run or state file ends in `.tmp`) and the next write of the same file removes.

Modes: a file that exists keeps its permission bits (an author's 0600 profile stays 0600); a new file gets
what open() would give it, 0666 less the umask, whatever it is (profiles, run artifacts, reports, state), so a
run's JSON files and the CSVs streamed beside them with open() read alike; a caller that writes a secret or an
executable says so with `mode` (0600, 0755), which then holds for an existing file too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.text import printable

_CHUNK_BYTES = 64 * 1024


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}."


def stale_temp_files(path: Path) -> list[Path]:
    """Temporary files an interrupted write of `path` left behind: those whose writer is gone. Another live
    process's (or thread's) temp file is a write in flight, not a leftover: removing it made that writer's rename
    fail (seen in CI, three test shards writing the same lab lock file into a cold wheelhouse at once)."""
    prefix = _tmp_prefix(path)
    return sorted(p for p in path.parent.glob(prefix + "*.tmp")
                  if p.is_file() and not _writer_alive(p.name[len(prefix):]))


def _writer_alive(rest: str) -> bool:
    """Whether the process named in a temp file's `PID.TOKEN.tmp` still runs (this one included: a thread)."""
    pid_text = rest.split(".", 1)[0]
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, as another user's: not ours to judge
    return True


def write_atomic(path: str | Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace `path` with `data` (str as UTF-8, or bytes) atomically; its directory is made if missing.

    mode: None keeps an existing file's bits (a new file gets 0666 less the umask); a number sets them."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
    for leftover in stale_temp_files(target):
        with contextlib.suppress(OSError):
            leftover.unlink()
    tmp = target.parent / f"{_tmp_prefix(target)}{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # Created 0600 and given its bits only once whole: a secret is never readable half-written.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view[:_CHUNK_BYTES])
                view = view[written:]
            os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask; the policy above is the rule
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _umask() -> int:
    mask = os.umask(0o022)  # reading it means setting it: put it straight back
    os.umask(mask)
    return mask


def write_json(path: str | Path, data: Any, *, mode: int | None = None) -> None:
    """`data` as indented JSON with sorted keys (a rewrite diffs cleanly), atomically."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", mode=mode)


def read_capped(path: str | Path, cap: int, *, what: str = "file") -> bytes:
    """At most `cap` + 1 bytes of a regular file (the caller refuses more): never blocks on a FIFO or a device,
    never reads a sparse or endless file whole. Anything that is not a readable regular file is a located
    ToolkitError."""
    p = Path(path)
    shown = printable(str(p))
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise ToolkitError.of(f"{shown} does not exist", file=shown, fix="check the name or path") from None
    except OSError as err:
        raise ToolkitError.of(f"cannot read the {what}: {os_reason(err)}", file=shown,
                              fix=os_fix(err)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "not a regular file")
            raise ToolkitError.of(f"the {what} is {kind}, not a regular file", file=shown,
                                  fix=f"point at a regular {what} (a directory, a pipe or a device is never read)")
        chunks: list[bytes] = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise ToolkitError.of(f"cannot read the {what}: {os_reason(err)}", file=shown, fix=os_fix(err)) from None
    finally:
        os.close(fd)


def os_reason(err: OSError) -> str:
    return {errno.ELOOP: "too many levels of symbolic links (a link loop)",
            errno.ENAMETOOLONG: "the path is longer than the file system allows"}.get(
        err.errno or 0, err.strerror or str(err))


def os_fix(err: OSError) -> str:
    if err.errno in (errno.EACCES, errno.EPERM):
        return "make the file readable by the user running toolkit (chmod/chown), or run as that user"
    if err.errno == errno.ELOOP:
        return "point the symbolic link at a file (it leads back to itself)"
    if err.errno == errno.ENAMETOOLONG:
        return "use a shorter name (a file name is at most 255 bytes)"
    if err.errno == errno.EISDIR:
        return "point at a file, not a directory"
    return "check the path and its permissions"
