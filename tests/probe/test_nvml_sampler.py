"""The NVML sampler's design (adapters/nvml.py), against the stand-in pynvml: one row per driver power sample
(50 Hz, the driver's timestamps), polled readings carried between reads, slow/GPM/energy reads at their own
rates, a thread of its own, out-parameters allocated once. Costs on the H200: benchmarks/bench_probe.py --fleet."""

from __future__ import annotations

import itertools
import time
from typing import Any
from unittest import mock

import pynvml

from toolkit.adapters import nvml as nvml_adapter

from . import fake_pynvml as fp


def _run(gpus: list[fp.FakeGpu], seconds: float, *, bench_at_s: float | None = None, ring: int = 119,
         ring_filled_s: float | None = None, **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    fake = fp.make_fake(gpus, ring=ring, ring_filled_s=ring_filled_s)
    with mock.patch.object(nvml_adapter, "pynvml", fake):
        s = nvml_adapter.NvmlSampler(**kw)
        s.open(None)
        rows: list[dict[str, Any]] = []
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < seconds:
            rows += s.sample(t)  # the probe's loop: collects what the thread made
            if bench_at_s is not None and t >= bench_at_s:
                s.bench_started(t)
                bench_at_s = None
            time.sleep(0.1)
        rows += s.finish(time.monotonic() - t0)
        cost = s.cost()
        s.close()
    return rows, cost, fake


def test_one_row_per_driver_power_sample_with_polled_readings_carried() -> None:
    gpu = fp.FakeGpu(util_gpu=80, power_mw=300_000, gpm=True)
    rows, cost, fake = _run([gpu], 1.6, bench_at_s=0.0)
    sampled = [r for r in rows if r.get("power_sample_w") is not None]
    # 50 Hz from the driver's ring (its depth read at open, a first drain, one 1.53 s later, the final one)
    assert 70 <= len(sampled) <= 85, len(sampled)
    gaps = [round(b["t_s"] - a["t_s"], 4) for a, b in itertools.pairwise(sampled)]
    assert min(gaps) > 0.019 and max(gaps) < 0.021
    assert sampled[0]["t_s"] >= 0  # samples from before the run's start are not part of it
    assert 2 <= fake.calls["samples"] <= 4 and cost["power_samples"] == len(sampled)
    assert all(r["power_sample_w"] == 300.0 and r["util_gpu_pct"] == 80.0 and r["power_w"] == 300.0
               and r["power_limit_w"] == 700.0 for r in sampled)
    # util/clock/power polled at 10 Hz (the rate they change), not per row
    assert 14 <= fake.calls["util"] <= 20 and fake.calls["power"] == fake.calls["util"]
    slow = [r for r in rows if r.get("temp_c") is not None]
    assert 2 <= len(slow) <= 3 and fake.calls["temp"] == len(slow)
    gpm = [r for r in rows if r.get("gpm_sm_util_pct") is not None]
    assert 3 <= len(gpm) <= 5 and gpm[0]["gpm_sm_util_pct"] == 72.0  # 2.5 Hz, >= 100 ms apart
    assert all(r.get("gpm_tensor_util_pct") is None for r in rows)  # not offered: empty, not 0
    assert "pcie" not in fake.calls  # the blocking throughput call is never made
    energy = [r for r in rows if r.get("energy_j") is not None]
    # the benchmark's start and the end only (every 20 s otherwise; none at the idle start)
    assert len(energy) == 2 and energy[-1]["energy_j"] > energy[0]["energy_j"]
    assert cost["thread_ticks"] >= 14 and cost["thread_cpu_s"] > 0


def test_benchmark_start_reads_the_energy_counter() -> None:
    rows, cost, _ = _run([fp.FakeGpu(power_mw=200_000)], 1.2, bench_at_s=0.5)
    assert cost["energy_reads"] == 2  # none at the thread's start: the idle baseline needs none
    reads = [r["t_s"] for r in rows if r.get("energy_j") is not None]
    assert len(reads) == 2 and 0.45 < reads[0] < 0.75 and reads[1] > 1.1


def test_unsupported_metrics_are_empty_not_zero_and_asked_once() -> None:
    gpu = fp.FakeGpu(util_gpu=50, power_mw=200_000, unsupported={"temp", "reasons"})
    rows, _, fake = _run([gpu], 1.1)
    assert rows and all(r.get("temp_c") is None and r.get("clock_reasons") is None for r in rows)
    assert not any(r.get("error") for r in rows)
    assert fake.calls["temp"] == 1


def test_gpu_without_driver_samples_gets_a_row_per_tick() -> None:
    gpu = fp.FakeGpu(util_gpu=50, power_mw=200_000, unsupported={"samples"})
    rows, _, fake = _run([gpu], 1.1)
    assert fake.calls["samples"] == 1  # asked once
    assert 9 <= len(rows) <= 14 and all(r["power_w"] == 200.0 and r.get("power_sample_w") is None for r in rows)


def test_lost_gpu_is_an_error_row_and_the_others_go_on() -> None:
    gpus = [fp.FakeGpu(power_mw=200_000), fp.FakeGpu(power_mw=200_000, fail_with=pynvml.NVML_ERROR_GPU_IS_LOST)]
    rows, _, _ = _run(gpus, 1.1)
    lost = [r for r in rows if r["gpu"] == 1]
    assert lost and all("GPU is lost" in r["error"] for r in lost)
    assert len([r for r in rows if r["gpu"] == 0 and r.get("power_sample_w")]) >= 45


def test_out_parameters_are_allocated_once() -> None:
    seen: dict[str, set[int]] = {}
    fake = fp.make_fake([fp.FakeGpu(power_mw=200_000)])
    inner = fake._nvmlGetFunctionPointer

    def spy(name: str) -> Any:
        fn = inner(name)

        def call(*args: Any) -> Any:
            seen.setdefault(name, set()).update(id(a) for a in args[1:])
            return fn(*args)
        return call

    fake._nvmlGetFunctionPointer = spy
    with mock.patch.object(nvml_adapter, "pynvml", fake):
        s = nvml_adapter.NvmlSampler()
        s.open(None)
        s.sample(0.0)
        time.sleep(1.2)
        s.finish(1.2)
        s.close()
    assert fake.calls["util"] >= 10 and fake.calls["samples"] >= 2
    # the same out-parameter objects every call (the clock call also passes the clock id, one int)
    assert len(seen["nvmlDeviceGetUtilizationRates"]) == 1 and len(seen["nvmlDeviceGetPowerUsage"]) == 1
    assert len(seen["nvmlDeviceGetSamples"]) <= 5  # kind, lastSeen, type, count, buffer


def _contiguous(rows: list[dict[str, Any]], gpu: int = 0) -> list[float]:
    """The gaps between one GPU's consecutive power-sample rows."""
    ts = [r["t_s"] for r in rows if r["gpu"] == gpu and r.get("power_sample_w") is not None]
    return [b - a for a, b in itertools.pairwise(ts)]


def test_drains_follow_the_depth_of_the_driver_ring() -> None:
    # A drain costs about the same with 50 samples or 100 (loads/sampler_breakdown.py): as few as the ring allows.
    # The H200's ring (119 x 20 ms) is drained every 0.65 x 2.36 s; a shallow one (30 samples) every 0.38 s.
    for ring, interval_s in ((119, 1.534), (30, 0.377)):
        rows, cost, fake = _run([fp.FakeGpu(power_mw=250_000)], 3.2, ring=ring)
        assert cost["power_ring_depth_s"] == round((ring - 1) * 0.02, 3)
        assert abs(cost["power_drain_interval_s"] - interval_s) < 0.002, cost
        gaps = _contiguous(rows)
        assert cost["power_ring_overruns"] == 0 and len(gaps) > 140 and max(gaps) < 0.021, (ring, max(gaps))
        drains = fake.calls["samples"] - 1  # the depth read at open
        assert drains <= 3.2 / interval_s + 3, (ring, drains)
    # a driver that began sampling 0.1 s ago tells nothing of its depth: the default second
    _, cost, _ = _run([fp.FakeGpu(power_mw=250_000)], 1.2, ring=119, ring_filled_s=0.1)
    assert cost["power_ring_depth_s"] is None and cost["power_drain_interval_s"] == 1.0


def test_a_ring_overrun_is_counted_and_drains_come_sooner() -> None:
    # Drains spaced wider than the ring (as a stalled thread would leave them): the samples the driver dropped are
    # not invented, the gap is counted in sampler_cost, and the interval shrinks until drains keep up.
    with mock.patch.object(nvml_adapter, "RING_DRAIN_FRACTION", 1.6):
        rows, cost, _ = _run([fp.FakeGpu(power_mw=250_000)], 3.5, ring=30)
    assert cost["power_ring_overruns"] >= 1
    assert cost["power_drain_interval_s"] < 0.58  # below the ring's depth (29 x 20 ms) after the overruns
    gaps = _contiguous(rows)
    assert max(gaps) > 0.1 and min(gaps) > 0.019  # a hole where samples were lost, nothing made up
    late = [r["t_s"] for r in rows if r.get("power_sample_w") is not None][-60:]
    assert max(b - a for a, b in itertools.pairwise(late)) < 0.021  # keeping up by the end
