"""`toolkit apply --probe --record` over several hosts, past the deploy: the fleet probe run in process over two
local hosts (the toolkit's own samplers, the GPUs a committed synthetic recording replayed), the benchmark run as
apply runs it on the probe host (its result brought back beside the fleet's run), into the directory a deploy
already fetched into, then recorded into a copy of the shipped glm5-2node: typed, per-node figures and clocks,
the replayed GPUs marked, and a second record changing nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.cli.test_json_contract import _run, _validated
from tests.probe.test_fleet_probe import REPO, _inventory, _local_vars
from toolkit.app import fleet_probe
from toolkit.app.apply import fleet_bench_command
from toolkit.app.record import load_results, record_fleet_run
from toolkit.core.errors import ToolkitError

BENCH_RESULT = {"backend": "sglang", "dataset_name": "random", "completed": 40, "duration": 1.2,
                "output_throughput": 3333.3, "total_output_tokens": 4000, "request_throughput": 33.3,
                "mean_ttft_ms": 80.0, "p99_ttft_ms": 140.0}


def _bench_argv(result_file: Path, rc: int = 0) -> list[str]:
    """The benchmark as it runs on the probe host: writes its result file, exits with its code."""
    code = (f"import json, sys, time; time.sleep(1.0); open({str(result_file)!r}, 'w').write("
            f"json.dumps({BENCH_RESULT!r}) + chr(10)); sys.exit({rc})")
    return [sys.executable, "-c", code]


def _fleet_run(tmp_path: Path, rc: int = 0) -> fleet_probe.FleetProbeOutcome:
    inv = _inventory(tmp_path / "inv.yml", {"ct": {"bench_probe_runs_dir": str(tmp_path / "a")},
                                            "ct2": {"bench_probe_runs_dir": str(tmp_path / "b")}},
                     _local_vars(tmp_path))
    out = tmp_path / "runs" / "20261206T112000Z-glm5-2node"
    (out / "ct").mkdir(parents=True)
    (out / "ct" / "server_info.json").write_text("{}")  # what the deploy fetched there first stays
    result_file = tmp_path / "a" / "20261206T112000Z-glm5-2node.bench.jsonl"
    bench = _bench_argv(result_file, rc)
    command = fleet_bench_command([], [], bench, str(result_file), "/models/huggingface")
    return fleet_probe.run(fleet_probe.FleetProbeRequest(command=command, inventory=inv, pattern="ct:ct2",
                                                         idle_s=0.5, sample_hz=10, out=out, network_gb_s=3.87,
                                                         bench_argv=bench, bench_host="ct"))


def test_the_fleet_run_holds_every_hosts_trace_and_clock_and_records_typed_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    outcome = _fleet_run(tmp_path)
    assert outcome.exit_code == 0, outcome.verdict["headline"]
    out = outcome.out
    run = json.loads((out / "run.json").read_text())
    for host in ("ct", "ct2"):
        assert (out / "hosts" / host / "trace.csv").is_file()
        assert run["clocks"][host]["bound_s"] > 0 and "offset_s" in run["clocks"][host]["start"]
    # the benchmark's result came back from the probe host, and its tokens are the fleet's
    assert json.loads((out / "bench.jsonl").read_text())["completed"] == 40
    assert outcome.verdict["fleet"]["output_tokens"] == 4000 and run["network_gb_s"] == 3.87

    first = record_fleet_run(out, "glm5-2node", tmp_path / "profiles")
    assert first.action == "added"
    entry = load_results("glm5-2node", tmp_path / "profiles").block.entries[-1]
    assert entry.run_id == out.name and entry.fleet is not None and entry.fleet.layout == "nodes"
    assert [n.host for n in entry.fleet.nodes] == ["ct", "ct2"] and entry.fleet.gpu_count == 16
    assert all(n.clock_bound_ms is not None and n.energy_j for n in entry.fleet.nodes)
    assert entry.fleet.network_gb_s == 3.87 and entry.bench.num_prompts == 40
    assert entry.throughput.full_run.output_tok_per_s == 3333.3
    # what ran is the benchmark on its host, not the SSH line around it (with its key's path)
    assert run["command"][0] == sys.executable and run["command_host"] == "ct"
    assert entry.bench.command is not None and not entry.bench.command.startswith("sh ")
    # replayed GPUs are never a measurement: the entry says so, naming the hosts
    assert entry.provenance().kind == "replayed" and entry.lab is not None and entry.lab.note.startswith("ct, ct2:")
    before = (tmp_path / "profiles" / "glm5-2node.yaml").read_bytes()
    # again, through `toolkit results record DIR` (which knows a fleet's directory): nothing changes
    again = _validated(_run(capsys, ["results", "record", str(out), "--profile", "glm5-2node", "--profiles-dir",
                                     str(tmp_path / "profiles"), "--json"]), "results.record")
    assert again["action"] == "unchanged" and again["entry"]["fleet"]["hosts"] == 2
    assert (tmp_path / "profiles" / "glm5-2node.yaml").read_bytes() == before


def test_a_failed_benchmark_keeps_its_exit_code_and_is_not_recorded(tmp_path: Path) -> None:
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    outcome = _fleet_run(tmp_path, rc=3)
    assert outcome.verdict["class"] == "benchmark-failed" and outcome.exit_code != 0
    before = (tmp_path / "profiles" / "glm5-2node.yaml").read_bytes()
    with pytest.raises(ToolkitError, match="a failure is not a result"):
        record_fleet_run(outcome.out, "glm5-2node", tmp_path / "profiles")
    assert (tmp_path / "profiles" / "glm5-2node.yaml").read_bytes() == before
