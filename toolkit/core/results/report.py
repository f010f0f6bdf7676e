"""`toolkit report`: what a report shows, in the order people read it, and its Markdown.

Top to bottom: what ran (profile, host, GPUs, SGLang, the workload and how long it took), the verdict with its next
steps, the plots, then the figures, the evidence (collapsed), the knobs against the parent and the history. Every
figure carries its provenance and its workload (toolkit.core.results.comparable); a report of data that was not
measured says so at the top and on every image (the SIMULATED or REPLAYED watermark).

Pure: a probe trace, summary and results entry in; plot series and document text out. Drawing is
toolkit/adapters/plots.py (the only importer of matplotlib), the HTML page toolkit/adapters/documents.py (its
Jinja2 template and the Markdown library); files are written by the use case.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.probe.bench import request_latencies
from toolkit.core.probe.host_trace import HostTrace
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.series import Trace
from toolkit.core.probe.server_trace import ServerTrace, counter_series
from toolkit.core.provenance import Provenance, mark
from toolkit.core.results.comparable import KIND_LABEL, rate_of, workload
from toolkit.core.results.model import ResultsEntry
from toolkit.core.tables import figure, markdown_table

THROUGHPUT_BIN_S = 1.0
# The idle baseline is drawn squeezed into this share of the time axis: it is a reference, not the run.
IDLE_AXIS_SHARE = 0.08


@dataclass
class Band:
    """One group of identical GPUs as one band: the mean line and the min-max range around it, on a common time
    grid; a group of one GPU is a line (lo == hi == mean)."""

    label: str
    gpus: list[int]
    t_s: list[float]
    mean: list[float | None]
    lo: list[float | None]
    hi: list[float | None]


def gpu_bands(trace: Trace, column: str, models: dict[int, str], bin_s: float | None = None) -> list[Band]:
    """GPUs grouped by model (identical GPUs are one band, distinct ones apart), each group's min/mean/max of
    `column` per time bin. GPUs without a value in the column are left out."""
    groups: dict[str, list[int]] = {}
    for g, s in sorted(trace.gpus.items()):
        if any(v is not None for v in s.values[column]):
            groups.setdefault(models.get(g) or "GPU", []).append(g)
    if not groups:
        return []
    ts_all = [t for g in itertools.chain(*groups.values()) for t in trace.gpus[g].t_s[:1] + trace.gpus[g].t_s[-1:]]
    span = max(ts_all) - min(ts_all) if ts_all else 0.0
    # A grid fine enough to show a 1 s phase, coarse enough that GPUs sampled a few ms apart share a bin.
    width = bin_s or max(0.1, span / 1500.0)
    bands = []
    for model, gpus in groups.items():
        per_bin: dict[int, list[list[float]]] = {}
        for k, g in enumerate(gpus):
            s = trace.gpus[g]
            for t, v in zip(s.t_s, s.values[column], strict=True):
                if v is None:
                    continue
                cell = per_bin.setdefault(int(t // width), [[] for _ in gpus])
                cell[k].append(v)
        t_s: list[float] = []
        mean: list[float | None] = []
        lo: list[float | None] = []
        hi: list[float | None] = []
        for b in sorted(per_bin):
            means = [sum(vs) / len(vs) for vs in per_bin[b] if vs]
            t_s.append((b + 0.5) * width)
            mean.append(sum(means) / len(means))
            lo.append(min(means))
            hi.append(max(means))
        label = (f"{len(gpus)}x {model}" if len(gpus) > 1 else f"GPU {gpus[0]} ({model})")
        bands.append(Band(label, gpus, t_s, mean, lo, hi))
    return bands


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


@dataclass
class Latencies:
    """bench_serving's per-request results (--output-details): TTFT per request, ITL per token, in ms."""

    ttft_ms: list[float]
    itl_ms: list[float]
    requests: int
    failed: int


