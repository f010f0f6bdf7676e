"""The report's plots as PNG bytes: the only importer of matplotlib.

Agg backend (no display), fixed size and DPI, and no timestamps in the PNG metadata, so the same run gives the same
bytes. Every time plot has the same width, the same axes position and the same time axis (the idle baseline
squeezed to a sliver at its start), so stacked one under another they line up second for second. Identical GPUs
are one band (min to max, the mean as a line); distinct GPUs are bands of their own. An image of data that was not
measured carries its provenance mark (toolkit.core.provenance: LAB STAND-IN, REPLAYED ...) across the plot.
"""

from __future__ import annotations

import io
from typing import Any

from toolkit.core.results.report import IDLE_AXIS_SHARE, Band, Plot, PlotData
from toolkit.core.tables import figure

_WIDTH_IN = 10.0
_HEIGHT_IN = 3.3
_DPI = 100
# The axes' place in every time figure (fractions of the figure): the legend lives right of `_RIGHT`.
_LEFT, _RIGHT = 0.075, 0.72
_COLOURS = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#bcbd22"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any, *, tight: bool = False) -> bytes:
    buf = io.BytesIO()
    # metadata={"Software": None}: no matplotlib version in the file, so the bytes depend only on the data.
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None}, **({"bbox_inches": "tight"} if tight else {}))
    _pyplot().close(fig)
    return buf.getvalue()


