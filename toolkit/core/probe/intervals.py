"""The run in intervals of about a second: GPU, server and host timelines side by side, one state per interval.

A person reading the probe's plots judges the run by what happens over time, not by the window's mean: an
alternating load averages to "kernels ran half the time" but reads as saturated, idle, saturated. So the judged
window is cut into `INTERVAL_S` slices; each slice gets the per-GPU rules (gpu_rules.judge_gpu over that slice),
then what the server (server_trace.csv) and the host (host_trace.csv) say about the same second. The run-level
judgement from the mix of states is timeline.py's.

Rules of one interval, first match wins (thresholds below, documented in docs/probe.md):

1. throttled: a GPU's clocks were cut (gpu_rules).
2. kv-bound: token_usage >= KV_FULL with requests queued or retracted, or >= KV_RESERVED with requests queued
   while running stays below its cap (SGLang's KV pool, with its decode reservation, binds admission).
3. scheduler-capped: running reached RUNNING_AT_CAP of max_running_requests (within SERVER_LOOKAROUND_S: the
   gauges are stale between SGLang's logs) with requests queued and token_usage under KV_WELL_BELOW (the
   request-slot cap binds, not memory; research sglang-metrics.md section 6).
4. The GPU underused (idle, on-off, launch-bound or util < 60 %):
   a. host-bound: a benchmark thread at >= HOST_FULL_CORE_PCT of one core; or a server thread, unless the server
      has nothing queued (SGLang's scheduler polls in a busy loop when idle, so its thread at a full core with an
      empty queue is not what limits the run);
   b. client-bound: the server has no queue and runs well below its cap;
   c. on-off: busy (util >= 80 %) and idle (util <= 3 %) samples both fill >= ON_OFF_SHARE of the interval: the
      load switches inside it, so its mean would be misread as fine-grained gaps;
   d. otherwise the GPU's own class (idle, launch-bound, ...).
5. Otherwise the GPU's own class (compute-bound, memory-bandwidth-bound, busy-but-waiting, mixed).

Pure: parsed traces in, intervals out (no I/O).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolkit.core.probe.gpu_rules import (
    BUSY_UTIL_PCT,
    CLIENT,
    HOST,
    IDLE,
    KV_BOUND,
    LAUNCH,
    LAUNCH_UTIL_PCT,
    NO_LOAD,
    ON_OFF,
    SCHEDULER_CAPPED,
    THROTTLED,
    GpuJudgement,
    judge_gpu,
)
from toolkit.core.probe.series import REASON_BITS, GpuSeries, Trace

INTERVAL_S = 1.0
IDLE_SAMPLE_UTIL_PCT = 3.0  # H200: 0 when nothing runs; the 1-element-kernel loop reads 7-13 every sample
ON_OFF_SHARE = 0.2
HOST_FULL_CORE_PCT = 85.0  # "near a full core": a Python thread that never waits (GIL-bound work) reads 95-100
KV_FULL = 0.9  # research sglang-metrics.md section 6: token_usage >= ~0.9 with a queue
KV_WELL_BELOW = 0.8
# SGLang admits a request only while the pool holds its prompt plus the decode tokens reserved for every running
# request (new_token_ratio, 0.7 at start, x schedule_conservativeness: srt/managers/schedule_policy.py's
# PrefillAdder), so admission stops with the pool well short of full: a queue that waits with running far below
# the cap and the pool this full is waiting on KV.
KV_RESERVED = 0.7
RUNNING_AT_CAP = 0.95
QUEUED_MIN = 1.0  # mean queued requests over the interval
# SGLang writes its gauges at prefill batches and every decode_log_interval (40) decode steps, about a second apart
# under load, and a prefill batch's log reports the running batch from before its admissions (research
# sglang-metrics.md section 1.4): a gauge read in one interval can be a second old. So whether running reached
# the cap is looked for over the interval and SERVER_LOOKAROUND_S on either side.
SERVER_LOOKAROUND_S = 1.0
CLIENT_RUNNING_OF_CAP = 0.5
CLIENT_QUEUE_MAX = 0.5
UNDERUSED_STATES = (IDLE, ON_OFF, LAUNCH)


class ServerTimeline(Protocol):
    """What the intervals read of a ServerTrace (toolkit/core/probe/server_trace.py)."""

    t_s: list[float]
    ok: list[bool]
    values: dict[str, list[float | None]]


class HostTimeline(Protocol):
    """What the intervals read of a HostTrace (toolkit/core/probe/host_trace.py)."""

    meta: dict[str, str]
    t_s: list[float]
    role: list[str]
    pid: list[int]
    comm: list[str]
    busiest_tid: list[int | None]
    busiest_thread: list[str]
    busiest_thread_cpu_pct: list[float | None]


def thread_name(t: dict[str, Any]) -> str:
    """`bench process 'python3' (pid 824), thread 'python3' (tid 824)` from a ThreadLoad.to_dict()."""
    tid = t.get("tid")
    thread = f"thread {t.get('thread')!r}" + (f" (tid {tid})" if tid is not None else "")
    return f"{t.get('role')} process {t.get('process')!r} (pid {t.get('pid')}), {thread}"


@dataclass(frozen=True)
class ThreadLoad:
    """The busiest thread of one role (bench or server) over an interval, in % of one core."""

    role: str
    pid: int
    process: str
    tid: int | None
    thread: str
    cpu_pct: float

    @property
    def name(self) -> str:
        return thread_name(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "process": self.process, "tid": self.tid, "thread": self.thread,
                "cpu_pct": round(self.cpu_pct, 1)}


@dataclass(frozen=True)
class ServerSlice:
    """The server's gauges over one interval (means of the good scrapes inside it)."""

    rows: int
    running: float | None
    queue: float | None
    token_usage: float | None
    max_running_requests: float | None
    retracted: float  # requests retracted inside the interval (counter delta, or the gauge's sum)
    running_max_near: float | None = None  # the highest running count within SERVER_LOOKAROUND_S of the interval