@dataclass
class PlotData:
    """Everything the plots draw, on the run's clock (seconds since the probe started)."""

    power: list[Band]
    power_limit_w: float | None
    idle_power_w: float | None
    util: list[Band]
    gpm_sm: list[Band]  # empty when the GPUs offer no GPM (or it was not sampled)
    bench_window_s: tuple[float, float] | None
    steady_window_s: tuple[float, float] | None
    steady_note: str  # what the steady window was found from, or why there is none
    idle_window_s: tuple[float, float] | None  # drawn squeezed (IDLE_AXIS_SHARE of the axis)
    throughput_t_s: list[float]
    throughput_tok_per_s: list[float]
    throughput_source: str  # how the time series was obtained, shown under the plot
    data_source: str
    watermark: str | None
    full_run_tok_per_s: float | None = None  # bench_serving's whole-run rate (ramp and drain included)
    steady_tok_per_s: float | None = None  # the rate over the steady window
    time_range_s: tuple[float, float] | None = None  # every time plot's x axis, so they line up
    server: ServerSeries | None = None  # the server and host panel under the power plot; None: not recorded
    latencies: Latencies | None = None
    latency_note: str = ""  # why there is no distribution


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


def server_series(server: ServerTrace | None, host: HostTrace | None, summary: Summary
                  ) -> ServerSeries | None:
    if server is None and host is None:
        return None
    ok = list(range(len(server))) if server is not None else []

    def col(name: str) -> list[float | None]:
        assert server is not None
        return [server.values[name][i] if server.ok[i] else None for i in ok]

    ct, cr = counter_series(server, "realtime_decode_tokens_total") if server is not None else ([], [])
    st, sc = host.series("server", "busiest_thread") if host is not None else ([], [])
    bt, bc = host.series("bench", "busiest_thread") if host is not None else ([], [])
    top = ((((summary.host or {}).get("steady") or {}).get("server") or {}).get("busiest_thread") or {})
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
        not_seen=list((summary.server or {}).get("what_was_not_seen") or []),
    )


def latencies_of(bench_raw: dict[str, Any] | None) -> tuple[Latencies | None, str]:
    """TTFT and ITL distributions from bench_serving's per-request results, or (None, why not); the requests read
    as the tune's percentiles read them (toolkit.core.probe.bench.request_latencies: failed ones left out)."""
    lat = request_latencies(bench_raw)
    if lat is None:
        return None, ("the benchmark wrote no per-request results (bench_serving writes them with "
                      "--output-details, which the toolkit's bench command passes)")
    if not lat.ttft_s:
        return None, "the benchmark's per-request results hold no successful request"
    return Latencies([t * 1000 for t in lat.ttft_s], [g * 1000 for g in lat.all_itl_s], len(lat) + lat.failed,
                     lat.failed), ""


