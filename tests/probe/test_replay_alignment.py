"""A recorded trace replays on the live run's phases, so the lab's verdict does not depend on the bench's length.

The lab replays the seed-shaped recording (35 s of benchmark) under SGLang's bench_serving, whose length
depends on the machine: 20 s on an idle one, two minutes on a loaded CI runner. On wall-clock playback a
long benchmark ran past the recording's end and was judged on its held idle row ("mixed"); playback aligned
to the live benchmark's start keeps the recorded plateau for as long as the benchmark runs.
"""

from __future__ import annotations

import pytest

from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.sampler import RecordedSampler
from toolkit.core.probe.summary import summarize
from toolkit.core.probe.trace import trace_from_rows
from toolkit.core.probe.verdict import judge

from .synthetic import seed_run

HZ = 10.0


def _live_run(sampler: RecordedSampler, idle_s: float, bench_s: float) -> tuple[Summary, dict]:  # type: ignore[type-arg]
    """What the probe's loop does, on a simulated clock: idle, then bench_started, then ticks until the end."""
    rows = []
    k = 0
    started = False
    while True:
        t = k / HZ
        if not started and t >= idle_s:
            sampler.bench_started(t)
            started = True
        rows.extend(sampler.sample(t))
        if started and t >= idle_s + bench_s:
            break
        k += 1
    trace = trace_from_rows(rows, {"sample_hz": str(HZ), "source": "test"})
    run = {"idle_start_s": 0.0, "idle_end_s": idle_s, "bench_start_s": idle_s, "bench_end_s": idle_s + bench_s,
           "data_source": "recorded GPU trace: lab data"}
    summary = summarize(trace, RunRecord.from_dict(run), {"completed": 1, "duration": bench_s})
    return summary, judge(summary, recorded_topology(), {"gpu_count": 8, "p2p": False}).to_dict()


def recorded_topology() -> dict:  # type: ignore[type-arg]
    return seed_run()[3]


def _sampler(with_phases: bool) -> RecordedSampler:
    trace, run, _bench, topology = seed_run()
    s = RecordedSampler(trace, "seed.csv", topology, run if with_phases else None)
    s.open(None)
    return s


@pytest.mark.parametrize(("idle_s", "bench_s"), [(10.0, 12.0), (10.0, 35.0), (10.0, 120.0), (3.0, 300.0),
                                                   (25.0, 60.0)])
def test_aligned_replay_keeps_the_plateau_for_the_whole_benchmark(idle_s: float, bench_s: float) -> None:
    summary, verdict = _live_run(_sampler(True), idle_s, bench_s)
    assert summary.steady_state.found, summary.steady_state
    steady = summary.steady
    # The window opens after the recording's 3 s ramp and runs to the live benchmark's end.
    assert idle_s + 1.0 <= steady.start_s <= idle_s + 4.0
    assert steady.end_s >= idle_s + bench_s - 1.5
    assert verdict["class"] == "busy-but-waiting", verdict
    # The idle baseline is the recording's idle, even when the live idle phase is longer than it.
    assert summary.idle.power_w["0"] == pytest.approx(87.0, abs=1.0)


def test_wall_clock_replay_of_a_long_benchmark_is_judged_on_a_held_row() -> None:
    """The failure the alignment removes: without the recording's phases a 120 s bench is mostly held idle."""
    aligned, _ = _live_run(_sampler(True), 10.0, 120.0)
    wall, _ = _live_run(_sampler(False), 10.0, 120.0)
    assert aligned.full.gpus["0"]["power_w"]["mean"] > 240.0
    assert wall.full.gpus["0"]["power_w"]["mean"] < 150.0


def test_a_benchmark_shorter_than_ramp_plus_min_window_has_no_steady_state() -> None:
    summary, _verdict = _live_run(_sampler(True), 10.0, 6.0)
    assert not summary.steady_state.found
    assert "shorter than min_window_s" in summary.steady_state.reason
