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


def _run(gpus: list[fp.FakeGpu], seconds: float, *, bench_at_s: float | None = None,
         **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    fake = fp.make_fake(gpus)
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
    # 50 Hz from the driver's ring, drained about once a second (2 drains + the final one), not polled
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
    assert 6 <= len(gpm) <= 10 and gpm[0]["gpm_sm_util_pct"] == 72.0  # 5 Hz, >= 100 ms apart
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
