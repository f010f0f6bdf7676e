"""net_trace.csv: a host's network interfaces' byte counters over a fleet run (schema 1), and the rates they give.

Written by a fleet's per-host sampler beside its host timeline (`/proc/net/dev`, one row per interface per tick), so
the inter-node verdict sees the network's rate while the ranks exchange, not only its mean over the benchmark: an
all-reduce near the link's limit for a part of each step reads far lower as a window's mean.
Pure: text in, rates out (core/probe/timeline_csv.py's layout).
"""

from __future__ import annotations

from toolkit.core.probe.numbers import percentile
from toolkit.core.probe.timeline_csv import header_line, parse_rows, row_line

NET_TRACE_MAGIC = "# toolkit-probe-net-trace"
NET_TRACE_SCHEMA_VERSION = 1
COLUMNS = ("t_s", "iface", "rx_bytes", "tx_bytes")
RATE_INTERVAL_S = 1.0  # the verdict's interval


def parse_proc_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """/proc/net/dev's (received, transmitted) bytes per interface, loopback left out."""
    out = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        cells = rest.split()
        if not sep or len(cells) < 9 or name.strip() == "lo":
            continue
        out[name.strip()] = (int(cells[0]), int(cells[8]))
    return out


def net_header(meta: dict[str, str]) -> str:
    return header_line(NET_TRACE_MAGIC, NET_TRACE_SCHEMA_VERSION, meta) + ",".join(COLUMNS) + "\n"


def net_rows(t_s: float, counters: dict[str, tuple[int, int]]) -> list[str]:
    return [row_line(COLUMNS, {"t_s": round(t_s, 4), "iface": name, "rx_bytes": rx, "tx_bytes": tx})
            for name, (rx, tx) in sorted(counters.items())]


NetSeries = dict[str, list[tuple[float, int, int]]]  # interface -> (t_s, rx bytes, tx bytes), in time order


def read_net_trace(text: str, file: str = "net_trace.csv") -> NetSeries:
    _meta, rows = parse_rows(text, magic=NET_TRACE_MAGIC, version=NET_TRACE_SCHEMA_VERSION, columns=COLUMNS,
                             file=file, what="network trace")
    out: NetSeries = {}
    for r in rows:
        out.setdefault(r[1], []).append((float(r[0]), int(r[2]), int(r[3])))
    return out


def shifted(series: NetSeries, times: dict[str, list[float]]) -> NetSeries:
    """`series` with each interface's times replaced (by the controller's clock)."""
    return {i: [(t, rx, tx) for t, (_, rx, tx) in zip(times[i], s, strict=True)] for i, s in series.items()}


def interval_rates_gb_s(series: NetSeries, start_s: float, end_s: float,
                        width_s: float = RATE_INTERVAL_S) -> list[float]:
    """The busiest interface's busier direction per interval of `width_s` inside the window, in GB/s (10^9 bytes:
    nccl-tests' unit). The busiest, not the sum: a bridge and the port under it count the same bytes twice."""
    best: list[float] = []
    for rows in series.values():
        rows = [r for r in rows if start_s <= r[0] <= end_s]
        rates: list[float] = []
        i = 0
        for j in range(1, len(rows)):
            span = rows[j][0] - rows[i][0]
            if span >= width_s or (j == len(rows) - 1 and span > 0):
                moved = max(rows[j][1] - rows[i][1], rows[j][2] - rows[i][2])
                if moved >= 0:  # a counter that went back (an interface reset) says nothing
                    rates.append(moved / span / 1e9)
                i = j
        if sum(rates) > sum(best):
            best = rates
    return best


def rate_figures(rates: list[float]) -> dict[str, float | None]:
    s = sorted(rates)
    return {"net_gb_s_p95": percentile(s, 95) if s else None, "net_gb_s_max": s[-1] if s else None}