def _median(vs: list[float]) -> float | None:
    if not vs:
        return None
    s = sorted(vs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def plot_data(trace: Trace, summary: Summary, run: RunRecord, bench_raw: dict[str, Any] | None,
              server: ServerTrace | None = None, host: HostTrace | None = None,
              topology: dict[str, Any] | None = None) -> PlotData:
    models = {int(g["index"]): str(g.get("name") or "GPU") for g in (topology or {}).get("gpus") or []
              if isinstance(g, dict) and isinstance(g.get("index"), int)}
    limits = [v for s in trace.gpus.values() for v in s.values["power_limit_w"] if v is not None]
    idles = [float(v) for v in summary.idle.power_w.values() if isinstance(v, int | float)]
    b0, b1 = run.bench_start_s, run.bench_end_s
    bench = (float(b0), float(b1)) if b0 is not None and b1 is not None else None
    i0, i1 = run.idle_start_s, run.idle_end_s
    idle_w = (float(i0), float(i1)) if i1 is not None and i1 > i0 else None
    steady, state = summary.steady, summary.steady_state
    found = state.found
    sw = (float(steady.start_s), float(steady.end_s)) if found and steady.start_s is not None \
        and steady.end_s is not None else None
    steady_note = (f"steady window {sw[0]:.1f}-{sw[1]:.1f} s, found from the {state.signal or 'GPU activity'}"
                   if sw else "no steady state: " + (state.reason or "not found")
                   .removesuffix("; using the full benchmark window"))
    ts, rates = throughput_series((bench_raw or {}).get("timeline"), bench[0] if bench else 0.0)
    full_avg = summary.full.throughput.output_tok_per_s
    steady_avg = steady.throughput.output_tok_per_s if found else None
    srv = server_series(server, host, summary)
    if srv is not None and len(srv.counter_t_s) >= 2:
        ts, rates = srv.counter_t_s, srv.counter_tok_per_s
        source = ("output tokens per second between scrapes of the server's sglang:realtime_tokens_total "
                  "(decode), which moves on every forward pass")
    elif ts:
        source = f"output tokens per {THROUGHPUT_BIN_S:g} s bin, from the benchmark's token timeline"
    else:
        peak = summary.benchmark.peak_output_tok_per_s
        if bench and isinstance(full_avg, int | float):
            ts, rates = [bench[0], bench[1]], [float(full_avg), float(full_avg)]
        source = ("the benchmark reports whole-run totals only (no token timeline): the line is its average over "
                  "the whole run" + (f"; its reported peak was {figure(peak)} tok/s" if isinstance(peak, int | float)
                                     else ""))
    prov = summary.provenance
    lat, lat_note = latencies_of(bench_raw)
    return PlotData(
        power=gpu_bands(trace, "power_w", models),
        power_limit_w=_median(limits),
        idle_power_w=_median(idles),
        util=gpu_bands(trace, "util_gpu_pct", models),
        gpm_sm=gpu_bands(trace, "gpm_sm_util_pct", models),
        bench_window_s=bench,
        steady_window_s=sw,
        steady_note=steady_note,
        idle_window_s=idle_w,
        throughput_t_s=ts,
        throughput_tok_per_s=rates,
        throughput_source=source,
        data_source=prov.detail or prov.label,
        watermark=prov.watermark,
        full_run_tok_per_s=float(full_avg) if isinstance(full_avg, int | float) else None,
        steady_tok_per_s=float(steady_avg) if isinstance(steady_avg, int | float) else None,
        time_range_s=_time_range(trace),
        server=srv,
        latencies=lat,
        latency_note=lat_note,
    )


def _time_range(trace: Trace) -> tuple[float, float] | None:
    ts = [t for s in trace.gpus.values() for t in (s.t_s[:1] + s.t_s[-1:])]
    return (min(ts), max(ts)) if ts else None


@dataclass
class Plot:
    key: str  # file-name stem: power, server, util-gpm, throughput, latency
    title: str
    caption: str  # Markdown
    png: bytes


@dataclass
class ReportData:
    profile: str
    file: str  # relative to the repository where it is inside it: no path of the machine that made the report
    parent: str | None
    knob_changes: list[str]  # rendered KnobChange lines against the parent
    entry: ResultsEntry | None
    stale: bool
    history: list[tuple[ResultsEntry, bool]]  # (entry, stale), oldest first
    next_steps: list[str] = field(default_factory=list)  # Markdown (knobs in backticks)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why something is missing (no artifacts, manual entry)
    run_facts: dict[str, Any] = field(default_factory=dict)  # from the run directory, where it is here
    watermark: str | None = None

    @property
    def provenance(self) -> Provenance | None:
        return self.entry.provenance() if self.entry else None


def what_ran(r: ReportData) -> list[tuple[str, str]]:
    """(what, value) rows: the profile, the run and where its figures come from, host, GPUs, SGLang, the workload,
    how long and how fast requests went, and the steady window (or why there is none)."""
    e = r.entry
    rows = [("profile", f"{r.profile}" + (f" (extends {r.parent})" if r.parent else "") + f", {r.file}")]
    if e is None:
        return rows
    p = e.provenance()
    rows.append(("run", f"{e.run_id}" + (f", {e.date}" if e.date else "")))
    rows.append(("figures", mark(p, detail=True)))
    spec = "spec not recorded" if not e.spec_hash else (f"spec {e.spec_hash[:12]}, " + (
        "STALE: an older spec than the profile's" if r.stale else "the profile's current spec"))
    rows.append(("spec", spec))
    gpus = (f"{e.gpu.count or '?'}x {e.gpu.model or 'GPU'}" if e.gpu.count or e.gpu.model else "not recorded")
    rows.append(("host, GPUs", f"{e.host or 'host not recorded'}; {gpus}"
                 + (f", driver {e.gpu.driver}" if e.gpu.driver else "")))
    rows.append(("SGLang", e.sglang_version or "not recorded"))
    rows.append(("workload", workload(e).text()))
    duration = e.bench.duration_s if e.bench.duration_s is not None else r.run_facts.get("duration_s")
    rps = (e.throughput.full_run.request_per_s if e.throughput.full_run.request_per_s is not None
           else r.run_facts.get("request_per_s"))
    # Every time below is on one clock, the probe's (0 s = its start, the idle baseline first), as the plots' x-axes
    # are; the benchmark's own duration is said as its span there.
    b0, b1 = r.run_facts.get("bench_start_s"), r.run_facts.get("bench_end_s")
    if duration is not None or rps is not None:
        span = (f" (the benchmark: {figure(b0)}-{figure(b1)} s of the probe's clock)"
                if isinstance(b0, int | float) and isinstance(b1, int | float) else "")
        rows.append(("duration", f"{figure(duration)} s" + (f", {figure(rps)} requests/s" if rps is not None
                                                           else "") + span))
    s = e.throughput.steady_state
    if e.throughput.no_steady_state:
        rows.append(("steady window", f"no steady state: {e.throughput.no_steady_state}"))
    elif s is not None and s.window_s:
        rows.append(("steady window", f"{figure(s.window_s[0])}-{figure(s.window_s[1])} s "
                     f"({figure(s.window_s[1] - s.window_s[0])} s) {PROBE_CLOCK}"
                     + (f"; {s.source}" if s.source else "")))
    return rows


PROBE_CLOCK = "of the probe's clock (the plots' x-axis)"


def headline_rows(e: ResultsEntry) -> list[tuple[str, str]]:
    """(figure, value) pairs: the entry's key figures, each with its kind."""
    t = e.throughput
    rows = []
    for kind in ("steady", "full"):
        rate = rate_of(e, kind)
        if rate is not None:
            rows.append((f"output throughput, {KIND_LABEL[kind]} (tok/s)", figure(rate)))
    if t.no_steady_state:
        rows.append(("output throughput, steady-state (tok/s)", "none: no steady state"))
    if t.full_run.total_tok_per_s is not None:
        rows.append(("total throughput, full-run (tok/s)", figure(t.full_run.total_tok_per_s)))
    if t.peak_output_tok_per_s is not None:
        rows.append(("peak output throughput (tok/s)", figure(t.peak_output_tok_per_s)))
    if e.latency_ms:
        for name, p in (("TTFT", e.latency_ms.ttft), ("ITL", e.latency_ms.itl), ("TPOT", e.latency_ms.tpot)):
            if p is not None:
                rows.append((f"{name} median / p99 (ms)", f"{figure(p.median)} / {figure(p.p99)}"))
    if e.power:
        limit = next((g.limit_w for g in e.power.per_gpu if g.limit_w), e.power.limit_w)
        rows.append((f"power per GPU, mean ({e.power.window or 'window n/a'}) / limit (W)",
                     f"{figure(e.power.mean_w)} / {figure(limit)}"))
        rows.append(("idle power per GPU (W)", figure(e.power.idle_w)))
    if e.energy:
        rows.append((f"energy per output token (J, {e.energy.window or '-'})", figure(e.energy.j_per_output_tok)))
        rows.append(("output tokens per joule", figure(e.energy.output_tok_per_j)))
    if e.note:
        rows.append(("note" + (" (approximate figures)" if e.approximate else ""), e.note))
    return rows


def verdict_line(e: ResultsEntry) -> str:
    """The verdict in one Markdown line: class, confidence, headline."""
    v = e.verdict
    if v is None:
        return "No verdict recorded."
    conf = f" (confidence {figure(v.confidence)})" if v.confidence is not None else ""
    summary = (v.summary or "").removeprefix(v.class_).lstrip(" :—-")
    return f"**{v.class_}**{conf}" + (f": {summary}" if summary else "")


def key_figures(e: ResultsEntry) -> list[str]:
    """The three figures a reader wants beside the verdict, each with its kind."""
    out = []
    rate, kind = e.output_tok_per_s()
    if rate is not None:
        out.append(f"{figure(rate)} output tok/s ({KIND_LABEL[kind]})")
    if e.power and e.power.mean_w is not None:
        limit = next((g.limit_w for g in e.power.per_gpu if g.limit_w), e.power.limit_w)
        out.append(f"{figure(e.power.mean_w)} W per GPU" + (f" of {figure(limit)} W" if limit else ""))
    if e.energy and e.energy.j_per_output_tok is not None:
        out.append(f"{figure(e.energy.j_per_output_tok)} J per output token")
    return out


def _history_row(e: ResultsEntry, stale: bool) -> list[str]:
    rate, kind = e.output_tok_per_s()
    return [e.run_id, e.date or "-", mark(e.provenance()), workload(e).text(),
            f"{figure(rate)} ({KIND_LABEL[kind]})" if rate is not None else "-",
            figure(e.energy.output_tok_per_j if e.energy else None), e.verdict_class() or "-",
            "STALE" if stale else ""]


HISTORY_HEAD = ["run", "date", "provenance", "workload", "output tok/s", "tok/J", "verdict", "spec"]


def evidence_rows(e: ResultsEntry) -> list[list[str]]:
    return [[k, figure(v) if isinstance(v, int | float | bool) or v is None else str(v)]
            for k, v in (e.verdict.evidence.items() if e.verdict else [])]


def render_markdown(r: ReportData, image_paths: dict[str, str] | None = None) -> str:
    """Markdown in the report's order; plots are referenced by `image_paths` (key -> relative path), else left
    out with a line saying where they are."""
    out = [f"# Report: {r.profile}", ""]
    e = r.entry
    p = r.provenance
    if p is not None and p.kind != "measured":
        out += [f"> **{mark(p)}: {p.label}, not a measurement on this profile's hardware.** {p.detail or ''}"
                .rstrip(), ""]
    if r.stale:
        out += ["> **Stale:** this entry measured an older spec of the profile; re-run the probe.", ""]
    out += ["## What ran", "", *markdown_table(["", ""], [list(row) for row in what_ran(r)]), ""]
    if e is None:
        out += ["No results recorded yet: `toolkit results record DIR --profile " + r.profile + "`.", ""]
    else:
        out += ["## Verdict", "", verdict_line(e), ""]
        if key_figures(e):
            out += [" · ".join(key_figures(e)), ""]
        if r.next_steps:
            out += ["Next steps:", ""] + [f"- {s}" for s in r.next_steps] + [""]
    if r.plots:
        out += ["## Plots", ""]
        if r.watermark:
            out += [f"Every image is marked **{r.watermark}**: {r.watermark.lower()} data, not a measurement.", ""]
    for plot in r.plots:
        out += [f"### {plot.title}", ""]
        if image_paths and plot.key in image_paths:
            out += [f"![{plot.title}]({image_paths[plot.key]})", ""]
        out += [plot.caption, ""]
    if e is not None:
        out += ["## Figures", "", *markdown_table(["figure", "value"], [list(x) for x in headline_rows(e)],
                                                  ["l", "r"]), ""]
        rows = evidence_rows(e)
        if rows:
            out += ["<details><summary>Evidence behind the verdict "
                    f"({len(rows)} figures)</summary>", "", *markdown_table(["evidence", "value"], rows, ["l", "r"]),
                    "", "</details>", ""]
    if r.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    out += [f"## Knobs that differ from {r.parent}" if r.parent else "## Knobs", ""]
    if r.parent:
        out += [f"    {line}" for c in r.knob_changes for line in c.splitlines()] or ["(none)"]
    else:
        out += ["(this profile extends nothing)"]
    out += ["", "## History", "", *markdown_table(HISTORY_HEAD, [_history_row(h, s) for h, s in r.history]), ""]
    return "\n".join(out)


def page_context(r: ReportData) -> dict[str, Any]:
    """What the HTML template renders: plain data, Markdown fragments marked as such (`*_md`)."""
    e = r.entry
    p = r.provenance
    return {
        "profile": r.profile,
        "banner": None if p is None or p.kind == "measured" else {"mark": mark(p), "label": p.label,
                                                                   "detail": p.detail or ""},
        "stale": r.stale,
        "what_ran": what_ran(r),
        "verdict_md": verdict_line(e) if e else None,
        "key_figures": key_figures(e) if e else [],
        "next_steps_md": r.next_steps,
        "record_hint": None if e else f"toolkit results record DIR --profile {r.profile}",
        "watermark": r.watermark,
        "plots": r.plots,
        "figures": headline_rows(e) if e else [],
        "evidence": evidence_rows(e) if e else [],
        "notes_md": r.notes,
        "parent": r.parent,
        "knob_changes": r.knob_changes,
        "history_head": HISTORY_HEAD,
        "history": [_history_row(h, s) for h, s in r.history],
    }
