"""Host locks on the controller: one `toolkit apply` or `toolkit sweep` at a time per target host.

Two deploys to one container at once interleave their tasks (one restarts the service under the other's
benchmark, both rewrite the unit). Each target host gets a lock file under the controller's state directory
(`$TOOLKIT_LOCK_DIR`, default `$TOOLKIT_STATE_DIR/locks` or `~/.local/state/toolkit/locks`), keyed by the
address and port Ansible connects to, so two inventories naming one container differently still meet.

The lock is `flock(2)` on that file: the kernel drops it when its holder exits however it exits (kill -9
included), so a lock left by a killed process is free at once and never guessed from a PID. The holder
writes who it is into the file (pid, command, start time, a token); a clean release empties it. A waiter
reads it to name the holder; a taker that finds it non-empty knows the last holder died holding it and
says so.

Re-entrant within one thread: a sweep holds its hosts for its whole run and calls apply for each point in the
same process; apply's own `host_locks` on those hosts finds them held by this thread and goes ahead (flock(2)
alone would make it wait for itself: a second open() of the file is a second owner, even in one process).

Not covered: two controllers deploying to one host (each has its own lock directory), a lock directory on
a network file system without flock, and Ansible runs started by hand.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import ToolkitError

LOCK_DIR_ENV = "TOOLKIT_LOCK_DIR"
# The lock files this process holds, each with the thread that took it: the same thread re-enters, another waits.
_HELD: dict[str, int] = {}


def locks_dir() -> Path:
    explicit = os.environ.get(LOCK_DIR_ENV)
    if explicit:
        return Path(explicit)
    state = os.environ.get("TOOLKIT_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "toolkit"
    )
    return Path(state) / "locks"


def lock_path(key: str, directory: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
    return (directory or locks_dir()) / f"{safe}.lock"


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    purpose: str
    started_at_utc: str
    controller: str
    token: str

    def describe(self) -> str:
        alive = "" if _alive(self.pid) else ", no longer running"
        what = f"{self.purpose}: {self.command}; since {self.started_at_utc}{alive}"
        return f"pid {self.pid} on {self.controller} ({what})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(path: Path) -> Holder | None:
    """Who holds (or, if the file is not locked, last held and died holding) the lock at `path`."""
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        data = json.loads(text)
        return Holder(**{k: data[k] for k in Holder.__dataclass_fields__})
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


@dataclass
class HostLocks:
    """What `host_locks` did: the hosts taken, those this thread already held (re-entered), stale locks taken over."""

    token: str
    taken: list[str]
    reentered: list[str]
    took_over: list[str]  # "<host>: <holder that died holding it>"


@contextlib.contextmanager
def host_locks(
    hosts: dict[str, str],
    *,
    purpose: str,
    wait: bool = True,
    on_message: Callable[[str], None] = lambda _m: None,
    directory: Path | None = None,
) -> Iterator[HostLocks]:
    """Hold the lock of every host in `hosts` ({inventory name: "address:port"}), taken in a fixed order so
    two multi-host runs never deadlock. `wait`: block (saying who holds it) until free; else refuse at once.
    A host this thread holds already (a sweep's apply of one point) is re-entered, and released by its taker."""
    directory = directory or locks_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    result = HostLocks(token=token, taken=[], reentered=[], took_over=[])
    held: list[tuple[int, str]] = []
    try:
        for name, key in sorted(hosts.items(), key=lambda item: item[1]):
            path = lock_path(key, directory)
            owned = os.path.abspath(path)
            if _HELD.get(owned) == threading.get_ident():
                result.reentered.append(name)
                continue
            fd, took_over = _acquire(name, path, token, purpose, wait, on_message)
            held.append((fd, owned))
            _HELD[owned] = threading.get_ident()
            result.taken.append(name)
            if took_over:
                result.took_over.append(f"{name}: {took_over}")
        yield result
    finally:
        for fd, owned in reversed(held):
            _HELD.pop(owned, None)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # a clean release leaves no holder behind
            os.close(fd)  # closing drops the flock


def _acquire(
    name: str,
    path: Path,
    token: str,
    purpose: str,
    wait: bool,
    on_message: Callable[[str], None],
) -> tuple[int, str]:
    """(fd holding the lock, the stale holder taken over)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(path)
            who = holder.describe() if holder else "another toolkit process"
            if not wait:
                raise ToolkitError.of(
                    f"host {name} is in use by {who}; nothing was changed",
                    file=str(path),
                    field="--no-wait",
                    fix="wait for it to finish (run again without --no-wait to queue behind it); "
                    "a lock left by a killed process is free again by itself",
                ) from None
            on_message(f"host {name} is in use by {who}: waiting for it (Ctrl-C to give up)")
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            on_message(f"host {name} is free after {time.monotonic() - started:.1f} s")
        stale = read_holder(path)
        took_over = stale.describe() if stale is not None else ""
        if took_over:
            on_message(f"host {name}: took over the lock left by {took_over}")
        record = {
            "pid": os.getpid(),
            "command": " ".join(["toolkit", *sys.argv[1:]])[:300],
            "purpose": purpose,
            "started_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "controller": socket.gethostname(),
            "token": token,
        }
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return fd, took_over
    except BaseException:
        os.close(fd)
        raise

