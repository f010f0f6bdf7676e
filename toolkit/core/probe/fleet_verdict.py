"""The fleet's verdict: where a run over several hosts loses its time, from every GPU's figures on one clock.

The classes, each from what the physics leaves in the counters:

- **slow node / slow rank**: ranks of one model step together, so the slowest sets the pace and the others wait
  for it inside their collectives (busy at low power: a spinning NCCL kernel reads 100 % utilization). The slow
  one runs at a lower SM clock than the fleet's (thermal or power slowdown, a lower power limit, an older card):
  the clock, not the power, tells it from the waiters (a waiter's power is low at a full clock). A whole host
  slow is a slow node; one GPU is a slow rank. Both named by host and GPU.
- **inter-node communication-bound**: every GPU busy at low power with full clocks (nobody is slow, everybody
  waits) and the network between the hosts moving close to what it was measured to carry (the NCCL preflight's
  bus bandwidth): the link is the limit. The same GPU picture with the network far below its bandwidth is waiting
  on something else, and is said so.
- **replicas out of balance**: independent copies behind the router; the router's per-backend load (requests, or
  tokens, per backend) spread wider than a quarter around the mean: one replica queues while another idles.
- otherwise the fleet's GPUs' own class (the single-host rules, gpu_rules.py), most common first.

Pure: figures in (fleet.py), a dict out (fleet_verdict.json).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from toolkit.core.probe.clock import NS_PER_S, HostClock
from toolkit.core.probe.gpu_rules import (
    BUSY_UTIL_PCT,
    FAILED,
    THROTTLE_REASONS,
    THROTTLE_SHARE,
    WAITING,
    WAITING_POWER_OF_LIMIT,
    judge_gpu,
)
from toolkit.core.probe.numbers import percentile
from toolkit.core.probe.numbers import rounded as _r

FLEET_VERDICT_SCHEMA_VERSION = 1
SLOW_NODE = "slow-node"
SLOW_RANK = "slow-rank"
COMM_BOUND = "inter-node-communication-bound"
REPLICAS_IMBALANCED = "replicas-imbalanced"

SLOW_CLOCK_GAP = 0.10  # a GPU 10 % below the fleet's median SM clock sets the pace of a synchronized step
WAITERS_SHARE = 0.5  # at least half the other GPUs busy at low power: they wait for it
NET_NEAR_BANDWIDTH = 0.7  # of the measured bus bandwidth: the link is (close to) full
NET_FAR_BELOW = 0.3  # under this, the link is not what the GPUs wait on
REPLICA_SPREAD = 0.25  # the busiest backend this much above the mean load


def _waiting(g: dict[str, Any]) -> bool:
    util, pol = g.get("util_gpu_pct"), g.get("power_of_limit")
    return util is not None and util >= BUSY_UTIL_PCT and pol is not None and pol < WAITING_POWER_OF_LIMIT


def _throttled(g: dict[str, Any]) -> dict[str, float]:
    reasons = g.get("clock_reasons_seen") or {}
    return {r: reasons[r] for r in THROTTLE_REASONS if reasons.get(r, 0.0) >= THROTTLE_SHARE}


def slow_gpus(per_host: dict[str, dict[str, Any]]) -> tuple[list[tuple[str, int]], float | None]:
    """(host, GPU) pairs whose SM clock is SLOW_CLOCK_GAP below the fleet's median (or that carry thermal /
    slowdown reasons), and that median."""
    clocks = sorted(float(g["sm_clock_mhz"]) for h in per_host.values() for g in h["gpus"].values()
                    if g.get("sm_clock_mhz") is not None)
    if len(clocks) < 2:
        return [], None
    median = percentile(clocks, 50)
    slow = []
    for host, h in sorted(per_host.items()):
        for gpu, g in sorted(h["gpus"].items()):
            clock = g.get("sm_clock_mhz")
            if (clock is not None and clock <= (1 - SLOW_CLOCK_GAP) * median) or _throttled(g):
                slow.append((host, gpu))
    return slow, median


def clock_problems(clocks: Sequence[HostClock], sample_interval_s: float) -> list[str]:
    """Sentences for each host whose merged times are not good to a sampling interval: a drift over the run
    beyond it, or an offset known only to worse than it."""
    out = []
    for c in clocks:
        drift = c.drift_problem(sample_interval_s)
        if drift:
            out.append(drift)
        bound_s = c.bound_ns / NS_PER_S
        if bound_s > sample_interval_s:
            out.append(f"{c.host}'s offset is known only to +/-{bound_s * 1000:.1f} ms, more than the "
                       f"{sample_interval_s * 1000:.0f} ms sampling interval: its samples may sit a tick off the "
                       "others' (a shorter network path to it, or a less loaded controller, narrows the bound)")
    return out


def clocks_evidence(clocks: Sequence[HostClock]) -> dict[str, dict[str, float]]:
    """Per host: its offset at the start (ms), the bound of a merged time (ms) and the drift over the run (ms)."""
    return {c.host: {"offset_ms": round(c.start.offset_ns / 1e6, 3), "bound_ms": round(c.bound_ns / 1e6, 3),
                     "drift_ms": round(c.drift_ns / 1e6, 3)} for c in clocks}


def _gpu_label(host: str, gpu: int) -> str:
    return f"{host} GPU {gpu}"


def judge_fleet(per_host: dict[str, dict[str, Any]], fleet: dict[str, Any], *, clocks: Sequence[HostClock] = (),
                sample_interval_s: float = 0.1, network_gb_s: float | None = None,
                backend_load: dict[str, float] | None = None, backend_load_is: str = "",
                bench_failed: str | None = None, notes: Sequence[str] = (),
                judged: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fleet's verdict. per_host: fleet.host_figures of each host over the benchmark's window; fleet:
    fleet.fleet_figures; network_gb_s: the measured bus bandwidth between the hosts (the NCCL preflight's), None
    when not measured; backend_load: the load per backend (the router's, else each server's own count), None without
    one; backend_load_is: what that load is, in words; notes: what the run could not do (a host left out), said in the
    evidence and the headline; judged: the hosts' figures over the window the classes are judged on (the nodes'
    common steady window: a benchmark's start-up or drain would dilute every GPU alike), else per_host's."""
    basis = ({h: {**fig, "verdict": per_host[h].get("verdict")} for h, fig in judged.items()} if judged
             else per_host)
    gpu_classes = {(h, g): judge_gpu(stats) for h, fig in basis.items() for g, stats in fig["gpus"].items()}
    problems = clock_problems(clocks, sample_interval_s)
    evidence: dict[str, Any] = {"clocks": clocks_evidence(clocks), "clock_problems": problems,
                                "network_measured_gb_s": network_gb_s}
    evidence["backend_load_is"] = backend_load_is or None
    evidence["notes"] = list(notes)
    cls, conf, headline, steps = _decide(basis, gpu_classes, evidence, network_gb_s, backend_load, bench_failed)
    if clocks:
        worst = max(clocks, key=lambda c: c.bound_ns)
        headline += f" (merged on the controller's clock within +/-{worst.bound_ns / 1e6:.2f} ms, {worst.host})"
    if problems:
        headline += "; " + problems[0]
        conf *= 0.8
    if notes:
        headline += f" (not seen: {'; '.join(notes)})"
        conf *= 0.8
    return {
        "schema_version": FLEET_VERDICT_SCHEMA_VERSION,
        "class": cls,
        "confidence": round(conf, 2),
        "headline": headline,
        "evidence": evidence,
        "next_steps": steps,
        "fleet": fleet,
        "per_host": {h: {k: v for k, v in fig.items() if k != "gpus"}
                     | {"gpus": {str(g): {"class": gpu_classes[(h, g)].cls, "util_gpu_pct": s["util_gpu_pct"],
                                          "power_of_limit": s["power_of_limit"], "sm_clock_mhz": s["sm_clock_mhz"],
                                          "energy_j": s["energy_j"]}
                                 for g, s in sorted(fig["gpus"].items())}}
                     for h, fig in sorted(per_host.items())},
    }


