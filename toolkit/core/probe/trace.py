"""The per-GPU trace: one row per GPU per sampling tick, on the run's monotonic clock.

The file format is CSV with a versioned header comment, chosen because a one-hour 8-GPU trace at 10 Hz
(288,000 rows) must parse in well under 2 s with the standard library alone (benchmarks/bench_probe.py).
An empty cell means "unavailable" (the GPU does not offer the metric, or it errored), never zero.

This module is pure: it turns lines into a `Trace` and a `Trace` into lines. Reading and writing files
is the adapters' job.
"""

from __future__ import annotations

import gc
import io
import operator
from collections.abc import Iterable, Sequence

from toolkit.core.errors import ToolkitError
from toolkit.core.probe import columnar
from toolkit.core.probe.series import COLUMNS, COLUMNS_BY_VERSION, NUMERIC_COLUMNS, GpuSeries, Trace

TRACE_SCHEMA_VERSION = 2
TRACE_MAGIC = "# toolkit-probe-trace"

def _fmt(v: float | int | str | None) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if v == v else ""
    return str(v)


def header_line(meta: dict[str, str]) -> str:
    items = {"schema_version": str(TRACE_SCHEMA_VERSION), **meta}
    # Values must not contain spaces: they are key=value tokens.
    return TRACE_MAGIC + " " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in items.items()) + "\n"


_COLUMN_INDEX = {c: i for i, c in enumerate(COLUMNS)}
_FMT_CACHE: dict[float | int | str, str] = {}
_UNCACHED = frozenset(("t_s", "power_sample_w"))


def format_row(row: dict[str, float | int | str | None]) -> str:
    # At 8 GPUs x 50 Hz the writer formats 400 rows a second (benchmarks/bench_probe.py --fleet counts it in
    # the process's CPU): filled from the row's own keys (a live NVML row has ~10 of the 26 columns), and the
    # values carried from row to row (limit, clocks, utilization) formatted once, from a small bounded cache.
    # The time and the 20 ms power sample differ on every row: formatted without the cache, which they would
    # only churn.
    cells = [""] * len(COLUMNS)
    index = _COLUMN_INDEX
    cache = _FMT_CACHE
    for k, v in row.items():
        if v is None:
            continue
        i = index.get(k)
        if i is None:
            continue
        if k in _UNCACHED:
            cells[i] = _fmt(v)
            continue
        text = cache.get(v)
        if text is None:
            text = _fmt(v)
            if len(cache) >= 4096:
                cache.clear()
            cache[v] = text
        cells[i] = text
    return ",".join(cells) + "\n"


def dump_trace(trace: Trace) -> str:
    """The whole trace as CSV text (rows ordered by time, then GPU)."""
    out = io.StringIO()
    out.write(header_line({k: v for k, v in trace.meta.items() if k != "schema_version"}))
    out.write(",".join(COLUMNS) + "\n")
    rows: list[tuple[float, int, int]] = []
    for g, s in trace.gpus.items():
        rows.extend((t, g, i) for i, t in enumerate(s.t_s))
    rows.sort()
    for t, g, i in rows:
        s = trace.gpus[g]
        row: dict[str, float | int | str | None] = {"t_s": t, "gpu": g, "error": s.errors[i]}
        for c in NUMERIC_COLUMNS:
            row[c] = s.values[c][i]
        out.write(format_row(row))
    return out.getvalue()


def _bad(file: str, line: int, message: str, fix: str) -> ToolkitError:
    return ToolkitError.of(message, file=file, line=line, fix=fix)


def parse_header(first: str, file: str) -> dict[str, str]:
    if not first.startswith(TRACE_MAGIC):
        raise _bad(file, 1, "not a toolkit probe trace (missing the '# toolkit-probe-trace' header)",
                   "give the trace.csv that `toolkit probe run` wrote")
    meta: dict[str, str] = {}
    for token in first[len(TRACE_MAGIC):].split():
        key, sep, value = token.partition("=")
        if not sep:
            raise _bad(file, 1, f"header token {token!r} is not key=value", "restore the trace's first line")
        meta[key] = value
    version = meta.get("schema_version", "")
    if not version.isdigit():
        raise _bad(file, 1, "header has no schema_version", "restore the trace's first line")
    if int(version) > TRACE_SCHEMA_VERSION:
        raise _bad(file, 1, f"trace schema_version {version} is newer than this toolkit reads "
                   f"({TRACE_SCHEMA_VERSION})", "upgrade the toolkit")
    return meta


def _floats(cells: Sequence[str]) -> list[float | None]:
    if not any(cells):
        return [None] * len(cells)  # a metric this GPU does not offer: all cells empty
    distinct = set(cells)
    if len(distinct) * 4 < len(cells):
        # Limits, clocks, reasons, temperatures and utilization repeat: convert each distinct text once and map
        # the rest through a dict (C-level), about 5x faster than float() per cell on a one-hour trace.
        table = {c: float(c) if c else None for c in distinct}
        return list(map(table.__getitem__, cells))
    if "" not in cells:
        return list(map(float, cells))  # fast path: a column with no gaps
    return [float(c) if c else None for c in cells]


def parse_trace(text: str, file: str = "trace.csv") -> Trace:
    """Parse trace text. Any malformed or truncated line raises a ToolkitError naming file and line."""
    # Millions of small objects and no cycles: the cyclic GC's passes over them cost ~30 % of a one-hour
    # trace's parse (measured with benchmarks/bench_probe.py), so it is paused for the parse only.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_trace(text, file)
    finally:
        if was_enabled:
            gc.enable()


