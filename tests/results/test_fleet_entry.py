"""A fleet run's results entry (pure): the fleet's figures beside each node's, each host's clock with its bound,
the provenance of its least real host, written into a profile's block and read back typed; recording it again
changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.probe.test_fleet import FULL, _burst, _figures
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.clock import NS_PER_S, HostClock, estimate_offset
from toolkit.core.probe.fleet import fleet_figures
from toolkit.core.probe.fleet_verdict import judge_fleet
from toolkit.core.probe.gpu_rules import WAITING
from toolkit.core.probe.records import Summary
from toolkit.core.provenance import Provenance
from toolkit.core.results.build import build_fleet_entry
from toolkit.core.results.record import read_block, with_entry

MS = 1_000_000
AUTHOR = "name: glm5-2node\nextends: glm5-tp8\n# the author's comment stays\n"


def _clock(host: str, offset_ms: int) -> HostClock:
    at = 1_700_000_000 * NS_PER_S
    return HostClock(estimate_offset(host, _burst(offset_ms * MS, at, 2 * MS, 1 * MS)),
                     estimate_offset(host, _burst(offset_ms * MS, at + 30 * NS_PER_S, 1 * MS, 1 * MS)))


def _fleet(stand_in: str | None = "pve2") -> tuple[dict[str, Any], dict[str, Any], dict[str, Summary], list[HostClock]]:
    per_host = _figures({"ct": {g: FULL for g in range(8)}, "ct2": {g: FULL for g in range(8)}},
                        net_gb={"ct": 1.0, "ct2": 1.0})
    for fig in per_host.values():
        fig["verdict"] = {"class": WAITING}  # each node judged alone (node_verdict, tested in test_fleet.py)
    clocks = [_clock("ct", 0), _clock("ct2", 250)]
    verdict = judge_fleet(per_host, fleet_figures(per_host, 10_000.0), clocks=clocks, sample_interval_s=0.1,
                          network_gb_s=3.87)
    run = {"kind": "fleet", "started_at_utc": "2026-12-06T11:20:00Z", "network_gb_s": 3.87,
           "command": ["ssh", "ct", "python", "-m", "sglang.bench_serving", "--num-prompts", "80",
                       "--api-key", "secret-key"]}
    summaries = {h: Summary(provenance=Provenance("stand-in", "simulated GPUs: the lab's engine model")
                            if h == stand_in else Provenance("measured", None)) for h in ("ct", "ct2")}
    return run, verdict, summaries, clocks


def _entry(stand_in: str | None = "ct2") -> Any:
    run, verdict, summaries, clocks = _fleet(stand_in)
    bench = {"output_tok_per_s": 812.345, "total_tok_per_s": 1600.0, "request_per_s": 2.5, "duration_s": 12.3,
             "latency_ms": {"ttft_ms": {"mean": 120.0, "p99": 300.0}}}
    return build_fleet_entry(run, verdict, summaries, layout="nodes", run_id="20261206T112000Z-glm5-2node",
                             spec_hash="abc123", artifacts="runs/20261206T112000Z-glm5-2node", clocks=clocks,
                             bench=bench, bench_raw={"completed": 80, "backend": "sglang"})


def test_the_entry_holds_the_fleets_figures_beside_each_nodes_with_its_clock_and_bound() -> None:
    e = _entry()
    assert e.fleet is not None and e.fleet.layout == "nodes" and e.fleet.hosts == 2 and e.fleet.gpu_count == 16
    nodes = {n.host: n for n in e.fleet.nodes}
    assert list(nodes) == ["ct", "ct2"]
    assert nodes["ct2"].clock_offset_ms == pytest.approx(250.0, abs=nodes["ct2"].clock_bound_ms or 0)
    assert 0 < (nodes["ct2"].clock_bound_ms or 0) <= 1.5  # the wider end's: half its 3 ms round trip
    assert e.fleet.clock_bound_ms == max(n.clock_bound_ms or 0 for n in nodes.values())
    # the fleet's energy is its nodes' summed, and its tokens per joule the benchmark's tokens over it
    assert e.fleet.energy_j == pytest.approx(sum(n.energy_j or 0 for n in nodes.values()), rel=1e-3)
    assert e.energy is not None and e.energy.output_tok_per_j == e.fleet.output_tok_per_j
    assert e.fleet.output_tok_per_j == pytest.approx(10_000.0 / (e.fleet.energy_j or 1), rel=1e-3)
    assert all(n.verdict == WAITING for n in nodes.values()) and e.fleet.network_gb_s == 3.87
    assert e.verdict is not None and e.verdict.basis == "fleet" and e.host == "ct+ct2"
    assert e.throughput.full_run.output_tok_per_s == 812.3 and e.bench.num_prompts == 80
    assert e.bench.command is not None and "secret-key" not in e.bench.command


def test_one_host_on_simulated_gpus_makes_the_entry_a_lab_stand_in_naming_it() -> None:
    e = _entry("ct2")
    assert e.provenance().kind == "stand-in" and e.lab is not None and e.lab.note.startswith("ct2:")
    assert _entry(None).provenance().kind == "measured"


def test_written_into_the_block_it_reads_back_typed_and_again_changes_nothing() -> None:
    e = _entry()
    first = with_entry(AUTHOR, e, file="glm5-2node.yaml")
    assert first.action == "added" and first.text.startswith(AUTHOR)
    back = read_block(first.text, file="glm5-2node.yaml").entries[-1]
    assert back == e and back.fleet is not None and back.fleet.nodes[1].host == "ct2"
    again = with_entry(first.text, _entry(), file="glm5-2node.yaml")
    assert again.action == "unchanged" and again.text == first.text


def test_a_failed_fleet_benchmark_is_not_recorded() -> None:
    run, verdict, summaries, clocks = _fleet()
    verdict["class"] = "benchmark-failed"
    with pytest.raises(ToolkitError, match="a failure is not a result"):
        build_fleet_entry(run, verdict, summaries, layout="nodes", run_id="r", spec_hash=None, artifacts=None,
                          clocks=clocks)
