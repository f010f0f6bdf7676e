"""The report's plots as PNG bytes: the only importer of matplotlib.

Agg backend (no display), fixed size and DPI, and no timestamps in the PNG metadata, so the same
run gives the same bytes.
"""

from __future__ import annotations

import io
from typing import Any

from toolkit.core.results.report import GpuLine, Plot, PlotData

_SIZE_IN = (10.0, 4.0)
_DPI = 100


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    # metadata={"Software": None}: no matplotlib version in the file, so the bytes depend only on the data.
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    _pyplot().close(fig)
    return buf.getvalue()


def _nan(vs: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in vs]


def _windows(ax: Any, d: PlotData) -> None:
    if d.bench_window_s:
        ax.axvspan(*d.bench_window_s, color="0.92", zorder=0, label="benchmark")
    if d.steady_window_s:
        ax.axvspan(*d.steady_window_s, color="#d8ecd8", zorder=0, label="steady window")


def _lines(ax: Any, lines: list[GpuLine], *, style: str = "-", alpha: float = 0.9, label: str = "GPU") -> None:
    for ln in lines:
        ax.plot(ln.t_s, [float("nan") if v is None else v for v in ln.values], style, lw=1.2, alpha=alpha,
                label=f"{label} {ln.gpu}")


def power_plot(d: PlotData) -> Plot:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
    _windows(ax, d)
    _lines(ax, d.power)
    if d.power_limit_w is not None:
        ax.axhline(d.power_limit_w, color="#c00000", ls="--", lw=1.5, label=f"enforced limit {d.power_limit_w:g} W")
    if d.idle_power_w is not None:
        ax.axhline(d.idle_power_w, color="0.35", ls=":", lw=1.5, label=f"idle baseline {d.idle_power_w:.0f} W")
    ax.set_xlabel("time since the probe started (s)")
    ax.set_ylabel("power (W)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    caption = ("Per-GPU board power (nvmlDeviceGetPowerUsage, a ~1 s average) against the enforced limit and the "
               "idle baseline measured before the load.")
    if "simulated" in d.data_source:
        caption = "SIMULATED GPUs (the lab's engine model, not a measurement). " + caption
    return Plot("power", "Power per GPU over time", caption, _png(fig))


