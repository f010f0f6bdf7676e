"""`toolkit report`: the data behind the plots, and the Markdown / standalone HTML around them.

Pure: a probe trace, summary and results entry in; plot series and document text out. Drawing is
toolkit/adapters/plots.py (the only importer of matplotlib); files are written by the command.
"""

from __future__ import annotations

import base64
import html
import itertools
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.probe.host_trace import HostTrace
from toolkit.core.probe.series import Trace
from toolkit.core.probe.server_trace import ServerTrace, counter_series
from toolkit.core.results.model import ResultsEntry

THROUGHPUT_BIN_S = 1.0


@dataclass
class GpuLine:
    gpu: int
    t_s: list[float]
    values: list[float | None]


@dataclass
class PlotData:
    """Everything the three plots draw, on the run's clock (seconds since the probe started)."""

    power: list[GpuLine]
    power_limit_w: float | None
    idle_power_w: float | None
    util: list[GpuLine]
    gpm_sm: list[GpuLine]  # empty when the GPUs offer no GPM (or it was not sampled)
    bench_window_s: tuple[float, float] | None
    steady_window_s: tuple[float, float] | None
    throughput_t_s: list[float]
    throughput_tok_per_s: list[float]
    throughput_source: str  # how the time series was obtained, shown under the plot
    data_source: str
    full_run_tok_per_s: float | None = None  # bench_serving's whole-run rate (ramp and drain included)
    steady_tok_per_s: float | None = None  # the rate over the steady window
    time_range_s: tuple[float, float] | None = None  # every time plot's x axis, so they line up
    server: ServerSeries | None = None  # the server and host panel under the power plot; None: not recorded


@dataclass
class ServerSeries:
    """What the server panel draws (server_trace.csv, host_trace.csv), on the same clock as the GPU trace."""

    t_s: list[float]
    running: list[float | None]
    queued: list[float | None]
    running_cap: list[float | None]
    token_usage: list[float | None]
    counter_t_s: list[float]
    counter_tok_per_s: list[float]
    server_thread_t_s: list[float]
    server_thread_cpu_pct: list[float]
    server_thread_name: str | None
    bench_thread_t_s: list[float]
    bench_thread_cpu_pct: list[float]
    gaps_t_s: list[float]
    not_seen: list[str]


def _median(vs: list[float]) -> float | None:
    if not vs:
        return None
    s = sorted(vs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def throughput_series(timeline: Any, bench_start_s: float, bin_s: float = THROUGHPUT_BIN_S
                      ) -> tuple[list[float], list[float]]:
    """Output tok/s per bin from a cumulative [[t_s since the bench's start, tokens so far], ...] timeline."""
    if not isinstance(timeline, list):
        return [], []
    pts = sorted((float(p[0]), float(p[1])) for p in timeline if isinstance(p, list | tuple) and len(p) == 2)
    if len(pts) < 2:
        return [], []

    def at(t: float) -> float:  # linear interpolation of the cumulative count
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, v0), (t1, v1) in itertools.pairwise(pts):
            if t <= t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
        return pts[-1][1]

    ts, rates = [], []
    t = pts[0][0]
    while t + bin_s <= pts[-1][0] + 1e-9:
        ts.append(bench_start_s + t + bin_s / 2)
        rates.append((at(t + bin_s) - at(t)) / bin_s)
        t += bin_s
    return ts, rates


def server_series(server: ServerTrace | None, host: HostTrace | None, summary: dict[str, Any]
                  ) -> ServerSeries | None:
    if server is None and host is None:
        return None
    ok = [i for i in range(len(server))] if server is not None else []

    def col(name: str) -> list[float | None]:
        assert server is not None
        return [server.values[name][i] if server.ok[i] else None for i in ok]

    ct, cr = counter_series(server, "realtime_decode_tokens_total") if server is not None else ([], [])
    st, sc = host.series("server", "busiest_thread") if host is not None else ([], [])
    bt, bc = host.series("bench", "busiest_thread") if host is not None else ([], [])
    top = ((((summary.get("host") or {}).get("steady") or {}).get("server") or {}).get("busiest_thread") or {})
    name = f"{top.get('process')}/{top.get('thread')} (pid {top.get('pid')})" if top else None
    return ServerSeries(
        t_s=[server.t_s[i] for i in ok] if server is not None else [],
        running=col("num_running_reqs") if server is not None else [],
        queued=col("num_queue_reqs") if server is not None else [],
        running_cap=col("max_running_requests") if server is not None else [],
        token_usage=col("token_usage") if server is not None else [],
        counter_t_s=ct, counter_tok_per_s=cr, server_thread_t_s=st, server_thread_cpu_pct=sc,
        server_thread_name=name, bench_thread_t_s=bt, bench_thread_cpu_pct=bc,
        gaps_t_s=[server.t_s[i] for i in range(len(server)) if not server.ok[i]] if server is not None else [],
        not_seen=list((summary.get("server") or {}).get("what_was_not_seen") or []),
    )


