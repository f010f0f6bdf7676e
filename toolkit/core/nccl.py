"""NCCL's all-reduce between the hosts of a multi-node profile, measured before the model loads: the command
(nccl-tests' `all_reduce_perf` under `mpirun`), the parser of its output and the judgement of what it says.

Pure. The parser reads nccl-tests' own table (src/common.cu: the `#  Rank` device lines, the size rows with
out-of-place and in-place time, algbw, busbw and #wrong, `# Out of bounds values`, `# Avg bus bandwidth`) and
NCCL's own `NCCL_DEBUG=INFO` lines (which network it chose: `NET/IB` or `NET/Socket`), so the real tool and the
lab's stand-in (toolkit/lab/standins/all_reduce_perf, which prints the same) are read by the same code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# The sizes swept: from 8 B (the latency: a decode step's small all-reduces) to 256 MiB (the bandwidth a
# prefill's activations see), doubling, 5 warm-up and 20 timed iterations (nccl-tests' defaults for the last two).
MIN_BYTES = 8
MAX_BYTES = 256 * 1024 * 1024
# A network NCCL reaches the other host over TCP sockets only: the bus bandwidth below which a run between hosts
# says so in its verdict, GB/s (a 25 GbE link tops out near 3 GB/s; RDMA at 100 Gb/s gives ~11).
TCP_CLASS_BUSBW_GBPS = 3.5

_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)\s+"
    r"(?P<time>[\d.]+)\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)\s+(?P<wrong>\S+)"
)
_RANK = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)\s+.*?\bon\s+(?P<host>\S+)\s+device\s+(?P<dev>\d+)\s+\[[^]]*\]\s*(?P<name>.*)$"
)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<v>[\d.]+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>\d+)")
# NCCL's INFO lines: "NET/IB : Using [0]mlx5_0:1/IB ..." or "NET/Socket : Using [0]eth0:10.0.0.1<0>"; the
# channels say "via NET/Socket/0" or "via NET/IB/0".
_NET = re.compile(r"NCCL INFO (?:NET/(?P<plugin>IB|Socket|\w+)\s*:\s*Using\s+(?P<using>.*)|Using network (?P<net>\w+))")
_VIA = re.compile(r"via NET/(?P<plugin>\w+)")
# NCCL's and nccl-tests' own failure lines.
_FAIL = re.compile(r"NCCL WARN .*|Test NCCL failure .*|Test CUDA failure .*|NCCL failure .*")
STANDIN_MARK = "lab stand-in"


@dataclass(frozen=True)
class Row:
    size_b: int
    time_us: float  # out-of-place
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None: not checked (nccl-tests' "N/A" with -c 0)


@dataclass(frozen=True)
class Result:
    rows: tuple[Row, ...]
    ranks: tuple[tuple[int, str, str], ...]  # (rank, host, device name)
    avg_busbw_gbps: float | None
    out_of_bounds: int | None
    transport: str | None  # "IB", "Socket", ... as NCCL named its network; None: not logged
    interfaces: str | None  # what NCCL's network line says it uses ("[0]eth0:10.0.0.1<0>")
    failures: tuple[str, ...]
    standin: bool  # the output says it is the lab's stand-in

    @property
    def latency_us(self) -> float | None:
        """The smallest message's out-of-place time: what one small all-reduce costs."""
        return self.rows[0].time_us if self.rows else None

    @property
    def busbw_gbps(self) -> float | None:
        """The largest message's bus bandwidth: what a large all-reduce gets."""
        return self.rows[-1].busbw_gbps if self.rows else None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h for _, h, _ in self.ranks))


