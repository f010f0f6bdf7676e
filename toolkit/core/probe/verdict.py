"""The verdict: where the time goes, as a pure function of summary, topology and the profile's target.

Judged on the steady window. The thresholds below are the documented rules (docs/probe.md); the figures
that set them were measured on this project's H200 (DOMAIN.md section 3, re-measured in
tests/fixtures/probe/h200-*) and taken from the seed (8 GPUs at 100 % util, ~250 W of 600 W, no P2P).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

VERDICT_SCHEMA_VERSION = 1

COMPUTE = "compute-bound"
MEMORY = "memory-bandwidth-bound"
WAITING = "busy-but-waiting"
LAUNCH = "launch-bound"
THROTTLED = "throttled"
IMBALANCED = "imbalanced"
NO_LOAD = "no-load"
FAILED = "benchmark-failed"
MIXED = "mixed"
CLASSES = (COMPUTE, MEMORY, WAITING, LAUNCH, THROTTLED, IMBALANCED, NO_LOAD, FAILED, MIXED)

# Rules (percent unless named otherwise).
NO_LOAD_UTIL_PCT = 5.0
NO_LOAD_ABOVE_IDLE = 0.10  # (power - idle) / (limit - idle)
THROTTLE_SHARE = 0.2  # share of steady samples with a thermal / slowdown / power-brake reason
POWER_CAP_SHARE = 0.2  # share of steady samples with sw_power_cap
LAUNCH_UTIL_PCT = 60.0  # below this, the GPU sits idle between kernels: gaps
BUSY_UTIL_PCT = 80.0
GPM_DRAM_BW_PCT = 60.0  # H200 copy loop: 88 %; bf16 matmul: 17 %
GPM_TENSOR_PCT = 30.0  # H200 matmul: 93 %
GPM_SM_BUSY_PCT = 60.0
GPM_SM_WAITING_PCT = 20.0  # H200 spinning kernel: ~1 % at 100 % util
POWER_CAPPED_OF_LIMIT = 0.85  # H200 matmul: 692 W of 700 W
WAITING_POWER_OF_LIMIT = 0.5  # seed: 250 W of 600 W = 0.42; H200 spin: 123 of 700
WAITING_ABOVE_IDLE = 0.4  # seed: (250-87)/(600-87) = 0.32
IMBALANCE_SPREAD = 0.25  # absolute spread of the work metric (0..1) across GPUs
IMBALANCE_RELATIVE = 0.3  # and relative to the busiest GPU
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass
class GpuJudgement:
    cls: str
    basis: str  # "gpm" or "power+util+clocks"
    confidence: float
    evidence: dict[str, Any]
    power_capped: bool = False
    note: str = ""


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
    data_source: str = "measured"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": VERDICT_SCHEMA_VERSION,
            "class": self.cls,
            "power_capped": self.power_capped,
            "slow_gpu": self.slow_gpu,
            "confidence": round(self.confidence, 2),
            "confidence_label": "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.5 else "low",
            "basis": self.basis,
            "headline": self.headline,
            "evidence": self.evidence,
            "next_steps": self.next_steps,
            "per_gpu": {
                g: {"class": j.cls, "basis": j.basis, "confidence": round(j.confidence, 2),
                    "power_capped": j.power_capped, "evidence": j.evidence, "note": j.note}
                for g, j in self.per_gpu.items()
            },
            "data_source": self.data_source,
        }


def _above_idle(g: dict[str, Any]) -> float | None:
    p, lim, idle = g["power_w"]["mean"], g["power_limit_w"], g["idle_power_w"]
    if p is None or lim is None or idle is None or lim <= idle:
        return None
    return max(0.0, (p - idle) / (lim - idle))


def judge_gpu(g: dict[str, Any]) -> GpuJudgement:
    """One GPU's steady-window statistics (summary['steady']['gpus'][i]) -> its class."""
    util = g["util_gpu_pct"]
    pol = g["power_of_limit"]
    above = _above_idle(g)
    reasons = g["clock_reasons_seen"]
    gpm = g["gpm"]
    ev: dict[str, Any] = {
        "util_gpu_pct": util, "power_w_mean": g["power_w"]["mean"], "power_limit_w": g["power_limit_w"],
        "power_of_limit": pol, "idle_power_w": g["idle_power_w"],
        "above_idle_of_headroom": round(above, 3) if above is not None else None,
        "sm_clock_of_max": g["sm_clock_of_max"], "clock_reasons_seen": reasons,
    }
    if gpm:
        ev["gpm"] = {k: gpm.get(k) for k in ("sm_util_pct", "tensor_util_pct", "dram_bw_util_pct", "sm_occupancy_pct")}
    basis = "gpm" if gpm and gpm.get("sm_util_pct") is not None else "power+util+clocks"
    capped_share = reasons.get("sw_power_cap", 0.0)
    capped = capped_share >= POWER_CAP_SHARE or (pol is not None and pol >= 0.95)
    if util is None and pol is None:
        return GpuJudgement(MIXED, basis, 0.1, ev, note="no utilization or power values in the window")
    throttle = {r: reasons[r] for r in THROTTLE_REASONS if reasons.get(r, 0.0) >= THROTTLE_SHARE}
    if throttle:
        return GpuJudgement(THROTTLED, basis, 0.8, ev, note=f"clock-event reasons {throttle}")
    if (util or 0.0) < NO_LOAD_UTIL_PCT and (above is None or above < NO_LOAD_ABOVE_IDLE):
        return GpuJudgement(NO_LOAD, basis, 0.9, ev)
    if util is not None and util < LAUNCH_UTIL_PCT:
        conf = 0.8 if basis == "gpm" else 0.6
        return GpuJudgement(LAUNCH, basis, conf, ev,
                            note=f"kernels ran only {util:.0f} % of the time: gaps between them")
    if basis == "gpm":
        assert gpm is not None
        sm, tensor, dram = gpm.get("sm_util_pct") or 0.0, gpm.get("tensor_util_pct"), gpm.get("dram_bw_util_pct")
        if dram is not None and dram >= GPM_DRAM_BW_PCT:
            return GpuJudgement(MEMORY, basis, 0.85, ev, note=f"DRAM bandwidth {dram:.0f} % of peak")
        if (tensor is not None and tensor >= GPM_TENSOR_PCT) or sm >= GPM_SM_BUSY_PCT:
            return GpuJudgement(COMPUTE, basis, 0.85, ev, power_capped=capped,
                                note=f"SM {sm:.0f} %, tensor {tensor if tensor is not None else 'n/a'} %")
        if (util or 0.0) >= BUSY_UTIL_PCT and sm < GPM_SM_WAITING_PCT:
            return GpuJudgement(WAITING, basis, 0.85, ev,
                                note=f"util {util:.0f} % but SMs busy only {sm:.1f} %: kernels wait")
        return GpuJudgement(MIXED, basis, 0.4, ev, note="busy, moderate SM activity, no dominant resource")
    # Without GPM: decide from power against the limit, utilization and clocks (lower confidence).
    if capped_share >= POWER_CAP_SHARE or (pol is not None and pol >= POWER_CAPPED_OF_LIMIT):
        return GpuJudgement(COMPUTE, basis, 0.6, ev, power_capped=True,
                            note="at the power limit; without GPM, compute and memory pressure look alike here")
    if ((util or 0.0) >= BUSY_UTIL_PCT and pol is not None and pol < WAITING_POWER_OF_LIMIT
            and (above is None or above < WAITING_ABOVE_IDLE)):
        return GpuJudgement(WAITING, basis, 0.55, ev,
                            note=f"util {util:.0f} % at {pol:.0%} of the power limit: busy, not working")
    if pol is not None and pol >= WAITING_POWER_OF_LIMIT:
        return GpuJudgement(MEMORY, basis, 0.4, ev,
                            note="busy at clocks near max, power well under the cap: memory-bound is likely; "
                            "GPM would tell it apart from light compute")
    return GpuJudgement(MIXED, basis, 0.3, ev)