@dataclass
class Interval:
    start_s: float
    end_s: float
    gpus: dict[str, GpuJudgement]
    gpu_state: str
    power_capped: bool
    busy_share: float | None  # of the GPU samples (mean over GPUs): util >= 80 %
    idle_share: float | None  # util <= 3 %
    util_gpu_pct: float | None  # mean over GPUs
    power_of_limit: float | None
    sm_util_pct: float | None  # GPM, mean over GPUs
    server: ServerSlice | None = None
    threads: list[ThreadLoad] = field(default_factory=list)
    state: str = ""
    confidence: float = 0.0
    why: str = ""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def underused(self) -> bool:
        return self.gpu_state in UNDERUSED_STATES or (self.util_gpu_pct is not None
                                                      and self.util_gpu_pct < LAUNCH_UTIL_PCT)

    def busiest(self, role: str | None = None) -> ThreadLoad | None:
        pool = [t for t in self.threads if role is None or t.role == role]
        return max(pool, key=lambda t: t.cpu_pct) if pool else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start_s": round(self.start_s, 3), "end_s": round(self.end_s, 3), "state": self.state,
                               "confidence": round(self.confidence, 2), "gpu_state": self.gpu_state,
                               "util_gpu_pct": _r(self.util_gpu_pct, 1), "power_of_limit": _r(self.power_of_limit, 3),
                               "sm_util_pct": _r(self.sm_util_pct, 1), "busy_share": _r(self.busy_share, 2),
                               "idle_share": _r(self.idle_share, 2)}
        if self.server is not None:
            out["server"] = {"running": _r(self.server.running, 1), "queue": _r(self.server.queue, 1),
                             "token_usage": _r(self.server.token_usage, 3),
                             "max_running_requests": self.server.max_running_requests,
                             "retracted": _r(self.server.retracted, 1)}
        top = self.busiest()
        if top is not None:
            out["busiest_thread"] = top.to_dict()
        return out


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def _mean(vs: list[float | None]) -> float | None:
    xs = [v for v in vs if v is not None]
    return sum(xs) / len(xs) if xs else None


