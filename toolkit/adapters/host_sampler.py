"""The host timeline from /proc: CPU of the benchmark's and the server's process trees, per process and thread.

/proc rather than psutil: the probe must run on the GPU box with the standard library only (no wheel to carry),
and what it needs is two integers per task (utime+stime of /proc/<pid>/stat and task/<tid>/stat) that psutil
would read from the same files. One tick scans /proc/[0-9]*/stat once (the pid -> ppid map finds the trees'
new children, and gives each process's CPU), then reads task/*/stat of the trees' processes only.
Cost per tick is measured by benchmarks/bench_timelines.py.

`server_pid_of_unit(unit)` finds a systemd unit's MainPID (`systemctl show`); `--server-pid` overrides it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.host_trace import ProcStat, descendants, format_host_row, host_header, parse_proc_stat
from toolkit.core.probe.net_trace import net_header, net_rows, parse_proc_net_dev

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_stat(path: Path) -> ProcStat | None:
    try:
        return parse_proc_stat(path.read_text())
    except (OSError, ValueError, IndexError):
        return None  # the task ended between listing and reading: gone, not an error


def server_pid_of_unit(unit: str) -> int:
    """The unit's MainPID. Raises ToolkitError (exit 2, before anything runs) when it has none."""
    try:
        proc = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ToolkitError.of(f"cannot ask systemd for {unit}'s MainPID: {err}", field="--server-unit",
                              fix="give --server-pid PID instead") from None
    pid = proc.stdout.strip()
    if proc.returncode != 0 or not pid.isdigit() or int(pid) == 0:
        raise ToolkitError.of(f"systemd unit {unit} has no running main process (MainPID={pid or '?'})",
                              field="--server-unit", fix=f"start it (systemctl start {unit}) or give --server-pid")
    return int(pid)


class HostSampler:
    """tick(t_s) -> CSV lines, one per process of each watched tree. Roots are set as they become known."""

    def __init__(self, proc: Path = PROC, clk_tck: int = CLK_TCK) -> None:
        self.proc = proc
        self.clk_tck = clk_tck
        self.roots: dict[str, int] = {}
        self._prev_proc: dict[int, tuple[float, int]] = {}
        self._prev_task: dict[tuple[int, int], tuple[float, int]] = {}
        self.rows = 0

    def header(self, sample_hz: float) -> str:
        return host_header({"sample_hz": str(sample_hz), "source": "proc"})

    def set_root(self, role: str, pid: int) -> None:
        self.roots[role] = pid

    def _pct(self, prev: tuple[float, int] | None, t_s: float, ticks: int) -> float | None:
        if prev is None or t_s <= prev[0]:
            return None
        return round(100.0 * (ticks - prev[1]) / self.clk_tck / (t_s - prev[0]), 2)

    def tick(self, t_s: float) -> list[str]:
        if not self.roots:
            return []
        stats: dict[int, ProcStat] = {}
        for d in self.proc.iterdir():
            if d.name.isdigit():
                st = _read_stat(d / "stat")
                if st is not None:
                    stats[st.pid] = st
        parent_of = {p: s.ppid for p, s in stats.items()}
        lines: list[str] = []
        seen: set[int] = set()
        seen.add(os.getpid())  # the probe itself is neither (it may run inside the server's tree in a test)
        # The benchmark's tree first: a process in both trees (a benchmark started under the server's tree)
        # is the benchmark's.
        for role in sorted(self.roots, key=lambda r: r != "bench"):
            root = self.roots[role]
            for pid in descendants(root, parent_of) if root in stats else []:
                if pid in seen:
                    continue
                seen.add(pid)
                st = stats[pid]
                lines.append(format_host_row(self._process_row(t_s, role, st)))
        self.rows += len(lines)
        live = set(stats)
        self._prev_proc = {p: v for p, v in self._prev_proc.items() if p in live}
        self._prev_task = {k: v for k, v in self._prev_task.items() if k[0] in live}
        return lines

    def _process_row(self, t_s: float, role: str, st: ProcStat) -> dict[str, float | int | str | bool | None]:
        cpu = self._pct(self._prev_proc.get(st.pid), t_s, st.cpu_ticks)
        self._prev_proc[st.pid] = (t_s, st.cpu_ticks)
        best: tuple[float, int, str] | None = None
        error = ""
        try:
            tids = [int(x) for x in os.listdir(self.proc / str(st.pid) / "task") if x.isdigit()]
        except OSError as err:
            tids, error = [], f"task list: {err.strerror or err}"
        for tid in tids:
            ts = _read_stat(self.proc / str(st.pid) / "task" / str(tid) / "stat")
            if ts is None:
                continue
            key = (st.pid, tid)
            pct = self._pct(self._prev_task.get(key), t_s, ts.cpu_ticks)
            self._prev_task[key] = (t_s, ts.cpu_ticks)
            if pct is not None and (best is None or pct > best[0]):
                best = (pct, tid, ts.comm)
        return {"t_s": round(t_s, 4), "role": role, "pid": st.pid, "ppid": st.ppid, "comm": st.comm, "cpu_pct": cpu,
                "threads": st.threads, "busiest_tid": best[1] if best else None,
                "busiest_thread": best[2] if best else None, "busiest_thread_cpu_pct": best[0] if best else None,
                "error": error}


class NetSampler:
    """tick(t_s) -> CSV lines of every interface's byte counters (net_trace.csv: a fleet's inter-node traffic)."""

    def __init__(self, proc: Path = PROC) -> None:
        self.path = proc / "net" / "dev"
        self.rows = 0

    def header(self, sample_hz: float) -> str:
        return net_header({"sample_hz": str(sample_hz), "source": "proc_net_dev"})

    def tick(self, t_s: float) -> list[str]:
        lines = net_rows(t_s, parse_proc_net_dev(self.path.read_text()))
        self.rows += len(lines)
        return lines
