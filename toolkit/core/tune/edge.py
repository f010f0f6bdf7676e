"""The verdict at the SLO's edge: which latency binds the capacity, why, and the knob that moves it.

Read from the capacity search's first missed rate (the edge) against the last met one: the bound furthest past its
limit binds, and the server's state at the edge says why:
- TTFT from queueing at the running cap: the running batch sat at max_running_requests with requests waiting, so
  a request's first token waited for a slot -> `server.max_running_requests` up;
- TTFT from long prefills: requests waited without the cap binding: for the prefill batches, whose new tokens are
  bounded by chunked_prefill_size -> `server.chunked_prefill_size` up (more prompts per prefill);
- ITL from prefills interrupting decode: the p99 gap is far above the median one (a decode step waits while a
  prefill batch runs, SGLang pausing decode for it) -> `server.chunked_prefill_size` down (shorter interruptions)
  and `server.max_running_requests` below what ran (fewer, larger prefills: requests wait and are admitted
  together);
- ITL from decode batches too large: even the median gap is near the bound: each decode step carries too many
  requests -> `server.max_running_requests` down;
- end-to-end: whichever of the first token and the decode makes up more of it, then as above.
Pure. The steps are `KnobStep` dicts, the shape the tune takes from a probe verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.probe.knobs import KnobStep
from toolkit.core.sweep.capacity import Capacity
from toolkit.core.sweep.slo import BOUNDS
from toolkit.core.sweep.state import KnobStepRecord, Measurement
from toolkit.core.tune.log import EdgeRecord

# The p99 inter-token gap at or above this multiple of the median one is interruptions, not the batch's own pace.
INTERRUPTION_RATIO = 2.0
QUEUE_AT_CAP_SHARE = 0.95  # running within 5 % of the cap counts as "at the cap"
SGLANG_CHUNKED_PREFILL_DEFAULT = 8192  # what SGLang 0.5.9 picks for large GPUs when the profile sets none


@dataclass(frozen=True)
class EdgeVerdict:
    binding: str | None  # ttft, itl, e2e; None when nothing could be read
    cause: str  # queueing-at-cap, long-prefills, prefill-interrupts-decode, decode-batch-too-large, ...
    text: str
    knob_steps: list[KnobStepRecord] = field(default_factory=list)

    def to_dict(self) -> EdgeRecord:
        return {"binding": self.binding, "cause": self.cause, "text": self.text, "knob_steps": self.knob_steps}


def _p(m: Measurement | None, name: str, q: str) -> float | None:
    v = ((m.latency_ms if m else {}) or {}).get(name, {}).get(q)
    return None if v is None else float(v)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def edge_verdict(cap: Capacity, knobs: Mapping[str, Any]) -> EdgeVerdict | None:
    """`knobs`: the variant's effective values by dotted path (server.max_running_requests, ...)."""
    edge, check = cap.edge, cap.check_edge
    if cap.hi is None:
        return None
    if edge is None or check is None:
        return EdgeVerdict(None, "benchmark-failed", f"at {cap.hi:g} req/s the benchmark failed (requests lost): "
                           "past what the server keeps up with; no latency to read")
    bound = check.binding
    if bound is None:
        return None
    # SGLang's per-request tpot is a decode pace like the ITL: the same causes and knobs move it.
    name = {"tpot": "itl"}.get(BOUNDS[bound.key][0], BOUNDS[bound.key][0])
    srv = edge.server or {}
    cap_n = _int(knobs.get("server.max_running_requests")) or _int(srv.get("max_running_requests"))
    running = _int(srv.get("running_max")) or 0
    queue = float(srv.get("queue") or 0.0)
    if name == "e2e":
        ttft, e2e = _p(edge, "ttft", "p99") or 0.0, _p(edge, "e2e", "p99") or 0.0
        name = "ttft" if ttft >= e2e - ttft else "itl"
        lead = f"end-to-end p99 {e2e:,.0f} ms misses {bound.limit_ms:,.0f}, most of it {name.upper()}; "
    else:
        lead = ""
    past = f"at {cap.hi:g} req/s {bound.key.replace('_ms', '')} {bound.value_ms:,.0f} ms > {bound.limit_ms:,.0f}"
    steps: list[KnobStep] = []
    evidence = {"edge_rate": cap.hi, "met_rate": cap.lo, "latency_ms": edge.latency_ms, "server": srv}
    chunk = _int(knobs.get("server.chunked_prefill_size"))
    chunk_now = chunk if chunk and chunk > 0 else SGLANG_CHUNKED_PREFILL_DEFAULT
    chunk_src = "profile" if chunk else "not set in the profile: SGLang picks it"
    if name == "ttft":
        at_cap = cap_n is not None and running >= QUEUE_AT_CAP_SHARE * cap_n and queue > 0
        if at_cap and cap_n:
            cause = "queueing-at-cap"
            why = (f"{lead}{past}: TTFT from queueing at the running cap (up to {running} of {cap_n} running, "
                   f"{queue:.0f} waiting): a request's first token waits for a slot")
            steps.append(KnobStep("server.max_running_requests", cap_n, "profile", (cap_n * 2, cap_n * 4), why,
                                  evidence))
        else:
            cause = "long-prefills"
            why = (f"{lead}{past}: TTFT from long prefills (up to {running} running"
                   + (f" of {cap_n}" if cap_n else "") + f", {queue:.0f} waiting: the cap does not bind): requests "
                   f"wait for prefill batches of at most {chunk_now} new tokens")
            steps.append(KnobStep("server.chunked_prefill_size", chunk, chunk_src, (chunk_now * 2, chunk_now * 4),
                                  why, evidence))
    else:
        p50, p99 = _p(edge, "itl", "p50"), _p(edge, "itl", "p99")
        top = min(running or cap_n or 0, cap_n or running)
        below = 1 << max(0, (max(top, 1) - 1).bit_length() - 1)  # the powers of two under what ran at the edge
        if p50 and p99 and p99 >= INTERRUPTION_RATIO * p50:
            cause = "prefill-interrupts-decode"
            why = (f"{lead}{past}: ITL from prefills interrupting decode (p99 {p99:,.0f} ms against a median of "
                   f"{p50:,.0f}: decode waits while a prefill batch runs)")
            steps.append(KnobStep("server.chunked_prefill_size", chunk, chunk_src,
                                  (max(chunk_now // 2, 512), max(chunk_now // 4, 256)),
                                  why + "; shorter prefill chunks interrupt for less", evidence))
            if top >= 4:
                # Each admission is a prefill between two decode steps; with the running cap below what ran, requests
                # wait (TTFT has room) and are admitted together, a few prefills instead of one per arrival.
                steps.append(KnobStep("server.max_running_requests", cap_n, "profile" if cap_n else "server",
                                      (below, max(below // 2, 1)),
                                      why + f"; a running cap below the {running} that ran admits requests in fewer, "
                                      "larger prefills", evidence))
        else:
            cause = "decode-batch-too-large"
            med = f"median {p50:,.0f} ms" if p50 else "the median"
            why = (f"{lead}{past}: ITL from decode batches too large ({med} with up to {running} running"
                   + (f" of {cap_n}" if cap_n else "") + "): fewer running requests make each decode step shorter")
            # Below what ran at the edge (a cap above it changes nothing).
            if top >= 4:
                steps.append(KnobStep("server.max_running_requests", cap_n, "profile" if cap_n else "server",
                                      (below, max(below // 2, 1)), why, evidence))
    text = steps[0].why if steps else f"{past} ({cause})"
    return EdgeVerdict(BOUNDS[bound.key][0], cause, text, [s.to_dict() for s in steps])
