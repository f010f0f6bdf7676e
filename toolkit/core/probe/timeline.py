"""The run judged from its intervals (intervals.py): the dominant state and its share, the mix, the phases.

Rules, in order (thresholds below; docs/probe.md has the table):

1. overloaded: the server's queue grows over the whole window (each third's mean above the one before, by at
   least OVERLOAD_GROWTH_MIN requests or a quarter of its peak, and still near its peak at the end): the offered
   load exceeds capacity, there is no steady state, and latency figures are not comparable between runs.
2. intermittent-load: the samples (mean util over GPUs, at the sampling rate) hold busy phases (util >= 80 %) and
   idle phases (util <= 3 %) of at least MIN_GAP_S, at least two of each, each >= INTERMITTENT_SHARE of the time
   and stretches of fine-grained gaps (below 50 % util but not idle) <= GAPPY_MAX: the load, not the GPU, is the
   limiter. (Phases are runs of samples on one side of 50 % util; a run is busy or idle by its median sample, so
   the one or two samples of each edge don't count.) Fine-grained gaps read as runs of 5-60 % util instead, and
   stay launch-bound (or host-bound).
   Not when the server's own limits (scheduler-capped, kv-bound) hold half the window or more.
3. The dominant state: one interval state holds >= DOMINANT_SHARE of the window's time (with a server timeline,
   of the time before the benchmark's drain: see drain_start).
4. Otherwise mixed, with the mix ("58 % compute-bound (power-capped), 42 % idle").

Phases are runs of one state lasting >= MIN_PHASE_S (shorter runs are left out of the list, not of the mix).
The confidence starts from the intervals' own (their rules' confidence), is scaled by the dominant share, and
falls by DISAGREEMENT_PENALTY for each pair of signals that disagree; each disagreement is named.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.probe.gpu_rules import (
    BUSY_UTIL_PCT,
    CLIENT,
    COMPUTE,
    HOST,
    IDLE,
    INTERMITTENT,
    KV_BOUND,
    MIXED,
    NO_LOAD,
    ON_OFF,
    OVERLOADED,
    SCHEDULER_CAPPED,
    WAITING,
)
from toolkit.core.probe.intervals import IDLE_SAMPLE_UTIL_PCT, QUEUED_MIN, Interval, Segment

DOMINANT_SHARE = 0.6
MIN_PHASE_S = 2.0
MIN_GAP_S = 0.3  # shorter idle runs are a sample or two of noise at 10 Hz
INTERMITTENT_SHARE = 0.15
GAPPY_MAX = 0.35
OVERLOAD_GROWTH_MIN = 4.0
MIN_OVERLOAD_INTERVALS = 6
DISAGREEMENT_PENALTY = 0.15
MAX_PHASES_LISTED = 40
MAX_RANGES = 10
DRAIN_QUEUED_SHARE = 0.25


@dataclass
class TimelineJudgement:
    cls: str
    share: float  # of the window's time, for the class (intermittent: busy + idle phases)
    confidence: float
    headline: str
    mix: list[dict[str, Any]]
    phases: list[dict[str, Any]]
    evidence: dict[str, Any]
    disagreements: list[str] = field(default_factory=list)
    lead: Interval | None = None  # an interval of the class, whose `why` stands for it
    intervals: list[Interval] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "share": round(self.share, 3), "mix": self.mix, "phases": self.phases,
                "disagreements": self.disagreements, "interval_s": _interval_s(self.intervals),
                "intervals": [iv.to_dict() for iv in self.intervals]}


def _interval_s(ivs: list[Interval]) -> float | None:
    return round(ivs[0].duration_s, 3) if ivs else None


def label(iv: Interval) -> str:
    """The state as the mix and phases name it: compute-bound splits by the power cap."""
    return iv.state + (" (power-capped)" if iv.state == COMPUTE and iv.power_capped else "")


def _run_class(state: str) -> str:
    return {IDLE: NO_LOAD, ON_OFF: INTERMITTENT}.get(state, state)


def mix_of(ivs: list[Interval]) -> list[dict[str, Any]]:
    total = sum(iv.duration_s for iv in ivs) or 1.0
    secs: dict[str, float] = defaultdict(float)
    for iv in ivs:
        secs[label(iv)] += iv.duration_s
    return [{"state": k, "share": round(v / total, 3), "seconds": round(v, 1)}
            for k, v in sorted(secs.items(), key=lambda kv: (-kv[1], kv[0]))]


def mix_text(mix: list[dict[str, Any]], top: int = 3) -> str:
    return ", ".join(f"{m['share']:.0%} {m['state']}" for m in mix[:top])


def phases_of(ivs: list[Interval]) -> list[dict[str, Any]]:
    runs: list[list[Any]] = []  # [label, start, end]
    for iv in ivs:
        lab = label(iv)
        if runs and runs[-1][0] == lab and abs(runs[-1][2] - iv.start_s) < 1e-6:
            runs[-1][2] = iv.end_s
        else:
            runs.append([lab, iv.start_s, iv.end_s])
    lasting: list[list[Any]] = []
    for r in runs:
        if r[2] - r[1] < MIN_PHASE_S - 1e-6:
            continue
        if lasting and lasting[-1][0] == r[0]:
            lasting[-1][2] = r[2]  # the same state on both sides of a blip: one phase
        else:
            lasting.append(list(r))
    return [{"state": r[0], "start_s": round(r[1], 2), "end_s": round(r[2], 2), "duration_s": round(r[2] - r[1], 2)}
            for r in lasting[:MAX_PHASES_LISTED]]


def ranges(ivs: list[Interval], keep: set[str]) -> list[list[float]]:
    """Where a state held: merged [start_s, end_s] spans of the intervals in `keep` (the first MAX_RANGES)."""
    out: list[list[float]] = []
    for iv in ivs:
        if iv.state not in keep:
            continue
        if out and abs(out[-1][1] - iv.start_s) < 1e-6:
            out[-1][1] = round(iv.end_s, 2)
        else:
            out.append([round(iv.start_s, 2), round(iv.end_s, 2)])
    return out[:MAX_RANGES]


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def intermittency(segments: list[Segment]) -> dict[str, Any] | None:
    """The load's phases at the sampling rate: busy runs (util above the split, saturated inside) and idle runs
    (below it, idle inside), or None when the window has no samples."""
    total = sum(s.duration_s for s in segments)
    if total <= 0:
        return None
    busy = [s for s in segments if s.level == "high" and s.median_util_pct >= BUSY_UTIL_PCT]
    idle = [s for s in segments if s.level == "low" and s.median_util_pct <= IDLE_SAMPLE_UTIL_PCT]
    low_busy = [s for s in segments if s.level == "low" and s.median_util_pct > IDLE_SAMPLE_UTIL_PCT]
    long_busy = [s.duration_s for s in busy if s.duration_s >= MIN_GAP_S]
    long_idle = [s.duration_s for s in idle if s.duration_s >= MIN_GAP_S]
    return {
        "busy_share": round(sum(s.duration_s for s in busy) / total, 3),
        "idle_share": round(sum(s.duration_s for s in idle) / total, 3),
        # below the split but not idle: kernels with fine-grained gaps between them
        "gappy_share": round(sum(s.duration_s for s in low_busy) / total, 3),
        "busy_phases": len(long_busy), "idle_phases": len(long_idle),
        "busy_phase_median_s": round(_median(long_busy), 2) if long_busy else None,
        "idle_phase_median_s": round(_median(long_idle), 2) if long_idle else None,
    }


def is_intermittent(stats: dict[str, Any] | None) -> bool:
    return bool(stats and stats["busy_phases"] >= 2 and stats["idle_phases"] >= 2
                and stats["busy_share"] >= INTERMITTENT_SHARE and stats["idle_share"] >= INTERMITTENT_SHARE
                and stats["gappy_share"] <= GAPPY_MAX)


def overload(ivs: list[Interval]) -> dict[str, Any] | None:
    """The queue's growth over the window when it grows throughout (rule 1), else None."""
    q = [(iv.start_s, iv.server.queue) for iv in ivs if iv.server is not None and iv.server.queue is not None]
    if len(q) < MIN_OVERLOAD_INTERVALS:
        return None
    k = len(q) // 3
    thirds = [q[:k], q[k:2 * k], q[2 * k:]]
    means = [sum(v for _, v in part) / len(part) for part in thirds]
    peak = max(v for _, v in q)
    growth = means[2] - means[0]
    if not (means[0] < means[1] < means[2] and growth >= max(OVERLOAD_GROWTH_MIN, 0.25 * peak)
            and q[-1][1] >= 0.5 * peak):
        return None
    slope = _slope([t for t, _ in q], [v for _, v in q])
    return {"queue_thirds_mean": [round(m, 1) for m in means], "queue_peak": round(peak, 1),
            "queue_growth_per_s": round(slope, 3), "queue_first": round(q[0][1], 1), "queue_last": round(q[-1][1], 1)}