def _decide(per_host: dict[str, dict[str, Any]], gpu_classes: dict[tuple[str, int], Any], evidence: dict[str, Any],
            network_gb_s: float | None, backend_load: dict[str, float] | None, bench_failed: str | None
            ) -> tuple[str, float, str, list[str]]:
    if bench_failed:
        return FAILED, 0.95, f"benchmark-failed: {bench_failed}", [
            "Fix the benchmark first; no verdict on the fleet's GPUs is possible from a failed run."]
    all_gpus = [(h, g, s) for h, fig in sorted(per_host.items()) for g, s in sorted(fig["gpus"].items())]
    slow, median = slow_gpus(per_host)
    if slow and len(slow) < len(all_gpus):
        others = [(h, g, s) for h, g, s in all_gpus if (h, g) not in slow]
        waiters = sum(1 for h, g, s in others if _waiting(s) or gpu_classes[(h, g)].cls == WAITING)
        slow_hosts = sorted({h for h, _ in slow})
        whole = [h for h in slow_hosts if all((h, g) in slow for g in per_host[h]["gpus"])]
        cls = SLOW_NODE if whole and len(whole) == len(slow_hosts) else SLOW_RANK
        stats = {_gpu_label(h, g): {"sm_clock_mhz": per_host[h]["gpus"][g]["sm_clock_mhz"],
                                    "power_of_limit": per_host[h]["gpus"][g]["power_of_limit"],
                                    "throttle_reasons": _throttled(per_host[h]["gpus"][g])} for h, g in slow}
        evidence.update({"slow": stats, "fleet_median_sm_clock_mhz": _r(median, 0),
                         "others_waiting": f"{waiters} of {len(others)}"})
        waited = waiters >= WAITERS_SHARE * len(others)
        who = (f"node {', '.join(whole)}" if cls == SLOW_NODE
               else ", ".join(_gpu_label(h, g) for h, g in slow))
        clocks_txt = ", ".join(f"{k} at {v['sm_clock_mhz']:.0f} MHz" for k, v in stats.items()
                               if v["sm_clock_mhz"] is not None)
        headline = (f"{cls}: {who} runs slower ({clocks_txt or 'slowdown reasons'} against the fleet's "
                    f"{median or 0:.0f} MHz)")
        headline += f"; {waiters} of {len(others)} other GPUs wait on it" if waited else (
            "; the other GPUs do not wait on it (independent replicas?)")
        steps = [f"Look at {who}: its temperature, clock-event reasons and power limit against the other hosts' "
                 "(`toolkit host doctor`), its cooling and PCIe link; a synchronized run goes at its pace."]
        return cls, 0.85 if waited else 0.6, headline, steps
    loads = {b: v for b, v in (backend_load or {}).items() if v is not None}
    # Copies behind a router exchange nothing with each other: with two or more backends the inter-node rule is not
    # theirs, their balance is.
    replicas = len(loads) >= 2
    if replicas and sum(loads.values()) > 0:
        mean = sum(loads.values()) / len(loads)
        busiest = max(loads, key=lambda b: loads[b])
        idlest = min(loads, key=lambda b: loads[b])
        spread = loads[busiest] / mean - 1
        evidence["backend_load"] = {b: _r(v, 2) for b, v in sorted(loads.items())}
        evidence["backend_spread"] = _r(spread, 3)
        if spread >= REPLICA_SPREAD:
            return REPLICAS_IMBALANCED, 0.8, (
                f"{REPLICAS_IMBALANCED}: {busiest} carried {loads[busiest]:.1f} against {idlest}'s "
                f"{loads[idlest]:.1f} ({spread:.0%} above the mean; {evidence['backend_load_is'] or 'load'})"), [
                "Check the router's policy (cache-aware routing keeps a prefix on one replica; round-robin or "
                "power-of-two spreads) and that every replica is healthy and has the same max_running_requests."]
    busy_low = [s for _, _, s in all_gpus if _waiting(s)]
    if not replicas and len(per_host) > 1 and all_gpus and len(busy_low) == len(all_gpus):
        # While the ranks exchange: the 95th percentile of 1 s intervals where the host's sampler recorded its
        # counters over time, else the window's mean (which reads a bursty exchange lower).
        net = [(fig["net_gb_s_p95"], "p95 of 1 s intervals") if fig.get("net_gb_s_p95") is not None
               else (fig["net_gb_s"], "mean over the window") for fig in per_host.values()
               if fig.get("net_gb_s_p95") is not None or fig.get("net_gb_s") is not None]
        peak, how = max(net) if net else (None, None)
        evidence["network_used_gb_s"] = _r(peak, 4)
        evidence["network_used_is"] = how
        if peak is not None and network_gb_s:
            share = peak / network_gb_s
            evidence["network_used_of_measured"] = _r(share, 3)
            if share >= NET_NEAR_BANDWIDTH:
                return COMM_BOUND, 0.8, (
                    f"{COMM_BOUND}: every GPU busy at low power with full clocks while the network between the "
                    f"hosts moved {peak:.2f} GB/s of the {network_gb_s:.2f} GB/s it was measured to carry "
                    f"({share:.0%})"), [
                    "Move less across the hosts: tensor parallel inside a host and pipeline parallel across "
                    "(target.nodes with pp_size = nodes), or a faster interconnect (RDMA: check NCCL_IB_HCA and "
                    "that NCCL does not fall back to TCP sockets)."]
            if share < NET_FAR_BELOW:
                return WAITING, 0.6, (
                    f"{WAITING}: every GPU busy at low power, but the network moved only {peak:.2f} of "
                    f"{network_gb_s:.2f} GB/s ({share:.0%}): they wait on something other than the link"), [
                    "Look inside each host: P2P between its GPUs (topology.json), the scheduler, launch gaps."]
            return WAITING, 0.55, (
                f"{WAITING}: every GPU busy at low power; the network moved {peak:.2f} of {network_gb_s:.2f} GB/s "
                f"({share:.0%}, {how}): part of the wait may be the link, not all of it"), [
                "Probe at a higher sampling rate of the host timeline (--host-hz) to see the exchanges' peaks, and "
                "look inside each host (P2P, scheduler) for the rest."]
        why = ("the network's bandwidth was not measured (the NCCL preflight gives it)" if not network_gb_s
               else "the network's traffic was not read")
        return WAITING, 0.5, (f"{WAITING}: every GPU of every host busy at low power; inter-node communication "
                              f"is likely, but {why}"), [
            "Run the NCCL preflight between the hosts and probe again: a measured bandwidth decides it."]
    nodes = {h: fig["verdict"] for h, fig in sorted(per_host.items()) if fig.get("verdict")}
    if nodes:
        # Nothing across the hosts stands out: the fleet is what its nodes are, each judged over time alone.
        cls, n = Counter(v["class"] for v in nodes.values()).most_common(1)[0]
        first = next(h for h, v in nodes.items() if v["class"] == cls)
        return cls, min(0.6, nodes[first]["confidence"]), (
            f"{cls}: {n} of {len(nodes)} hosts judged alone, no host apart ({first}: {nodes[first]['headline']})"), []
    counts = Counter(j.cls for j in gpu_classes.values())
    if not counts:
        return "no-data", 0.1, "no GPU was sampled on any host", ["Check each host's sampler (run.json per host)."]
    cls, n = counts.most_common(1)[0]
    return cls, 0.6, f"{cls}: {n} of {len(gpu_classes)} GPUs across {len(per_host)} hosts, no host apart", []

