"""router_trace.csv: the router's per-backend load over a fleet run (schema 1), scraped on the controller.

SGLang's router (smg) exports `smg_worker_requests_active{worker=URL}`: the requests it has in flight to each backend.
Its mean over the benchmark's window is that backend's load (by Little's law, its arrival rate times the time a
request spends there): a replica the router favours carries more. Pure: rows in, loads out.
"""

from __future__ import annotations

from toolkit.core.probe.timeline_csv import header_line, parse_rows, row_line

ROUTER_TRACE_MAGIC = "# toolkit-probe-router-trace"
ROUTER_TRACE_SCHEMA_VERSION = 1
COLUMNS = ("t_s", "worker", "requests_active", "error")
LOAD_METRIC = "smg_worker_requests_active"
LOAD_IS = "mean requests in flight at the router"

Sample = tuple[str, dict[str, str], float]


def router_header(meta: dict[str, str]) -> str:
    return header_line(ROUTER_TRACE_MAGIC, ROUTER_TRACE_SCHEMA_VERSION, meta) + ",".join(COLUMNS) + "\n"


def router_rows(t_s: float, samples: list[Sample] | None, error: str = "") -> list[str]:
    """One row per backend of one scrape; a failed scrape is one row with its error (a gap, never zeros)."""
    if samples is None:
        return [row_line(COLUMNS, {"t_s": round(t_s, 4), "worker": "", "requests_active": None, "error": error})]
    per: dict[str, float] = {}
    for name, labels, value in samples:
        if name == LOAD_METRIC and labels.get("worker"):
            per[labels["worker"]] = per.get(labels["worker"], 0.0) + value
    return [row_line(COLUMNS, {"t_s": round(t_s, 4), "worker": w, "requests_active": v, "error": ""})
            for w, v in sorted(per.items())]


def backend_load(text: str, start_s: float, end_s: float, file: str = "router_trace.csv") -> dict[str, float]:
    """Each backend's mean requests in flight over [start_s, end_s] (scrapes that failed left out)."""
    _meta, rows = parse_rows(text, magic=ROUTER_TRACE_MAGIC, version=ROUTER_TRACE_SCHEMA_VERSION, columns=COLUMNS,
                             file=file, what="router trace")
    seen: dict[str, list[float]] = {}
    for t, worker, active, _error in rows:
        if worker and active and start_s <= float(t) <= end_s:
            seen.setdefault(worker, []).append(float(active))
    return {w: sum(v) / len(v) for w, v in sorted(seen.items())}


def busy_span(text: str, start_s: float, end_s: float, file: str = "router_trace.csv") -> tuple[float, float] | None:
    """The first and last scrape in [start_s, end_s] at which the router had a request in flight to any backend:
    where the replica set worked (the benchmark's window also holds its client's start-up). None if never."""
    _meta, rows = parse_rows(text, magic=ROUTER_TRACE_MAGIC, version=ROUTER_TRACE_SCHEMA_VERSION, columns=COLUMNS,
                             file=file, what="router trace")
    busy = [float(t) for t, worker, active, _error in rows
            if worker and active and float(active) > 0 and start_s <= float(t) <= end_s]
    return (min(busy), max(busy)) if busy else None
