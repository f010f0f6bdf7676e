"""An in-process `run_variant` over the lab's engine model: each point is the variant's resolved spec run through
the stand-in's scheduler (toolkit/lab/standin_server/engine_model.py) on a virtual clock, in milliseconds.

SIMULATED, and every measurement says so (its provenance: engine-model). What it stands in for is `toolkit apply
profile VARIANT --probe` against the lab: the same engine model answers there, in real time behind a real server
and a real bench_serving. Here there is no server, no bench client and no probe trace: the verdict is a reduced form
of the probe's over-time rules (docs/probe.md "The run from its intervals") computed from the scheduler's own state per
forward, then the probe's real `knob_steps` code (toolkit.core.probe.knobs.propose) names the next steps. It is how
`toolkit tune` and `toolkit sweep` are compared on a grid of dozens of points in seconds (benchmarks/bench_tune.py)
and how the tune's CPU tests drive the real loop.

The reduced verdict, per forward, time-weighted (first match wins):
- scheduler-capped: the running batch is within 5 % (or 1) of max_running_requests, >= 1 request queued, KV < 0.8;
- kv-bound: KV usage >= 0.9 with >= 1 queued, or a retraction in that forward;
- busy-but-waiting: the forward's compute share (the engine model's GPM SM utilisation; util is 100 %) < 20 %, or
  < 40 % of the power headroom above idle with power < 50 % of the limit (gpu_rules' second busy-but-waiting rule);
- compute-bound: compute share >= 50 % (power-capped at >= 94 %: 95 % of the power limit); else mixed.
The benchmark's drain (after the last forward with a queue) is left out of the shares when queued forwards cover
>= 25 % of the run, as the probe does; the class is the state holding >= 60 %, else mixed.

The workload is bench_serving's with its default --seed 1: every run of every variant sends the same requests
(random lengths) and, at a request rate, the same Poisson arrivals stretched to that rate. Run-to-run noise is the
host's pace: each run's forward times are scaled by one factor N(1, PACE_SD) drawn from the variant's knobs, the
level, the rate and the repeat number, so a base measured three times spreads by about 1 %, and the within-run
spread comes from the workload itself (1 s intervals of the steady window).

With a request rate (a capacity search's point), requests arrive as bench_serving sends them (exponential gaps,
the first at 0), each request's TTFT and token gaps are recorded as bench_serving's --output-details would list them,
and the throughput is read over the steady part of the arrivals (from a tenth of them to the last), not the drain.
The power limit (`gpu.power_limit_w`) slows the compute phases and caps their power (engine_model.py, "The power
limit").
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolkit.core.probe.bench import RequestLatencies, latency_percentiles
from toolkit.core.probe.gpu_rules import COMPUTE, KV_BOUND, SCHEDULER_CAPPED, WAITING
from toolkit.core.probe.knobs import propose, run_target
from toolkit.core.provenance import Provenance
from toolkit.core.sweep.run import PointRequest, VariantFailed
from toolkit.core.sweep.state import Measurement
from toolkit.core.sweep.variants import canonical
from toolkit.lab.standin_server import engine_model as em

if TYPE_CHECKING:
    from toolkit.app.measure import RunnerContext

PROVENANCE = Provenance("engine-model", "in-process: no server, no GPU")
MIXED = "mixed"
DOMINANT_SHARE = 0.6  # the probe's dominant-state rule (toolkit/core/probe/timeline.py)
DRAIN_QUEUED_SHARE = 0.25
BENCH_SEED = 1  # bench_serving's --seed default
PACE_SD = 0.004  # a host's pace from run to run; a loaded host's spread is larger (the lab in real time: 2 %)
INTERVAL_S = 1.0  # the steady window's throughput per second: the run's own spread (toolkit.core.sweep.noise)


def _hardware(spec: Mapping[str, Any]) -> em.Hardware:
    t = spec.get("target") or {}
    hw = em.Hardware()
    default_w = float(t.get("gpu_power_limit_w") or hw.power_limit_w)
    enforced = (spec.get("gpu") or {}).get("power_limit_w")
    return em.Hardware(
        gpu_name=str(t.get("gpu_model") or hw.gpu_name),
        gpu_count=int(t.get("gpu_count") or hw.gpu_count),
        gpu_memory_gib=float(t.get("gpu_memory_gib") or hw.gpu_memory_gib),
        power_limit_w=float(enforced or default_w),
        default_limit_w=default_w,
        p2p=bool(t.get("p2p") or False),
        interconnect=str(t.get("interconnect") or hw.interconnect),
    )


def _run_seed(request: PointRequest) -> int:
    """One run's own draw (its pace): a different one for every variant, level, rate and repeat."""
    key = canonical({"knobs": request.variant.knob_dict(), "repeat": request.repeat, "c": request.concurrency,
                     **({} if request.request_rate is None else {"rate": request.request_rate})})
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def pace(seed: int) -> float:
    """The run's pace: N(1, PACE_SD), clipped to 3 sd. A host's speed differs a little from run to run (clocks,
    what else runs); the engine model itself is exact, so without it two runs of a variant would agree to the
    token."""
    return 1.0 + max(-3.0, min(3.0, random.Random(seed).gauss(0.0, 1.0))) * PACE_SD