def parse(text: str) -> Result:
    rows: list[Row] = []
    ranks: list[tuple[int, str, str]] = []
    avg = oob = None
    transport = interfaces = None
    failures: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if (m := _RANK.match(line)) is not None:
            ranks.append((int(m["rank"]), m["host"], m["name"].strip()))
        elif (m := _AVG.match(line)) is not None:
            avg = float(m["v"])
        elif (m := _OOB.match(line)) is not None:
            oob = int(m["n"])
        elif not line.startswith("#") and (m := _ROW.match(line)) is not None:
            wrong = m["wrong"]
            rows.append(Row(int(m["size"]), float(m["time"]), float(m["algbw"]), float(m["busbw"]),
                            int(wrong) if wrong.isdigit() else None))
        if (m := _NET.search(line)) is not None:
            transport = m["plugin"] or m["net"] or transport
            interfaces = (m["using"] or "").strip() or interfaces
        elif transport is None and (m := _VIA.search(line)) is not None:
            transport = m["plugin"]
        if (m := _FAIL.search(line)) is not None:
            failures.append(m.group(0).strip())
    return Result(tuple(sorted(rows, key=lambda r: r.size_b)), tuple(ranks), avg, oob, transport, interfaces,
                  tuple(failures), STANDIN_MARK in text)


@dataclass(frozen=True)
class Verdict:
    ok: bool  # False: the deploy stops before the model loads
    kind: str  # "ok", "tcp-only", "misconfigured", "not-run"
    text: str
    notes: list[str] = field(default_factory=list)


def judge(result: Result, *, expected_ranks: int, hosts: Sequence[str], rc: int = 0) -> Verdict:
    """What the run says of the network between the hosts. Misconfigured (the deploy stops): NCCL or the test
    failed, a value came back wrong, fewer ranks joined than the profile has GPUs, or no size was measured. TCP
    only (said, the deploy goes on): NCCL reached the other host over sockets, not RDMA, or got the bandwidth of
    one. Each verdict names the figures it read."""
    where = f"between {', '.join(hosts)}"
    figures = ""
    if result.rows:
        figures = (f"all-reduce latency {result.latency_us:.1f} us ({result.rows[0].size_b} B), bus bandwidth "
                   f"{result.busbw_gbps:.2f} GB/s ({result.rows[-1].size_b // (1024 * 1024)} MiB)")
    notes = [f"the NCCL figures are the lab's stand-in's, not NCCL's: {figures}"] if result.standin and figures else []
    if result.failures or rc != 0:
        first = result.failures[0] if result.failures else f"exit status {rc}"
        return Verdict(False, "misconfigured", f"NCCL's all-reduce {where} failed: {first}", notes)
    if not result.rows:
        return Verdict(False, "misconfigured", f"NCCL's all-reduce {where} measured nothing (no size row in its "
                       "output)", notes)
    wrong = sum(r.wrong or 0 for r in result.rows) + (result.out_of_bounds or 0)
    if wrong:
        return Verdict(False, "misconfigured", f"NCCL's all-reduce {where} returned {wrong} wrong value(s): a "
                       "GPU, its driver or the link corrupts data", notes)
    if result.ranks and len(result.ranks) != expected_ranks:
        return Verdict(False, "misconfigured", f"{len(result.ranks)} rank(s) joined NCCL's all-reduce {where}, "
                       f"the profile has {expected_ranks} GPUs", notes)
    if result.transport == "Socket" or (result.busbw_gbps or 0.0) < TCP_CLASS_BUSBW_GBPS:
        via = f"NET/{result.transport}" if result.transport else "an unnamed network"
        return Verdict(True, "tcp-only", f"NCCL reaches the other host over TCP ({via}"
                       + (f", {result.interfaces}" if result.interfaces else "") + f"), not RDMA: {figures}; "
                       "pipeline stages cross it once a step, a tensor-parallel group over it every layer", notes)
    return Verdict(True, "ok", f"NCCL's all-reduce {where} over NET/{result.transport or '?'}: {figures}", notes)


def command(hosts: Sequence[str], gpus_per_host: int, *, binary: str = "all_reduce_perf",
            env: Sequence[str] = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")) -> list[str]:
    """nccl-tests' all_reduce_perf over every GPU of every host, one process a GPU (`-g 1`), started by mpirun
    from node 0 (nccl-tests spans hosts only under MPI), NCCL's INFO lines on so its network is named."""
    slots = ",".join(f"{h}:{gpus_per_host}" for h in hosts)
    exported = [a for name in env for a in ("-x", name)]
    return ["mpirun", "--allow-run-as-root", "-np", str(gpus_per_host * len(hosts)), "-H", slots,
            "-x", "NCCL_DEBUG=INFO", *exported, binary, "-b", str(MIN_BYTES), "-e", str(MAX_BYTES), "-f", "2",
            "-g", "1"]
