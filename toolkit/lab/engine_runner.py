"""An in-process `run_variant` over the lab's engine model: each point is the variant's resolved spec run through
the stand-in's scheduler (toolkit/lab/standin_server/engine_model.py) on a virtual clock, in milliseconds.

SIMULATED, and every measurement says so (`data_source`). What it stands in for is `toolkit apply profile VARIANT
--probe` against the lab: the same engine model answers there, in real time behind a real server and a real
bench_serving. Here there is no server, no bench client and no probe trace: the verdict is a reduced form of the
probe's over-time rules (docs/probe.md "The run from its intervals") computed from the scheduler's own state per
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

Run-to-run noise: each measurement draws the workload's random lengths with its own seed (from the variant's
knobs and the repeat number), as two bench_serving runs with different seeds would; the spread of a base measured
three times is about 1 %.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from toolkit.core.probe.gpu_rules import COMPUTE, KV_BOUND, SCHEDULER_CAPPED, WAITING
from toolkit.core.probe.knobs import propose, run_target
from toolkit.core.sweep.run import PointRequest, VariantFailed
from toolkit.core.sweep.state import Measurement
from toolkit.core.sweep.variants import canonical
from toolkit.lab.standin_server import engine_model as em

if TYPE_CHECKING:
    from toolkit.app.measure import RunnerContext

DATA_SOURCE = "lab engine model (simulated in-process: no server, no GPU)"
MIXED = "mixed"
DOMINANT_SHARE = 0.6  # the probe's dominant-state rule (toolkit/core/probe/timeline.py)
DRAIN_QUEUED_SHARE = 0.25


def _hardware(spec: Mapping[str, Any]) -> em.Hardware:
    t = spec.get("target") or {}
    hw = em.Hardware()
    return em.Hardware(
        gpu_name=str(t.get("gpu_model") or hw.gpu_name),
        gpu_count=int(t.get("gpu_count") or hw.gpu_count),
        gpu_memory_gib=float(t.get("gpu_memory_gib") or hw.gpu_memory_gib),
        power_limit_w=float(t.get("gpu_power_limit_w") or hw.power_limit_w),
        p2p=bool(t.get("p2p") or False),
        interconnect=str(t.get("interconnect") or hw.interconnect),
    )


def _seed(request: PointRequest) -> int:
    key = canonical({"knobs": request.variant.knob_dict(), "repeat": request.repeat, "c": request.concurrency})
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


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
        work = em.random_workload(n, int(bench.get("random_input_len") or 256),
                                  int(bench.get("random_output_len") or 128), ratio, seed=_seed(request))
        return self._measure(eng, hw, work, request.concurrency, spec)

    def _measure(self, eng: em.Engine, hw: em.Hardware, work: list[tuple[int, int]], concurrency: int,
                 spec: Mapping[str, Any]) -> Measurement:
        cap = eng.max_running_requests
        pending = [em.Req(f"r{i}", inp, out, 0.0) for i, (inp, out) in enumerate(work)]
        pending.reverse()
        in_flight = 0
        now = 0.0
        rows: list[tuple[float, str, bool, int, float, int]] = []  # (duration, state, queued, running, usage, demand)
        retracted_before = 0.0
        while True:
            while pending and in_flight < concurrency:  # bench_serving's --max-concurrency: a client-side window
                eng.add_request(pending.pop())
                in_flight += 1
            fwd = eng.next_forward(now)
            if fwd is None:
                break
            running = len(eng.running) + (len(fwd.reqs) if fwd.kind == "prefill" else 0)
            queued = len(eng.waiting)
            usage = eng.used_tokens / eng.max_total_num_tokens
            retracted = eng.counters.retracted_requests > retracted_before
            retracted_before = eng.counters.retracted_requests
            share = fwd.compute_share
            power_w = hw.idle_power_w + (hw.power_limit_w - hw.idle_power_w) * share  # the engine model's own rule
            if running >= min(0.95 * cap, cap - 1) and queued >= 1 and usage < 0.8:
                state = SCHEDULER_CAPPED
            elif (usage >= 0.9 and queued >= 1) or retracted:
                state = KV_BOUND
            elif share < 0.2 or (share < 0.4 and power_w < 0.5 * hw.power_limit_w):
                state = WAITING
            elif share >= 0.5:
                state = COMPUTE
            else:
                state = MIXED
            rows.append((fwd.duration_s, state, queued >= 1, running, usage, running + queued))
            now += fwd.duration_s
            done_before = len(eng.finished)
            eng.finish_forward(now)
            in_flight -= len(eng.finished) - done_before
        out_tokens = sum(r.generated for r in eng.finished)
        if now <= 0 or not rows:
            raise VariantFailed("the engine model ran no forward")
        window = rows
        queued_s = sum(r[0] for r in rows if r[2])
        if queued_s >= DRAIN_QUEUED_SHARE * now:
            last = max(i for i, r in enumerate(rows) if r[2])
            window = rows[: last + 1]
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
        energy_j = eng.energy_j * eng.tp  # every GPU of the group, idle gaps included
        power_total_w = energy_j / now
        power_capped = cls == COMPUTE and power_total_w / eng.tp >= 0.95 * hw.power_limit_w
        name = self.base
        target = run_target(name, dict(spec), self.profile_names)
        evidence = {"server": srv, "held": round(top_share, 3)}
        steps = propose(cls, evidence, target, gpus=eng.tp, no_p2p=not hw.p2p,
                        variants=list(target.get("variants") or []), power_capped=power_capped)
        tput = out_tokens / now
        headline = (f"{cls} ({top_share:.0%} of the run{'' if cls != MIXED else f' {top}'}): "
                    f"{tput:,.0f} output tok/s, up to {srv['running_max']} running of {cap}, "
                    f"{power_total_w / eng.tp:.0f} W of {hw.power_limit_w:.0f} per GPU (simulated)")
        return Measurement(
            steady_output_tok_per_s=round(tput, 2),
            output_tok_per_s=round(tput, 2),
            tokens_per_j=round(out_tokens / energy_j, 6),
            energy_per_output_token_j=round(energy_j / out_tokens, 6),
            power_w_total=round(power_total_w, 1),
            verdict=cls,
            data_source=DATA_SOURCE,
            throughput_window="full",
            knob_steps=[s.to_dict() for s in steps],
            verdict_headline=headline,
        )


def runner(ctx: RunnerContext) -> EngineModelRunner:
    """`--runner engine-model` (the entry point toolkit.runners: engine-model): the base's name, the profiles that
    exist beside it, and the prompts per measurement (the profile's unless --num-prompts says)."""
    return EngineModelRunner(base=ctx.base.name, profile_names=ctx.profiles.names(), num_prompts=ctx.num_prompts)