def bounds(start_s: float, end_s: float, interval_s: float = INTERVAL_S) -> list[tuple[float, float]]:
    """[start, end] cut into interval_s slices; a last slice under half an interval joins the one before it."""
    if end_s <= start_s:
        return []
    n = max(1, int((end_s - start_s) // interval_s))
    edges = [start_s + i * interval_s for i in range(n)] + [end_s]
    if end_s - edges[-2] >= 1.5 * interval_s:
        edges.insert(-1, start_s + n * interval_s)
    return list(itertools.pairwise(edges))


class _Prefix:
    """Running sums and counts of one column's present values: any slice's mean in O(1) (a one-hour 8-GPU trace
    has ~29,000 GPU-intervals; slicing lists per interval cost seconds)."""

    def __init__(self, col: list[float | None]) -> None:
        self.counts: list[int] | None = None  # None: every value present, so a count is hi - lo
        if None not in col:  # most columns: C-level all the way
            self.sums: list[float] = list(itertools.accumulate(col, initial=0.0))  # type: ignore[arg-type]
            return
        present = list(map(operator.is_not, col, itertools.repeat(None)))
        self.sums = list(itertools.accumulate(itertools.compress(col, present), initial=0.0))  # type: ignore[arg-type]
        # sums is indexed by present values: map a row index to the number of present values before it
        self.counts = list(itertools.accumulate(present, initial=0))

    def count(self, lo: int, hi: int) -> int:
        return hi - lo if self.counts is None else self.counts[hi] - self.counts[lo]

    def mean(self, lo: int, hi: int) -> float | None:
        c = self.counts
        if c is None:
            return (self.sums[hi] - self.sums[lo]) / (hi - lo) if hi > lo else None
        a, b = c[lo], c[hi]
        return (self.sums[b] - self.sums[a]) / (b - a) if b > a else None


def _flags(col: list[float | None], test: Any) -> list[float | None]:
    """1.0 where test(value), 0.0 where not, None where the value is missing."""
    if None not in col:
        return list(map(float, map(test, col)))
    return [None if x is None else float(test(x)) for x in col]


GPM_COLUMNS = {"sm_util_pct": "gpm_sm_util_pct", "tensor_util_pct": "gpm_tensor_util_pct",
               "dram_bw_util_pct": "gpm_dram_bw_util_pct", "sm_occupancy_pct": "gpm_sm_occupancy_pct"}


class _GpuColumns:
    """One GPU's columns prepared for per-interval statistics."""

    def __init__(self, s: GpuSeries) -> None:
        v = s.values
        empty: list[float | None] = [None] * len(s)
        self.util = _Prefix(v["util_gpu_pct"])
        util = v["util_gpu_pct"]
        self.busy = _Prefix(_flags(util, BUSY_UTIL_PCT.__le__))
        self.idle = _Prefix(_flags(util, IDLE_SAMPLE_UTIL_PCT.__ge__))
        self.power_instant = _Prefix(v.get("power_instant_w", empty))
        self.power = _Prefix(v["power_w"])
        self.limit = _Prefix(v["power_limit_w"])
        self.sm = _Prefix(v["sm_clock_mhz"])
        self.sm_max = _Prefix(v["sm_clock_max_mhz"])
        self.gpm = {k: _Prefix(v.get(c, empty)) for k, c in GPM_COLUMNS.items()}
        masks = [None if m is None else int(m) for m in v["clock_reasons"]]
        self.reason_rows = _Prefix([None if m is None else 1.0 for m in masks])
        seen = 0
        for m in set(masks):  # few distinct masks
            seen |= m or 0
        self.reasons = {name: _Prefix([None if m is None else float(bool(m & bit)) for m in masks])
                        for bit, name in REASON_BITS.items() if seen & bit}

    def stats(self, lo: int, hi: int, idle_w: float | None) -> tuple[dict[str, Any], float | None, float | None]:
        """Rows [lo, hi) in the shape gpu_rules.judge_gpu reads, and the shares of busy and idle samples."""
        # Instant power where offered: NVML's averaged power_w lags by about a second, as long as an interval.
        power = self.power_instant.mean(lo, hi)
        if power is None:
            power = self.power.mean(lo, hi)
        limit = self.limit.mean(lo, hi)
        n_masks = self.reason_rows.count(lo, hi)
        reasons = {name: round(share, 3) for name, p in self.reasons.items()
                   if n_masks and (share := p.mean(lo, hi) or 0.0) > 0}
        gpm: dict[str, float | None] | None = {k: p.mean(lo, hi) for k, p in self.gpm.items()}
        if gpm is not None and all(x is None for x in gpm.values()):
            gpm = None
        sm, sm_max = self.sm.mean(lo, hi), self.sm_max.mean(lo, hi)
        stats = {
            "util_gpu_pct": self.util.mean(lo, hi),
            "power_w": {"mean": power},
            "power_limit_w": limit,
            "power_of_limit": power / limit if power is not None and limit else None,
            "idle_power_w": idle_w,
            "sm_clock_of_max": sm / sm_max if sm and sm_max else None,
            "clock_reasons_seen": reasons,
            "gpm": gpm,
        }
        return stats, self.busy.mean(lo, hi), self.idle.mean(lo, hi)


def _combine(judged: dict[str, GpuJudgement]) -> tuple[str, bool, float]:
    """The interval's GPU state over all GPUs: throttled if any is, else the most common class."""
    if not judged:
        return IDLE, False, 0.1
    if any(j.cls == THROTTLED for j in judged.values()):
        cls = THROTTLED
    else:
        cls = Counter(j.cls for j in judged.values()).most_common(1)[0][0]
    members = [j for j in judged.values() if j.cls == cls]
    return (IDLE if cls == NO_LOAD else cls), any(j.power_capped for j in members), min(j.confidence for j in members)


def _server_slice(server: ServerTimeline, start_s: float, end_s: float) -> ServerSlice | None:
    lo, hi = bisect.bisect_left(server.t_s, start_s), bisect.bisect_left(server.t_s, end_s)
    rows = [i for i in range(lo, hi) if server.ok[i]]
    if not rows:
        return None
    col = server.values

    def mean(c: str) -> float | None:
        return _mean([col[c][i] for i in rows]) if c in col else None

    caps = [x for i in rows if (x := col["max_running_requests"][i]) is not None] \
        if "max_running_requests" in col else []
    retracted = 0.0
    total = col.get("retracted_requests_total")
    if total is not None:
        # From the last good row before the interval, so a retraction between two intervals is counted once.
        prev = next((i for i in range(lo - 1, -1, -1) if server.ok[i] and total[i] is not None), None)
        seq = ([prev] if prev is not None else []) + [i for i in rows if total[i] is not None]
        for a, b in itertools.pairwise(seq):
            ta, tb = total[a], total[b]
            if ta is not None and tb is not None and tb >= ta:  # a restart (counter went back) counts nothing
                retracted += tb - ta
    gauge_col = col.get("num_retracted_reqs")
    gauge = [x for i in rows if (x := gauge_col[i]) is not None] if gauge_col is not None else []
    if not retracted and gauge:
        retracted = float(sum(gauge))
    near_lo = bisect.bisect_left(server.t_s, start_s - SERVER_LOOKAROUND_S)
    near_hi = bisect.bisect_left(server.t_s, end_s + SERVER_LOOKAROUND_S)
    running_col = col.get("num_running_reqs")
    near = [x for i in range(near_lo, near_hi) if server.ok[i] and (x := running_col[i]) is not None] \
        if running_col is not None else []
    return ServerSlice(rows=len(rows), running=mean("num_running_reqs"), queue=mean("num_queue_reqs"),
                       token_usage=mean("token_usage"), max_running_requests=max(caps) if caps else None,
                       retracted=retracted, running_max_near=max(near) if near else None)


class _HostIndex:
    """The host trace's rows in time order, each placed at the middle of the span its CPU share covers."""

    def __init__(self, host: HostTimeline) -> None:
        try:
            hz = float(host.meta.get("sample_hz", "0") or 0)
        except ValueError:
            hz = 0.0
        half = 0.5 / hz if hz > 0 else 0.0
        order = sorted(range(len(host.t_s)), key=host.t_s.__getitem__)
        self.host = host
        self.order = order
        self.t_mid = [host.t_s[i] - half for i in order]

    def busiest(self, start_s: float, end_s: float) -> list[ThreadLoad]:
        h = self.host
        lo, hi = bisect.bisect_left(self.t_mid, start_s), bisect.bisect_left(self.t_mid, end_s)
        acc: dict[tuple[str, int, int | None], list[float]] = {}
        names: dict[tuple[str, int, int | None], tuple[str, str]] = {}
        for k in range(lo, hi):
            i = self.order[k]
            v = h.busiest_thread_cpu_pct[i]
            if v is None:
                continue
            key = (h.role[i], h.pid[i], h.busiest_tid[i])
            acc.setdefault(key, []).append(v)
            names[key] = (h.comm[i], h.busiest_thread[i])
        best: dict[str, ThreadLoad] = {}
        for key, vals in acc.items():
            load = ThreadLoad(key[0], key[1], names[key][0], key[2], names[key][1], sum(vals) / len(vals))
            if key[0] not in best or load.cpu_pct > best[key[0]].cpu_pct:
                best[key[0]] = load
        return [best[r] for r in sorted(best)]


def build_intervals(trace: Trace, idle_power_w: dict[int, float | None], start_s: float, end_s: float, *,
                    server: ServerTimeline | None = None, host: HostTimeline | None = None,
                    interval_s: float = INTERVAL_S) -> list[Interval]:
    """The window [start_s, end_s] in intervals, each with its GPU judgement, server slice and busiest threads,
    classified (`state`, `confidence`, `why`)."""
    host_index = _HostIndex(host) if host is not None and len(host.t_s) else None
    columns = {g: _GpuColumns(s) for g, s in trace.gpus.items()}
    out: list[Interval] = []
    for a, b in bounds(start_s, end_s, interval_s):
        judged: dict[str, GpuJudgement] = {}
        busy: list[float | None] = []
        idle: list[float | None] = []
        utils: list[float | None] = []
        pols: list[float | None] = []
        sms: list[float | None] = []
        for g, s in trace.gpus.items():
            lo, hi = bisect.bisect_left(s.t_s, a), bisect.bisect_left(s.t_s, b)
            if hi <= lo:
                continue
            stats, bs, ids = columns[g].stats(lo, hi, idle_power_w.get(g))
            judged[str(g)] = judge_gpu(stats)
            busy.append(bs)
            idle.append(ids)
            utils.append(stats["util_gpu_pct"])
            pols.append(stats["power_of_limit"])
            sms.append((stats["gpm"] or {}).get("sm_util_pct"))
        if not judged:
            continue
        state, capped, conf = _combine(judged)
        iv = Interval(a, b, judged, state, capped, _mean(busy), _mean(idle), _mean(utils), _mean(pols), _mean(sms))
        if server is not None:
            iv.server = _server_slice(server, a, b)
        if host_index is not None:
            iv.threads = host_index.busiest(a, b)
        classify(iv, conf, has_server=server is not None)
        out.append(iv)
    return out


def classify(iv: Interval, gpu_confidence: float, *, has_server: bool) -> None:
    """Set iv.state, iv.confidence and iv.why (the rules in this module's docstring)."""
    sv = iv.server
    gpu_text = _gpu_text(iv)
    if iv.gpu_state == THROTTLED:
        iv.state, iv.confidence, iv.why = THROTTLED, gpu_confidence, gpu_text
        return
    cap = sv.max_running_requests if sv is not None else None
    top = sv.running_max_near if sv is not None else None
    queued = sv is not None and (sv.queue or 0.0) >= QUEUED_MIN
    at_cap = bool(cap and top is not None and (top >= RUNNING_AT_CAP * cap or cap - top <= 1.0))
    if sv is not None and sv.token_usage is not None and (
            (sv.token_usage >= KV_FULL and (queued or sv.retracted > 0))
            or (sv.token_usage >= KV_RESERVED and queued and not at_cap and cap is not None)):
        iv.state, iv.confidence = KV_BOUND, 0.85 if sv.token_usage >= KV_FULL or sv.retracted else 0.7
        iv.why = (f"token usage {sv.token_usage:.2f} with {sv.queue or 0:.0f} queued"
                  + (f", {sv.retracted:.0f} retracted" if sv.retracted else "")
                  + (f", running {sv.running:.0f} of {cap:.0f}" if cap and sv.running is not None else ""))
        return
    if (sv is not None and cap and top is not None and queued and at_cap
            and (sv.token_usage is None or sv.token_usage < KV_WELL_BELOW)):
        iv.state = SCHEDULER_CAPPED
        iv.confidence = 0.85 if sv.token_usage is not None else 0.65
        usage = f"token usage {sv.token_usage:.2f}" if sv.token_usage is not None else "token usage unknown"
        iv.why = f"running up to {top:.0f} of max_running_requests {cap:.0f}, {sv.queue:.0f} queued, {usage}"
        return
    if iv.underused:
        thread = _limiting_thread(iv, has_server)
        if thread is not None:
            iv.state, iv.confidence = HOST, 0.8
            iv.why = f"{thread.name} at {thread.cpu_pct:.0f} % of a core while {gpu_text}"
            return
        if (sv is not None and sv.running is not None and (sv.queue or 0.0) < CLIENT_QUEUE_MAX
                and (cap is None or sv.running < CLIENT_RUNNING_OF_CAP * cap)):
            iv.state, iv.confidence = CLIENT, 0.8 if cap else 0.6
            iv.why = (f"no queue ({sv.queue or 0:.1f}), running {sv.running:.0f}"
                      + (f" of {cap:.0f}" if cap else " (cap unknown)") + f", {gpu_text}")
            return
        if (iv.busy_share is not None and iv.idle_share is not None and iv.busy_share >= ON_OFF_SHARE
                and iv.idle_share >= ON_OFF_SHARE):
            iv.state, iv.confidence = ON_OFF, 0.8
            iv.why = (f"busy (util >= {BUSY_UTIL_PCT:.0f} %) {iv.busy_share:.0%} and idle {iv.idle_share:.0%} "
                      "of the samples: the load switched inside the interval")
            return
    iv.state, iv.confidence, iv.why = iv.gpu_state, gpu_confidence, gpu_text


def _limiting_thread(iv: Interval, has_server: bool) -> ThreadLoad | None:
    bench = iv.busiest("bench")
    if bench is not None and bench.cpu_pct >= HOST_FULL_CORE_PCT:
        return bench
    srv = iv.busiest("server")
    if srv is None or srv.cpu_pct < HOST_FULL_CORE_PCT:
        return None
    sv = iv.server
    if has_server and (sv is None or (sv.queue or 0.0) < QUEUED_MIN):
        return None  # the scheduler's idle poll loop, not a limit: nothing was waiting for it
    return srv


def _gpu_text(iv: Interval) -> str:
    parts = [f"GPU {iv.gpu_state}" + (" (power-capped)" if iv.power_capped else "")]
    if iv.util_gpu_pct is not None:
        parts.append(f"util {iv.util_gpu_pct:.0f} %")
    if iv.sm_util_pct is not None:
        parts.append(f"SM {iv.sm_util_pct:.0f} %")
    if iv.power_of_limit is not None:
        parts.append(f"{iv.power_of_limit:.0%} of the power limit")
    return ", ".join(parts)


@dataclass(frozen=True)
class Segment:
    """A run of consecutive samples on one side of SPLIT_UTIL_PCT (mean util over the GPUs at each tick): `high`
    or `low`, with the median util of its samples (a saturated phase reads ~100, an idle one 0, fine-grained
    gaps in between)."""

    level: str
    start_s: float
    end_s: float
    median_util_pct: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


SPLIT_UTIL_PCT = 50.0  # a phase edge falls in one or two samples (NVML's util window, ~0.2 s on the H200)


def load_segments(trace: Trace, start_s: float, end_s: float) -> list[Segment]:
    """The window's samples as runs above and below SPLIT_UTIL_PCT (rows align by index across GPUs, as in
    steady.activity_series). A run ends where the next begins, so the durations add up to the window."""
    series = list(trace.gpus.values())
    if not series:
        return []
    n = min(len(s) for s in series)
    t = series[0].t_s[:n]
    lo, hi = bisect.bisect_left(t, start_s), bisect.bisect_right(t, end_s)
    ticks: list[tuple[float, float]] = []
    for i in range(lo, hi):
        us = [u for s in series if (u := s.values["util_gpu_pct"][i]) is not None]
        if us:
            ticks.append((t[i], sum(us) / len(us)))
    runs: list[tuple[str, float, float, list[float]]] = []
    for k, (ti, u) in enumerate(ticks):
        level = "high" if u >= SPLIT_UTIL_PCT else "low"
        nxt = ticks[k + 1][0] if k + 1 < len(ticks) else min(end_s, ti + (ti - ticks[k - 1][0] if k else 0.0))
        if runs and runs[-1][0] == level:
            runs[-1][3].append(u)
            runs[-1] = (level, runs[-1][1], nxt, runs[-1][3])
        else:
            runs.append((level, ti, nxt, [u]))
    # the lower median: an edge sample beside one idle sample does not make the run look busy
    return [Segment(level, a, b, sorted(us)[(len(us) - 1) // 2]) for level, a, b, us in runs]
