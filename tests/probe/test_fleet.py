"""The fleet probe's pure core: several hosts' traces merged on the controller's clock, and the verdicts across
nodes, from synthetic multi-host traces (each says so in its header)."""

from __future__ import annotations

import pytest

from toolkit.core.probe.clock import NS_PER_S, ClockExchange, HostClock, estimate_offset
from toolkit.core.probe.fleet import (
    HostRun,
    NetCounters,
    aligned,
    fleet_figures,
    host_figures,
    node_verdict,
)
from toolkit.core.probe.fleet_verdict import (
    COMM_BOUND,
    REPLICAS_IMBALANCED,
    SLOW_NODE,
    SLOW_RANK,
    judge_fleet,
)
from toolkit.core.probe.gpu_rules import FAILED, WAITING
from toolkit.core.probe.net_trace import net_header, net_rows, parse_proc_net_dev, read_net_trace
from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.series import Trace
from toolkit.core.probe.trace import trace_from_rows

MS = 1_000_000
LIMIT_W, IDLE_W = 700.0, 90.0
IDLE_S, BENCH_S, HZ = 3.0, 20.0, 10.0


def _gpu_trace(host: str, shape: dict[int, tuple[float, float, float]], *, step_at_s: float | None = None) -> Trace:
    """One host's GPUs: idle for IDLE_S, then each GPU at (util %, power W, SM MHz) for BENCH_S. With step_at_s,
    power jumps to the limit at that time of the host's own clock (an event to line up)."""
    rows = []
    for i in range(int((IDLE_S + BENCH_S + 1) * HZ)):
        t = i / HZ
        busy = IDLE_S <= t < IDLE_S + BENCH_S
        for g, (util, power, clock) in shape.items():
            p = power if busy else IDLE_W
            if step_at_s is not None and t >= step_at_s:
                p = LIMIT_W
            rows.append({"t_s": round(t, 3), "gpu": g, "power_w": p, "power_limit_w": LIMIT_W,
                         "util_gpu_pct": util if busy else 0.0, "sm_clock_mhz": clock if busy else 345.0,
                         "sm_clock_max_mhz": 1980.0, "energy_j": None})
    return trace_from_rows(rows, {"sample_hz": str(HZ), "source": f"synthetic:fleet-{host}",
                                  "gpus": ";".join(map(str, shape))})


