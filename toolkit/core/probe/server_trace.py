"""server_trace.csv: SGLang's own view of the run, one row per scrape of /metrics (and /v1/loads).

Format (schema 1, docs/probe.md): `t_s` is the probe's clock (the same as trace.csv); a row with ok=0 is a
gap (the server did not answer or its exposition did not parse) with `error` saying why; an empty cell is
"unavailable". Gauges are SGLang 0.5.9's (`sglang:` names, srt/metrics/collector.py): counts are summed
over label sets (dp ranks, the `pid` label of mode-less gauges), ratios (token_usage) averaged. Counters and the
histograms' `_sum`/`_count` are the raw cumulative values; `counter_reset` = 1 on the first row after a counter
went backwards (a server restart), and no rate is ever taken across such a pair.

Pure: `scrape_row` turns already-parsed samples (the adapter's prometheus_client output, as plain tuples) into a
row; `read_server_trace` parses the file; `counter_rate` and `server_window` are what summary and verdict use.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.timeline_csv import header_line, number, parse_rows, row_line

SERVER_TRACE_SCHEMA_VERSION = 1
SERVER_TRACE_MAGIC = "# toolkit-probe-server-trace"

GAUGES: dict[str, str] = {  # column -> SGLang 0.5.9 sample name
    "num_running_reqs": "sglang:num_running_reqs",
    "num_queue_reqs": "sglang:num_queue_reqs",
    "token_usage": "sglang:token_usage",
    "num_used_tokens": "sglang:num_used_tokens",
    "max_total_num_tokens": "sglang:max_total_num_tokens",
    "gen_throughput_tok_s": "sglang:gen_throughput",
}
RATIO_GAUGES = frozenset({"token_usage"})
# (column, sample name, label filter): `realtime_tokens_total` moves on every forward pass, the others at finish.
COUNTERS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("realtime_prefill_compute_tokens_total", "sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    ("realtime_prefill_cache_tokens_total", "sglang:realtime_tokens_total", {"mode": "prefill_cache"}),
    ("realtime_decode_tokens_total", "sglang:realtime_tokens_total", {"mode": "decode"}),
    ("prompt_tokens_total", "sglang:prompt_tokens_total", {}),
    ("generation_tokens_total", "sglang:generation_tokens_total", {}),
    ("cached_tokens_total", "sglang:cached_tokens_total", {}),
    ("num_requests_total", "sglang:num_requests_total", {}),
    ("num_aborted_requests_total", "sglang:num_aborted_requests_total", {}),
    ("retracted_requests_total", "sglang:num_retracted_requests_total", {}),
)
HISTOGRAMS: dict[str, str] = {  # column prefix -> histogram family
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
    "queue_time": "sglang:queue_time_seconds",
}
COUNTER_COLUMNS: tuple[str, ...] = tuple(c for c, _, _ in COUNTERS) + tuple(
    f"{p}_{k}" for p in HISTOGRAMS for k in ("sum_s", "count"))

COLUMNS: tuple[str, ...] = (
    "t_s", "ok", "error",
    "num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens", "max_total_num_tokens",
    "gen_throughput_tok_s", "max_running_requests", "num_retracted_reqs",
    "realtime_prefill_compute_tokens_total", "realtime_prefill_cache_tokens_total", "realtime_decode_tokens_total",
    "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
    "num_requests_total", "num_aborted_requests_total", "retracted_requests_total",
    "counter_reset",
    "ttft_sum_s", "ttft_count", "itl_sum_s", "itl_count", "e2e_sum_s", "e2e_count", "queue_time_sum_s",
    "queue_time_count",
)
VALUE_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in ("t_s", "ok", "error", "counter_reset"))

Sample = tuple[str, dict[str, str], float]  # (sample name, labels, value), as prometheus_client yields them
Row = dict[str, float | int | str | bool | None]


def server_header(meta: dict[str, str]) -> str:
    return header_line(SERVER_TRACE_MAGIC, SERVER_TRACE_SCHEMA_VERSION, meta) + ",".join(COLUMNS) + "\n"


def format_server_row(row: Row) -> str:
    return row_line(COLUMNS, row)


def _match(labels: dict[str, str], want: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def scrape_row(samples: Iterable[Sample] | None, loads: dict[str, Any] | None) -> tuple[Row, list[str]]:
    """One row's values from a parsed /metrics (None: not served) and /v1/loads (None: not read this time).

    Returns (row, the columns no source gave). With /metrics missing, /v1/loads' live per-rank figures stand in
    for the gauges (SGLang computes them on each call, with or without --enable-metrics); counters stay empty."""
    row: Row = {}
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in samples or ():
        by_name.setdefault(name, []).append((labels, value))
    for col, name in GAUGES.items():
        vals = [v for _, v in by_name.get(name, [])]
        if vals:
            row[col] = sum(vals) / len(vals) if col in RATIO_GAUGES else sum(vals)
    retracted = [v for _, v in by_name.get("sglang:num_retracted_reqs", [])]
    if retracted:
        row["num_retracted_reqs"] = sum(retracted)
    for col, name, want in COUNTERS:
        series = by_name.get(name, [])
        if name == "sglang:cached_tokens_total" and any(lb.get("cache_source") == "total" for lb, _ in series):
            want = {"cache_source": "total"}  # device + host + storage already summed by SGLang
        vals = [v for lb, v in series if _match(lb, want)]
        if vals:
            row[col] = sum(vals)
    for prefix, fam in HISTOGRAMS.items():
        for suffix, col in (("_sum", f"{prefix}_sum_s"), ("_count", f"{prefix}_count")):
            vals = [v for _, v in by_name.get(fam + suffix, [])]
            if vals:
                row[col] = sum(vals)
    ranks = [r for r in (loads or {}).get("loads") or [] if isinstance(r, dict)]
    caps = [r["max_running_requests"] for r in ranks if isinstance(r.get("max_running_requests"), int | float)]
    if caps:
        row["max_running_requests"] = sum(caps)
    if samples is None and ranks:
        for col, key in (("num_running_reqs", "num_running_reqs"), ("num_queue_reqs", "num_waiting_reqs"),
                         ("num_used_tokens", "num_used_tokens"), ("max_total_num_tokens", "max_total_num_tokens"),
                         ("gen_throughput_tok_s", "gen_throughput"), ("token_usage", "token_usage")):
            vals = [float(r[key]) for r in ranks if isinstance(r.get(key), int | float)]
            if vals:
                row[col] = sum(vals) / len(vals) if col in RATIO_GAUGES else sum(vals)
    missing = [c for c in VALUE_COLUMNS if c not in row]
    return row, missing


def went_backwards(prev: Row | None, row: Row) -> bool:
    """True when any cumulative column is lower than in the previous good row: the server restarted."""
    if prev is None:
        return False
    for c in COUNTER_COLUMNS:
        a, b = prev.get(c), row.get(c)
        if isinstance(a, int | float) and isinstance(b, int | float) and b < a:
            return True
    return False


@dataclass
class ServerTrace:
    meta: dict[str, str]
    t_s: list[float] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)
    error: list[str] = field(default_factory=list)
    counter_reset: list[bool] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=lambda: {c: [] for c in VALUE_COLUMNS})

    def __len__(self) -> int:
        return len(self.t_s)

    def column(self, name: str) -> list[float | None]:
        return self.values[name]

    @property
    def gaps(self) -> int:
        return sum(1 for x in self.ok if not x)

    @property
    def resets(self) -> int:
        return sum(self.counter_reset)


def read_server_trace(text: str, file: str = "server_trace.csv") -> ServerTrace:
    meta, rows = parse_rows(text, magic=SERVER_TRACE_MAGIC, version=SERVER_TRACE_SCHEMA_VERSION, columns=COLUMNS,
                            file=file, what="server trace")
    tr = ServerTrace(meta)
    idx = {c: COLUMNS.index(c) for c in VALUE_COLUMNS}
    for i, cells in enumerate(rows):
        line = i + 3
        t = number(cells[0], file, line, "t_s")
        if t is None:
            raise ToolkitError.of("field t_s is empty", file=file, line=line, fix="repair or cut this line")
        if tr.t_s and t < tr.t_s[-1]:
            raise ToolkitError.of(f"t_s goes backwards ({t} after {tr.t_s[-1]})", file=file, line=line,
                                  fix="the trace was edited or concatenated; re-record the run")
        tr.t_s.append(t)
        tr.ok.append(cells[1] == "1")
        tr.error.append(cells[2])
        tr.counter_reset.append(cells[COLUMNS.index("counter_reset")] == "1")
        for c, j in idx.items():
            tr.values[c].append(number(cells[j], file, line, c))
    return tr


def _window(trace: ServerTrace, start_s: float, end_s: float) -> range:
    return range(bisect.bisect_left(trace.t_s, start_s), bisect.bisect_right(trace.t_s, end_s))


def counter_delta(trace: ServerTrace, column: str, start_s: float, end_s: float) -> tuple[float, float] | None:
    """(increase, seconds it covers) of a cumulative column over consecutive good rows inside the window.

    A pair whose later row follows a restart (counter_reset, or a value lower than before) is skipped, so a
    restart never shows as negative throughput; a gap row (ok=0) is stepped over (counters are cumulative).
    None when fewer than two good rows with a value fall inside the window."""
    col = trace.values[column]
    prev: tuple[float, float] | None = None
    total = covered = 0.0
    pairs = 0
    for i in _window(trace, start_s, end_s):
        v = col[i]
        if not trace.ok[i] or v is None:
            continue
        if prev is not None and not trace.counter_reset[i] and v >= prev[1]:
            total += v - prev[1]
            covered += trace.t_s[i] - prev[0]
            pairs += 1
        prev = (trace.t_s[i], v)
    return (total, covered) if pairs else None


def counter_rate(trace: ServerTrace, column: str, start_s: float, end_s: float) -> float | None:
    """Per-second increase of a cumulative column over [start_s, end_s] (reset-safe; None: not enough rows)."""
    d = counter_delta(trace, column, start_s, end_s)
    return d[0] / d[1] if d is not None and d[1] > 0 else None


def counter_series(trace: ServerTrace, column: str) -> tuple[list[float], list[float]]:
    """Per-second rate between consecutive good rows (at their midpoint), restarts and gaps skipped."""
    col = trace.values[column]
    ts: list[float] = []
    rates: list[float] = []
    prev: tuple[float, float] | None = None
    for i, t in enumerate(trace.t_s):
        v = col[i]
        if not trace.ok[i] or v is None:
            continue
        if prev is not None and not trace.counter_reset[i] and v >= prev[1] and t > prev[0]:
            ts.append((t + prev[0]) / 2)
            rates.append((v - prev[1]) / (t - prev[0]))
        prev = (t, v)
    return ts, rates


def counter_intervals(trace: ServerTrace, column: str, start_s: float, end_s: float, width_s: float
                      ) -> list[float]:
    """Per-second rate of a cumulative column in each consecutive `width_s` slice of [start_s, end_s] (a slice
    without two good rows is left out): a run's own spread of its throughput, in order."""
    out: list[float] = []
    t = start_s
    while t + width_s <= end_s + 1e-9:
        rate = counter_rate(trace, column, t, t + width_s)
        if rate is not None:
            out.append(rate)
        t += width_s
    return out