def _parse_trace(text: str, file: str) -> Trace:
    # Offsets, not partition(): the body of a one-hour trace is ~30 MB, copied once here rather than twice.
    i = text.find("\n")
    first = text if i < 0 else text[:i]
    meta = parse_header(first, file)
    j = -1 if i < 0 else text.find("\n", i + 1)
    head_line = "" if i < 0 else text[i + 1:] if j < 0 else text[i + 1:j]
    body = "" if j < 0 else text[j + 1:]
    if not head_line:
        raise _bad(file, 2, "trace is truncated: no column header", "re-record the run")
    head = head_line.rstrip("\r").split(",")
    version = int(meta["schema_version"])
    columns = COLUMNS_BY_VERSION.get(version, COLUMNS)
    if tuple(head) != columns:
        missing = [c for c in columns if c not in head]
        raise _bad(file, 2, f"column header does not match schema {version} "
                   f"(missing: {missing or 'order differs'})", "give a trace written by `toolkit probe run`")
    ncol = len(columns)
    numeric = columns[2:-1]
    if columnar.available() and body.endswith("\n"):
        fast = columnar.parse_body(body, columns, NUMERIC_COLUMNS)
        if fast is not None:
            return Trace(meta, fast)
        # a fast check failed: the list path below names the bad line (or reads what numpy would not)
    if body.endswith("\n"):
        body = body[:-1]
    elif body:
        _check_lines(body, ncol, file)
        raise _bad(file, body.count("\n") + 3, "last row has no line end: the trace is truncated",
                   "re-record the run, or cut the trace before this line")
    if not body:
        return Trace(meta, {})
    nrows = body.count("\n") + 1
    # Cells never hold a comma or newline (the writer strips them from error texts), so the whole body is one
    # flat list of cells and each column is a C-level slice of it: no per-row Python work at all.
    if body.count(",") != (ncol - 1) * nrows or "\r" in body or '"' in body:
        _check_lines(body, ncol, file)
    flat = body.replace("\n", ",").split(",")
    cols = [flat[j::ncol] for j in range(ncol)]
    gpu_col = cols[1]
    gpu_keys = list(dict.fromkeys(gpu_col[: min(len(gpu_col), 4096)]))
    k = len(gpu_keys)
    periodic = nrows % k == 0 and all(len(set(gpu_col[i::k])) == 1 for i in range(k))
    groups: list[tuple[str, list[list[str]], list[int] | None]] = []
    if periodic:
        for i in range(k):
            groups.append((gpu_col[i], [c[i::k] for c in cols], None))
    else:  # a GPU missing from some ticks: gather by index
        by_gpu: dict[str, list[int]] = {}
        for i, cell in enumerate(gpu_col):
            by_gpu.setdefault(cell, []).append(i)
        for cell, where in by_gpu.items():
            groups.append((cell, [[c[i] for i in where] for c in cols], where))
    gpus: dict[int, GpuSeries] = {}
    for key, gcols, idx in groups:
        try:
            g = int(key)
        except ValueError:
            line = (idx[0] if idx else gpu_col.index(key)) + 3
            raise _bad(file, line, f"field gpu is {key!r}, not an index", "repair this line") from None
        series = GpuSeries(gpu=g)
        try:
            series.t_s = list(map(float, gcols[0]))
            for j, c in enumerate(numeric):
                series.values[c] = _floats(gcols[j + 2])
            for c in NUMERIC_COLUMNS:
                if c not in series.values or len(series.values[c]) != len(series.t_s):
                    series.values[c] = [None] * len(series.t_s)  # a column this file's schema lacks
        except ValueError:
            _raise_bad_cell(file, body, columns)
            raise
        series.errors = gcols[-1]
        t = series.t_s
        if not all(map(operator.le, t[:-1], t[1:])):
            i = next(i for i in range(1, len(t)) if t[i] < t[i - 1])
            row = idx[i] if idx else (gpu_col.index(key) + i * k)
            raise _bad(file, row + 3, f"t_s goes backwards for GPU {g} ({t[i]} after {t[i - 1]})",
                       "the trace was edited or concatenated; re-record the run")
        gpus[g] = series
    return Trace(meta, dict(sorted(gpus.items())))


def _check_lines(body: str, ncol: int, file: str) -> None:
    """Slow path: name the first line whose field count is wrong."""
    for i, line in enumerate(body.split("\n")):
        n = len(line.rstrip("\r").split(","))
        if n != ncol or '"' in line:
            raise _bad(file, i + 3, f"row has {n} fields, expected {ncol} (truncated or malformed)",
                       "re-record the run, or cut the trace before this line")


def _raise_bad_cell(file: str, body: str, columns: tuple[str, ...]) -> None:
    """Slow path, only to name the line and field that is not a number."""
    for i, line in enumerate(body.split("\n")):
        for j, cell in enumerate(line.split(",")[:-1]):
            if j == 1 or (not cell and j != 0):
                continue
            try:
                float(cell)
            except ValueError:
                raise _bad(file, i + 3, f"field {columns[j]} is {cell!r}, not a number",
                           "re-record the run, or repair this line") from None


def trace_from_rows(rows: Iterable[dict[str, float | int | str | None]], meta: dict[str, str]) -> Trace:
    """Build a Trace from sample dicts (the live sampler's output, or a synthetic test trace)."""
    gpus: dict[int, GpuSeries] = {}
    for row in rows:
        g = int(row["gpu"])  # type: ignore[arg-type]
        s = gpus.get(g)
        if s is None:
            s = gpus[g] = GpuSeries(gpu=g)
        s.t_s.append(float(row["t_s"]))  # type: ignore[arg-type]
        for c in NUMERIC_COLUMNS:
            v = row.get(c)
            s.values[c].append(None if v is None or v == "" else float(v))
        s.errors.append(str(row.get("error") or ""))
    return Trace(meta, dict(sorted(gpus.items())))