def _figures(shapes: dict[str, dict[int, tuple[float, float, float]]],
             net_gb: dict[str, float] | None = None) -> dict[str, dict]:
    out = {}
    for host, shape in shapes.items():
        net = None
        if net_gb and host in net_gb:
            moved = round(net_gb[host] * 1e9 * BENCH_S)
            net = (NetCounters(IDLE_S, {"eth0": (0, 0), "vmbr0": (0, 0)}),
                   NetCounters(IDLE_S + BENCH_S, {"eth0": (moved // 3, moved), "vmbr0": (moved // 3, moved)}))
        run = HostRun(host, _gpu_trace(host, shape), idle_start_s=0.0, idle_end_s=IDLE_S, net=net)
        out[host] = host_figures(run, IDLE_S + 2.0, IDLE_S + BENCH_S - 1.0)
    return out


FULL = (100.0, 260.0, 1980.0)  # busy, low power, full clock: waiting in a collective
SLOW = (100.0, 520.0, 1400.0)  # busy, working, clock cut


def test_a_slow_host_is_named_with_its_gpus_while_the_others_wait() -> None:
    per_host = _figures({"pve1": {g: FULL for g in range(4)}, "pve2": {g: SLOW for g in range(4)}})
    v = judge_fleet(per_host, fleet_figures(per_host, 1000.0))
    assert v["class"] == SLOW_NODE
    assert "node pve2" in v["headline"] and "4 of 4 other GPUs wait" in v["headline"]
    assert set(v["evidence"]["slow"]) == {f"pve2 GPU {g}" for g in range(4)}
    assert v["confidence"] >= 0.8


def test_one_slow_gpu_is_a_slow_rank_named_by_host_and_gpu() -> None:
    per_host = _figures({"pve1": {g: FULL for g in range(4)},
                         "pve2": {0: FULL, 1: FULL, 2: SLOW, 3: FULL}})
    v = judge_fleet(per_host, fleet_figures(per_host, None))
    assert v["class"] == SLOW_RANK
    assert list(v["evidence"]["slow"]) == ["pve2 GPU 2"] and "pve2 GPU 2" in v["headline"]


def test_a_slower_gpu_nobody_waits_on_is_said_with_less_confidence() -> None:
    working = (95.0, 600.0, 1980.0)
    per_host = _figures({"pve1": {0: working, 1: working}, "pve2": {0: working, 1: (95.0, 600.0, 1500.0)}})
    v = judge_fleet(per_host, fleet_figures(per_host, None))
    assert v["class"] == SLOW_RANK and v["confidence"] < 0.7
    assert "do not wait" in v["headline"]


def test_every_gpu_waiting_with_the_network_near_its_bandwidth_is_comm_bound() -> None:
    per_host = _figures({"pve1": {g: FULL for g in range(4)}, "pve2": {g: FULL for g in range(4)}},
                        net_gb={"pve1": 11.0, "pve2": 10.5})
    v = judge_fleet(per_host, fleet_figures(per_host, None), network_gb_s=12.0)
    assert v["class"] == COMM_BOUND
    assert v["evidence"]["network_used_gb_s"] == pytest.approx(11.0, rel=0.01)
    assert "11.00 GB/s of the 12.00 GB/s" in v["headline"]


def test_the_classes_are_judged_on_the_common_steady_window_not_diluted_by_the_start() -> None:
    """A benchmark that takes seconds to start dilutes every GPU's mean over its whole window (util 73 %); over the
    nodes' common steady window they are busy at low power, and the link is near full."""
    def figures(start_s: float, end_s: float) -> dict[str, dict]:
        out = {}
        for host in ("pve1", "pve2"):
            moved = round(11.0e9 * BENCH_S)
            net = (NetCounters(IDLE_S, {"eth0": (0, 0)}), NetCounters(IDLE_S + BENCH_S, {"eth0": (moved, moved)}))
            run = HostRun(host, _gpu_trace(host, {g: FULL for g in range(2)}), idle_end_s=IDLE_S, net=net)
            out[host] = host_figures(run, start_s, end_s)
        return out

    whole = figures(0.0, IDLE_S + 8.0)
    assert whole["pve1"]["util_gpu_pct"] < 80
    diluted = judge_fleet(whole, fleet_figures(whole, None), network_gb_s=12.0)
    assert diluted["class"] != COMM_BOUND
    steady = judge_fleet(whole, fleet_figures(whole, None), network_gb_s=12.0, judged=figures(IDLE_S + 1, IDLE_S + 8))
    assert steady["class"] == COMM_BOUND
    assert steady["per_host"]["pve1"]["util_gpu_pct"] == whole["pve1"]["util_gpu_pct"]  # figures: the whole window


def test_the_same_gpus_with_the_network_far_below_its_bandwidth_are_not_comm_bound() -> None:
    per_host = _figures({"pve1": {g: FULL for g in range(4)}, "pve2": {g: FULL for g in range(4)}},
                        net_gb={"pve1": 0.5, "pve2": 0.4})
    v = judge_fleet(per_host, fleet_figures(per_host, None), network_gb_s=12.0)
    assert v["class"] == WAITING and "something other than the link" in v["headline"]
    unmeasured = judge_fleet(per_host, fleet_figures(per_host, None), network_gb_s=None)
    assert unmeasured["class"] == WAITING and "not measured" in unmeasured["headline"]
    assert unmeasured["confidence"] < v["confidence"]


def test_replicas_out_of_balance_behind_the_router_name_both_backends() -> None:
    working = (90.0, 550.0, 1980.0)
    per_host = _figures({"pve1": {0: working}, "pve2": {0: (40.0, 200.0, 1980.0)}})
    v = judge_fleet(per_host, fleet_figures(per_host, None), backend_load={"pve1:30000": 900, "pve2:30000": 300},
                    backend_load_is="requests")
    assert v["class"] == REPLICAS_IMBALANCED
    assert "pve1:30000 carried 900.0 against pve2:30000's 300.0 (50% above the mean; requests)" in v["headline"]
    even = judge_fleet(per_host, fleet_figures(per_host, None), backend_load={"a": 610, "b": 590})
    assert even["class"] != REPLICAS_IMBALANCED


def test_replicas_all_waiting_are_judged_on_their_balance_not_on_the_network() -> None:
    """Copies behind a router exchange nothing: busy-at-low-power GPUs there are not inter-node bound."""
    per_host = _figures({"pve1": {0: FULL}, "pve2": {0: FULL}}, net_gb={"pve1": 11.5, "pve2": 11.5})
    v = judge_fleet(per_host, fleet_figures(per_host, None), network_gb_s=12.0, backend_load={"a": 10, "b": 10.5})
    assert v["class"] == WAITING and "network_used_gb_s" not in v["evidence"]


def test_a_failed_benchmark_is_failed_whatever_the_gpus() -> None:
    per_host = _figures({"pve1": {0: FULL}, "pve2": {0: SLOW}})
    v = judge_fleet(per_host, fleet_figures(per_host, None), bench_failed="exit 1")
    assert v["class"] == FAILED


def test_energy_and_tokens_per_joule_add_up_per_host_and_for_the_fleet() -> None:
    per_host = _figures({"pve1": {0: (90.0, 500.0, 1980.0), 1: (90.0, 500.0, 1980.0)},
                         "pve2": {0: (90.0, 300.0, 1980.0)}})
    window_s = BENCH_S - 3.0
    assert per_host["pve1"]["energy_j"] == pytest.approx(2 * 500.0 * window_s, rel=0.01)
    assert per_host["pve2"]["energy_j"] == pytest.approx(300.0 * window_s, rel=0.01)
    fleet = fleet_figures(per_host, 26_000.0)
    assert fleet["energy_j"] == pytest.approx(per_host["pve1"]["energy_j"] + per_host["pve2"]["energy_j"])
    assert fleet["tokens_per_j"] == pytest.approx(26_000.0 / fleet["energy_j"], rel=1e-3)
    assert fleet["gpu_count"] == 3 and fleet["power_w"] == pytest.approx(1300.0)
    v = judge_fleet(per_host, fleet)
    assert v["per_host"]["pve1"]["energy_j"] == per_host["pve1"]["energy_j"]
    assert v["per_host"]["pve2"]["gpus"]["0"]["power_of_limit"] == pytest.approx(300 / 700, abs=1e-3)


def test_each_node_is_also_judged_alone_by_the_single_host_code() -> None:
    waiting = HostRun("pve1", _gpu_trace("pve1", {g: FULL for g in range(4)}), idle_end_s=IDLE_S)
    v = node_verdict(waiting, RunRecord(sample_hz=HZ), {}, IDLE_S, IDLE_S + BENCH_S)
    assert v["class"] == WAITING and "busy, not working" in v["headline"]
    idle = HostRun("pve2", _gpu_trace("pve2", {0: (0.0, IDLE_W, 345.0)}), idle_end_s=IDLE_S)
    assert node_verdict(idle, RunRecord(sample_hz=HZ), {}, IDLE_S, IDLE_S + BENCH_S)["class"] == "no-load"


def _bursty(on_gb_s: float, host: str) -> HostRun:
    """Exchanges at on_gb_s for 1 s, then 1 s of nothing (a pipeline's bubbles), counters every 0.25 s."""
    rows, moved, t = [], 0, 0.0
    while t <= IDLE_S + BENCH_S:
        rows.append((t, moved // 2, moved))
        if t >= IDLE_S and int(t) % 2 == 0:
            moved += round(on_gb_s * 1e9 * 0.25)
        t = round(t + 0.25, 2)
    text = net_header({"sample_hz": "4"}) + "".join(
        line for t, rx, tx in rows for line in net_rows(t, {"eth0": (rx, tx)}))
    series = read_net_trace(text)
    a, b = rows[int(IDLE_S * 4)], rows[int((IDLE_S + BENCH_S) * 4)]
    ends = (NetCounters(a[0], {"eth0": (a[1], a[2])}), NetCounters(b[0], {"eth0": (b[1], b[2])}))
    return HostRun(host, _gpu_trace(host, {g: FULL for g in range(4)}), idle_end_s=IDLE_S, net=ends,
                   net_series=series)


def test_a_bursty_exchange_near_the_links_limit_is_comm_bound_from_the_net_trace() -> None:
    """11 GB/s half the time on a 12 GB/s link: the window's mean (5.5) says neither; the 1 s intervals say full."""
    runs = [_bursty(11.0, "pve1"), _bursty(11.0, "pve2")]
    per_host = {r.host: host_figures(r, IDLE_S, IDLE_S + BENCH_S) for r in runs}
    assert per_host["pve1"]["net_gb_s"] == pytest.approx(5.5, rel=0.1)
    assert per_host["pve1"]["net_gb_s_p95"] == pytest.approx(11.0, rel=0.05)
    v = judge_fleet(per_host, fleet_figures(per_host, None), network_gb_s=12.0)
    assert v["class"] == COMM_BOUND and v["evidence"]["network_used_is"] == "p95 of 1 s intervals"
    for fig in per_host.values():  # the same run with only the window's two ends read
        fig["net_gb_s_p95"] = None
    mean_only = judge_fleet(per_host, fleet_figures(per_host, None), network_gb_s=12.0)
    assert mean_only["class"] == WAITING and "part of the wait may be the link" in mean_only["headline"]


def test_proc_net_dev_is_read_per_interface_without_loopback() -> None:
    text = ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
            "carrier compressed\n"
            "    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0 "
            "      0          0\n"
            "  eth0:   13554      85    0    0    0     0          0         0    12732      85    0    0    0     0 "
            "      0          0\n")
    assert parse_proc_net_dev(text) == {"eth0": (13554, 12732)}


def _burst(offset_ns: int, at_ns: int, there_ns: int, back_ns: int, n: int = 6) -> list[ClockExchange]:
    out, t = [], at_ns
    for _ in range(n):
        out.append(ClockExchange(sent_ns=t, host_ns=t + there_ns + offset_ns, received_ns=t + there_ns + back_ns))
        t += there_ns + back_ns + 2 * MS
    return out


def test_a_host_250_ms_ahead_comes_out_aligned_within_the_stated_bound() -> None:
    """pve2's clock is 250 ms ahead (and 40 ppm fast); the same power step at controller time 8.0 s is seen at
    8.0 s on pve1 (the controller's clock) and, once merged, within pve2's bound on pve2."""
    ctrl_origin_ns = 1_700_000_000 * NS_PER_S
    skew_ns, ppm = 250 * MS, 40.0
    run_s = IDLE_S + BENCH_S
    start = estimate_offset("pve2", _burst(skew_ns, ctrl_origin_ns - NS_PER_S, 3 * MS, 1 * MS))
    end_at = ctrl_origin_ns + round((run_s + 1) * NS_PER_S)
    end = estimate_offset("pve2", _burst(skew_ns + round((run_s + 2) * NS_PER_S * ppm / 1e6), end_at, 1 * MS, 2 * MS))
    clock = HostClock(start, end)
    # pve2's sampler started 0.3 s after the controller (controller time); its clock reads that moment 250 ms on.
    host_origin_ns = ctrl_origin_ns + 300 * MS + skew_ns
    event_ctrl_s = 8.0
    event_host_s = round(event_ctrl_s - 0.3 + (event_ctrl_s + 1) * ppm / 1e6, 1)  # its own tick nearest the step
    raw = HostRun("pve2", _gpu_trace("pve2", {0: FULL}, step_at_s=event_host_s), clock=clock,
                  idle_start_s=0.0, idle_end_s=IDLE_S)
    merged = aligned(raw, host_origin_ns, ctrl_origin_ns)
    s = merged.trace.gpus[0]
    seen = next(t for t, p in zip(s.t_s, s.values["power_w"], strict=True) if p == LIMIT_W)
    bound_s = clock.bound_ns / NS_PER_S
    tick_s = 1 / HZ
    assert abs(seen - event_ctrl_s) <= bound_s + tick_s / 2
    assert bound_s < 0.005  # the 250 ms raw skew is gone to within a few ms
    # Unmerged, the step sits 0.3 s early on pve2's own clock: the test would catch a merge that did nothing.
    assert abs(raw.trace.gpus[0].t_s[s.t_s.index(seen)] - event_ctrl_s) > 0.25
    v = judge_fleet({"pve2": host_figures(merged, IDLE_S + 1, run_s - 1)}, {}, clocks=[clock], sample_interval_s=0.1)
    assert v["evidence"]["clocks"]["pve2"]["offset_ms"] == pytest.approx(250.0, abs=bound_s * 1000)
    assert "within +/-" in v["headline"] and not v["evidence"]["clock_problems"]


def test_a_drift_beyond_the_sampling_interval_is_said_in_the_verdict() -> None:
    start = estimate_offset("pve2", _burst(0, 10 * NS_PER_S, 1 * MS, 1 * MS))
    end = estimate_offset("pve2", _burst(150 * MS, 600 * NS_PER_S, 1 * MS, 1 * MS))
    per_host = _figures({"pve1": {0: FULL}, "pve2": {0: FULL}})
    v = judge_fleet(per_host, fleet_figures(per_host, None), clocks=[HostClock(start, end)], sample_interval_s=0.1)
    assert any("drifted 150.0 ms" in p for p in v["evidence"]["clock_problems"])
    assert "drifted" in v["headline"]
