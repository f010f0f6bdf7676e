"""Asks a host for its clock over one long-lived command (an SSH session to it, in a fleet probe).

One process for the whole burst: a new SSH connection per question would put its handshake, tens of milliseconds,
inside every round trip, and the bound of the offset is half the shortest round trip. The host side is the
standard library only (a GPU box has python3; it needs no wheel): it answers each line read with its clock.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Sequence

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.clock import ClockExchange, ClockOffset, estimate_offset

# Runs on the host: one line in, its wall clock in ns out. `-u`: unbuffered, so each answer leaves at once.
HOST_SCRIPT = "import sys,time\nfor _ in sys.stdin:\n    sys.stdout.write('%d\\n' % time.time_ns()); sys.stdout.flush()"


def host_command(python: str = "python3") -> list[str]:
    return [python, "-u", "-c", HOST_SCRIPT]


def exchange_burst(host: str, argv_prefix: Sequence[str], count: int = 8, timeout_s: float = 20.0, *,
                   remote_shell: bool = False, host_prefix: Sequence[str] = ()) -> ClockOffset:
    """`count` exchanges with `host` through `argv_prefix + host_command()` (e.g. `ssh -o BatchMode=yes root@pve2`),
    and the offset they give. Raises ToolkitError naming the host when it does not answer. `remote_shell`: the
    prefix hands one command line to a shell on the host (ssh does: it joins its arguments with spaces), so the
    script goes quoted as one argument. `host_prefix` runs on the host before the script (`pct exec 100 --`: the
    clock of a container reached through its Proxmox host)."""
    command = [*host_prefix, *host_command()]
    argv = [*argv_prefix, *([shlex.join(command)] if remote_shell else command)]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, bufsize=1)
    except OSError as err:
        raise ToolkitError.of(f"cannot ask {host} for its clock: {err}", field=host,
                              fix="check that the host is reachable over SSH and has python3") from None
    assert proc.stdin is not None and proc.stdout is not None
    exchanges: list[ClockExchange] = []
    deadline = time.monotonic() + timeout_s
    try:
        # The first answer also pays the interpreter's start: asked, but not counted.
        for i in range(count + 1):
            if time.monotonic() > deadline:
                break
            sent_ns = time.time_ns()
            proc.stdin.write("t\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            received_ns = time.time_ns()
            if not line.strip().isdigit():
                break
            if i:
                exchanges.append(ClockExchange(sent_ns=sent_ns, host_ns=int(line), received_ns=received_ns))
    except (BrokenPipeError, OSError):
        pass  # the host side ended: its stderr below says why
    finally:
        with contextlib.suppress(OSError):  # already gone with the process
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stderr_text = proc.stderr.read() if proc.stderr else ""
    if not exchanges:
        detail = (stderr_text or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise ToolkitError.of(f"{host} did not answer with its clock: {detail[0]}", field=host,
                              fix="check that the host is reachable over SSH and has python3")
    return estimate_offset(host, exchanges)
