"""The verdict, from summaries computed by the real summary code over synthetic traces."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from toolkit.core.probe.bench import normalize_bench_result
from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.summary import summarize
from toolkit.core.probe.trace import trace_from_rows
from toolkit.core.probe.verdict import judge

from .synthetic import H200_SHAPES, SEED_IDLE_W, SEED_POWER_W, seed_run


def test_seed_case_is_busy_but_waiting_and_says_fewer_tp_ranks() -> None:
    trace, run, bench, topology = seed_run()
    summary = summarize(trace, run, normalize_bench_result(bench))
    v = judge(summary, topology, run.target)
    assert v.cls == "busy-but-waiting"
    assert v.basis == "power+util+clocks"  # nvidia-smi gave no GPM: lower confidence, said so
    assert v.confidence < 0.75 and "lower confidence" in v.evidence["note"]
    assert v.evidence["util_gpu_pct"] >= 99
    assert 240 < v.evidence["power_w_mean"] < 260
    assert v.evidence["p2p_between_all_gpus"] is False
    steps = " ".join(v.next_steps)
    assert "glm5-tp4-pp2" in steps and "glm5-ep8" in steps
    assert "not more compute tuning" in steps
    # idle baseline and steady window came from the trace, not from constants
    assert abs(summary.idle.power_w["0"] - SEED_IDLE_W) < 1
    st = summary.steady.gpus
    for g, p in enumerate(SEED_POWER_W):
        assert abs(st[str(g)]["power_w"]["mean"] - p) < 1.0
    assert summary.steady_state.found
    assert summary.steady.start_s > run.bench_start_s + 1  # ramp cut


def test_seed_figures_with_p2p_would_not_blame_the_link() -> None:
    trace, run, bench, topology = seed_run()
    for link in topology["links"]:
        link["p2p_read_ok"] = True
    v = judge(summarize(trace, run, normalize_bench_result(bench)), topology, run.target)
    assert v.cls == "busy-but-waiting"
    assert "no P2P" not in " ".join(v.next_steps)


def _flat(gpus: dict[int, dict[str, float]], seconds: float = 30.0, idle_w: float = 80.0) -> tuple[Any, RunRecord]:
    rows = []
    for i in range(int(seconds * 10)):
        t = i / 10
        for g, m in gpus.items():
            busy = t >= 5.0
            row = {"t_s": t, "gpu": g, "power_limit_w": 700.0, "sm_clock_max_mhz": 1980.0}
            row.update(m if busy else {"power_w": idle_w, "util_gpu_pct": 0.0, "sm_clock_mhz": 345.0})
            rows.append(row)
    run = RunRecord(idle_end_s=5.0, bench_start_s=5.0, bench_end_s=seconds - 0.1, exit_code=0)
    return trace_from_rows(rows, {"sample_hz": "10", "source": "synthetic:flat"}), run


H200_LIKE = {  # shapes of the earlier H200 readings (docs/probe.md), for the GPM path
    **{k: H200_SHAPES[k] for k in ("compute", "memory", "spin")},
    "launch": {"power_w": 126.0, "util_gpu_pct": 29.0, "gpm_sm_util_pct": 2.0, "gpm_tensor_util_pct": 0.0,
               "gpm_dram_bw_util_pct": 0.0, "sm_clock_mhz": 1980.0, "clock_reasons": 0},
    "thermal": {"power_w": 500.0, "util_gpu_pct": 99.0, "gpm_sm_util_pct": 90.0, "gpm_tensor_util_pct": 80.0,
                "gpm_dram_bw_util_pct": 10.0, "sm_clock_mhz": 900.0, "clock_reasons": 0x40},
}
EXPECTED = {"compute": "compute-bound", "memory": "memory-bandwidth-bound", "spin": "busy-but-waiting",
            "launch": "launch-bound", "thermal": "throttled"}


def test_each_shape_gets_its_class_with_gpm() -> None:
    for name, metrics in H200_LIKE.items():
        trace, run = _flat({0: metrics})
        v = judge(summarize(trace, run, {}), {}, {})
        assert v.cls == EXPECTED[name], (name, v.headline)
        assert v.basis == "gpm"
        assert v.confidence >= 0.75 or v.cls == "throttled"
    trace, run = _flat({0: H200_LIKE["compute"]})
    assert judge(summarize(trace, run, {})).power_capped is True


def test_without_gpm_compute_and_spin_still_separate_with_lower_confidence() -> None:
    strip = {k: v for k, v in H200_LIKE["compute"].items() if not k.startswith("gpm_")}
    trace, run = _flat({0: strip})
    v = judge(summarize(trace, run, {}))
    assert (v.cls, v.power_capped, v.basis) == ("compute-bound", True, "power+util+clocks")
    assert v.confidence < 0.75
    spin = {k: v for k, v in H200_LIKE["spin"].items() if not k.startswith("gpm_")}
    trace, run = _flat({0: spin})
    assert judge(summarize(trace, run, {})).cls == "busy-but-waiting"


def test_imbalance_names_the_gpu_the_others_wait_for() -> None:
    gpus = {g: H200_LIKE["spin"] for g in range(8)}
    gpus[5] = H200_LIKE["compute"]
    trace, run = _flat(gpus)
    v = judge(summarize(trace, run, {}), {}, {})
    assert v.cls == "imbalanced" and v.slow_gpu == 5
    assert "GPU 5" in v.next_steps[0]
    assert v.evidence["work_by_gpu"]["5"] > 0.9 > v.evidence["work_by_gpu"]["0"]


def test_no_load_and_benchmark_failed() -> None:
    trace, run = _flat({0: {"power_w": 80.0, "util_gpu_pct": 0.0}})
    assert judge(summarize(trace, run, {})).cls == "no-load"
    trace, run = _flat({0: H200_LIKE["compute"]})
    run = replace(run, exit_code=3, stderr_tail="Traceback ...\nConnectionRefusedError: [Errno 111]")
    v = judge(summarize(trace, run, {}))
    assert v.cls == "benchmark-failed"
    assert "ConnectionRefusedError" in v.evidence["stderr_tail"]


def test_requests_lost_with_exit_0_is_a_failed_benchmark_not_a_result() -> None:
    # bench_serving exits 0 when requests fail (the server was killed, then restarted before its closing
    # /get_server_info): only "completed" below what it sent says so.
    from toolkit.core.probe.bench import failed_requests, requests_sent

    stderr = "  3%|3         | 5/160 [00:01<00:40,  3.80it/s]\r 100%|##########| 160/160 [00:09<00:00, 16.2it/s]"
    assert requests_sent(["python", "-m", "sglang.bench_serving", "--num-prompts", "200"], stderr) == 160
    assert requests_sent(["bench", "--num-prompts=200"], "") == 200
    assert requests_sent(["bench"], "no progress bar") is None
    assert failed_requests(123.0, 160) == 37 and failed_requests(160.0, 160) == 0
    assert failed_requests(None, 160) is None and failed_requests(5.0, None) is None

    trace, run = _flat({0: H200_LIKE["compute"]})
    run = replace(run, requests_sent=160, failed_requests=37, server_log_tail="sglang.service: Main process exited, "
                  "code=killed, status=9/KILL")
    v = judge(summarize(trace, run, {"completed": 123.0}))
    assert v.cls == "benchmark-failed"
    assert v.headline.startswith("the benchmark lost 37 of 160 requests")
    assert "status=9/KILL" in v.evidence["server_log_tail"] and v.evidence["failed_requests"] == 37
    run = replace(run, failed_requests=0)
    assert judge(summarize(trace, run, {"completed": 160.0})).cls == "compute-bound"


def test_bench_result_parsed_by_presence_of_keys() -> None:
    old = normalize_bench_result({"duration": 10.0, "input_throughput": 100.0, "output_throughput": 50.0,
                                  "mean_ttft_ms": 12.5, "p99_itl_ms": 3.0})
    assert old["total_tok_per_s"] == 150.0 and old["total_tok_per_s_source"].startswith("input")
    assert old["latency_ms"] == {"ttft_ms": {"mean": 12.5}, "itl_ms": {"p99": 3.0}}
    assert old["request_per_s"] is None  # absent stays absent
    new = normalize_bench_result({"total_throughput": 200.0, "output_throughput": 50.0, "input_throughput": 100.0})
    assert new["total_tok_per_s"] == 200.0 and new["total_tok_per_s_source"] == "reported"


def test_committed_seed_fixture_matches_its_generator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from .synthetic import write_seed_fixture

    write_seed_fixture(tmp_path)
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "probe" / "seed-synthetic-8gpu"
    for name in ("topology.json", "run.json"):
        assert (fixture / name).read_text() == (tmp_path / name).read_text(), name
    # The committed trace is schema 1 (kept so: a schema-1 file must still read); the generator writes the
    # current schema. Same data either way.
    from toolkit.core.probe.trace import parse_trace

    old, new = parse_trace((fixture / "trace.csv").read_text()), parse_trace((tmp_path / "trace.csv").read_text())
    assert old.meta["schema_version"] == "1"
    assert old.gpus == new.gpus