def _slope(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    den = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / den if den else 0.0


def drain_start(ivs: list[Interval]) -> float | None:
    """Where the benchmark's drain begins: after the last interval with requests queued, when queued intervals
    cover >= DRAIN_QUEUED_SHARE of the window and some follow it. A closed benchmark (all its requests sent at
    once, bench_serving's --request-rate inf) ends with the admitted requests finishing and nothing waiting: its
    end, not a limit of the server, so it is left out of the dominant share (it stays in the mix and phases)."""
    total = sum(iv.duration_s for iv in ivs) or 1.0
    queued = [iv for iv in ivs if iv.server is not None and (iv.server.queue or 0.0) >= QUEUED_MIN]
    if not queued or sum(iv.duration_s for iv in queued) / total < DRAIN_QUEUED_SHARE:
        return None
    last = queued[-1].end_s
    tail = [iv for iv in ivs if iv.start_s >= last - 1e-6]
    return tail[0].start_s if tail else None


def _mean_of(ivs: list[Interval], get: Any) -> float | None:
    vals = [v for iv in ivs if (v := get(iv)) is not None]
    return sum(vals) / len(vals) if vals else None


def deciding_numbers(ivs: list[Interval]) -> dict[str, Any]:
    """Means over the intervals where the class held: GPU, server and the busiest thread."""
    def rnd(v: float | None, nd: int = 1) -> float | None:
        return None if v is None else round(v, nd)

    out: dict[str, Any] = {
        "util_gpu_pct": rnd(_mean_of(ivs, lambda iv: iv.util_gpu_pct)),
        "power_of_limit": rnd(_mean_of(ivs, lambda iv: iv.power_of_limit), 3),
        "sm_util_pct": rnd(_mean_of(ivs, lambda iv: iv.sm_util_pct)),
    }
    srv = [iv.server for iv in ivs if iv.server is not None]
    if srv:
        def smean(get: Any) -> float | None:
            vals = [v for s in srv if (v := get(s)) is not None]
            return sum(vals) / len(vals) if vals else None

        out["server"] = {
            "running": rnd(smean(lambda s: s.running)),
            "running_max": rnd(max((r for s in srv if (r := s.running_max_near) is not None), default=None)),
            "queue": rnd(smean(lambda s: s.queue)),
            "token_usage": rnd(smean(lambda s: s.token_usage), 3),
            "max_running_requests": max((c for s in srv if (c := s.max_running_requests) is not None), default=None),
            "demand_max": rnd(max((s.running or 0.0) + (s.queue or 0.0) for s in srv)),
            "retracted": rnd(sum(s.retracted for s in srv)),
        }
    loads: dict[tuple[str, int, int | None], list[float]] = defaultdict(list)
    names: dict[tuple[str, int, int | None], Any] = {}
    for iv in ivs:
        top = iv.busiest()
        if top is not None:
            key = (top.role, top.pid, top.tid)
            loads[key].append(top.cpu_pct)
            names[key] = top
    if loads:
        key = max(loads, key=lambda k: (len(loads[k]), sum(loads[k])))
        t = names[key]
        out["busiest_thread"] = {**t.to_dict(), "cpu_pct": round(sum(loads[key]) / len(loads[key]), 1)}
    return out


def _disagreements(cls: str, held: list[Interval], ivs: list[Interval], has_server: bool) -> list[str]:
    out: list[str] = []
    if cls in (SCHEDULER_CAPPED, KV_BOUND):
        capped = [iv for iv in held if iv.gpu_state == COMPUTE and iv.power_capped]
        if len(capped) >= 0.5 * len(held):
            out.append(f"gpu vs server: the server says {cls}, but the GPUs are compute-bound at the power limit in "
                       f"{len(capped)} of {len(held)} of its intervals, so more admitted requests may add latency "
                       "rather than throughput")
    if cls == CLIENT:
        near = [iv for iv in held if (t := iv.busiest("bench")) is not None and t.cpu_pct >= 60.0]
        if len(near) >= 0.5 * len(held):
            out.append(f"host vs server: no queue at the server, and the benchmark's busiest thread runs at >= 60 % "
                       f"of a core in {len(near)} of {len(held)} intervals: the client may be close to its own CPU "
                       "limit, not only sending too little")
    if cls == WAITING:
        hot = [iv for iv in held if (t := iv.busiest("server")) is not None and t.cpu_pct >= 85.0
               and iv.server is not None and (iv.server.queue or 0) >= 1]
        if hot and len(hot) >= 0.5 * len(held):
            out.append(f"host vs gpu: the GPUs wait, and a server thread is at a full core with requests queued in "
                       f"{len(hot)} of {len(held)} intervals: the wait may be on the host, not on communication")
    if has_server:
        gaps = sum(1 for iv in ivs if iv.server is None)
        if gaps > 0.2 * len(ivs):
            out.append(f"server: {gaps} of {len(ivs)} intervals have no good scrape; its states are judged on "
                       "the rest")
    return out


def judge_timeline(ivs: list[Interval], segments: list[Segment], *, has_server: bool) -> TimelineJudgement:
    total = sum(iv.duration_s for iv in ivs) or 1.0
    mix = mix_of(ivs)
    phases = phases_of(ivs)
    inter = intermittency(segments)
    evidence: dict[str, Any] = {"window_intervals": len(ivs), "mix": mix_text(mix, 4)}
    if inter is not None:
        evidence["load_phases"] = inter
    over = overload(ivs) if has_server else None
    server_share = sum(iv.duration_s for iv in ivs if iv.state in (SCHEDULER_CAPPED, KV_BOUND)) / total
    host_share = sum(iv.duration_s for iv in ivs if iv.state == HOST) / total
    ivs_judged = ivs
    if over is not None:
        cls = OVERLOADED
        held_states = {iv.state for iv in ivs}
        share = 1.0
        evidence["queue"] = over
        headline = (f"overloaded: the queue grew from {over['queue_first']:.0f} to {over['queue_last']:.0f} "
                    f"({over['queue_growth_per_s']:+.1f}/s) over the whole window: no steady state, so latency "
                    "figures are not comparable between runs")
        base_conf = 0.8
    elif is_intermittent(inter) and server_share < 0.5 and host_share < 0.3:
        assert inter is not None
        cls = INTERMITTENT
        held_states = {iv.state for iv in ivs}
        share = inter["busy_share"] + inter["idle_share"]
        headline = (f"intermittent load: busy phases of {inter['busy_phase_median_s']} s and idle phases of "
                    f"{inter['idle_phase_median_s']} s (medians; busy {inter['busy_share']:.0%}, idle "
                    f"{inter['idle_share']:.0%} of the time): the load, not the GPU, is the limiter — "
                    f"{mix_text(mix)}")
        base_conf = 0.85 * (1.0 - inter["gappy_share"])
    else:
        drain = drain_start(ivs) if has_server else None
        judged = [iv for iv in ivs if drain is None or iv.start_s < drain]
        jmix = mix_of(judged)
        top_state = next(iv.state for iv in judged if label(iv) == jmix[0]["state"])
        # compute-bound with and without the cap are one class: they share the rule that decided them
        share = sum(m["share"] for m in jmix if m["state"].split(" (")[0] == top_state)
        where = "of the window" if drain is None else f"of the window until the drain at {drain:.1f} s"
        if drain is not None:
            evidence["drain"] = [round(drain, 2), round(ivs[-1].end_s, 2)]
        if share >= DOMINANT_SHARE:
            cls = _run_class(top_state)
            held_states = {top_state}
            headline = f"{cls}: {share:.0%} {where}" + (f" ({mix_text(mix)})" if share < 0.999 else "")
        else:
            cls = MIXED
            held_states = {iv.state for iv in judged}
            headline = f"mixed: {mix_text(jmix)}" + ("" if drain is None else f" until the drain at {drain:.1f} s")
        base_conf = 0.0
        ivs_judged = judged
    held = [iv for iv in ivs_judged if iv.state in held_states]
    if base_conf == 0.0:
        conf = sum(iv.confidence * iv.duration_s for iv in held) / (sum(iv.duration_s for iv in held) or 1.0)
        if cls == MIXED:
            conf = min(conf, 0.5)
        elif share < 0.8:
            conf *= 0.75 + 0.25 * (share - DOMINANT_SHARE) / (0.8 - DOMINANT_SHARE)
    else:
        conf = base_conf
    disagreements = _disagreements(cls, held, ivs, has_server)
    conf = max(0.1, conf - DISAGREEMENT_PENALTY * len(disagreements))
    evidence["held"] = ranges(ivs, held_states)
    evidence["held_share"] = round(share, 3)
    evidence.update(deciding_numbers(held))
    lead = next((iv for iv in held if iv.state == cls or _run_class(iv.state) == cls), held[0] if held else None)
    return TimelineJudgement(cls, share, conf, headline, mix, phases, evidence, disagreements, lead, ivs)
