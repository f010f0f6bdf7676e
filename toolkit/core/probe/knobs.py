"""Next steps that name the knob: the profile's path, its current value and the values to try.

Each step is machine-readable (verdict.json `knob_steps`), so `toolkit sweep --vary` (and a later `toolkit tune`)
can take it as variants directly: `sweep_args` is the sweep's own spelling of the step. The rules follow the
signal -> knob table of the server-signal table of docs/probe.md and the GLM-5 story's history (docs/story.md).

Current values come from the run's target (`target.knobs`: the profile's resolved server and bench settings, put
into run.json by `toolkit probe run --profile` or `--target-json`), else from what the server reported
(max_running_requests from /v1/loads), else they are null with `current_source` saying why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.probe.gpu_rules import (
    CLIENT,
    COMPUTE,
    HOST,
    INTERMITTENT,
    KV_BOUND,
    LAUNCH,
    MEMORY,
    OVERLOADED,
    SCHEDULER_CAPPED,
    WAITING,
)
from toolkit.core.sweep.state import KnobStepRecord
from toolkit.core.sweep.variants import VARIABLE_SECTIONS, Scalar, format_value

POWER_LIMIT_STEPS = 4  # rungs of a lower power limit, from the current limit down to the floor
POWER_LIMIT_QUANTUM_W = 10  # limits proposed in whole tens of watts
MEM_FRACTION_STEP = 0.08  # the example 0.80 -> 0.88; SGLang's own defaults sit at 0.8-0.9
MEM_FRACTION_MAX = 0.93  # above this the CUDA graphs and activations of a large model run out of room
FP8_KV = "fp8_e4m3"


@dataclass(frozen=True)
class KnobStep:
    knob: str  # dotted path into the profile
    current: Scalar
    current_source: str  # "profile", "server", or why it is unknown
    proposed: tuple[Scalar, ...]
    why: str
    evidence: dict[str, Any]
    together: dict[str, Scalar] = field(default_factory=dict)  # knobs that change with it (tp 4 needs pp 2)
    profiles: tuple[str, ...] = ()  # existing profiles that make this change
    profile_why: str | None = None  # the profile's own reason for the current value (a pinned knob)

    @property
    def sweep_args(self) -> list[str]:
        """The step as `toolkit sweep` arguments: --vary for profile knobs, --concurrency for the bench's."""
        if not self.proposed:
            return []
        if self.knob == "bench.max_concurrency":
            return ["--concurrency", ",".join(format_value(v) for v in self.proposed)]
        if self.knob.split(".", 1)[0] not in VARIABLE_SECTIONS:
            return []
        args = ["--vary", f"{self.knob}=" + ",".join(format_value(v) for v in self.proposed)]
        for k, v in self.together.items():
            args += ["--vary", f"{k}={format_value(v)}"]
        return args

    def text(self) -> str:
        cur = "unset" if self.current is None else format_value(self.current)
        vals = self.proposed
        if len(vals) >= 3 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
            new = f"{format_value(vals[0])}..{format_value(vals[-1])}"
        else:
            new = " or ".join(format_value(v) for v in vals)
        extra = "".join(f", {k}: {format_value(v)}" for k, v in self.together.items())
        named = f" (profiles {' / '.join(self.profiles)})" if self.profiles else ""
        pinned = f" [the profile pins it: {self.profile_why}]" if self.profile_why else ""
        return f"`{self.knob}: {cur} -> {new}{extra}`{named}: {self.why}{pinned}"

    def to_dict(self) -> KnobStepRecord:
        return {"knob": self.knob, "current": self.current, "current_source": self.current_source,
                "proposed": list(self.proposed), "why": self.why, "evidence": self.evidence,
                "together": dict(self.together), "profiles": list(self.profiles), "profile_why": self.profile_why,
                "sweep_args": self.sweep_args}

    @classmethod
    def from_dict(cls, data: KnobStepRecord) -> KnobStep:
        """A step as verdict.json holds it (`sweep_args` is derived, not read)."""
        return cls(knob=str(data.get("knob", "")), current=data.get("current"),
                   current_source=str(data.get("current_source", "")), proposed=tuple(data.get("proposed") or ()),
                   why=str(data.get("why", "")), evidence=dict(data.get("evidence") or {}),
                   together=dict(data.get("together") or {}), profiles=tuple(data.get("profiles") or ()),
                   profile_why=data.get("profile_why"))


def _num(v: Scalar) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _pow2_up(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1.0, x))))


