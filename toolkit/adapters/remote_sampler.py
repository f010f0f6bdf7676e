"""A fleet's per-host sampler over SSH: the toolkit's own `probe run --until-eof` on each host (the same NVML
sampler, server scrape and /proc timeline a single-host probe runs), its run directory brought back with tar.

One SSH session per sampler for the whole run: its stdin is the sampler's lifeline. Closing it ends the run on the
host as a benchmark's exit would (the sampler's stand-in benchmark reads stdin to its end), and a controller that
dies closes it too, so no sampler outlives its controller. The host needs the toolkit's venv (the `bench_probe`
role installs it) and nothing else; OpenSSH is the only client here.
"""

from __future__ import annotations

import contextlib
import io
import select
import shlex
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.fleet import SAMPLER_READY
from toolkit.core.probe.net_trace import parse_proc_net_dev

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR")


def ssh_argv(name: str, host_vars: dict[str, Any]) -> list[str]:
    """The argv prefix that runs a command on inventory host `name` as Ansible would reach it (address, port, user,
    key, its ssh args); empty for `ansible_connection: local`."""
    if host_vars.get("ansible_connection") == "local":
        return []
    for key in ("ansible_host", "ansible_user", "ansible_ssh_private_key_file", "ansible_ssh_common_args",
                "ansible_ssh_extra_args"):
        value = host_vars.get(key)
        if isinstance(value, str) and "{{" in value:
            raise ToolkitError.of(f"{name}'s {key} is a template ({value!r}): the fleet probe reaches hosts with "
                                  "ssh directly, without Ansible's templating", field=key,
                                  fix=f"give {name} a literal {key} in the inventory")
    argv = ["ssh", *SSH_OPTIONS]
    if host_vars.get("ansible_port"):
        argv += ["-p", str(host_vars["ansible_port"])]
    if host_vars.get("ansible_ssh_private_key_file"):
        argv += ["-i", str(host_vars["ansible_ssh_private_key_file"]), "-o", "IdentitiesOnly=yes"]
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        argv += shlex.split(str(host_vars.get(key) or ""))
    user = host_vars.get("ansible_user")
    address = host_vars.get("ansible_host") or name
    argv.append(f"{user}@{address}" if user else str(address))
    return argv


def exec_prefix(name: str, host_vars: dict[str, Any]) -> list[str]:
    """`toolkit_probe_exec_prefix`: argv put before every command the fleet probe runs on the host (its sampler, its
    clock, its counters, the fetch), e.g. `pct exec 100 --` for a container reached through its Proxmox host."""
    prefix = host_vars.get("toolkit_probe_exec_prefix") or []
    if isinstance(prefix, str):
        prefix = shlex.split(prefix)
    if not isinstance(prefix, list):
        raise ToolkitError.of(f"{name}'s toolkit_probe_exec_prefix is not a list", field="toolkit_probe_exec_prefix",
                              fix="give a YAML list, e.g. [pct, exec, '100', '--']")
    return [str(p) for p in prefix]


def _remote(ssh: Sequence[str], argv: Sequence[str]) -> list[str]:
    """argv run on the host: through ssh as one shell-quoted command line, or as is for a local host."""
    return [*ssh, shlex.join(argv)] if ssh else list(argv)


def remote_argv(ssh: Sequence[str], argv: Sequence[str]) -> list[str]:
    """argv run on the host (through `ssh_argv`'s prefix, or here for a local host), for a caller's own process."""
    return _remote(ssh, argv)


def run_on(host: str, ssh: Sequence[str], argv: Sequence[str], timeout_s: float = 60.0) -> bytes:
    """A short command on the host; its stdout. Raises ToolkitError naming the host and the command's stderr."""
    try:
        proc = subprocess.run(_remote(ssh, argv), capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ToolkitError.of(f"{host}: {shlex.join(argv)} did not finish: {err}", field=host,
                              fix="check that the host is reachable over SSH (toolkit host doctor)") from None
    if proc.returncode != 0:
        last = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise ToolkitError.of(f"{host}: {shlex.join(argv)} failed: {last[0]}", field=host,
                              fix="check that the host is reachable over SSH and has the toolkit's venv")
    return proc.stdout


def net_counters(host: str, ssh: Sequence[str], prefix: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
    """The host's interfaces' (rx, tx) byte counters."""
    return parse_proc_net_dev(run_on(host, ssh, [*prefix, "cat", "/proc/net/dev"], timeout_s=20).decode())


class RemoteSampler:
    """`argv` (a `toolkit probe run --until-eof ...` command line) running on `host` for the length of a run."""

    def __init__(self, host: str, ssh: Sequence[str], argv: Sequence[str], log: Path) -> None:
        self.host = host
        self.ssh = list(ssh)
        self.argv = list(argv)
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_f: IO[bytes] | None = None

    def start(self) -> None:
        self._log_f = self.log.open("wb")
        try:
            self._proc = subprocess.Popen(_remote(self.ssh, self.argv), stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._log_f)
        except OSError as err:
            raise ToolkitError.of(f"cannot start the sampler on {self.host}: {err}", field=self.host,
                                  fix="check toolkit_probe_sampler_command in the inventory, and that ssh is "
                                  "installed here") from None

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the sampler says it samples. Raises ToolkitError with its last words when it ends or stays silent."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                chunk = proc.stdout.read1(4096)  # type: ignore[attr-defined]
                if not chunk:
                    break  # the sampler ended before it sampled
                buf += chunk
                if SAMPLER_READY.encode() in buf:
                    return
            elif proc.poll() is not None:
                break
        self.stop(timeout_s=5)
        why = "ended" if proc.returncode is not None else f"said nothing in {timeout_s:.0f} s"
        raise ToolkitError.of(f"the sampler on {self.host} {why} before sampling: {self.last_words()}",
                              field=self.host, fix=f"see {self.log}; the host needs the toolkit's venv "
                              "(toolkit apply --probe installs it) and its GPU source")

    def last_words(self) -> str:
        text = self.log.read_text(errors="replace").strip() if self.log.exists() else ""
        return (text.splitlines()[-1:] or ["no output"])[0]

    def stop(self, timeout_s: float = 120.0) -> int | None:
        """Close its stdin (the run's end on the host), wait for it to write its files; its exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # already gone with the process
                proc.stdin.close()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._log_f is not None:
            self._log_f.close()
            self._log_f = None
        return proc.returncode


def fetch_dir(host: str, ssh: Sequence[str], remote_dir: str, local_dir: Path, prefix: Sequence[str] = ()
              ) -> list[str]:
    """Every file of `remote_dir` on the host into `local_dir` (one tar stream); the names brought."""
    data = run_on(host, ssh, [*prefix, "tar", "-C", remote_dir, "-cf", "-", "."], timeout_s=300)
    local_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(local_dir, members=members, filter="data")
    return sorted(m.name.removeprefix("./") for m in members)