def watermark(fig: Any, word: str | None) -> None:
    """A large translucent word across the figure: every image of data that was not measured says so."""
    if word:
        # Smaller for a longer stamp ("ENGINE MODEL + REPLAYED"), so it stays inside the figure.
        size = 64 if len(word) <= 12 else max(24, 64 * 12 // len(word))
        fig.text(0.5, 0.5, word, transform=fig.transFigure, ha="center", va="center", rotation=18, fontsize=size,
                 color="#c00000", alpha=0.13, fontweight="bold", zorder=100)


def _nan(vs: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in vs]


def _time_scale(ax: Any, d: PlotData) -> None:
    """The shared time axis: the probe's clock, with the idle baseline before the benchmark squeezed into
    IDLE_AXIS_SHARE of the width (it is a reference level, drawn as a line in the power plot)."""
    import numpy as np

    if not d.time_range_s:
        return
    lo, hi = d.time_range_s
    if d.idle_window_s:
        lo = min(lo, d.idle_window_s[0])  # the probe's clock starts with the idle baseline: the axis at its 0
    b = d.bench_window_s[0] if d.bench_window_s else lo
    k = 1.0
    if d.idle_window_s and lo < b < hi:
        k = min(1.0, IDLE_AXIS_SHARE / (1 - IDLE_AXIS_SHARE) * (hi - b) / (b - lo))
    if k < 1.0:
        ax.set_xscale("function", functions=(lambda t: np.where(t < b, b + (t - b) * k, t),
                                             lambda u: np.where(u < b, b + (u - b) / k, u)))
        ax.axvspan(lo, b, color="0.85", zorder=0, label=f"idle baseline ({b - lo:.0f} s, compressed)")
    from matplotlib.ticker import MaxNLocator

    ticks = [t for t in MaxNLocator(nbins=8).tick_values(b, hi) if b <= t <= hi]
    if k < 1.0 and (not ticks or ticks[0] - b > 0.3 * (ticks[1] - ticks[0] if len(ticks) > 1 else 1.0)):
        ticks.insert(0, round(b, 1))  # where the benchmark starts, after the squeezed idle baseline
    from matplotlib.ticker import FuncFormatter

    ax.set_xticks(([lo] if k < 1.0 else []) + ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    pad = 0.02 * (hi - b)
    ax.set_xlim(lo if k < 1.0 else lo - pad, hi + pad)


def _time_axes(fig: Any, rect: tuple[float, float, float, float] | None = None) -> Any:
    return fig.add_axes(rect or (_LEFT, 0.17, _RIGHT - _LEFT, 0.72))


def _windows(ax: Any, d: PlotData) -> None:
    if d.bench_window_s:
        ax.axvspan(*d.bench_window_s, color="0.95", zorder=0, label="benchmark")
    if d.steady_window_s:
        ax.axvspan(*d.steady_window_s, color="#d8ecd8", zorder=0, label="steady window")


def _bands(ax: Any, bands: list[Band], *, style: str = "-", what: str = "", colour_at: int = 0,
           scale_top: float | None = None) -> None:
    """Each group of identical GPUs as its mean line and, where the GPUs differ visibly, the min-max band; the
    legend names only what is drawn (a band of GPUs that read alike is no band)."""
    # A band is drawn where the GPUs differ visibly for a good part of the run: the 90th percentile of the spread
    # above 1 % of the scale (a few bins at a ramp, GPUs sampled ms apart, are no difference).
    spread_bar = 0.01 * (scale_top or max([v for b in bands for v in b.hi if v is not None] + [1.0]))
    for i, b in enumerate(bands):
        colour = _COLOURS[(colour_at + i) % len(_COLOURS)]
        mean = _nan(b.mean)
        name = b.label if len(bands) > 1 else (f"{len(b.gpus)} GPUs" if len(b.gpus) > 1 else f"GPU {b.gpus[0]}")
        spreads = sorted(h - lo for h, lo in zip(b.hi, b.lo, strict=True) if h is not None and lo is not None)
        spread = spreads[int(0.9 * (len(spreads) - 1))] if spreads else 0.0
        if len(b.gpus) > 1 and spread > spread_bar:
            ax.fill_between(b.t_s, _nan(b.lo), _nan(b.hi), color=colour, alpha=0.25, lw=0,
                            label=f"{what}{name}: min-max")
            ax.plot(b.t_s, mean, style, color=colour, lw=1.3, label=f"{what}{name}: mean")
        else:
            alike = " (all alike)" if len(b.gpus) > 1 else ""
            ax.plot(b.t_s, mean, style, color=colour, lw=1.3, label=f"{what}{name}{alike}")


def _gpus_line(bands: list[Band]) -> str:
    return "; ".join(b.label for b in bands)


def _legend(ax: Any, fontsize: int = 8) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=fontsize, frameon=False)


def _time_figure(d: PlotData, height_in: float = _HEIGHT_IN) -> tuple[Any, Any]:
    plt = _pyplot()
    fig = plt.figure(figsize=(_WIDTH_IN, height_in))
    ax = _time_axes(fig)
    _time_scale(ax, d)
    _windows(ax, d)
    ax.set_xlabel("time since the probe started (s)")
    ax.grid(alpha=0.3)
    return fig, ax


def _sim(d: PlotData) -> str:
    return f"**{d.watermark}** ({d.data_source}). " if d.watermark else ""


def power_plot(d: PlotData) -> Plot:
    fig, ax = _time_figure(d)
    _bands(ax, d.power, scale_top=max([v for b in d.power for v in b.hi if v is not None] + [d.power_limit_w or 0.0]))
    if d.power_limit_w is not None:
        ax.axhline(d.power_limit_w, color="#c00000", ls="--", lw=1.5,
                   label=f"enforced limit {figure(d.power_limit_w)} W")
    if d.idle_power_w is not None:
        ax.axhline(d.idle_power_w, color="0.35", ls=":", lw=1.5, label=f"idle baseline {d.idle_power_w:.0f} W")
    ax.set_ylabel("power per GPU (W)")
    top = max([*(v for b in d.power for v in b.hi if v is not None), d.power_limit_w or 0.0])
    ax.set_ylim(0, top * 1.08 if top > 0 else 1.0)
    _legend(ax)
    watermark(fig, d.watermark)
    identical = [b for b in d.power if len(b.gpus) > 1]
    caption = (_sim(d) + f"Board power per GPU ({_gpus_line(d.power)}; NVML's ~1 s average) against the enforced "
               "limit and the idle baseline measured before the load (its seconds squeezed at the left)"
               + ("; identical GPUs are one line, their mean, with a band from the lowest to the highest where they "
                  "differ" if identical else "") + f". {d.steady_note[0].upper()}{d.steady_note[1:]}.")
    return Plot("power", "Power per GPU over time", caption, _png(fig))


def util_gpm_plot(d: PlotData) -> Plot:
    fig, ax = _time_figure(d)
    _bands(ax, d.util, what="util.gpu, ", scale_top=100.0)
    if d.gpm_sm:
        _bands(ax, d.gpm_sm, style="--", what="GPM SM, ", colour_at=1, scale_top=100.0)
        caption = ("util.gpu is the share of time any kernel ran (a spinning kernel reads 100 %); GPM SM activity "
                   "(dashed) is the share of SM cycles doing work. A wide gap between them is the busy-but-waiting "
                   "signature.")
    else:
        ax.text(0.5, 0.5, "GPM not available on these GPUs (or not sampled):\npower against the limit is the check",
                transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#a05000")
        caption = "Utilization only: these GPUs offer no GPM metrics (Hopper and newer do)."
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    _legend(ax, 7)
    watermark(fig, d.watermark)
    return Plot("util-gpm", "Utilization against GPM SM activity", _sim(d) + caption, _png(fig))


def throughput_plot(d: PlotData) -> Plot:
    fig, ax = _time_figure(d)
    if d.throughput_t_s:
        ax.plot(d.throughput_t_s, d.throughput_tok_per_s, "-", color="#1f77b4", lw=1.6, label="output tok/s")
        if d.full_run_tok_per_s is not None:
            ax.axhline(d.full_run_tok_per_s, color="0.4", ls=":", lw=1.2,
                       label=f"full-run average {figure(d.full_run_tok_per_s)}")
        if d.steady_tok_per_s is not None and d.steady_window_s:
            ax.hlines(d.steady_tok_per_s, *d.steady_window_s, colors="#2ca02c", linestyles="--", lw=1.5,
                      label=f"steady-state average {figure(d.steady_tok_per_s)}")
    else:
        ax.text(0.5, 0.5, "no throughput figures in this run", transform=ax.transAxes, ha="center", va="center")
    ax.set_ylabel("output tokens / s")
    top = max([*d.throughput_tok_per_s, d.full_run_tok_per_s or 0.0, d.steady_tok_per_s or 0.0], default=0.0)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    _legend(ax)
    watermark(fig, d.watermark)
    caption = _sim(d) + d.throughput_source[0].upper() + d.throughput_source[1:] + f". {d.steady_note[0].upper()}" \
        f"{d.steady_note[1:]}."
    return Plot("throughput", "Throughput over time", caption, _png(fig))


def server_plot(d: PlotData) -> Plot:
    """Under the power plot, the same time axis: SGLang's running/queued (and its cap where it is on the scale),
    the KV pool's usage on a scale that shows it, the counter's throughput, and the busiest threads' CPU."""
    assert d.server is not None
    sv = d.server
    plt = _pyplot()
    fig = plt.figure(figsize=(_WIDTH_IN, 7.2))
    axes: list[Any] = []
    for i in range(4):
        ax = fig.add_axes((_LEFT, 0.08 + (3 - i) * 0.225, _RIGHT - _LEFT, 0.19), sharex=axes[0] if axes else None)
        if not axes:
            _time_scale(ax, d)
        _windows(ax, d)
        for t in sv.gaps_t_s:
            ax.axvline(t, color="#c00000", lw=0.6, alpha=0.5)
        ax.grid(alpha=0.3)
        axes.append(ax)
    a0, a1, a2, a3 = axes
    for ax in axes[:3]:
        ax.tick_params(labelbottom=False)
    notes = []
    if sv.t_s:
        a0.step(sv.t_s, _nan(sv.running), where="post", color="#1f77b4", lw=1.5, label="running")
        a0.step(sv.t_s, _nan(sv.queued), where="post", color="#ff7f0e", lw=1.5, label="queued")
        data_top = max([v for v in sv.running + sv.queued if v is not None], default=0.0)
        caps = [v for v in sv.running_cap if v is not None]
        cap = max(caps) if caps else None
        if cap is not None and cap <= 1.5 * max(data_top, 1.0):
            a0.step(sv.t_s, _nan(sv.running_cap), where="post", color="#c00000", ls="--", lw=1.2,
                    label="running cap")
            data_top = max(data_top, cap)
        elif cap is not None:
            notes.append(f"the running cap ({figure(cap)}) is far above the requests and is left off the scale")
            a0.plot([], [], color="#c00000", ls="--", lw=1.2, label=f"running cap {figure(cap)}: off the scale")
        a0.set_ylim(0, data_top * 1.15 if data_top > 0 else 1.0)
        usage = [v for v in sv.token_usage if v is not None]
        a1.step(sv.t_s, _nan(sv.token_usage), where="post", color="#9467bd", lw=1.5, label="KV token usage")
        u_top = max(usage, default=0.0)
        a1.set_ylim(0, min(1.05, max(u_top * 1.3, 0.02)))
        if u_top * 1.3 < 1.0:
            notes.append(f"KV token usage is on a 0-{figure(min(1.05, max(u_top * 1.3, 0.02)))} scale (of a full "
                         "pool, 1)")
    else:
        a0.text(0.5, 0.5, "no server timeline in this run", transform=a0.transAxes, ha="center", va="center")
    a0.set_ylabel("requests")
    a1.set_ylabel("KV usage")
    if sv.counter_t_s:
        a2.plot(sv.counter_t_s, sv.counter_tok_per_s, "-", color="#2ca02c", lw=1.4, label="output tok/s (counter)")
        a2.set_ylim(0, max(sv.counter_tok_per_s) * 1.15 if max(sv.counter_tok_per_s) > 0 else 1.0)
    else:
        a2.text(0.5, 0.5, "no realtime_tokens counter (server without --enable-metrics?)", transform=a2.transAxes,
                ha="center", va="center", fontsize=9, color="#a05000")
    a2.set_ylabel("tok/s")
    if sv.server_thread_t_s:
        a3.plot(sv.server_thread_t_s, sv.server_thread_cpu_pct, "-", color="#8c564b", lw=1.4,
                label="server's busiest thread")
    if sv.bench_thread_t_s:
        a3.plot(sv.bench_thread_t_s, sv.bench_thread_cpu_pct, ":", color="0.3", lw=1.2,
                label="benchmark's busiest thread")
    if not sv.server_thread_t_s and not sv.bench_thread_t_s:
        a3.text(0.5, 0.5, "no host timeline in this run", transform=a3.transAxes, ha="center", va="center")
    a3.set_ylabel("CPU % of a core")
    a3.set_ylim(0, 110)
    a3.set_xlabel("time since the probe started (s)")
    for ax in axes[1:]:  # the windows are named once, in the first panel's legend
        handles, labels = ax.get_legend_handles_labels()
        keep = [(h, lb) for h, lb in zip(handles, labels, strict=True) if lb not in ("benchmark", "steady window")]
        if keep:
            ax.legend(*zip(*keep, strict=True), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                      frameon=False)
    _legend(a0)
    watermark(fig, d.watermark)
    caption = ("SGLang's gauges (written at each prefill batch and every `decode_log_interval` decode steps, so "
               "they step), its running cap from `/v1/loads`, throughput between scrapes of its per-forward token "
               "counter, and the busiest thread's CPU from /proc"
               + (f" ({sv.server_thread_name})" if sv.server_thread_name else "") + ".")
    if notes:
        caption += " " + "; ".join(n[0].upper() + n[1:] for n in notes) + "."
    if sv.gaps_t_s:
        caption += f" Red lines: {len(sv.gaps_t_s)} scrape(s) that got no answer."
    if sv.not_seen:
        caption += " Not seen: " + "; ".join(sv.not_seen) + "."
    return Plot("server", "Server and host over time", _sim(d) + caption, _png(fig))


def latency_plot(d: PlotData) -> Plot:
    """TTFT per request and ITL per token as distributions (empirical CDFs), their p50, p90 and p99 marked."""
    import numpy as np

    assert d.latencies is not None
    lat = d.latencies
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(_WIDTH_IN, _HEIGHT_IN))
    fig.subplots_adjust(left=_LEFT, right=0.98, bottom=0.17, top=0.86, wspace=0.25)
    for ax, values, name, unit in ((axes[0], lat.ttft_ms, "TTFT", "per request"),
                                   (axes[1], lat.itl_ms, "ITL", "per token")):
        if not values:
            ax.text(0.5, 0.5, f"no {name} values", transform=ax.transAxes, ha="center", va="center")
            continue
        xs = np.sort(np.asarray(values))
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", color="#1f77b4", lw=1.5)
        for q, ls in ((50, "-"), (90, "--"), (99, ":")):
            v = float(np.percentile(xs, q))
            ax.axvline(v, color="#c00000", ls=ls, lw=1.1, label=f"p{q} {figure(v)} ms")
        if xs[-1] > 20 * max(xs[0], 1e-3):
            ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, {unit}, {len(xs):,} values)")
        ax.set_ylabel("share at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    watermark(fig, d.watermark)
    caption = (f"{_sim(d)}Time to first token of each of the {lat.requests - lat.failed:,} completed requests and "
               "the gap between consecutive output tokens (inter-token latency), from bench_serving's per-request "
               "results (`--output-details`)" + (f"; {lat.failed} failed requests left out" if lat.failed else "")
               + ".")
    return Plot("latency", "TTFT and ITL distributions", caption, _png(fig))


def report_plots(d: PlotData) -> list[Plot]:
    plots = [power_plot(d)]
    if d.server is not None:
        plots.append(server_plot(d))  # under the power plot, on its time axis
    plots += [util_gpm_plot(d), throughput_plot(d)]
    if d.latencies is not None:
        plots.append(latency_plot(d))
    return plots


# --- sweep plots (toolkit sweep); plain data in, PNG bytes out; `mark`: the watermark of simulated data ---


def sweep_throughput_png(curves: list[dict[str, Any]], *, title: str, mark: str | None = None) -> bytes:
    """Steady-state output throughput against concurrency, one line per variant.

    `curves`: [{"variant": "v01", "label": "max_running_requests=256 ...", "points": [(concurrency, tok/s)]}].
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 4.0))
    for c in curves:
        xs = [p[0] for p in c["points"]]
        ys = [p[1] for p in c["points"]]
        ax.plot(xs, ys, "o-", lw=1.4, label=f"{c['variant']} {c['label']}")
    levels = sorted({p[0] for c in curves for p in c["points"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("steady-state output tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    watermark(fig, mark)
    return _png(fig, tight=True)


def sweep_pareto_png(
    points: list[tuple[str, int, float, float]], front: list[tuple[str, int]], *, title: str, mark: str | None = None
) -> bytes:
    """Every measured point as (variant, concurrency, tok/s, J per output token); the Pareto front joined."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 4.0))
    on_front = set(front)
    ax.scatter([p[3] for p in points], [p[2] for p in points], color="0.6", s=22, label="measured point")
    best = sorted((p for p in points if (p[0], p[1]) in on_front), key=lambda p: p[3])
    ax.plot([p[3] for p in best], [p[2] for p in best], "o-", color="#c00000", lw=1.6, label="Pareto front")
    for vid, conc, tput, energy in best:
        ax.annotate(f"{vid}@{conc}", (energy, tput), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("energy per output token (J, all GPUs)")
    ax.set_ylabel("steady-state output tok/s")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    watermark(fig, mark)
    return _png(fig, tight=True)


# --- tune plots (toolkit tune); plain data in, PNG bytes out; `mark` as above ---------------------------


def tune_step_png(bars: list[tuple[str, float, str]], *, band_pct: float, title: str, unit: str,
                  intervals: list[tuple[float, float] | None] | None = None, mark: str | None = None) -> bytes:
    """One step of a tune: the incumbent and its candidates as bars, the noise band around the incumbent shaded,
    each bar's 95 % interval as an error bar where it has one.

    `bars`: [(variant id, value in `unit`, "incumbent" | "kept" | "not kept" | "failed" | "invalid")]; a failed or
    invalid candidate is a zero bar with its status written on it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 4.0))
    colours = {"incumbent": "0.45", "kept": "#2a7d2a", "not kept": "#c08000", "failed": "#c00000", "invalid": "#c00000"}
    xs = list(range(len(bars)))
    ax.bar(xs, [b[1] for b in bars], color=[colours.get(b[2], "0.6") for b in bars])
    for x, (_vid, value, _s), ci in zip(xs, bars, intervals or [None] * len(bars), strict=True):
        if ci is not None and value > 0:
            ax.errorbar([x], [value], yerr=[[value - ci[0]], [ci[1] - value]], color="black", capsize=4,
                        linewidth=1)
    inc = bars[0][1] if bars else 0.0
    if inc > 0:
        ax.axhspan(inc * (1 - band_pct / 100), inc * (1 + band_pct / 100), color="0.8", alpha=0.5,
                   label=f"noise band +-{band_pct:.2f} %")
        ax.legend(loc="lower right", fontsize=8)
    for x, (_vid, value, status) in zip(xs, bars, strict=True):
        ax.annotate(status if value <= 0 else f"{value:,.4g}\n{status}", (x, value), ha="center",
                    textcoords="offset points", xytext=(0, 3), fontsize=8)
    ax.set_xticks(xs, [b[0] for b in bars])
    ax.set_ylabel(unit)
    ax.set_ylim(0, max([b[1] for b in bars] + [1.0]) * 1.2)  # room for the labels above the bars
    ax.set_title(title, fontsize=9)
    watermark(fig, mark)
    return _png(fig, tight=True)


def frontier_png(series: list[dict[str, Any]], *, slo: dict[str, float], title: str,
                 mark: str | None = None) -> bytes:
    """A capacity search's frontier: per variant, output tok/s against p99 TTFT and against p99 ITL at each rate it
    was offered (filled: the SLO held; hollow: missed), the SLO's bounds as lines; beside them each variant's energy
    per output token at its capacity rate, labelled with the power limit it ran under; `mark` as above.

    `series`: [{"label", "points": [{"tok_s", "ttft_ms", "itl_ms", "met"}], "j_per_tok", "power_limit_w"}]."""
    plt = _pyplot()
    # The report's width; the two latency panels share the throughput axis and the variants' legend goes below
    # all three, so no label runs into the next panel.
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(_WIDTH_IN, 4.6), gridspec_kw={"width_ratios": [1.0, 1.0, 0.7]})
    axes[1].sharey(axes[0])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(series):
        c = colours[i % len(colours)]
        pts = sorted(s["points"], key=lambda p: p["tok_s"])
        for ax, key in ((axes[0], "ttft_ms"), (axes[1], "itl_ms")):
            xs = [p[key] for p in pts if p.get(key) is not None]
            ys = [p["tok_s"] for p in pts if p.get(key) is not None]
            ax.plot(xs, ys, "-", color=c, alpha=0.6, label=s["label"] if key == "ttft_ms" else None)
            for p in pts:
                if p.get(key) is not None:
                    ax.plot([p[key]], [p["tok_s"]], "o", color=c, markerfacecolor=c if p["met"] else "none")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax, key, name in ((axes[0], "ttft_p99_ms", "p99 TTFT (ms)"), (axes[1], "itl_p99_ms", "p99 ITL (ms)")):
        if key in slo:
            line = ax.axvline(slo[key], color="#c00000", linestyle="--", linewidth=1)
            handles.append(line)
            labels.append(f"SLO {name.split(' ')[1]} {slo[key]:g} ms")
        lo, hi = ax.get_xlim()
        # A log axis for latencies spanning decades (queueing); a narrow span (ITL 220 to 330 ms) stays linear, or
        # it gets no decade tick and overlapping 2.2 x 10^2 labels. Plain numbers either way.
        if lo > 0 and hi / lo > 10:
            ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(name + "; filled: met, hollow: missed", fontsize=8)
    axes[0].set_ylabel("output tok/s the rate carries")
    axes[1].tick_params(labelleft=False)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=7, frameon=False)
    bars = [s for s in series if s.get("j_per_tok") is not None]
    xs = list(range(len(bars)))
    axes[2].bar(xs, [s["j_per_tok"] for s in bars], color=[colours[series.index(s) % len(colours)] for s in bars])
    for x, s in zip(xs, bars, strict=True):
        lim = s.get("power_limit_w")
        axes[2].annotate(f"{s['j_per_tok']:.3g} J\n{lim:g} W" if lim else f"{s['j_per_tok']:.3g} J",
                         (x, s["j_per_tok"]), ha="center", textcoords="offset points", xytext=(0, 3), fontsize=7)
    axes[2].set_xticks(xs, [s["label"].split(" ")[0] for s in bars], fontsize=7)
    axes[2].set_ylabel("J per output token at capacity")
    axes[2].set_ylim(0, max([s["j_per_tok"] for s in bars] + [0.001]) * 1.3)
    fig.suptitle(title, fontsize=9)
    watermark(fig, mark)
    return _png(fig, tight=True)