class _Knobs:
    def __init__(self, target: dict[str, Any], evidence: dict[str, Any]) -> None:
        # run.json targets written before `knobs` existed carry the parallel layout at the top level
        self.values: dict[str, Any] = {f"server.{k}": target[k] for k in ("tp_size", "pp_size", "ep_size", "dp_size")
                                       if target.get(k) is not None}
        self.values.update(target.get("knobs") or {})
        self.why: dict[str, str] = {k: str(v) for k, v in (target.get("why") or {}).items()}
        self.server = evidence.get("server") or {}

    def current(self, path: str, server_key: str | None = None) -> tuple[Scalar, str]:
        if path in self.values and self.values[path] is not None:
            return self.values[path], "profile"
        if server_key and self.server.get(server_key) is not None:
            v = self.server[server_key]
            return (int(v) if float(v).is_integer() else v), "server"
        if path in self.values:
            return None, "not set in the profile: SGLang picks it"
        return None, "unknown: the run has no profile target (probe run --profile or --target-json)"

    def step(self, path: str, proposed: list[Scalar], why: str, evidence: dict[str, Any], *,
             server_key: str | None = None, **kw: Any) -> KnobStep:
        cur, src = self.current(path, server_key)
        return KnobStep(path, cur, src, tuple(proposed), why, evidence, profile_why=self.why.get(path), **kw)


def lower_power_limits(current_w: float, mean_w: float | None, min_w: float | None) -> list[Scalar]:
    """Power limits below `current_w`, highest first, down to a floor: the board's lowest settable limit, half the
    current limit, and 1.2 x what the GPUs drew on average (below that even the waiting phases would be capped)."""
    floor = max(float(min_w or 0.0), 0.5 * current_w, 1.2 * float(mean_w or 0.0))
    floor = math.ceil(floor / POWER_LIMIT_QUANTUM_W) * POWER_LIMIT_QUANTUM_W
    if floor >= current_w - POWER_LIMIT_QUANTUM_W:
        return []
    span = current_w - floor
    out: list[Scalar] = []
    for i in range(1, POWER_LIMIT_STEPS + 1):
        v = float(round((current_w - span * i / POWER_LIMIT_STEPS) / POWER_LIMIT_QUANTUM_W) * POWER_LIMIT_QUANTUM_W)
        if v < current_w and v >= floor and v not in out:
            out.append(v)
    return out


def _power_step(k: _Knobs, power: dict[str, Any] | None, why: str, evidence: dict[str, Any]) -> KnobStep | None:
    """`gpu.power_limit_w` lower, when the GPUs wait (busy-but-waiting) or wait on memory (memory-bound): the cap
    slows only their compute phases, which are a small part of the time, and every compute phase draws less."""
    if not power:
        return None
    cur, src = k.current("gpu.power_limit_w")
    current = _num(cur) or _num(power.get("limit_w")) or _num(power.get("default_w"))
    if not current:
        return None
    values = lower_power_limits(current, _num(power.get("mean_w")), _num(power.get("min_w")))
    if not values:
        return None
    mean = _num(power.get("mean_w"))
    said = f"{mean:.0f} W of {current:.0f}" if mean is not None else f"the limit {current:.0f} W"
    return KnobStep("gpu.power_limit_w", float(current if cur is None else cur),
                    src if cur is not None else "the GPUs' limit during the run", tuple(values),
                    f"{why} at {said} per GPU: a lower power limit slows only the compute phases and cuts the power "
                    "each draws (energy per token)", {**evidence, "power": power},
                    profile_why=k.why.get("gpu.power_limit_w"))