def arrivals(n: int, request_rate: float | None, seed: int) -> list[float]:
    """bench_serving's send times: the first at 0, then exponential gaps of mean 1 / rate (Poisson arrivals); all at
    0 for rate inf (sglang/bench_serving.py get_request)."""
    if request_rate is None or math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed ^ 0x5EED)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(request_rate)
    return out


def steady_bounds(arrive: list[float], closed: bool, drain_end_s: float) -> tuple[float, float]:
    """The window the throughput is read over. Poisson arrivals: from a tenth into the arrivals to the last one (the
    server's warm-up and the drain after the last request are left out, as the probe's plateau rule leaves them
    out). Closed loop: the whole run (the engine model's figures have always been whole-run ones)."""
    if closed or len(arrive) < 2 or arrive[-1] <= 0:
        return 0.0, drain_end_s
    return arrive[-1] * 0.1, arrive[-1]


def _tokens_between(marks: list[tuple[float, float]], start_s: float, end_s: float) -> float:
    """How much of a cumulative count (output tokens, joules) accrued in [start_s, end_s], from (time, count so far)
    marks at each forward's end, interpolated."""
    times = [t for t, _ in marks]

    def at(t: float) -> float:
        i = bisect.bisect_right(times, t)
        if i == 0:
            return 0.0
        if i >= len(marks):
            return float(marks[-1][1])
        (t0, n0), (t1, n1) = marks[i - 1], marks[i]
        return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else float(n1)

    return at(end_s) - at(start_s)


