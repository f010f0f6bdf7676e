"""The per-GPU rules: one GPU's statistics over a window (the steady window, or one ~1 s interval) -> its class.

The thresholds are the documented rules (docs/probe.md); the figures that set them were measured on this
project's H200 (re-measured in tests/fixtures/probe/h200-*) and taken from the GLM-5 story (docs/story.md) (8 GPUs
at 100 % util, ~250 W of 600 W, no P2P). Pure: dicts in, a judgement out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# One GPU's figures over a window (a summary's GpuWindowStats, toolkit.core.probe.records) or over one interval of
# the timeline (toolkit.core.probe.intervals): the keys the rules read, util_gpu_pct ... gpm.
GpuFigures = Mapping[str, Any]

COMPUTE = "compute-bound"
MEMORY = "memory-bandwidth-bound"
WAITING = "busy-but-waiting"
LAUNCH = "launch-bound"
THROTTLED = "throttled"
IMBALANCED = "imbalanced"
NO_LOAD = "no-load"
FAILED = "benchmark-failed"
MIXED = "mixed"
# Judged over time (intervals of about a second from the GPU, server and host timelines together).
HOST = "host-bound"
INTERMITTENT = "intermittent-load"
SCHEDULER_CAPPED = "scheduler-capped"
KV_BOUND = "kv-bound"
CLIENT = "client-bound"
OVERLOADED = "overloaded"
# States of one interval only (a run is never judged to be one): nothing ran; busy and idle inside one interval.
IDLE = "idle"
ON_OFF = "on-off"

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
WAITING_POWER_OF_LIMIT = 0.5  # story (docs/story.md): 250 W of 600 W = 0.42; H200 spin: 123 of 700
WAITING_ABOVE_IDLE = 0.4  # story (docs/story.md): (250-87)/(600-87) = 0.32
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


def above_idle(g: GpuFigures) -> float | None:
    p, lim, idle = g["power_w"]["mean"], g["power_limit_w"], g["idle_power_w"]
    if p is None or lim is None or idle is None or lim <= idle:
        return None
    return max(0.0, (p - idle) / (lim - idle))


def judge_gpu(g: GpuFigures) -> GpuJudgement:
    """One GPU's steady-window statistics (Summary.steady.gpus[i]) -> its class."""
    util = g["util_gpu_pct"]
    pol = g["power_of_limit"]
    above = above_idle(g)
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
        if ((util or 0.0) >= BUSY_UTIL_PCT and pol is not None and pol < WAITING_POWER_OF_LIMIT
                and (above is None or above < WAITING_ABOVE_IDLE)):
            # SMs partly active, no resource near its peak, and the power says little work is done: the kernels
            # mostly wait (the story's TP8 over PCIe: 100 % util at 42 % of the limit); less certain than SM < 20 %.
            return GpuJudgement(WAITING, basis, 0.7, ev,
                                note=f"util {util:.0f} %, SMs busy {sm:.0f} %, at {pol:.0%} of the power limit: "
                                "kernels mostly wait")
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


def work_of(g: GpuFigures) -> float | None:
    gpm = g["gpm"]
    if gpm and gpm.get("sm_util_pct") is not None:
        return float(gpm["sm_util_pct"]) / 100.0
    return above_idle(g)
