"""Ansible runner events in, a per-host result out: pure, no I/O.

ansible-runner hands us one dict per event (`event`, `event_data` with `host`, `task`, `res`, ...);
`playbook_on_stats` closes the run with per-host counters. Nothing above the adapter should see those
raw dicts, so this module turns them into small typed values the CLI can render and tests can assert on.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Runner event name -> our kind. Everything else (verbose, warnings, includes) is "other".
_KINDS = {
    "playbook_on_play_start": "play_start",
    "playbook_on_task_start": "task_start",
    "playbook_on_handler_task_start": "task_start",
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
    "runner_item_on_failed": "item_failed",
    "playbook_on_stats": "stats",
}

# Ansible replaces a no_log task's result with this text; we keep it as the only message.
NO_LOG_MESSAGE = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


@dataclass(frozen=True)
class PlaybookEvent:
    """One thing that happened in a run, as a command wants to show it."""

    kind: str  # play_start, task_start, ok, changed, failed, unreachable, skipped, item_failed, stats, other
    counter: int = 0
    play: str = ""
    task: str = ""
    host: str = ""
    message: str = ""
    ignore_errors: bool = False
    result: Mapping[str, Any] = field(default_factory=dict)  # the module's return values (censored under no_log)


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class TaskFailure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass
class PlaybookResult:
    rc: int
    status: str  # runner's: successful, failed, timeout, canceled
    hosts: dict[str, HostStats]
    failures: list[TaskFailure]
    artifacts_dir: Path | None
    events: list[PlaybookEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.failures

    def results_of(self, task: str) -> dict[str, Mapping[str, Any]]:
        """host -> module result of the task of this name that ran ok (for read-only report tasks)."""
        return {e.host: e.result for e in self.events if e.kind in ("ok", "changed") and e.task == task}


def failure_message(res: Mapping[str, Any]) -> str:
    """The most useful single line from a failed module result."""
    if res.get("censored"):
        return NO_LOG_MESSAGE
    items = res.get("results")
    if isinstance(items, list):
        # A loop: Ansible's own msg is only "One or more items failed"; the failed item says why.
        failed = [i for i in items if isinstance(i, Mapping) and i.get("failed")]
        if failed:
            item = failed[0].get("item")
            return f"item {item!r}: {failure_message(failed[0])}"
    parts: list[str] = []
    msg = res.get("msg")
    if isinstance(msg, str | int | float) and str(msg).strip():
        parts.append(str(msg).strip())
    elif isinstance(msg, list | tuple):
        parts.append("; ".join(str(m) for m in msg))
    stderr = res.get("stderr")
    if isinstance(stderr, str) and stderr.strip() and stderr.strip() not in parts:
        parts.append(stderr.strip().splitlines()[-1])
    if not parts:
        stdout = res.get("stdout")
        if isinstance(stdout, str) and stdout.strip():
            parts.append(stdout.strip().splitlines()[-1])
    if not parts and "rc" in res:
        parts.append(f"exit status {res['rc']}")
    return " | ".join(parts) or "failed (no message)"


def diff_text(result: Mapping[str, Any]) -> str:
    """What a changed task's `--diff` says, as unified diffs (Ansible's before/after pairs, or the text a module
    prepared itself); a loop's items in order. Empty when the task reported no diff, or hid it (no_log)."""
    if result.get("censored"):
        return ""
    items = result.get("results")
    if isinstance(items, list):
        return "\n".join(t for t in (diff_text(i) for i in items if isinstance(i, Mapping)) if t)
    raw = result.get("diff")
    entries = raw if isinstance(raw, list) else [raw] if isinstance(raw, Mapping) else []
    out: list[str] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        if entry.get("prepared"):
            out.append(str(entry["prepared"]).rstrip("\n"))
            continue
        before, after = entry.get("before"), entry.get("after")
        if before is None and after is None:
            continue
        if not isinstance(before, str) or not isinstance(after, str):
            # A module's state rather than a file (file: state absent -> directory): one line each way.
            out.append(f"- {before!r}\n+ {after!r}")
            continue
        lines = difflib.unified_diff(before.splitlines(), after.splitlines(),
                                     fromfile=str(entry.get("before_header") or "before"),
                                     tofile=str(entry.get("after_header") or "after"), lineterm="")
        out.append("\n".join(lines))
    return "\n".join(t for t in out if t)


# What SSH's refusal of a host key reads as: through ansible-core's own SSH connection (with the address), and
# through Mitogen's (the toolkit's strategy, adapters/ansible.py), which names no address.
_HOST_KEY_REFUSED = ("Host key verification failed", "SSH reported an unrecognized or mismatching host key")


