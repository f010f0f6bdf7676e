"""Recorded H200 runs (tests/fixtures/probe/h200-*, loads/h200_experiment.sh) through the real summary and
verdict code: each phase of loads/gpu_phases.py must get its class. Multi-GPU cases are COMPOSED from these
single-GPU traces (labelled so), not measured on 8 GPUs."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path

import pytest

from toolkit.adapters.probe_store import load_run
from toolkit.core.probe.bench import normalize_bench_result
from toolkit.core.probe.judge import ProbeRun, judge_run
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.series import Trace
from toolkit.core.probe.summary import summarize
from toolkit.core.probe.verdict import Verdict, judge
from toolkit.core.provenance import Provenance

from .synthetic import seed_run

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "probe"
EXPECTED = {
    "h200-idle": "no-load",
    "h200-compute": "compute-bound",
    "h200-compute-50hz": "compute-bound",
    "h200-memory": "memory-bandwidth-bound",
    "h200-spin": "busy-but-waiting",
    "h200-launch": "launch-bound",
    "h200-failing": "benchmark-failed",
    "h200-interrupted": "benchmark-failed",
    # second call (loads/h200_cost.sh), after PCIe throughput left the hot path: 50 / 10 / 20 Hz
    "h200b-compute-50hz": "compute-bound",
    "h200b-spin-10hz": "busy-but-waiting",
    "h200b-memory-20hz": "memory-bandwidth-bound",
    # third and fourth calls (loads/h200_tiered.sh, h200_under_load.sh): the tiered sampler (slow readings every
    # 0.5 s, the power limit carried), energy counter every 1 s (h200c) and every 5 s, the default (h200d)
    "h200c-compute-10hz": "compute-bound",
    "h200c-memory-10hz": "memory-bandwidth-bound",
    "h200c-spin-10hz": "busy-but-waiting",
    "h200c-launch-10hz": "launch-bound",
    "h200d-compute-20hz": "compute-bound",
    # (loads/h200_fleet.sh): the same loads under the sampler on the driver's 20 ms power samples
    # (trace schema 2: one row per sample, 50 Hz), util/clocks at 10 Hz, GPM at 5 Hz, energy at the edges
    "h200e-compute": "compute-bound",
    "h200e-memory": "memory-bandwidth-bound",
    "h200e-spin": "busy-but-waiting",
    "h200e-launch": "launch-bound",
}


def replayed(name: str, expected: str) -> tuple[ProbeRun, Summary, Verdict]:
    """A recorded H200 run replayed through the summary and verdict code: measured, of the expected class, and
    the class the same code gave on the GPU machine."""
    run = load_run(FIX / name)
    assert run.manifest.data_source == "measured (NVML)"
    summary, verdict = judge_run(run)
    assert verdict.cls == expected, verdict.headline
    assert run.verdict is not None and run.verdict.cls == verdict.cls
    return run, summary, verdict


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_recorded_phase_gets_its_class(name: str) -> None:
    _run, summary, verdict = replayed(name, EXPECTED[name])
    if verdict.cls in ("compute-bound", "memory-bandwidth-bound", "busy-but-waiting", "launch-bound"):
        assert summary.steady_state.found
        assert verdict.basis == "gpm" and verdict.confidence >= 0.75
    if "compute" in name:
        assert verdict.power_capped is True
        assert verdict.evidence["power_of_limit"] > 0.95


def test_recorded_energy_counter_matches_integrated_power_within_2_percent() -> None:
    for name in ("h200-compute", "h200-memory", "h200-spin", "h200-launch"):
        summary, _ = judge_run(load_run(FIX / name))
        g = summary.steady.gpus["0"]
        assert g["energy_source"] == "counter"
        # instant power (NVML_FI_DEV_POWER_INSTANT) integrates to the counter; the 1 s averaged power lags
        assert abs(g["energy_integrated_instant_j"] / g["energy_j"] - 1) < 0.02, name
        assert abs(g["energy_integrated_j"] / g["energy_j"] - 1) < 0.03, name


def test_benchmark_failure_keeps_artifacts_and_stderr_tail() -> None:
    run = load_run(FIX / "h200-failing")
    _, verdict = judge_run(run)
    assert run.manifest.exit_code == 3
    assert "planted failure" in verdict.evidence["stderr_tail"]
    interrupted = load_run(FIX / "h200-interrupted")
    assert interrupted.manifest.interrupted is True and interrupted.manifest.status == "interrupted"
    assert len(interrupted.trace.gpus[0]) > 50  # what it had was written


def _strip_gpm(trace: Trace) -> Trace:
    t = copy.deepcopy(trace)
    for s in t.gpus.values():
        for c in list(s.values):
            if c.startswith("gpm_"):
                s.values[c] = [None] * len(s)
    return t


@pytest.mark.parametrize("name", ["h200-compute", "h200-spin", "h200-launch", "h200-idle"])
def test_without_gpm_the_class_holds_at_lower_confidence(name: str) -> None:
    run = load_run(FIX / name)
    summary = summarize(_strip_gpm(run.trace), run.manifest, normalize_bench_result(run.bench_raw))
    v = judge(summary, run.topology, {})
    assert v.cls == EXPECTED[name]
    assert v.basis == "power+util+clocks"
    if v.cls != "no-load":
        assert v.confidence < 0.75


def _compose(parts: dict[int, str]) -> tuple[Trace, RunRecord]:
    """An N-GPU trace whose GPU g is the recorded GPU 0 of fixture parts[g], cut to the shortest."""
    runs = {g: load_run(FIX / name) for g, name in parts.items()}
    n = min(len(r.trace.gpus[0]) for r in runs.values())
    gpus = {}
    for g, r in runs.items():
        s = copy.deepcopy(r.trace.gpus[0])
        s.gpu = g
        s.t_s = s.t_s[:n]
        s.values = {c: v[:n] for c, v in s.values.items()}
        s.errors = s.errors[:n]
        gpus[g] = s
    first = runs[0].manifest
    end = min(min(r.manifest.bench_end_s for r in runs.values()), gpus[0].t_s[-1])
    manifest = dataclasses.replace(first, bench_end_s=end, provenance=Provenance(
        "stand-in", "composed from single-GPU H200 recordings; not measured on 8 GPUs"))
    return Trace({"sample_hz": "10", "source": "composed:h200"}, gpus), manifest


def test_composed_eight_gpus_one_working_is_imbalanced_and_named() -> None:
    trace, manifest = _compose({g: "h200-spin" for g in range(7)} | {7: "h200-compute"})
    v = judge(summarize(trace, manifest, {}), {}, {})
    assert v.cls == "imbalanced"
    assert v.slow_gpu == 7
    assert "GPU 7" in v.headline and "GPU 7" in v.next_steps[0]


def test_composed_eight_spinning_gpus_without_p2p_say_fewer_tp_ranks() -> None:
    trace, manifest = _compose({g: "h200-spin" for g in range(8)})
    *_, topology = seed_run()  # the story's topology: 8 GPUs, each on its own root complex, no P2P
    v = judge(summarize(trace, manifest, {}), topology, {"profile": "glm5-tp8"})
    assert v.cls == "busy-but-waiting"
    assert "glm5-tp4-pp2" in v.next_steps[0] and "glm5-ep8" in v.next_steps[0]


def test_energy_from_one_counter_read_a_second_matches_every_tick() -> None:
    """The adapter reads the counter at 1 Hz (its CPU cost); window energy must not suffer for it."""
    run = load_run(FIX / "h200-compute")
    full, _ = judge_run(run)
    sparse = copy.deepcopy(run.trace)
    s = sparse.gpus[0]
    last = -1e9
    for i, t in enumerate(s.t_s):
        if t - last >= 1.0:
            last = t
        else:
            s.values["energy_j"][i] = None
    summary = summarize(sparse, run.manifest, normalize_bench_result(run.bench_raw))
    for window in ("full", "steady"):
        a = getattr(full, window).gpus["0"]["energy_j"]
        b = getattr(summary, window).gpus["0"]["energy_j"]
        assert abs(b / a - 1) < 0.01, (window, a, b)
    assert summary.steady.gpus["0"]["energy_source"].startswith("counter (+ power")


def test_tiered_traces_read_slow_metrics_at_most_twice_a_second_and_carry_the_limit() -> None:
    for name in ("h200c-compute-10hz", "h200d-compute-20hz"):
        s = load_run(FIX / name).trace.gpus[0]
        assert None not in s.values["power_limit_w"] and None not in s.values["util_gpu_pct"], name
        temps = [t for t, v in zip(s.t_s, s.values["temp_c"], strict=True) if v is not None]
        gaps = [b - a for a, b in itertools.pairwise(temps)]
        assert min(gaps) >= 0.45 and len(temps) < len(s.t_s) / 3, name


def test_default_energy_interval_run_matches_integrated_instant_power() -> None:
    summary, _ = judge_run(load_run(FIX / "h200d-compute-20hz"))
    g = summary.steady.gpus["0"]
    assert g["energy_source"].startswith("counter (+ power over the edges")
    assert abs(g["energy_integrated_instant_j"] / g["energy_j"] - 1) < 0.02


@pytest.mark.parametrize("name", ["h200e-compute", "h200e-memory", "h200e-spin", "h200e-launch"])
def test_driver_sample_traces_are_schema_2_at_50_hz_with_energy_at_the_edges(name: str) -> None:
    run = load_run(FIX / name)
    assert run.trace.meta["schema_version"] == "2" and run.trace.meta["power_source"] == "driver_samples"
    s = run.trace.gpus[0]
    t = [x for x, p in zip(s.t_s, s.values["power_sample_w"], strict=True) if p is not None]
    gaps = sorted(b - a for a, b in itertools.pairwise(t))
    assert len(t) > 0.95 * len(s) and abs(gaps[len(gaps) // 2] - 0.02) < 0.002  # the driver's 20 ms period
    assert max(gaps) < 0.1  # no drain lost samples (the ring holds ~2.4 s)
    reads = [x for x, e in zip(s.t_s, s.values["energy_j"], strict=True) if e is not None]
    bench = (run.manifest.bench_start_s, run.manifest.bench_end_s)
    assert any(abs(x - bench[0]) < 0.2 for x in reads) and any(abs(x - bench[1]) < 0.3 for x in reads)
    summary, _ = judge_run(run)
    full = summary.full.gpus["0"]
    # over the benchmark window the counter pair is there: the 20 ms samples integrate to within 1 % of it
    assert full["energy_source"].startswith("counter")
    assert abs(full["energy_integrated_sample_j"] / full["energy_j"] - 1) < 0.01, full
    assert run.manifest.extra["sampler_cost"]["thread"] == "toolkit-nvml-sampler"