def util_gpm_plot(d: PlotData) -> Plot:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
    _windows(ax, d)
    _lines(ax, d.util, label="util.gpu, GPU")
    if d.gpm_sm:
        _lines(ax, d.gpm_sm, style="--", label="GPM SM activity, GPU")
        caption = ("util.gpu is the share of time any kernel ran (a spinning kernel reads 100 %); GPM SM activity "
                   "is the share of SM cycles doing work. A wide gap between them is the busy-but-waiting signature.")
    else:
        ax.text(0.5, 0.5, "GPM not available on these GPUs (or not sampled):\npower against the limit is the check",
                transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#a05000")
        caption = "Utilization only: these GPUs offer no GPM metrics (Hopper and newer do)."
    ax.set_xlabel("time since the probe started (s)")
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    ax.grid(alpha=0.3)
    return Plot("util-gpm", "Utilization against GPM SM activity", caption, _png(fig))


def throughput_plot(d: PlotData) -> Plot:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
    _windows(ax, d)
    if d.throughput_t_s:
        ax.plot(d.throughput_t_s, d.throughput_tok_per_s, "-", color="#1f77b4", lw=1.8, label="output tok/s")
        if d.full_run_tok_per_s is not None:
            ax.axhline(d.full_run_tok_per_s, color="0.4", ls=":", lw=1.2,
                       label=f"full-run average {d.full_run_tok_per_s:,.0f}")
        if d.steady_tok_per_s is not None and d.steady_window_s:
            ax.hlines(d.steady_tok_per_s, *d.steady_window_s, colors="#2ca02c", linestyles="--", lw=1.5,
                      label=f"steady-state average {d.steady_tok_per_s:,.0f}")
    else:
        ax.text(0.5, 0.5, "no throughput figures in this run", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlabel("time since the probe started (s)")
    ax.set_ylabel("output tokens / s")
    top = max([*d.throughput_tok_per_s, d.full_run_tok_per_s or 0.0, d.steady_tok_per_s or 0.0], default=0.0)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    return Plot("throughput", "Throughput over time", d.throughput_source[0].upper() + d.throughput_source[1:] + ".",
                _png(fig))


def server_plot(d: PlotData) -> Plot:
    """Under the power plot, same time axis: SGLang's running/queued against the cap, the KV pool's usage, the
    counter's throughput, and the busiest threads' CPU (a host-bound process shows one thread near 100 %)."""
    assert d.server is not None
    sv = d.server
    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(_SIZE_IN[0], 7.5), sharex=True)
    for ax in axes:
        _windows(ax, d)
        if d.time_range_s:
            # The power plot's x axis: the GPU trace's range with matplotlib's default 5 % margins.
            lo, hi = d.time_range_s
            ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        for t in sv.gaps_t_s:
            ax.axvline(t, color="#c00000", lw=0.6, alpha=0.5)
        ax.grid(alpha=0.3)
    a0, a1, a2, a3 = axes
    if sv.t_s:
        a0.step(sv.t_s, _nan(sv.running), where="post", color="#1f77b4", lw=1.5, label="running")
        a0.step(sv.t_s, _nan(sv.queued), where="post", color="#ff7f0e", lw=1.5, label="queued")
        if any(v is not None for v in sv.running_cap):
            a0.step(sv.t_s, _nan(sv.running_cap), where="post", color="#c00000", ls="--", lw=1.2,
                    label="running cap (max_running_requests)")
        a1.step(sv.t_s, _nan(sv.token_usage), where="post", color="#9467bd", lw=1.5, label="KV token usage")
    else:
        a0.text(0.5, 0.5, "no server timeline in this run", transform=a0.transAxes, ha="center", va="center")
    a0.set_ylabel("requests")
    a0.set_ylim(bottom=0)
    a1.set_ylabel("token usage")
    a1.set_ylim(0, 1.05)
    if sv.counter_t_s:
        a2.plot(sv.counter_t_s, sv.counter_tok_per_s, "-", color="#2ca02c", lw=1.4, label="output tok/s (counter)")
    else:
        a2.text(0.5, 0.5, "no realtime_tokens counter (server without --enable-metrics?)", transform=a2.transAxes,
                ha="center", va="center", fontsize=9, color="#a05000")
    a2.set_ylabel("tok/s")
    a2.set_ylim(bottom=0)
    if sv.server_thread_t_s:
        a3.plot(sv.server_thread_t_s, sv.server_thread_cpu_pct, "-", color="#8c564b", lw=1.4,
                label="server's busiest thread" + (f" ({sv.server_thread_name})" if sv.server_thread_name else ""))
    if sv.bench_thread_t_s:
        a3.plot(sv.bench_thread_t_s, sv.bench_thread_cpu_pct, ":", color="0.3", lw=1.2,
                label="benchmark's busiest thread")
    if not sv.server_thread_t_s and not sv.bench_thread_t_s:
        a3.text(0.5, 0.5, "no host timeline in this run", transform=a3.transAxes, ha="center", va="center")
    a3.set_ylabel("CPU % of a core")
    a3.set_ylim(0, 110)
    a3.set_xlabel("time since the probe started (s)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    caption = ("SGLang's gauges (written at each prefill batch and every decode_log_interval decode steps, so "
               "they step), its running cap from /v1/loads, throughput between scrapes of its per-forward token "
               "counter, and the busiest thread's CPU from /proc. Red lines: scrapes that got no answer.")
    if sv.not_seen:
        caption += " Not seen: " + "; ".join(sv.not_seen) + "."
    if "simulated" in d.data_source:
        caption = "SIMULATED (the lab's engine model). " + caption
    return Plot("server", "Server and host over time", caption, _png(fig))


def report_plots(d: PlotData) -> list[Plot]:
    plots = [power_plot(d)]
    if d.server is not None:
        plots.append(server_plot(d))  # under the power plot, on its time axis
    return [*plots, util_gpm_plot(d), throughput_plot(d)]


# --- sweep plots (issue #8: toolkit sweep); plain data in, PNG bytes out -------------------------------


def sweep_throughput_png(curves: list[dict[str, Any]], *, title: str) -> bytes:
    """Steady-state output throughput against concurrency, one line per variant.

    `curves`: [{"variant": "v01", "label": "max_running_requests=256 ...", "points": [(concurrency, tok/s)]}].
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
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
    return _png(fig)


def sweep_pareto_png(
    points: list[tuple[str, int, float, float]], front: list[tuple[str, int]], *, title: str
) -> bytes:
    """Every measured point as (variant, concurrency, tok/s, J per output token); the Pareto front joined."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
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
    return _png(fig)


# --- tune plots (issue #17: toolkit tune); plain data in, PNG bytes out --------------------------------


def tune_step_png(bars: list[tuple[str, float, str]], *, band_pct: float, title: str, unit: str,
                  intervals: list[tuple[float, float] | None] | None = None) -> bytes:
    """One step of a tune: the incumbent and its candidates as bars, the noise band around the incumbent shaded,
    each bar's 95 % interval as an error bar where it has one.

    `bars`: [(variant id, value in `unit`, "incumbent" | "kept" | "not kept" | "failed" | "invalid")]; a failed or
    invalid candidate is a zero bar with its status written on it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
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
    return _png(fig)


def frontier_png(series: list[dict[str, Any]], *, slo: dict[str, float], title: str) -> bytes:
    """A capacity search's frontier: per variant, output tok/s against p99 TTFT and against p99 ITL at each rate it
    was offered (filled: the SLO held; hollow: missed), the SLO's bounds as lines; beside them each variant's energy
    per output token at its capacity rate, labelled with the power limit it ran under.

    `series`: [{"label", "points": [{"tok_s", "ttft_ms", "itl_ms", "met"}], "j_per_tok", "power_limit_w"}]."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(_SIZE_IN[0] * 1.9, _SIZE_IN[1]),
                             gridspec_kw={"width_ratios": [1.0, 1.0, 0.8]})
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
    for ax, key, name in ((axes[0], "ttft_p99_ms", "p99 TTFT (ms)"), (axes[1], "itl_p99_ms", "p99 ITL (ms)")):
        if key in slo:
            ax.axvline(slo[key], color="#c00000", linestyle="--", linewidth=1, label=f"SLO {slo[key]:g} ms")
        ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("output tok/s")
        ax.legend(fontsize=7, loc="best")
    bars = [s for s in series if s.get("j_per_tok") is not None]
    xs = list(range(len(bars)))
    axes[2].bar(xs, [s["j_per_tok"] for s in bars], color=[colours[series.index(s) % len(colours)] for s in bars])
    for x, s in zip(xs, bars, strict=True):
        lim = s.get("power_limit_w")
        axes[2].annotate(f"{s['j_per_tok']:.3g} J\n{lim:g} W" if lim else f"{s['j_per_tok']:.3g} J",
                         (x, s["j_per_tok"]), ha="center", textcoords="offset points", xytext=(0, 3), fontsize=7)
    axes[2].set_xticks(xs, [s["label"].split(" ")[0] for s in bars])
    axes[2].set_ylabel("J per output token at the capacity rate")
    axes[2].set_ylim(0, max([s["j_per_tok"] for s in bars] + [0.001]) * 1.3)
    fig.suptitle(title, fontsize=9)
    return _png(fig)