def host_key_fix(message: str, address: str | None = None) -> str:
    """The fix for an SSH host key that known_hosts lacks or contradicts (host-key checking is on: run_playbook),
    appended to the connection's refusal; other messages unchanged. `address` is the host's, where the message
    names none."""
    if not any(refused in message for refused in _HOST_KEY_REFUSED):
        return message
    found = re.search(r'remote host "([^"]+)"', message)
    address = found.group(1) if found else (address or "ADDRESS")
    return (f"{message}\nFix: the host's SSH key is not in known_hosts, or differs from the one there. Check that "
            f"{address} is the machine you mean, then `ssh-keyscan -H {address} >> ~/.ssh/known_hosts` (a "
            f"reinstalled host or a re-created container: `ssh-keygen -R {address}` first); or give the host the "
            "inventory variable "
            "ansible_ssh_common_args: '-o StrictHostKeyChecking=accept-new' (trust its key on first contact, as for "
            "containers the toolkit creates), or '-o UserKnownHostsFile=FILE' where its key is pinned")


def event_from_runner(raw: Mapping[str, Any], addresses: Mapping[str, str] | None = None) -> PlaybookEvent:
    """Translate one ansible-runner event dict. `addresses`: each inventory host's address, for a fix whose
    message names none."""
    name = str(raw.get("event", ""))
    data = raw.get("event_data") or {}
    kind = _KINDS.get(name, "other")
    res = data.get("res") if isinstance(data.get("res"), Mapping) else {}
    assert isinstance(res, Mapping)
    if kind == "ok" and res.get("changed"):
        kind = "changed"
    message = ""
    if kind in ("failed", "unreachable", "item_failed"):
        message = failure_message(res)
    if kind == "unreachable":
        message = host_key_fix(message, (addresses or {}).get(str(data.get("host") or "")))
    elif kind == "play_start":
        message = str(data.get("name") or data.get("play") or "")
    return PlaybookEvent(
        kind=kind,
        counter=int(raw.get("counter") or 0),
        play=str(data.get("play") or ""),
        task=str(data.get("task") or ""),
        host=str(data.get("host") or data.get("remote_addr") or ""),
        message=message,
        ignore_errors=bool(data.get("ignore_errors")),
        result=dict(res),
    )


def stats_from_event(data: Mapping[str, Any]) -> dict[str, HostStats]:
    """Per-host counters from a `playbook_on_stats` event's data (keys as Ansible's callback writes them)."""
    hosts: dict[str, HostStats] = {}
    columns = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable", "skipped": "skipped"}
    for src, dst in columns.items():
        for host, count in (data.get(src) or {}).items():
            setattr(hosts.setdefault(str(host), HostStats()), dst, int(count))
    for host in data.get("processed") or {}:
        hosts.setdefault(str(host), HostStats())
    return hosts


def summarize(
    raw_events: Iterable[Mapping[str, Any]],
    *,
    rc: int,
    status: str,
    artifacts_dir: Path | None,
    addresses: Mapping[str, str] | None = None,
) -> PlaybookResult:
    """Fold a run's events into one result. Ignored failures (`ignore_errors: true`) are not failures."""
    events: list[PlaybookEvent] = []
    hosts: dict[str, HostStats] = {}
    failures: list[TaskFailure] = []
    for raw in raw_events:
        event = event_from_runner(raw, addresses)
        events.append(event)
        if event.kind == "stats":
            hosts = stats_from_event(raw.get("event_data") or {})
        elif event.kind in ("failed", "unreachable") and not event.ignore_errors:
            failures.append(
                TaskFailure(
                    host=event.host, task=event.task, message=event.message, unreachable=event.kind == "unreachable"
                )
            )
    events.sort(key=lambda e: e.counter)
    if not hosts:
        # The run died before the stats event (a syntax error, a missing inventory): count what we saw.
        for event in events:
            if not event.host:
                continue
            stats = hosts.setdefault(event.host, HostStats())
            if event.kind in ("ok", "changed"):
                stats.ok += 1
                stats.changed += event.kind == "changed"
            elif event.kind == "failed" and not event.ignore_errors:
                stats.failed += 1
            elif event.kind == "unreachable":
                stats.unreachable += 1
            elif event.kind == "skipped":
                stats.skipped += 1
    return PlaybookResult(
        rc=rc, status=status, hosts=hosts, failures=failures, artifacts_dir=artifacts_dir, events=events
    )


def redact(text: str, secrets: Iterable[str], mask: str = "********") -> str:
    """Replace every occurrence of each secret value (longest first, so one secret inside another is covered)."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, mask)
    return text
