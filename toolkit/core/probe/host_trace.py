"""host_trace.csv: CPU of the benchmark's process tree and of the server's, per process and busiest thread.

Format (schema 1, docs/probe.md): one row per process per tick on the probe's clock. `cpu_pct` is % of ONE
core (100 = a full core) over the interval since that pid's previous sample (utime+stime of all its threads,
/proc/<pid>/stat); `busiest_thread_cpu_pct` likewise for its busiest thread (/proc/<pid>/task/<tid>/stat). The
first sample of a pid has no interval yet: its cells are empty. Python's GIL makes one thread at ~100 % the
signature of a host-bound process even when the process total looks modest, hence the busiest thread.

Pure: parsing /proc's stat lines, the CSV, and per-window figures. Reading /proc is adapters/host_sampler.py.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.timeline_csv import header_line, number, parse_rows, row_line

HOST_TRACE_SCHEMA_VERSION = 1
HOST_TRACE_MAGIC = "# toolkit-probe-host-trace"
COLUMNS: tuple[str, ...] = ("t_s", "role", "pid", "ppid", "comm", "cpu_pct", "threads", "busiest_tid",
                            "busiest_thread", "busiest_thread_cpu_pct", "error")
ROLES = ("bench", "server")

Row = dict[str, float | int | str | bool | None]


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks (os.sysconf("SC_CLK_TCK"))
    threads: int


def parse_proc_stat(text: str) -> ProcStat:
    """One /proc/<pid>/stat (or task/<tid>/stat) line. comm may hold spaces and parentheses: split at the last ')'.

    Fields after comm (proc(5)): state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
    stime cutime cstime priority nice num_threads ..."""
    open_i, close_i = text.find("("), text.rfind(")")
    if open_i < 0 or close_i < open_i:
        raise ValueError(f"not a /proc stat line: {text[:60]!r}")
    rest = text[close_i + 2:].split()
    return ProcStat(pid=int(text[:open_i]), comm=text[open_i + 1:close_i], state=rest[0], ppid=int(rest[1]),
                    cpu_ticks=int(rest[11]) + int(rest[12]), threads=int(rest[17]))


def descendants(root: int, parent_of: dict[int, int]) -> list[int]:
    """root and every process below it, from a pid -> ppid map (one /proc scan)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    seen: set[int] = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        todo.extend(children.get(p, ()))
    return sorted(out)


def host_header(meta: dict[str, str]) -> str:
    return header_line(HOST_TRACE_MAGIC, HOST_TRACE_SCHEMA_VERSION, meta) + ",".join(COLUMNS) + "\n"


def format_host_row(row: Row) -> str:
    return row_line(COLUMNS, row)


@dataclass
class HostTrace:
    meta: dict[str, str]
    t_s: list[float] = field(default_factory=list)
    role: list[str] = field(default_factory=list)
    pid: list[int] = field(default_factory=list)
    ppid: list[int | None] = field(default_factory=list)
    comm: list[str] = field(default_factory=list)
    cpu_pct: list[float | None] = field(default_factory=list)
    threads: list[int | None] = field(default_factory=list)
    busiest_tid: list[int | None] = field(default_factory=list)
    busiest_thread: list[str] = field(default_factory=list)
    busiest_thread_cpu_pct: list[float | None] = field(default_factory=list)
    error: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t_s)

    def series(self, role: str, what: str = "cpu_pct") -> tuple[list[float], list[float]]:
        """Per tick of `role`: the tree's total cpu_pct, or ("busiest_thread") the busiest thread of any process."""
        col = self.cpu_pct if what == "cpu_pct" else self.busiest_thread_cpu_pct
        ticks: dict[float, float] = {}
        for i, r in enumerate(self.role):
            if r != role or col[i] is None:
                continue
            v = col[i]
            assert v is not None
            ticks[self.t_s[i]] = ticks.get(self.t_s[i], 0.0) + v if what == "cpu_pct" else max(
                ticks.get(self.t_s[i], 0.0), v)
        t = sorted(ticks)
        return t, [ticks[x] for x in t]


def _int(cell: str, file: str, line: int, column: str) -> int | None:
    v = number(cell, file, line, column)
    return None if v is None else int(v)


def read_host_trace(text: str, file: str = "host_trace.csv") -> HostTrace:
    meta, rows = parse_rows(text, magic=HOST_TRACE_MAGIC, version=HOST_TRACE_SCHEMA_VERSION, columns=COLUMNS,
                            file=file, what="host trace")
    tr = HostTrace(meta)
    for i, c in enumerate(rows):
        line = i + 3
        t = number(c[0], file, line, "t_s")
        pid = _int(c[2], file, line, "pid")
        if t is None or pid is None:
            raise ToolkitError.of("t_s and pid may not be empty", file=file, line=line, fix="repair or cut this line")
        tr.t_s.append(t)
        tr.role.append(c[1])
        tr.pid.append(pid)
        tr.ppid.append(_int(c[3], file, line, "ppid"))
        tr.comm.append(c[4])
        tr.cpu_pct.append(number(c[5], file, line, "cpu_pct"))
        tr.threads.append(_int(c[6], file, line, "threads"))
        tr.busiest_tid.append(_int(c[7], file, line, "busiest_tid"))
        tr.busiest_thread.append(c[8])
        tr.busiest_thread_cpu_pct.append(number(c[9], file, line, "busiest_thread_cpu_pct"))
        tr.error.append(c[10])
    return tr


def host_window(trace: HostTrace, start_s: float, end_s: float) -> dict[str, Any]:
    """Per role over one window: the tree's CPU (mean/max of per-tick sums, in % of one core), and the busiest
    thread's (mean/max), with which process and thread it was (the one with the highest mean)."""
    out: dict[str, Any] = {}
    for role in ROLES:
        t, tree = trace.series(role, "cpu_pct")
        lo, hi = bisect.bisect_left(t, start_s), bisect.bisect_right(t, end_s)
        tree_w = tree[lo:hi]
        per_thread: dict[tuple[int, int | None, str, str], list[float]] = {}
        for i, r in enumerate(trace.role):
            v = trace.busiest_thread_cpu_pct[i]
            if r == role and v is not None and start_s <= trace.t_s[i] <= end_s:
                key = (trace.pid[i], trace.busiest_tid[i], trace.comm[i], trace.busiest_thread[i])
                per_thread.setdefault(key, []).append(v)
        _, busiest = trace.series(role, "busiest_thread")
        t_b, _ = trace.series(role, "busiest_thread")
        blo, bhi = bisect.bisect_left(t_b, start_s), bisect.bisect_right(t_b, end_s)
        bw = busiest[blo:bhi]
        if not tree_w and not bw:
            out[role] = None
            continue
        top = max(per_thread.items(), key=lambda kv: sum(kv[1]) / len(kv[1])) if per_thread else None
        out[role] = {
            "cpu_pct": {"mean": round(sum(tree_w) / len(tree_w), 1) if tree_w else None,
                        "max": round(max(tree_w), 1) if tree_w else None},
            "busiest_thread_cpu_pct": {"mean": round(sum(bw) / len(bw), 1) if bw else None,
                                       "max": round(max(bw), 1) if bw else None},
            "busiest_thread": None if top is None else {
                "pid": top[0][0], "tid": top[0][1], "process": top[0][2], "thread": top[0][3],
                "cpu_pct_mean": round(sum(top[1]) / len(top[1]), 1)},
            "processes": len({trace.pid[i] for i, r in enumerate(trace.role) if r == role}),
        }
    return out
