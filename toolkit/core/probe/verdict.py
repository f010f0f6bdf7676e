"""The verdict: where the time goes, as a pure function of summary, topology, the profile's target and, when
given, the run's timelines (GPU trace, server trace, host trace).

With the trace, the run is judged over time (intervals.py, timeline.py): a state per ~1 s interval from the GPU,
server and CPU timelines together, the run from the mix of states, and next steps that name the knob (knobs.py).
Without it (or with too short a window), the steady window's means are judged: the window-mean fallback, which is
also kept beside the timeline's verdict (`window_mean`). The per-GPU rules are gpu_rules.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.probe.gpu_rules import (
    CLIENT,
    COMPUTE,
    FAILED,
    HOST,
    IMBALANCE_RELATIVE,
    IMBALANCE_SPREAD,
    IMBALANCED,
    INTERMITTENT,
    KV_BOUND,
    LAUNCH,
    MEMORY,
    MIXED,
    NO_LOAD,
    OVERLOADED,
    SCHEDULER_CAPPED,
    THROTTLED,
    WAITING,
    GpuJudgement,
    judge_gpu,
    work_of,
)
from toolkit.core.probe.intervals import HostTimeline, ServerTimeline, build_intervals, load_segments, thread_name
from toolkit.core.probe.knobs import KnobStep, fewer_tp_variants, propose
from toolkit.core.probe.records import Summary
from toolkit.core.probe.series import Trace
from toolkit.core.probe.timeline import TimelineJudgement, judge_timeline
from toolkit.core.provenance import MEASURED, Provenance, mark, of_record

VERDICT_SCHEMA_VERSION = 1  # keys are only ever added (knob_steps, timeline, window_mean, signals)
MIN_INTERVALS = 3  # a shorter window is judged by its means only
# Classes only the timelines can show; the window mean (GPU counters) cannot contradict them.
TIMELINE_ONLY = (HOST, INTERMITTENT, SCHEDULER_CAPPED, KV_BOUND, CLIENT, OVERLOADED)


@dataclass
class Verdict:
    cls: str
    confidence: float
    basis: str
    evidence: dict[str, Any]
    next_steps: list[str]
    per_gpu: dict[str, GpuJudgement] = field(default_factory=dict)
    power_capped: bool | None = None
    slow_gpu: int | None = None
    headline: str = ""
    provenance: Provenance = MEASURED
    knob_steps: list[KnobStep] = field(default_factory=list)
    timeline: TimelineJudgement | None = None
    window_mean: dict[str, Any] | None = None  # the fallback's judgement, when the timeline decided
    signals: list[str] = field(default_factory=lambda: ["gpu"])

    @property
    def disagreements(self) -> list[str]:
        return self.timeline.disagreements if self.timeline is not None else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": VERDICT_SCHEMA_VERSION,
            "class": self.cls,
            "power_capped": self.power_capped,
            "slow_gpu": self.slow_gpu,
            "confidence": round(self.confidence, 2),
            "confidence_label": self.confidence_label,
            "disagreements": self.disagreements,
            "basis": self.basis,
            "signals": self.signals,
            "headline": self.headline,
            "evidence": self.evidence,
            "next_steps": self.next_steps,
            "knob_steps": [k.to_dict() for k in self.knob_steps],
            "mix": self.timeline.mix if self.timeline is not None else None,
            "phases": self.timeline.phases if self.timeline is not None else None,
            "timeline": self.timeline.to_dict() if self.timeline is not None else None,
            "window_mean": self.window_mean,
            "per_gpu": {
                g: {"class": j.cls, "basis": j.basis, "confidence": round(j.confidence, 2),
                    "power_capped": j.power_capped, "evidence": j.evidence, "note": j.note}
                for g, j in self.per_gpu.items()
            },
            "provenance": self.provenance.to_dict(),
            "data_source": mark(self.provenance, detail=True),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """verdict.json read back (migrated: a verdict from before a key was added has it at its default). The
        timeline comes back without its intervals (verdict.json keeps them as figures, not as the GPU judgements
        they were made from): a read verdict is for reading; `probe replay --write` judges the traces again."""
        tl = data.get("timeline")
        timeline = None if not isinstance(tl, Mapping) else TimelineJudgement(
            cls=str(tl.get("class", "")), share=float(tl.get("share") or 0.0),
            confidence=float(data.get("confidence") or 0.0), headline=str(data.get("headline", "")),
            mix=list(tl.get("mix") or []), phases=list(tl.get("phases") or []), evidence={},
            disagreements=list(tl.get("disagreements") or []))
        per_gpu = {str(g): GpuJudgement(cls=str(j.get("class", "")), basis=str(j.get("basis", "")),
                                        confidence=float(j.get("confidence") or 0.0),
                                        evidence=dict(j.get("evidence") or {}),
                                        power_capped=bool(j.get("power_capped")), note=str(j.get("note") or ""))
                   for g, j in (data.get("per_gpu") or {}).items()}
        raw = data.get("evidence") or {}
        # a verdict of the first releases kept its evidence as a list of notes
        evidence = dict(raw) if isinstance(raw, Mapping) else {f"note{i + 1}": v for i, v in enumerate(raw)}
        return cls(cls=str(data.get("class", "")), confidence=float(data.get("confidence") or 0.0),
                   basis=str(data.get("basis") or ""), evidence=evidence,
                   next_steps=[str(s) for s in data.get("next_steps") or []], per_gpu=per_gpu,
                   power_capped=data.get("power_capped"), slow_gpu=data.get("slow_gpu"),
                   headline=str(data.get("headline") or data.get("summary") or ""), provenance=of_record(data),
                   knob_steps=[KnobStep.from_dict(k) for k in data.get("knob_steps") or []],
                   timeline=timeline, window_mean=data.get("window_mean"),
                   signals=list(data.get("signals") or ["gpu"]))

    @property
    def confidence_label(self) -> str:
        return "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.5 else "low"

    @property
    def failed(self) -> bool:
        """The benchmark failed: nothing the run measured may be recorded or ranked."""
        return self.cls == FAILED


def _no_p2p(topology: dict[str, Any]) -> bool | None:
    links = topology.get("links") or []
    if not links:
        return None
    return any(not link.get("p2p_read_ok", False) for link in links)


def next_steps(cls: str, power_capped: bool | None, topology: dict[str, Any], target: dict[str, Any],
               slow_gpu: int | None, summary: Summary, evidence: dict[str, Any] | None = None) -> list[str]:
    ngpu = len(topology.get("gpus") or summary.gpus)
    tp = int(target.get("tp_size") or ngpu or 1)
    ev = evidence or {}
    if cls in TIMELINE_ONLY:
        return _timeline_steps(cls, ev)
    if cls == FAILED:
        return ["Fix the benchmark first: it exited non-zero (stderr tail in summary.json.benchmark.stderr_tail);"
                " no verdict on the GPUs is possible from a failed run."]
    if cls == NO_LOAD:
        return ["The GPUs were idle during the benchmark: check that it targets the server on these GPUs "
                "(base URL, --gpus), and that requests completed."]
    if cls == THROTTLED:
        return ["Clocks were cut by thermal or power-brake events: fix cooling, power delivery or the power limit "
                "on the host before tuning anything else; results from this run are not comparable."]
    if cls == IMBALANCED:
        return [f"GPU {slow_gpu} works while the others wait on it: compare its PCIe link width/speed, clocks, "
                "temperature and NUMA placement with the others (`toolkit doctor`), then re-probe."]
    if cls == WAITING:
        steps = []
        if ngpu > 1 and _no_p2p(topology):
            variants = fewer_tp_variants(target)
            steps.append(
                f"These {ngpu} GPUs have no P2P path (allreduce crosses the host's PCIe root complexes) and spend the "
                f"run waiting, not computing: try fewer tensor-parallel ranks"
                + (f" (profiles {' / '.join(variants)})" if variants else " (tp/2 with pp2, or expert parallel)")
                + ", not more compute tuning (kernel autotune, attention backends, NCCL knobs)."
            )
        elif ngpu > 1 or tp > 1:
            steps.append("The GPUs wait on each other (collectives or synchronisation): measure allreduce time; "
                         "fewer tensor-parallel ranks or expert parallelism cut the traffic; "
                         "compute tuning won't help.")
        else:
            steps.append("The GPU runs kernels that wait (spin or synchronise) rather than compute: look for host "
                         "syncs, a CPU-bound scheduler or a stalled input; compute tuning won't help.")
        return steps
    if cls == COMPUTE and power_capped:
        return ["At the power limit: more throughput needs less work per token (lower-precision weights or KV cache, "
                "speculative decoding) or a higher power limit; batching more only shifts latency."]
    if cls == COMPUTE:
        return ["Compute-bound below the power limit: larger batches (--max-running-requests, --cuda-graph-max-bs) "
                "and kernel tuning (MoE autotune, attention backends) should pay."]
    if cls == MEMORY:
        return ["Memory-bandwidth-bound: raise arithmetic intensity with larger batches (--max-running-requests), "
                "an fp8 KV cache (--kv-cache-dtype), or lower-precision weights."]
    if cls == LAUNCH:
        return ["Launch/host-bound (fine-grained gaps between kernels inside busy intervals): enable CUDA graphs "
                "unless a profile note forbids them, try --num-continuous-decode-steps, and raise concurrency so the "
                "GPU has work queued."]
    return ["No dominant bottleneck: compare against a variant (`toolkit sweep`) rather than tuning one knob."]


def _n(v: Any) -> str:
    """A figure for a sentence: whole numbers without '.0', others to 2 significant decimals."""
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() or abs(v) >= 100 else f"{v:.2g}" if abs(v) < 1 else f"{v:.1f}"
    return "?" if v is None else str(v)


def _timeline_steps(cls: str, ev: dict[str, Any]) -> list[str]:
    srv = {k: _n(v) for k, v in (ev.get("server") or {}).items()}
    if cls == HOST:
        t = ev.get("busiest_thread") or {}
        who = thread_name(t) if t else "a thread"
        if t.get("role") == "bench":
            return [f"{who} runs at {_n(t.get('cpu_pct'))} % of a core while the GPU is underused "
                    f"(util {_n(ev.get('util_gpu_pct'))} %): the benchmark's own CPU work limits the run, so it "
                    "measures the client. Move Python work off the path between kernels (or spread the client over "
                    "more processes) before tuning the server or the GPU."]
        return [f"{who} runs at {_n(t.get('cpu_pct'))} % of a core with requests queued while the GPU is "
                "underused: the server's host side (scheduler, tokenizer or launch loop) limits the run; fewer host "
                "steps per token help (CUDA graphs where the profile allows them, --num-continuous-decode-steps), "
                "GPU kernels won't."]
    if cls == INTERMITTENT:
        lp = ev.get("load_phases") or {}
        return [f"The load comes in phases (busy {lp.get('busy_phase_median_s')} s, idle "
                f"{lp.get('idle_phase_median_s')} s): the GPU is saturated when it has work and waits for the load "
                "otherwise. Raise the client's concurrency or request rate (or overlap its pauses) so work is queued "
                "during the idle phases; GPU-side tuning (CUDA graphs, kernels, batching knobs) won't help."]
    if cls == SCHEDULER_CAPPED:
        return [f"The scheduler's running cap binds: up to {srv.get('running_max')} running of "
                f"max_running_requests {srv.get('max_running_requests')} with {srv.get('queue')} queued on average, "
                f"KV usage {srv.get('token_usage')}. "
                "Raise the cap, then re-probe: once it no longer binds, the next limit shows (KV, compute or "
                "communication)."]
    if cls == KV_BOUND:
        retracted = f", {srv.get('retracted')} requests retracted" if srv.get("retracted") else ""
        return [f"The KV cache is full (token usage {srv.get('token_usage')}) with {srv.get('queue')} queued"
                f"{retracted}: give the KV pool more memory (--mem-fraction-static), an fp8 KV cache, or shorter "
                "requests; with retractions, --schedule-conservativeness > 1.0 admits fewer requests that would be "
                "retracted later."]
    if cls == CLIENT:
        return [f"The server is not saturated: no queue, {srv.get('running')} running of "
                f"{srv.get('max_running_requests')}: the client sends too little. Raise the benchmark's "
                "--max-concurrency or --request-rate; no server knob will help at this load."]
    q = ev.get("queue") or {}
    return [f"No steady state: the queue grew from {q.get('queue_first')} to {q.get('queue_last')} over the whole "
            "window, so the offered load exceeds capacity and this run's latency figures (TTFT, E2E) are not "
            "comparable with other runs. Lower the client's request rate or concurrency to measure a steady state, "
            "or add capacity."]


def judge_window_mean(summary: Summary, topology: dict[str, Any] | None = None,
                      target: dict[str, Any] | None = None) -> Verdict:
    """The steady window's means, per GPU then across GPUs: the verdict when only those exist."""
    topology = topology or {}
    target = target or {}
    source = summary.provenance
    bench = summary.benchmark
    # summary.steady is the window to judge: the steady window, or without one the GPUs' busy span (or the whole
    # benchmark window where there is none), with steady_state.found false.
    window = summary.steady
    per_gpu = {g: judge_gpu(s) for g, s in window.gpus.items()}
    basis = "gpm" if per_gpu and all(j.basis == "gpm" for j in per_gpu.values()) else "power+util+clocks"
    window_ev = {"window": "steady" if summary.steady_state.found else "no steady state",
                 "start_s": window.start_s, "end_s": window.end_s}
    lost = bench.failed_requests or 0
    if bench.exit_code not in (0, None) or bench.interrupted or lost:
        if bench.interrupted:
            what = "was interrupted"
        elif bench.exit_code not in (0, None):
            what = f"exited {bench.exit_code}"
        else:  # exit 0, yet requests failed: its throughput counts only the survivors, so it is no result
            what = f"lost {lost} of {bench.requests_sent} requests"
        failed: dict[str, Any] = {**window_ev, "exit_code": bench.exit_code,
                                  "failed_requests": bench.failed_requests,
                                  "requests_sent": bench.requests_sent,
                                  "stderr_tail": bench.stderr_tail[-800:]}
        server_log = bench.server_log_tail
        if server_log:
            failed["server_log_tail"] = server_log[-1500:]
            what += "; the server's log tail is in evidence.server_log_tail"
        v = Verdict(FAILED, 0.95, basis, failed, [], per_gpu, headline=f"the benchmark {what}", provenance=source)
        v.next_steps = next_steps(FAILED, None, topology, target, None, summary)
        return v
    if not per_gpu:
        return Verdict(NO_LOAD, 0.3, basis, window_ev, ["No GPU samples were recorded."], headline="no samples",
                       provenance=source)
    classes = Counter(j.cls for j in per_gpu.values())
    slow_gpu: int | None = None
    cls = classes.most_common(1)[0][0]
    throttled = [g for g, j in per_gpu.items() if j.cls == THROTTLED]
    works = {g: w for g, s in window.gpus.items() if (w := work_of(s)) is not None}
    evidence: dict[str, Any] = dict(window_ev)
    if throttled:
        cls = THROTTLED
        evidence["throttled_gpus"] = [int(g) for g in throttled]
    elif len(works) >= 2 and classes.get(NO_LOAD, 0) < len(per_gpu):
        hi_g = max(works, key=lambda g: works[g])
        spread = works[hi_g] - min(works.values())
        if spread >= IMBALANCE_SPREAD and spread / max(works[hi_g], 1e-9) >= IMBALANCE_RELATIVE:
            cls = IMBALANCED
            slow_gpu = int(hi_g)
            evidence["work_metric"] = "gpm sm_util" if basis == "gpm" else "power above idle / headroom"
            evidence["work_by_gpu"] = {g: round(w, 3) for g, w in sorted(works.items(), key=lambda kv: int(kv[0]))}
            evidence["spread"] = round(spread, 3)
    members = [j for j in per_gpu.values() if j.cls == cls] or list(per_gpu.values())
    confidence = min(j.confidence for j in members)
    if cls == IMBALANCED:
        confidence = 0.7 if basis == "gpm" else 0.5
    if not summary.steady_state.found and cls not in (NO_LOAD,):
        confidence *= 0.8  # judged over ramp and drain too
    power_capped = any(j.power_capped for j in members) if cls == COMPUTE else None
    # The numbers that decided, as the mean over GPUs of the deciding class.
    keys = ("util_gpu_pct", "power_w_mean", "power_limit_w", "power_of_limit", "idle_power_w", "sm_clock_of_max")
    for k in keys:
        vals = [j.evidence[k] for j in members if j.evidence.get(k) is not None]
        evidence[k] = round(sum(vals) / len(vals), 3) if vals else None
    gpm_vals = [j.evidence["gpm"] for j in members if j.evidence.get("gpm")]
    if gpm_vals:
        evidence["gpm"] = {k: round(sum(x[k] for x in gpm_vals if x[k] is not None) / len(gpm_vals), 2)
                           for k in gpm_vals[0] if any(x[k] is not None for x in gpm_vals)}
    evidence["gpus"] = len(per_gpu)
    evidence["p2p_between_all_gpus"] = None if _no_p2p(topology) is None else not _no_p2p(topology)
    if basis != "gpm":
        evidence["note"] = ("GPM unavailable: judged from power against the limit, utilization and clocks "
                            "(lower confidence)")
    headline = cls + (" (power-capped)" if power_capped else "") + (f": GPU {slow_gpu}" if slow_gpu is not None else "")
    if cls != IMBALANCED:
        first = next(((g, j) for g, j in per_gpu.items() if j.cls == cls and j.note), None)
        if first is not None:
            # One GPU's numbers stand for the class; per_gpu has every GPU's own.
            more = sum(1 for j in per_gpu.values() if j.cls == cls) - 1
            headline += f" — {first[1].note}" + (f" (GPU {first[0]}; {more} more GPUs alike)" if more else "")
    else:
        headline += f" — others wait: work by GPU {evidence['work_by_gpu']}"
    not_seen = _not_seen(summary)
    if not_seen:
        # Part of the run was not read: the class stands on the rest, and says so.
        evidence["not_seen"] = not_seen
        missing = sum(g["samples"] for g in summary.gaps) / max(1, sum(g["of_samples"] for g in summary.gaps))
        confidence *= max(0.5, 1.0 - missing)
        headline += f" (not seen: {'; '.join(not_seen)})"
    v = Verdict(cls, confidence, basis, evidence, [], per_gpu, power_capped, slow_gpu, headline, source)
    v.next_steps = next_steps(cls, power_capped, topology, target, slow_gpu, summary)
    return v