def _work(g: dict[str, Any]) -> float | None:
    gpm = g["gpm"]
    if gpm and gpm.get("sm_util_pct") is not None:
        return float(gpm["sm_util_pct"]) / 100.0
    return _above_idle(g)


def fewer_tp_variants(target: dict[str, Any]) -> list[str]:
    if target.get("variants"):
        return [str(v) for v in target["variants"]]
    name = str(target.get("profile", ""))
    m = re.search(r"tp(\d+)", name)
    if not m or int(m.group(1)) < 2:
        return []
    n = int(m.group(1))
    return [name.replace(m.group(0), f"tp{n // 2}-pp2"), name.replace(m.group(0), f"ep{n}")]


def _no_p2p(topology: dict[str, Any]) -> bool | None:
    links = topology.get("links") or []
    if not links:
        return None
    return any(not link.get("p2p_read_ok", False) for link in links)


def next_steps(cls: str, power_capped: bool | None, topology: dict[str, Any], target: dict[str, Any],
               slow_gpu: int | None, summary: dict[str, Any]) -> list[str]:
    ngpu = len(topology.get("gpus") or summary.get("gpus") or [])
    tp = int(target.get("tp_size") or ngpu or 1)
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
        return ["Launch/host-bound (gaps between kernels): enable CUDA graphs unless a profile note forbids them, "
                "try --num-continuous-decode-steps, and raise concurrency so the GPU has work queued."]
    return ["No dominant bottleneck: compare against a variant (`toolkit sweep`) rather than tuning one knob."]