def propose(cls: str, evidence: dict[str, Any], target: dict[str, Any], *, gpus: int, no_p2p: bool | None,
            variants: list[str], power_capped: bool | None, power: dict[str, Any] | None = None
            ) -> list[KnobStep]:
    """The knob steps for a verdict of class `cls` (evidence: the verdict's, with `server` and `held`). `power`:
    the run's mean draw and limit per GPU ({"mean_w", "limit_w", "default_w", "min_w"}), for the power-limit
    step."""
    k = _Knobs(target, evidence)
    srv = evidence.get("server") or {}
    held = evidence.get("held")
    steps: list[KnobStep] = []
    if cls == SCHEDULER_CAPPED:
        cap, _ = k.current("server.max_running_requests", "max_running_requests")
        cap_n = float(cap) if isinstance(cap, int | float) and not isinstance(cap, bool) else None
        demand = float(srv.get("demand_max") or 0.0)
        if cap_n:
            hi = min(16 * cap_n, max(2 * cap_n, float(_pow2_up(demand))))
            lo = min(4 * cap_n, hi)
            vals: list[Scalar] = []
            v = float(_pow2_up(lo))
            while v <= hi:
                vals.append(int(v))
                v *= 2
            vals = vals or [int(hi)]
            steps.append(k.step("server.max_running_requests", vals,
                                f"running reached the cap ({srv.get('running_max') or 0:.0f} of {cap}) with "
                                f"{srv.get('queue'):.0f} queued and KV usage {srv.get('token_usage')}: "
                                f"the request-slot cap binds, not memory (up to {demand:.0f} requests wanted a slot)",
                                {"server": srv, "held": held}, server_key="max_running_requests"))
            graph_bs = k.values.get("server.cuda_graph_max_bs")
            top = _num(vals[-1]) or 0.0
            if k.values.get("server.cuda_graph") is True and isinstance(graph_bs, int) and graph_bs < top:
                steps.append(k.step("server.cuda_graph_max_bs", [vals[-1]],
                                    "CUDA graphs cover batches up to this size only; a larger running cap "
                                    "runs its big batches without graphs",
                                    {"proposed_max_running_requests": vals[-1]}))
    elif cls == KV_BOUND:
        mfs, _ = k.current("server.mem_fraction_static")
        if isinstance(mfs, float | int) and not isinstance(mfs, bool) and mfs + 0.01 < MEM_FRACTION_MAX:
            new = round(min(MEM_FRACTION_MAX, float(mfs) + MEM_FRACTION_STEP), 2)
            mfs_vals: list[Scalar] = [new]
        else:
            mfs_vals = [] if isinstance(mfs, float | int) else [0.88]
        why = (f"KV usage {srv.get('token_usage')} with {srv.get('queue')} queued"
               + (f" and {srv.get('retracted')} retracted" if srv.get("retracted") else "")
               + ": the KV pool binds admission; a larger static fraction gives it more tokens")
        if mfs_vals:
            steps.append(k.step("server.mem_fraction_static", mfs_vals, why, {"server": srv, "held": held}))
        dtype, _ = k.current("server.kv_cache_dtype")
        if dtype in (None, "auto"):
            steps.append(k.step("server.kv_cache_dtype", [FP8_KV],
                                "an fp8 KV cache holds twice the tokens in the same memory (check accuracy)",
                                {"server": srv}))
    elif cls in (CLIENT, INTERMITTENT, OVERLOADED):
        conc, _ = k.current("bench.max_concurrency")
        rate, _ = k.current("bench.request_rate")
        rate_n = _num(rate)
        if cls == OVERLOADED:
            if rate_n is not None:
                steps.append(k.step("bench.request_rate", [round(rate_n * 0.5, 3), round(rate_n * 0.75, 3)],
                                    "the queue grew the whole run: offer less than the server's capacity to "
                                    "measure a steady state", {"queue": evidence.get("queue")}))
            elif isinstance(conc, int):
                steps.append(k.step("bench.max_concurrency", [max(1, conc // 2)],
                                    "the queue grew the whole run: fewer requests in flight", {}))
        else:
            why = ("the server had no queue and ran well below its cap" if cls == CLIENT else
                   "the GPU alternated between busy and idle phases of a second or more")
            if isinstance(conc, int):
                steps.append(k.step("bench.max_concurrency", [conc * 2, conc * 4],
                                    f"{why}: more requests in flight keep it fed", {"server": srv, "held": held}))
            elif rate_n is not None:
                steps.append(k.step("bench.request_rate", [rate_n * 2, rate_n * 4],
                                    f"{why}: a higher request rate keeps it fed", {"server": srv, "held": held}))
    elif cls in (HOST, LAUNCH):
        thread = evidence.get("busiest_thread") or {}
        on_server = thread.get("role") == "server" or (cls == LAUNCH and not thread)
        if on_server:
            if k.values.get("server.cuda_graph") is False:
                steps.append(k.step("server.cuda_graph", [True],
                                    "each decode step's kernels are launched one by one from the host; a CUDA graph "
                                    "replays them in one launch", {"held": held, "busiest_thread": thread}))
            nds, _ = k.current("server.num_continuous_decode_steps")
            steps.append(k.step("server.num_continuous_decode_steps",
                                [2, 4] if not isinstance(nds, int) or nds < 2 else [nds * 2],
                                "several decode steps per scheduler pass spend less host time per token",
                                {"held": held, "busiest_thread": thread}))
    elif cls == WAITING and gpus > 1:
        tp, _ = k.current("server.tp_size")
        tp_n = tp if isinstance(tp, int) and not isinstance(tp, bool) else gpus
        if tp_n >= 2:
            why = ("the GPUs are busy but not working (waiting on collectives)"
                   + (" over PCIe without P2P" if no_p2p else "") + ": halve the tensor-parallel group")
            pp, _ = k.current("server.pp_size")
            steps.append(k.step("server.tp_size", [tp_n // 2], why, {"held": held},
                                together={"server.pp_size": (pp if isinstance(pp, int) and pp > 1 else 1) * 2},
                                profiles=tuple(v for v in variants if "pp" in v)))
            ep_profiles = tuple(v for v in variants if "ep" in v)
            if ep_profiles or "server.ep_size" in k.values:
                steps.append(k.step("server.ep_size", [tp_n],
                                    "expert parallelism trades the MoE layers' allreduce for all-to-all",
                                    {"held": held}, profiles=ep_profiles))
        step = _power_step(k, power, "busy but waiting on collectives", {"held": held})
        if step is not None:
            steps.append(step)
    elif cls == WAITING:
        step = _power_step(k, power, "busy but waiting", {"held": held})
        if step is not None:
            steps.append(step)
    elif cls == COMPUTE and power_capped:
        # Held at its power limit: a lower limit would slow every step. Only a limit below the board's own is
        # worth raising back.
        cur, _src = k.current("gpu.power_limit_w")
        board = _num((power or {}).get("default_w"))
        if board is not None and (_num(cur) or board) < board:
            steps.append(k.step("gpu.power_limit_w", [float(board)], f"compute-bound at the power limit ({cur} W of "
                                f"the board's {board:.0f} W): the cap slows the compute",
                                {"held": held, "power": power}))
    elif cls == COMPUTE and not power_capped:
        cap, _ = k.current("server.max_running_requests", "max_running_requests")
        if isinstance(cap, int) and not isinstance(cap, bool):
            steps.append(k.step("server.max_running_requests", [cap * 2, cap * 4],
                                "compute-bound below the power limit: larger batches use the GPU better",
                                {"held": held}, server_key="max_running_requests"))
    elif cls == MEMORY:
        dtype, _ = k.current("server.kv_cache_dtype")
        if dtype in (None, "auto"):
            steps.append(k.step("server.kv_cache_dtype", [FP8_KV],
                                "memory-bandwidth-bound: an fp8 KV cache halves the bytes attention reads",
                                {"held": held}))
        step = _power_step(k, power, "memory-bandwidth-bound (the SMs wait on memory)", {"held": held})
        if step is not None:
            steps.append(step)
    return steps


def target_knobs(resolved: dict[str, Any]) -> dict[str, Any]:
    """`knobs` and `why` for a run's target, from a resolved profile (a plain mapping): every scalar under
    server and bench as a dotted path (what a step's `current` is read from), and the profile's reasons for them."""
    knobs: dict[str, Any] = {}
    for section in ("server", "bench", "gpu"):
        for key, value in sorted((resolved.get(section) or {}).items()):
            if value is None or isinstance(value, bool | int | float | str):
                knobs[f"{section}.{key}"] = value
    why = {path: str((w or {}).get("reason", "")).strip() for path, w in (resolved.get("why") or {}).items()
           if path in knobs}
    return {"knobs": knobs, "why": why}


def fewer_tp_variants(target: dict[str, Any]) -> list[str]:
    if target.get("variants"):
        return [str(v) for v in target["variants"]]
    name = str(target.get("profile", ""))
    m = re.search(r"tp(\d+)", name)
    if not m or int(m.group(1)) < 2:
        return []
    n = int(m.group(1))
    return [name.replace(m.group(0), f"tp{n // 2}-pp2"), name.replace(m.group(0), f"ep{n}")]


def run_target(name: str, resolved: dict[str, Any], known_profiles: set[str]) -> dict[str, Any]:
    """run.json's `target` for a resolved profile (a plain mapping): the hardware target, the parallel layout,
    the existing variant profiles a verdict may name (glm5-tp8 -> glm5-tp4-pp2, glm5-ep8), and the knobs."""
    target: dict[str, Any] = {"profile": name, **(resolved.get("target") or {})}
    server = resolved.get("server") or {}
    for attr in ("tp_size", "pp_size", "ep_size", "dp_size"):
        if server.get(attr) is not None:
            target[attr] = server[attr]
    named = fewer_tp_variants({"profile": name})
    tp = server.get("tp_size")
    if not named and isinstance(tp, int) and tp >= 2:
        # A name without its layout (glm5-baseline, a tune's variant glm5-baseline-...-v03): the family's own
        # layout profiles (glm5-tp4-pp2, glm5-ep8), kept below only where they exist.
        family = name.split("-", 1)[0]
        named = [f"{family}-tp{tp // 2}-pp2", f"{family}-ep{tp}"]
    target["variants"] = [v for v in named if v in known_profiles]
    target.update(target_knobs(resolved))
    return target