def plot_data(trace: Trace, summary: dict[str, Any], run: dict[str, Any], bench_raw: dict[str, Any] | None,
              server: ServerTrace | None = None, host: HostTrace | None = None) -> PlotData:
    def lines(column: str) -> list[GpuLine]:
        out = []
        for g, s in sorted(trace.gpus.items()):
            vals = s.values[column]
            if any(v is not None for v in vals):
                out.append(GpuLine(g, s.t_s, vals))
        return out

    limits = [v for s in trace.gpus.values() for v in s.values["power_limit_w"] if v is not None]
    idle_map = (summary.get("idle") or {}).get("power_w") or {}
    idles = [float(v) for v in idle_map.values() if isinstance(v, int | float)]
    b0, b1 = run.get("bench_start_s"), run.get("bench_end_s")
    bench = (float(b0), float(b1)) if isinstance(b0, int | float) and isinstance(b1, int | float) else None
    steady = summary.get("steady") or {}
    found = bool((summary.get("steady_state") or {}).get("found"))
    sw = (float(steady["start_s"]), float(steady["end_s"])) if found and "start_s" in steady else None
    ts, rates = throughput_series((bench_raw or {}).get("timeline"), bench[0] if bench else 0.0)
    full_avg = ((summary.get("full") or {}).get("throughput") or {}).get("output_tok_per_s")
    steady_avg = (steady.get("throughput") or {}).get("output_tok_per_s") if found else None
    srv = server_series(server, host, summary)
    if srv is not None and len(srv.counter_t_s) >= 2:
        ts, rates = srv.counter_t_s, srv.counter_tok_per_s
        source = ("output tokens per second between scrapes of the server's sglang:realtime_tokens_total "
                  "(decode), which moves on every forward pass")
    elif ts:
        source = f"output tokens per {THROUGHPUT_BIN_S:g} s bin, from the benchmark's token timeline"
    else:
        full = (summary.get("full") or {}).get("throughput") or {}
        avg = full.get("output_tok_per_s")
        peak = (summary.get("benchmark") or {}).get("peak_output_tok_per_s")
        if bench and isinstance(avg, int | float):
            ts, rates = [bench[0], bench[1]], [float(avg), float(avg)]
        source = ("the benchmark reports whole-run totals only (no token timeline): the line is its average over "
                  "the whole run" + (f"; its reported peak was {peak:g} tok/s" if isinstance(peak, int | float)
                                     else ""))
    return PlotData(
        power=lines("power_w"),
        power_limit_w=_median(limits),
        idle_power_w=_median(idles),
        util=lines("util_gpu_pct"),
        gpm_sm=lines("gpm_sm_util_pct"),
        bench_window_s=bench,
        steady_window_s=sw,
        throughput_t_s=ts,
        throughput_tok_per_s=rates,
        throughput_source=source,
        data_source=str(summary.get("data_source") or run.get("data_source") or "measured"),
        full_run_tok_per_s=float(full_avg) if isinstance(full_avg, int | float) else None,
        steady_tok_per_s=float(steady_avg) if isinstance(steady_avg, int | float) else None,
        time_range_s=_time_range(trace),
        server=srv,
    )


def _time_range(trace: Trace) -> tuple[float, float] | None:
    ts = [t for s in trace.gpus.values() for t in (s.t_s[:1] + s.t_s[-1:])]
    return (min(ts), max(ts)) if ts else None


@dataclass
class Plot:
    key: str  # file-name stem: power, util-gpm, throughput
    title: str
    caption: str
    png: bytes