class EngineModelRunner:
    """`run_variant` answering from the engine model. `profile_names`: the profile store's names, so a verdict can
    name the existing variant profiles (glm5-tp4-pp2, glm5-ep8) as a probe run through apply does."""

    def __init__(self, *, base: str, profile_names: Iterable[str] = (), num_prompts: int | None = None) -> None:
        self.base = base
        self.profile_names = set(profile_names)
        self.num_prompts = num_prompts
        self.calls: list[tuple[str, int, int]] = []

    def describe(self) -> str:
        return "the lab's engine model, in-process (simulated: no server, no GPU, a reduced verdict)"

    def __call__(self, request: PointRequest) -> Measurement:
        self.calls.append((request.variant.id, request.concurrency, request.repeat))
        spec = request.spec
        server = spec.get("server") or {}
        bench = spec.get("bench") or {}
        hw = _hardware(spec)
        cfg = em.EngineConfig(
            tp_size=int(server.get("tp_size") or 1),
            max_running_requests=server.get("max_running_requests"),
            mem_fraction_static=server.get("mem_fraction_static"),
            chunked_prefill_size=server.get("chunked_prefill_size"),
        )
        facts = em.facts_for(str((spec.get("model") or {}).get("repo_id") or ""))
        try:
            eng = em.Engine(cfg, hw, facts)
        except em.NotEnoughMemory as exc:
            # What the lab's stand-in (and SGLang) does at start: the server never answers /health.
            raise VariantFailed(f"server never up: {exc} (engine model, tp_size {cfg.tp_size})") from None
        n = int(self.num_prompts or bench.get("num_prompts") or 1024)
        ratio = float(bench.get("random_range_ratio") or 0.0)
        # bench_serving seeds its random lengths and its arrivals with --seed (default 1): every run of every
        # variant sends the same requests, at any rate the same arrivals stretched in time.
        seed = int(bench["seed"]) if bench.get("seed") is not None else BENCH_SEED
        work = em.random_workload(n, int(bench.get("random_input_len") or 256),
                                  int(bench.get("random_output_len") or 128), ratio, seed=seed)
        eng.pace = pace(_run_seed(request))
        rate = request.request_rate
        if rate is None and bench.get("request_rate") not in (None, "inf"):
            rate = float(bench["request_rate"])
        return self._measure(eng, hw, work, request.concurrency, spec, arrivals(n, rate, seed), rate)

    def _measure(self, eng: em.Engine, hw: em.Hardware, work: list[tuple[int, int]], concurrency: int,
                 spec: Mapping[str, Any], arrive: list[float], rate: float | None) -> Measurement:
        cap = eng.max_running_requests
        pending = [em.Req(f"r{i}", inp, out, 0.0) for i, (inp, out) in enumerate(work)]
        pending.reverse()
        times = list(reversed(arrive))
        in_flight = 0
        now = 0.0
        rows: list[tuple[float, str, bool, int, float, int]] = []  # (duration, state, queued, running, usage, demand)
        retracted_before = 0.0
        sent: dict[str, float] = {}  # when bench_serving started each request (its TTFT clock)
        last_tok: dict[str, float] = {}
        ttft: dict[str, float] = {}
        gaps: dict[str, list[float]] = {}
        marks: list[tuple[float, float]] = [(0.0, 0.0)]  # (time, output tokens so far)
        energy: list[tuple[float, float]] = [(0.0, 0.0)]  # (time, joules per GPU so far)
        produced = 0.0
        while True:
            # bench_serving: a request is sent at its arrival time, when --max-concurrency has a free slot.
            while pending and in_flight < concurrency and times[-1] <= now + 1e-12:
                nxt = pending.pop()
                times.pop()
                nxt.arrival_s = now
                sent[nxt.rid] = now
                eng.add_request(nxt)
                in_flight += 1
            fwd = eng.next_forward(now)
            if fwd is None:
                if pending and in_flight < concurrency:
                    now = max(now, times[-1])  # idle until the next request arrives
                    continue
                break
            running = len(eng.running) + (len(fwd.reqs) if fwd.kind == "prefill" else 0)
            queued = len(eng.waiting)
            usage = eng.used_tokens / eng.max_total_num_tokens
            retracted = eng.counters.retracted_requests > retracted_before
            retracted_before = eng.counters.retracted_requests
            share = fwd.compute_share
            power_w = hw.idle_power_w + (eng.compute_power_w - hw.idle_power_w) * share  # the engine model's rule
            if running >= min(0.95 * cap, cap - 1) and queued >= 1 and usage < 0.8:
                state = SCHEDULER_CAPPED
            elif (usage >= 0.9 and queued >= 1) or retracted:
                state = KV_BOUND
            elif share < 0.2 or (share < 0.4 and power_w < 0.5 * eng.power_limit_w):
                state = WAITING
            elif share >= 0.5:
                state = COMPUTE
            else:
                state = MIXED
            rows.append((fwd.duration_s, state, queued >= 1, running, usage, running + queued))
            now += fwd.duration_s
            done_before = len(eng.finished)
            touched = eng.finish_forward(now)
            for req in touched:
                if req.rid not in ttft:
                    ttft[req.rid] = now - sent[req.rid]
                    gaps[req.rid] = []
                else:
                    gaps[req.rid].append(now - last_tok[req.rid])
                last_tok[req.rid] = now
            produced += len(touched)
            marks.append((now, produced))
            energy.append((now, eng.energy_j))
            in_flight -= len(eng.finished) - done_before
        out_tokens = sum(r.generated for r in eng.finished)
        if now <= 0 or not rows:
            raise VariantFailed("the engine model ran no forward")
        window = rows
        drain_s = 0.8 * now  # where the plateau ends without a queue to say so
        queued_s = sum(r[0] for r in rows if r[2])
        if queued_s >= DRAIN_QUEUED_SHARE * now:
            last = max(i for i, r in enumerate(rows) if r[2])
            window = rows[: last + 1]
            drain_s = sum(r[0] for r in window)
        total_s = sum(r[0] for r in window)
        shares: dict[str, float] = {}
        for r in window:
            shares[r[1]] = shares.get(r[1], 0.0) + r[0] / total_s
        top, top_share = max(shares.items(), key=lambda kv: kv[1])
        cls = top if top_share >= DOMINANT_SHARE else MIXED
        held = [r for r in window if r[1] == top]
        held_s = sum(r[0] for r in held) or 1.0
        srv = {
            "running_max": max(r[3] for r in rows),
            "queue": round(sum(r[0] * (r[5] - r[3]) for r in held) / held_s, 1),  # mean waiting where it held
            "token_usage": round(sum(r[0] * r[4] for r in held) / held_s, 2),
            "max_running_requests": cap,
            "demand_max": max(r[5] for r in rows),
            "retracted": int(eng.counters.retracted_requests),
        }
        closed = rate is None
        w0, w1 = steady_bounds(arrive, closed, now)
        out_w = _tokens_between(marks, w0, w1) if w1 > w0 else float(out_tokens)
        tput = out_w / (w1 - w0) if w1 > w0 else out_tokens / now
        # every GPU of the group over the same window, idle gaps included
        energy_j = (_tokens_between(energy, w0, w1) if w1 > w0 else eng.energy_j) * eng.tp
        power_total_w = energy_j / ((w1 - w0) if w1 > w0 else now)
        power_capped = cls == COMPUTE and power_total_w / eng.tp >= 0.95 * eng.power_limit_w
        name = self.base
        target = run_target(name, dict(spec), self.profile_names)
        evidence = {"server": srv, "held": round(top_share, 3)}
        steps = propose(cls, evidence, target, gpus=eng.tp, no_p2p=not hw.p2p,
                        variants=list(target.get("variants") or []), power_capped=power_capped,
                        power={"mean_w": power_total_w / eng.tp, "limit_w": eng.power_limit_w,
                               "default_w": hw.default_limit_w, "min_w": (spec.get("target") or {})
                               .get("gpu_power_limit_min_w")})
        # The run's own spread, over its plateau: a closed-loop run's throughput falls to nothing in the drain after
        # the last queued forward, which is the benchmark emptying, not noise (the probe's plateau rule cuts it too).
        p0, p1 = (w0, w1) if not closed else (0.1 * drain_s, drain_s)
        per = [_tokens_between(marks, t, t + INTERVAL_S) / INTERVAL_S
               for t in _frange(p0, p1 - INTERVAL_S + 1e-9, INTERVAL_S)] if p1 > p0 else []
        lat = RequestLatencies([ttft[r.rid] for r in eng.finished],
                               [gaps[r.rid] for r in eng.finished], failed=0)
        headline = (f"{cls} ({top_share:.0%} of the run{'' if cls != MIXED else f' {top}'}): "
                    f"{tput:,.0f} output tok/s, up to {srv['running_max']} running of {cap}, "
                    f"{power_total_w / eng.tp:.0f} W of {eng.power_limit_w:.0f} per GPU"
                    + (f" (clock {eng.clock:.0%} in compute)" if eng.clock < 1 else "") + " (simulated)")
        return Measurement(
            steady_output_tok_per_s=round(tput, 2),
            output_tok_per_s=round(out_tokens / now, 2),
            tokens_per_j=round(out_w / energy_j, 6),
            energy_per_output_token_j=round(energy_j / out_w, 6),
            power_w_total=round(power_total_w, 1),
            gpu_count=eng.tp,
            verdict=cls,
            provenance=PROVENANCE,
            throughput_window="full" if closed else "steady",
            knob_steps=[s.to_dict() for s in steps],
            verdict_headline=headline,
            request_rate=rate,
            request_per_s=round(len(eng.finished) / now, 4),
            latency_ms=latency_percentiles(lat),
            latency_source="engine model: each request's first token and token gaps (simulated)",
            interval_tok_per_s=[round(x, 2) for x in per],
            interval_s=INTERVAL_S if per else None,
            power_limit_w=eng.power_limit_w,
            server=srv,
        )


def _frange(start: float, stop: float, step: float) -> list[float]:
    out = []
    t = start
    while t <= stop:
        out.append(t)
        t += step
    return out


def runner(ctx: RunnerContext) -> EngineModelRunner:
    """`--runner engine-model` (the entry point toolkit.runners: engine-model): the base's name, the profiles that
    exist beside it, and the prompts per measurement (the profile's unless --num-prompts says)."""
    return EngineModelRunner(base=ctx.base.name, profile_names=ctx.profiles.names(), num_prompts=ctx.num_prompts)