def _stats(vals: list[float]) -> dict[str, float | None]:
    if not vals:
        return {"mean": None, "max": None}
    return {"mean": round(sum(vals) / len(vals), 4), "max": round(max(vals), 4)}


def server_window(trace: ServerTrace, start_s: float, end_s: float) -> dict[str, Any]:
    """The server's figures over one window (summary.json `server`; keys in docs/probe.md)."""
    rows = [i for i in _window(trace, start_s, end_s) if trace.ok[i]]

    def vals(c: str) -> list[float]:
        return [x for i in rows if (x := trace.values[c][i]) is not None]

    out_rate = counter_rate(trace, "realtime_decode_tokens_total", start_s, end_s)
    rates = [counter_rate(trace, c, start_s, end_s) for c in ("realtime_prefill_compute_tokens_total",
                                                             "realtime_prefill_cache_tokens_total",
                                                             "realtime_decode_tokens_total")]
    total_rate = sum(r for r in rates if r is not None) if all(r is not None for r in rates) else None
    dec = counter_delta(trace, "realtime_decode_tokens_total", start_s, end_s)
    retr = counter_delta(trace, "retracted_requests_total", start_s, end_s)
    caps = vals("max_running_requests")
    queue = vals("num_queue_reqs")
    return {
        "rows": len(rows),
        "gaps": sum(1 for i in _window(trace, start_s, end_s) if not trace.ok[i]),
        "num_running_reqs": _stats(vals("num_running_reqs")),
        "num_queue_reqs": _stats(queue),
        "queue_nonzero_share": round(sum(1 for q in queue if q > 0) / len(queue), 3) if queue else None,
        "token_usage": _stats(vals("token_usage")),
        "max_total_num_tokens": max(vals("max_total_num_tokens"), default=None),
        "max_running_requests": max(caps) if caps else None,
        "gen_throughput_tok_s": _stats(vals("gen_throughput_tok_s")),
        "output_tok_per_s": round(out_rate, 2) if out_rate is not None else None,
        "total_tok_per_s": round(total_rate, 2) if total_rate is not None else None,
        "output_tokens": round(dec[0], 1) if dec is not None else None,
        "counter_covered_s": round(dec[1], 3) if dec is not None else None,
        "retracted_requests": round(retr[0], 1) if retr is not None else None,
    }
