"""A stand-in for the `pynvml` module, patched in at toolkit.adapters.nvml's boundary only.

It implements the calls the adapter makes, with GPUs whose readings a test sets; it is not a GPU model.
Errors use the real NVMLError class and codes from the installed nvidia-ml-py, so the adapter's
error translation is exercised as it would be against a real driver.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, field
from typing import Any

import pynvml as real


@dataclass
class FakeGpu:
    power_mw: int = 100_000
    limit_mw: int = 700_000
    energy_mj: int = 1_000_000
    util_gpu: int = 0
    util_mem: int = 0
    sm_mhz: int = 1980
    mem_mhz: int = 3201
    reasons: int = 0
    temp_c: int = 40
    gpm: bool = False
    fail_with: int | None = None  # an NVML error code every call of this GPU raises (e.g. GPU_IS_LOST)
    unsupported: set[str] = field(default_factory=set)


def make_fake(gpus: list[FakeGpu], *, init_error: int | None = None, ring: int = 119,
              ring_filled_s: float | None = None) -> types.SimpleNamespace:
    ns = types.SimpleNamespace()
    for name in dir(real):
        if name.startswith("NVML_") or name in ("NVMLError", "c_nvmlGpmMetricsGet_t", "c_nvmlUtilization_t",
                                                 "c_nvmlSample_t"):
            setattr(ns, name, getattr(real, name))
    calls: dict[str, int] = {}
    ns.calls = calls

    def err(code: int) -> Exception:
        return real.NVMLError(code)

    def dev(h: Any, what: str) -> FakeGpu:
        calls[what] = calls.get(what, 0) + 1
        g = gpus[h]
        if g.fail_with is not None:
            raise err(g.fail_with)
        if what in g.unsupported:
            raise err(real.NVML_ERROR_NOT_SUPPORTED)
        return g

    def init() -> None:
        if init_error is not None:
            raise err(init_error)

    ns.nvmlInit = init
    ns.nvmlShutdown = lambda: None
    ns.nvmlDeviceGetCount = lambda: len(gpus)
    ns.nvmlDeviceGetHandleByIndex = lambda i: i
    ns.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980 if c == real.NVML_CLOCK_SM else 3201
    ns.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=int(gpus[h].gpm))
    samples: dict[int, tuple[int, float]] = {}  # id(sample) -> (gpu, time taken)
    ns.nvmlGpmSampleAlloc = lambda: types.SimpleNamespace()
    ns.nvmlGpmSampleFree = lambda smp: None

    def gpm_get(h: int, smp: Any) -> Any:
        dev(h, "gpm_sample")
        samples[id(smp)] = (h, time.monotonic())
        return smp

    ns.nvmlGpmSampleGet = gpm_get

    class MetricsGet:  # the fields the adapter sets and reads of c_nvmlGpmMetricsGet_t
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]

    ns.c_nvmlGpmMetricsGet_t = MetricsGet

    def metrics_get(mg: MetricsGet) -> MetricsGet:
        (h1, t1), (h2, t2) = samples[id(mg.sample1)], samples[id(mg.sample2)]
        assert h1 == h2 and t2 > t1, "GPM samples must be of one GPU, in order"
        calls["gpm_metrics"] = calls.get("gpm_metrics", 0) + 1
        g = gpus[h1]
        values = {real.NVML_GPM_METRIC_SM_UTIL: g.util_gpu * 0.9, real.NVML_GPM_METRIC_DRAM_BW_UTIL: 5.0}
        for m in mg.metrics[: mg.numMetrics]:
            m.nvmlReturn = real.NVML_SUCCESS if m.metricId in values else real.NVML_ERROR_NOT_SUPPORTED
            m.value = values.get(m.metricId, 0.0)
        return mg

    ns.nvmlGpmMetricsGet = metrics_get
    ns.nvmlDeviceGetPowerUsage = lambda h: dev(h, "power").power_mw
    ns.nvmlDeviceGetEnforcedPowerLimit = lambda h: dev(h, "limit").limit_mw

    last: dict[int, float] = {}

    def energy(h: int) -> int:
        g = dev(h, "energy")
        now = time.monotonic()
        g.energy_mj += int(g.power_mw * (now - last.get(h, now)))  # constant power since the last read
        last[h] = now
        return g.energy_mj

    ns.nvmlDeviceGetTotalEnergyConsumption = energy
    ns.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
        gpu=dev(h, "util").util_gpu, memory=gpus[h].util_mem)
    ns.nvmlDeviceGetClockInfo = lambda h, c: dev(h, "clock").sm_mhz if c == real.NVML_CLOCK_SM else gpus[h].mem_mhz
    ns.nvmlDeviceGetCurrentClocksEventReasons = lambda h: dev(h, "reasons").reasons
    ns.nvmlDeviceGetTemperature = lambda h, s: dev(h, "temp").temp_c
    ns.nvmlDeviceGetPcieThroughput = lambda h, c: (dev(h, "pcie"), 1000)[1]

    def field_values(h: int, ids: list[int]) -> list[Any]:
        dev(h, "field")
        raise err(real.NVML_ERROR_NOT_SUPPORTED)

    ns.nvmlDeviceGetFieldValues = field_values
    # The C functions the adapter calls through pointers with its own out-parameters (ctypes pointers made once),
    # returning nvmlReturn_t codes as the library does.
    def c_call(h: int, what: str) -> tuple[FakeGpu | None, int]:
        calls[what] = calls.get(what, 0) + 1
        g = gpus[h]
        if g.fail_with is not None:
            return None, g.fail_with
        if what in g.unsupported:
            return None, real.NVML_ERROR_NOT_SUPPORTED
        return g, real.NVML_SUCCESS

    def c_power(h: int, p: Any) -> int:
        g, rc = c_call(h, "power")
        if g is not None:
            p.contents.value = g.power_mw
        return rc

    def c_util(h: int, p: Any) -> int:
        g, rc = c_call(h, "util")
        if g is not None:
            p.contents.gpu, p.contents.memory = g.util_gpu, g.util_mem
        return rc

    def c_clock(h: int, clock: int, p: Any) -> int:
        g, rc = c_call(h, "clock")
        if g is not None:
            p.contents.value = g.sm_mhz if clock == real.NVML_CLOCK_SM else g.mem_mhz
        return rc

    # The driver's power ring: a sample every SAMPLE_PERIOD_US of wall time, the newest RING kept (H200: 20 ms,
    # 119); the oldest after lastSeen come first when more are pending than the caller's buffer holds.
    # The driver ran before the probe: its ring is full at open, unless ring_filled_s says it began sampling
    # that long ago (a driver just loaded).
    sample_period_us = 20_000
    filled_us = ring * sample_period_us if ring_filled_s is None else int(ring_filled_s * 1e6)
    started_us = time.time_ns() // 1000 - filled_us

    def c_samples(h: int, kind: int, last_seen: Any, p_type: Any, p_count: Any, buf: Any) -> int:
        g, rc = c_call(h, "samples")
        if g is None:
            return rc
        now_us = time.time_ns() // 1000
        newest = now_us - now_us % sample_period_us
        oldest = max(started_us - started_us % sample_period_us, newest - (ring - 1) * sample_period_us)
        first = max(oldest, last_seen.value - last_seen.value % sample_period_us + sample_period_us)
        stamps = list(range(first, newest + 1, sample_period_us))[: p_count.contents.value]
        if not stamps:
            return real.NVML_ERROR_NOT_FOUND
        for i, ts in enumerate(stamps):
            buf[i].timeStamp = ts
            buf[i].sampleValue.uiVal = g.power_mw
        p_type.contents.value = real.NVML_VALUE_TYPE_UNSIGNED_INT
        p_count.contents.value = len(stamps)
        return real.NVML_SUCCESS

    c_functions = {"nvmlDeviceGetPowerUsage": c_power, "nvmlDeviceGetUtilizationRates": c_util,
                   "nvmlDeviceGetClockInfo": c_clock, "nvmlDeviceGetSamples": c_samples}

    def function_pointer(name: str) -> Any:
        if name not in c_functions:
            raise err(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        return c_functions[name]

    ns._nvmlGetFunctionPointer = function_pointer
    ns.nvmlDeviceGetName = lambda h: b"Fake GPU (test stand-in)"
    ns.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}"
    ns.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:0{h}:00.0".encode())
    ns.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    ns.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    ns.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: real.NVML_TOPOLOGY_SYSTEM
    ns.nvmlDeviceGetP2PStatus = lambda a, b, i: real.NVML_P2P_STATUS_NOT_SUPPORTED
    ns.nvmlSystemGetDriverVersion = lambda: "0.0-fake"
    ns.nvmlSystemGetNVMLVersion = lambda: "0.0-fake"
    ns.nvmlSystemGetCudaDriverVersion = lambda: 0
    return ns