def judge(summary: dict[str, Any], topology: dict[str, Any] | None = None,
          target: dict[str, Any] | None = None) -> Verdict:
    topology = topology or {}
    target = target or {}
    source = str(summary.get("data_source", "measured"))
    bench = summary["benchmark"]
    window = summary["steady"] if summary["steady_state"]["found"] else summary["full"]
    per_gpu = {g: judge_gpu(s) for g, s in window["gpus"].items()}
    basis = "gpm" if per_gpu and all(j.basis == "gpm" for j in per_gpu.values()) else "power+util+clocks"
    window_ev = {"window": "steady" if summary["steady_state"]["found"] else "full benchmark",
                 "start_s": window["start_s"], "end_s": window["end_s"]}
    if bench.get("exit_code") not in (0, None) or bench.get("interrupted"):
        what = "was interrupted" if bench.get("interrupted") else f"exited {bench.get('exit_code')}"
        failed: dict[str, Any] = {**window_ev, "exit_code": bench.get("exit_code"),
                                  "stderr_tail": bench.get("stderr_tail", "")[-800:]}
        server_log = str(bench.get("server_log_tail") or "")
        if server_log:
            failed["server_log_tail"] = server_log[-1500:]
            what += "; the server's log tail is in evidence.server_log_tail"
        v = Verdict(FAILED, 0.95, basis, failed, [], per_gpu, headline=f"the benchmark {what}", data_source=source)
        v.next_steps = next_steps(FAILED, None, topology, target, None, summary)
        return v
    if not per_gpu:
        return Verdict(NO_LOAD, 0.3, basis, window_ev, ["No GPU samples were recorded."], headline="no samples",
                       data_source=source)
    classes = Counter(j.cls for j in per_gpu.values())
    slow_gpu: int | None = None
    cls = classes.most_common(1)[0][0]
    throttled = [g for g, j in per_gpu.items() if j.cls == THROTTLED]
    works = {g: w for g, s in window["gpus"].items() if (w := _work(s)) is not None}
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
    if not summary["steady_state"]["found"] and cls not in (NO_LOAD,):
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
        missing = sum(g["samples"] for g in summary["gaps"]) / max(1, sum(g["of_samples"] for g in summary["gaps"]))
        confidence *= max(0.5, 1.0 - missing)
        headline += f" (not seen: {'; '.join(not_seen)})"
    v = Verdict(cls, confidence, basis, evidence, [], per_gpu, power_capped, slow_gpu, headline, source)
    v.next_steps = next_steps(cls, power_capped, topology, target, slow_gpu, summary)
    return v


def _not_seen(summary: dict[str, Any]) -> list[str]:
    """One line per GPU and gap in the readings (summary.gaps): when, how much, and NVML's error."""
    return [
        f"GPU {g['gpu']} {g['start_s']:.1f}-{g['end_s']:.1f} s, {g['samples']} of {g['of_samples']} samples "
        f"({str(g['error']).split(';')[0][:80]})"
        for g in summary.get("gaps") or []
    ]