@dataclass
class ReportData:
    profile: str
    file: str
    parent: str | None
    knob_changes: list[str]  # rendered KnobChange lines against the parent
    entry: ResultsEntry | None
    stale: bool
    history: list[tuple[ResultsEntry, bool]]  # (entry, stale), oldest first
    next_steps: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why something is missing (no artifacts, manual entry)


def _f(v: Any, spec: str = "g") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float | int):
        return format(v, spec)
    return str(v)


def headline_rows(e: ResultsEntry) -> list[tuple[str, str]]:
    """(figure, value) pairs: the entry's key figures, as both documents and the terminal show them."""
    t = e.throughput
    rows = [
        ("output throughput, steady state (tok/s)", _f(t.steady_state.output_tok_per_s if t.steady_state else None)),
        ("output throughput, full run (tok/s)", _f(t.full_run.output_tok_per_s)),
        ("total throughput, full run (tok/s)", _f(t.full_run.total_tok_per_s)),
        ("peak output throughput (tok/s)", _f(t.peak_output_tok_per_s)),
    ]
    if e.latency_ms:
        for name, p in (("TTFT", e.latency_ms.ttft), ("ITL", e.latency_ms.itl), ("TPOT", e.latency_ms.tpot)):
            if p is not None:
                rows.append((f"{name} median / p99 (ms)", f"{_f(p.median)} / {_f(p.p99)}"))
    if e.power:
        limit = next((g.limit_w for g in e.power.per_gpu if g.limit_w), e.power.limit_w)
        rows.append((f"power per GPU, mean ({e.power.window or 'window n/a'}) / limit (W)",
                     f"{_f(e.power.mean_w)} / {_f(limit)}"))
        rows.append(("idle power per GPU (W)", _f(e.power.idle_w)))
    if e.energy:
        rows.append((f"energy per output token (J, {e.energy.window or '-'})", _f(e.energy.j_per_output_tok)))
        rows.append(("output tokens per joule", _f(e.energy.output_tok_per_j)))
    if e.verdict:
        rows.append(("verdict", e.verdict.class_ + (f" (confidence {e.verdict.confidence:g})"
                                                    if e.verdict.confidence is not None else "")))
    if e.note:
        rows.append(("note" + (" (approximate figures)" if e.approximate else ""), e.note))
    return rows


def _stamp(e: ResultsEntry) -> str:
    bits = [f"run {e.run_id}", f"source {e.source}"]
    if e.date:
        bits.append(e.date)
    if e.gpu.count or e.gpu.model:
        bits.append(f"{e.gpu.count or '?'}x {e.gpu.model or 'GPU'}" + (f", driver {e.gpu.driver}" if e.gpu.driver
                                                                         else ""))
    if e.sglang_version:
        bits.append(f"SGLang {e.sglang_version}")
    if e.host:
        bits.append(f"host {e.host}")
    if e.spec_hash:
        bits.append(f"spec {e.spec_hash[:12]}")
    return ", ".join(bits)


def _history_row(e: ResultsEntry, stale: bool) -> list[str]:
    rate, kind = e.output_tok_per_s()
    return [e.run_id, e.date or "-", e.source + (f" ({e.lab.kind})" if e.lab else ""),
            f"{_f(rate)} ({kind})" if rate is not None else "-",
            _f(e.energy.output_tok_per_j if e.energy else None), e.verdict_class() or "-",
            "STALE" if stale else ""]


HISTORY_HEAD = ["run", "date", "source", "output tok/s", "tok/J", "verdict", ""]


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return out