def _not_seen(summary: Summary) -> list[str]:
    """One line per GPU and gap in the readings (summary.gaps): when, how much, and NVML's error."""
    return [
        f"GPU {g['gpu']} {g['start_s']:.1f}-{g['end_s']:.1f} s, {g['samples']} of {g['of_samples']} samples "
        f"({str(g['error']).split(';')[0][:80]})"
        for g in summary.gaps
    ]


def _server_not_seen(server: ServerTimeline | None) -> list[str]:
    """One line per run of failed scrapes of the server: when, how many, and the first error."""
    if server is None:
        return []
    errors = list(getattr(server, "error", None) or [""] * len(server.t_s))
    out, i, n = [], 0, len(server.t_s)
    while i < n:
        if server.ok[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and not server.ok[j + 1]:
            j += 1
        what = str(errors[i]).split(";")[0][:80]
        out.append(f"server {server.t_s[i]:.1f}-{server.t_s[j]:.1f} s, {j - i + 1} of {n} scrapes failed"
                   + (f" ({what})" if what else ""))
        i = j + 1
    return out


def _power_seen(summary: Summary, target: dict[str, Any]) -> dict[str, Any] | None:
    """Each GPU's mean draw and limit over the judged window (the steady one when found), for the power-limit step:
    the mean over GPUs of their means, the highest limit, and the board's range from the profile's target."""
    gpus = summary.judged.gpus
    means = [m for g in gpus.values() if (m := g["power_w"]["mean"]) is not None]
    limits = [lim for g in gpus.values() if (lim := g["power_limit_w"]) is not None]
    if not means or not limits:
        return None
    return {"mean_w": round(sum(means) / len(means), 1), "limit_w": max(limits),
            "default_w": target.get("gpu_power_limit_w"), "min_w": target.get("gpu_power_limit_min_w")}


def judge(summary: Summary, topology: dict[str, Any] | None = None, target: dict[str, Any] | None = None,
          *, trace: Trace | None = None, server: ServerTimeline | None = None,
          host: HostTimeline | None = None) -> Verdict:
    """The run's verdict. With `trace` (and the server and host timelines where they were recorded), judged over
    time; without it, or on a window shorter than MIN_INTERVALS intervals, by the window's means."""
    topology = topology or {}
    target = target or {}
    base = judge_window_mean(summary, topology, target)
    ngpu = len(topology.get("gpus") or summary.gpus)
    no_p2p = _no_p2p(topology)
    variants = fewer_tp_variants(target)

    def knobs(v: Verdict, evidence: dict[str, Any]) -> Verdict:
        v.knob_steps = propose(v.cls, evidence, target, gpus=ngpu, no_p2p=no_p2p, variants=variants,
                               power_capped=v.power_capped, power=_power_seen(summary, target))
        v.next_steps = v.next_steps + [k.text() for k in v.knob_steps]
        server_gaps = _server_not_seen(server)
        if server_gaps:
            # The server's side was not read for a while: a GPU class stands on the GPU readings, but what the
            # server did then (queue, running, KV) is unknown, and the verdict says so.
            v.evidence["not_seen"] = list(v.evidence.get("not_seen") or []) + server_gaps
            v.headline += f" (not seen: {'; '.join(server_gaps)})"
        return v

    if trace is None or base.cls == FAILED or not base.per_gpu:
        return knobs(base, base.evidence)
    found = summary.steady_state.found
    window = summary.steady
    start_s, end_s = float(window.start_s or 0.0), float(window.end_s or 0.0)
    idle = {int(g): w for g, w in summary.idle.power_w.items()}
    ivs = build_intervals(trace, idle, start_s, end_s, server=server, host=host)
    if len(ivs) < MIN_INTERVALS:
        base.evidence["over_time"] = f"not judged: {len(ivs)} intervals in the window (fewer than {MIN_INTERVALS})"
        return knobs(base, base.evidence)
    tl = judge_timeline(ivs, load_segments(trace, start_s, end_s), has_server=server is not None)
    cls = tl.cls
    if base.cls in (THROTTLED, IMBALANCED) and cls not in TIMELINE_ONLY:
        cls = base.cls  # a window-level finding the per-interval majority hides (one slow GPU, thermal events)
    signals = ["gpu"] + (["server"] if server is not None else []) + (["host"] if host is not None else [])
    window_mean = {"class": base.cls, "confidence": round(base.confidence, 2), "headline": base.headline}
    evidence = {**base.evidence, "over_time": tl.evidence}
    if cls == base.cls:
        power_capped = base.power_capped
        headline = f"{base.headline} ({tl.share:.0%} of the window)"
        steps = list(base.next_steps)
        confidence = tl.confidence if tl.cls == cls else base.confidence
    else:
        lead = tl.lead
        power_capped = bool(lead.power_capped) if cls == COMPUTE and lead is not None else None
        headline = tl.headline + (f" — {lead.why}" if lead is not None and cls not in (INTERMITTENT, MIXED) else "")
        if cls == MIXED:
            steps = [f"No state dominates ({tl.evidence['mix']}): read the phases, then compare variants "
                     "(`toolkit sweep`) rather than tuning one knob."]
        else:
            steps = next_steps(cls, power_capped, topology, target, base.slow_gpu, summary, tl.evidence)
        confidence = tl.confidence
    if not found and cls != NO_LOAD:
        confidence *= 0.8  # judged over ramp and drain too
    v = Verdict(cls, confidence, base.basis, evidence, steps, base.per_gpu, power_capped,
                base.slow_gpu if cls == IMBALANCED else None, headline, base.provenance,
                timeline=tl, window_mean=window_mean, signals=signals)
    return knobs(v, {**base.evidence, **tl.evidence})