def render_markdown(r: ReportData, image_paths: dict[str, str] | None = None) -> str:
    """Markdown; plots are referenced by `image_paths` (key -> relative path), or left out."""
    out = [f"# Report: {r.profile}", "", f"Profile file: `{r.file}`" + (f", extends `{r.parent}`" if r.parent else ""),
           ""]
    e = r.entry
    if e is None:
        out += ["No results recorded yet: `toolkit results record DIR --profile " + r.profile + "`.", ""]
    else:
        if e.lab:
            out += [f"> **Lab data ({e.lab.kind}), not a measurement on real GPUs:** {e.lab.note}", ""]
        if r.stale:
            out += ["> **Stale:** this entry measured an older spec of the profile; re-run the probe.", ""]
        out += ["## Latest result", "", _stamp(e), ""]
        out += [*_md_table(["figure", "value"], [[a, b] for a, b in headline_rows(e)]), ""]
        if e.verdict:
            out += ["## Verdict evidence", "", f"**{e.verdict.class_}**" + (f": {e.verdict.summary}"
                                                                              if e.verdict.summary else ""), ""]
            if e.verdict.evidence:
                out += [*_md_table(["evidence", "value"], [[k, _f(v)] for k, v in e.verdict.evidence.items()]), ""]
        if r.next_steps:
            out += ["Next steps the probe suggests:", ""] + [f"- {s}" for s in r.next_steps] + [""]
    for p in r.plots:
        out += [f"## {p.title}", ""]
        if image_paths and p.key in image_paths:
            out += [f"![{p.title}]({image_paths[p.key]})", ""]
        out += [p.caption, ""]
    if r.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    out += [f"## Knobs that differ from {r.parent}" if r.parent else "## Knobs", ""]
    if r.parent:
        out += [f"    {line}" for c in r.knob_changes for line in c.splitlines()] or ["(none)"]
    else:
        out += ["(this profile extends nothing)"]
    out += ["", "## History", "", *_md_table(HISTORY_HEAD, [_history_row(h, s) for h, s in r.history]), ""]
    return "\n".join(out)


_CSS = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; background: #fff; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: left; }
th { background: #eef; }
.lab { background: #fff3cd; border: 1px solid #e0b000; padding: 0.6em; }
.stale { background: #fde2e2; border: 1px solid #c00; padding: 0.6em; }
img { max-width: 100%; border: 1px solid #ddd; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; }
.caption { color: #555; font-size: 0.9em; }
"""


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def render_html(r: ReportData) -> str:
    """One standalone HTML file: plots embedded as data URIs, no external resources at all."""
    esc = html.escape
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             f"<title>toolkit report: {esc(r.profile)}</title><style>{_CSS}</style></head><body>",
             f"<h1>Report: {esc(r.profile)}</h1>",
             f"<p>Profile file <code>{esc(r.file)}</code>" + (f", extends <code>{esc(r.parent)}</code>" if r.parent
                                                               else "") + "</p>"]
    e = r.entry
    if e is None:
        parts.append(f"<p>No results recorded yet: <code>toolkit results record DIR --profile {esc(r.profile)}"
                     "</code>.</p>")
    else:
        if e.lab:
            parts.append(f"<p class='lab'><b>Lab data ({esc(e.lab.kind)}), not a measurement on real GPUs:</b> "
                         f"{esc(e.lab.note)}</p>")
        if r.stale:
            parts.append("<p class='stale'><b>Stale:</b> this entry measured an older spec of the profile.</p>")
        parts += ["<h2>Latest result</h2>", f"<p>{esc(_stamp(e))}</p>",
                  _html_table(["figure", "value"], [[a, b] for a, b in headline_rows(e)])]
        if e.verdict:
            parts.append(f"<h2>Verdict evidence</h2><p><b>{esc(e.verdict.class_)}</b>"
                         + (f": {esc(e.verdict.summary)}" if e.verdict.summary else "") + "</p>")
            if e.verdict.evidence:
                parts.append(_html_table(["evidence", "value"], [[k, _f(v)] for k, v in e.verdict.evidence.items()]))
        if r.next_steps:
            parts.append("<p>Next steps the probe suggests:</p><ul>"
                         + "".join(f"<li>{esc(s)}</li>" for s in r.next_steps) + "</ul>")
    for p in r.plots:
        data = base64.b64encode(p.png).decode("ascii")
        parts.append(f"<h2>{esc(p.title)}</h2><img id='plot-{esc(p.key)}' alt='{esc(p.title)}' "
                     f"src='data:image/png;base64,{data}'><p class='caption'>{esc(p.caption)}</p>")
    if r.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in r.notes) + "</ul>")
    if r.parent:
        parts.append(f"<h2>Knobs that differ from {esc(r.parent)}</h2><pre>"
                     + esc("\n".join(r.knob_changes) or "(none)") + "</pre>")
    parts.append("<h2>History</h2>" + _html_table(HISTORY_HEAD, [_history_row(h, s) for h, s in r.history]))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
