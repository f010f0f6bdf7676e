"""NVML, the only importer of `pynvml` (package nvidia-ml-py). NVML errors become toolkit errors here.

A metric a GPU does not offer (NVML_ERROR_NOT_SUPPORTED) is recorded as unavailable (empty), never as zero,
and is not asked for again. Any other NVML error of one GPU at one tick is written into that row's `error`
cell and the run goes on: a GPU falling off the bus mid-run must not lose the others' data.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.sampler import Row

try:  # imported lazily by the CLI only for `probe run` without a replay trace
    import pynvml
except ImportError:  # pragma: no cover - depends on the machine
    pynvml = None

# GPM samples must be at least 100 ms apart (nvml.h, nvmlGpmMetricsGet); at 10 Hz a tick may land a hair
# early, so a tick less than this after the previous GPM sample leaves the GPM cells empty.
GPM_MIN_INTERVAL_S = 0.1

# Every tick reads what the verdict follows in time: power (average and instant), utilization, SM clock.
# The memory clock, temperature, clock-event reasons and GPM are read at most once per SLOW_INTERVAL_S, their
# cells empty between reads (not sampled then, as for the energy counter): they move slowly, and a GPM metric
# is an exact average between two GPM samples, so a longer interval only coarsens it. The power limit is read
# at the same rate and carried into every row (a setting, not a measurement). With 8 GPU slots at 20 Hz on the
# H200, every reading every tick took 4.2 % of a core (benchmarks/results/h200-sampler-tiers.json).
SLOW_INTERVAL_S = 0.5

# nvmlDeviceGetPcieThroughput blocks while it measures (a 20 ms window per call, nvml.h); TX and RX made
# every GPU-sample cost ~46 ms on the H200 (tests/fixtures/probe/h200-*/run.json sampler_cost, first run).
# Where GPM runs it reports PCIe TX/RX itself, so the blocking calls are skipped; elsewhere they are made at
# most once per PCIE_MIN_INTERVAL_S and the cells between are empty.
PCIE_MIN_INTERVAL_S = 1.0
# nvmlDeviceGetTotalEnergyConsumption costs ~2.8 ms of CPU per call on the H200 device machine (median of 20,
# benchmarks/results/h200-nvml-cost.json) against ~3 us for the other readings: it is the probe's largest
# cost. Read once a second it alone is 8 GPUs x 2.8 ms = 2.3 % of a core, over the 2 % goal; measured with
# 8 GPU slots at 20 Hz, the tiered sampler took 3.6 % of a core at 1 s and 1.3 % at 5 s
# (benchmarks/results/h200-sampler-tiers.json). The counter is therefore read once per `energy_interval_s`
# (default 5 s); window energy is the delta between the first and last reads inside the window plus power
# over the edges (core/probe/energy.py). Thinning the recorded H200 runs' 1 s reads to 5 s moved their
# steady-window energy by at most 0.61 % (tests/probe/test_energy_interval.py).
ENERGY_INTERVAL_S = 5.0

_TOPOLOGY_NAMES = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}
# pynvml spells NVML_P2P_CAPS_INDEX_READ as `0,` (a tuple) in nvidia-ml-py 12.x/13.x: use the enum values.
_P2P_READ, _P2P_NVLINK = 0, 2


def _gpm_metric_ids() -> dict[str, int]:
    assert pynvml is not None
    names = {
        "gpm_sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
        "gpm_sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
        "gpm_tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        "gpm_dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
        "gpm_pcie_tx_mib_s": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
        "gpm_pcie_rx_mib_s": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
        "gpm_nvlink_tx_mib_s": "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
        "gpm_nvlink_rx_mib_s": "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
    }
    return {col: int(getattr(pynvml, n)) for col, n in names.items() if hasattr(pynvml, n)}


def _err_text(err: Exception) -> str:
    return str(err).replace(",", ";").replace("\n", " ") or type(err).__name__


def _not_supported(err: Exception) -> bool:
    assert pynvml is not None
    return getattr(err, "value", None) in (pynvml.NVML_ERROR_NOT_SUPPORTED, getattr(pynvml, "NVML_ERROR_NOT_FOUND", -1))


class _Gpu:
    """One GPU's handle, static facts and which metrics it turned out not to offer."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.sm_max_mhz: float | None = None
        self.mem_max_mhz: float | None = None
        self.gpm = False
        self.gpm_prev: Any = None
        self.gpm_prev_t = 0.0
        self.gpm_spare: Any = None
        self.pcie_last_t = -1e9
        self.gpm_request: Any = None  # one c_nvmlGpmMetricsGet_t per GPU, reused: it holds 477 metric slots
        self.energy_last_t = -1e9
        self.slow_last_t = -1e9
        self.power_limit_w: float | None = None


class NvmlSampler:
    """The real GPUs through NVML. Cost per GPU-sample is measured by benchmarks/bench_probe.py --nvml."""

    source = "nvml"

    def __init__(self, *, gpm: bool = True, energy_interval_s: float = ENERGY_INTERVAL_S,
                 slow_interval_s: float = SLOW_INTERVAL_S) -> None:
        self._want_gpm = gpm
        self.energy_interval_s = energy_interval_s
        self.slow_interval_s = slow_interval_s
        self._gpus: list[_Gpu] = []
        self._gpm_ids: dict[str, int] = {}
        self._open = False

    # -- lifecycle -------------------------------------------------------------------------------------------
    def open(self, gpus: list[int] | None) -> list[int]:
        if pynvml is None:
            raise ToolkitError.of("the Python package nvidia-ml-py (module pynvml) is not installed",
                                  field="probe", fix="pip install nvidia-ml-py (or run `scripts/setup`)")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise ToolkitError.of(
                f"no NVIDIA driver: NVML could not start ({_err_text(err)})",
                field="nvml",
                fix="run on a machine with the NVIDIA driver loaded (nvidia-smi must work there); "
                "in the lab use `toolkit probe run --replay-gpu-trace FILE -- CMD`",
            ) from None
        self._open = True
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                raise ToolkitError.of("NVML sees no GPU", field="--gpus",
                                      fix="check `nvidia-smi -L` and the container's device passthrough")
            chosen = list(range(count)) if gpus is None else gpus
            bad = [g for g in chosen if not 0 <= g < count]
            if bad:
                raise ToolkitError.of(f"GPU index {bad} does not exist (NVML sees {count})", field="--gpus",
                                      fix=f"use indices 0..{count - 1} or --gpus all")
            self._gpm_ids = _gpm_metric_ids() if self._want_gpm else {}
            self._gpus = [self._setup(g) for g in chosen]
        except ToolkitError:
            self.close()
            raise
        except pynvml.NVMLError as err:
            self.close()
            raise ToolkitError.of(f"NVML failed while listing GPUs: {_err_text(err)}", field="nvml",
                                  fix="check `nvidia-smi`; a driver/library mismatch needs a reboot") from None
        return chosen

    def _setup(self, index: int) -> _Gpu:
        assert pynvml is not None
        g = _Gpu(index, pynvml.nvmlDeviceGetHandleByIndex(index))
        for attr, clock in (("sm_max_mhz", pynvml.NVML_CLOCK_SM), ("mem_max_mhz", pynvml.NVML_CLOCK_MEM)):
            try:
                setattr(g, attr, float(pynvml.nvmlDeviceGetMaxClockInfo(g.handle, clock)))
            except pynvml.NVMLError:
                setattr(g, attr, None)
        if self._gpm_ids:
            try:
                g.gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice)
            except (pynvml.NVMLError, AttributeError):
                g.gpm = False
            if g.gpm:
                try:
                    g.gpm_prev = pynvml.nvmlGpmSampleAlloc()
                    g.gpm_spare = pynvml.nvmlGpmSampleAlloc()
                    pynvml.nvmlGpmSampleGet(g.handle, g.gpm_prev)
                    g.gpm_prev_t = time.monotonic()
                except pynvml.NVMLError:
                    g.gpm = False
        return g

    def bench_started(self, t_s: float) -> None:
        return None  # real GPUs need no alignment; see RecordedSampler.bench_started

    def close(self) -> None:
        if pynvml is None or not self._open:
            return
        for g in self._gpus:
            for s in (g.gpm_prev, g.gpm_spare):
                if s is not None:
                    with contextlib.suppress(pynvml.NVMLError):
                        pynvml.nvmlGpmSampleFree(s)
        self._gpus = []
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
        self._open = False

    # -- once per run --------------------------------------------------------------------------------------------
    def topology(self) -> dict[str, Any]:
        assert pynvml is not None

        def text(v: Any) -> str | None:
            return v.decode() if isinstance(v, bytes) else None if v is None else str(v)

        def safe(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(*args)
            except pynvml.NVMLError:
                return None

        gpus = []
        for g in self._gpus:
            h = g.handle
            pci = safe(pynvml.nvmlDeviceGetPciInfo, h)
            gpus.append({
                "index": g.index,
                "name": text(safe(pynvml.nvmlDeviceGetName, h)),
                "uuid": text(safe(pynvml.nvmlDeviceGetUUID, h)),
                "pci_bus_id": text(pci.busId) if pci is not None else None,
                "power_limit_w": (safe(pynvml.nvmlDeviceGetEnforcedPowerLimit, h) or 0) / 1000.0 or None,
                "sm_clock_max_mhz": g.sm_max_mhz,
                "mem_clock_max_mhz": g.mem_max_mhz,
                "gpm_supported": g.gpm,
                "pcie_link_gen": safe(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                "pcie_link_width": safe(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
            })
        links = []
        for i, a in enumerate(self._gpus):
            for b in self._gpus[i + 1:]:
                anc = safe(pynvml.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle)
                p2p = safe(pynvml.nvmlDeviceGetP2PStatus, a.handle, b.handle, _P2P_READ)
                nvl = safe(pynvml.nvmlDeviceGetP2PStatus, a.handle, b.handle, _P2P_NVLINK)
                links.append({
                    "a": a.index, "b": b.index,
                    "common_ancestor": _TOPOLOGY_NAMES.get(anc, str(anc)) if anc is not None else None,
                    "p2p_read_ok": p2p == pynvml.NVML_P2P_STATUS_OK if p2p is not None else False,
                    "p2p_nvlink_ok": nvl == pynvml.NVML_P2P_STATUS_OK if nvl is not None else False,
                })
        return {
            "driver_version": text(safe(pynvml.nvmlSystemGetDriverVersion)),
            "nvml_version": text(safe(pynvml.nvmlSystemGetNVMLVersion)),
            "cuda_driver_version": safe(pynvml.nvmlSystemGetCudaDriverVersion),
            "gpus": gpus,
            "links": links,
            "data_source": "nvml",
        }

    # -- every tick ----------------------------------------------------------------------------------------------
    def sample(self, t_s: float) -> list[Row]:
        return [self._sample_one(g, t_s) for g in self._gpus]

    def _read(self, g: _Gpu, key: str, fn: Callable[[], Any], errors: list[str]) -> Any:
        if key in g.unsupported:
            return None
        assert pynvml is not None
        try:
            return fn()
        except pynvml.NVMLError as err:
            if _not_supported(err):
                g.unsupported.add(key)
            else:
                errors.append(f"{key}: {_err_text(err)}")
            return None

    def _sample_one(self, g: _Gpu, t_s: float) -> Row:
        assert pynvml is not None
        nv = pynvml
        h = g.handle
        errors: list[str] = []
        row: Row = {"t_s": t_s, "gpu": g.index, "sm_clock_max_mhz": g.sm_max_mhz, "mem_clock_max_mhz": g.mem_max_mhz}
        p = self._read(g, "power", lambda: nv.nvmlDeviceGetPowerUsage(h), errors)
        if errors and not p:
            # The first call failed for a reason other than "not supported" (GPU lost, driver gone): record it
            # once for this tick instead of paying for a dozen more failing calls.
            row["error"] = errors[0]
            return row
        row["power_w"] = p / 1000.0 if p is not None else None
        fv = self._read(g, "power_instant", lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT]),
                        errors)
        if fv is not None:
            f = fv[0]
            if f.nvmlReturn == nv.NVML_SUCCESS:
                row["power_instant_w"] = float(_field_value(f)) / 1000.0
            else:
                g.unsupported.add("power_instant")
        now = time.monotonic()
        if now - g.energy_last_t >= self.energy_interval_s:
            g.energy_last_t = now
            e = self._read(g, "energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), errors)
            row["energy_j"] = e / 1000.0 if e is not None else None
        u = self._read(g, "util", lambda: nv.nvmlDeviceGetUtilizationRates(h), errors)
        if u is not None:
            row["util_gpu_pct"], row["util_mem_pct"] = float(u.gpu), float(u.memory)
        row["sm_clock_mhz"] = self._read(g, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), errors)
        if now - g.slow_last_t >= self.slow_interval_s:
            g.slow_last_t = now
            self._sample_slow(g, row, errors, now)
        # The enforced limit is a setting, not a measurement: every row carries its latest read, so the
        # steady-state rule and the verdict have it at each tick (core/probe/steady.py).
        row["power_limit_w"] = g.power_limit_w
        if errors:
            row["error"] = "; ".join(errors)[:300]
        return row

    def _sample_slow(self, g: _Gpu, row: Row, errors: list[str], now: float) -> None:
        """The readings taken at most once per slow_interval_s (SLOW_INTERVAL_S says why)."""
        assert pynvml is not None
        nv = pynvml
        h = g.handle
        lim = self._read(g, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), errors)
        g.power_limit_w = lim / 1000.0 if lim is not None else None
        row["mem_clock_mhz"] = self._read(g, "mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                                          errors)
        # Renamed from ...ThrottleReasons in nvidia-ml-py 12.535; older bindings have only the old name.
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if reasons_fn is not None:
            row["clock_reasons"] = self._read(g, "reasons", lambda: reasons_fn(h), errors)
        row["temp_c"] = self._read(g, "temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), errors)
        if not g.gpm and now - g.pcie_last_t >= PCIE_MIN_INTERVAL_S:
            g.pcie_last_t = now
            row["pcie_tx_kib_s"] = self._read(
                g, "pcie_tx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES), errors)
            row["pcie_rx_kib_s"] = self._read(
                g, "pcie_rx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES), errors)
        if g.gpm:
            self._gpm(g, row, errors)

    def _gpm(self, g: _Gpu, row: Row, errors: list[str]) -> None:
        assert pynvml is not None
        now = time.monotonic()
        if now - g.gpm_prev_t < GPM_MIN_INTERVAL_S:
            return
        try:
            pynvml.nvmlGpmSampleGet(g.handle, g.gpm_spare)
            cols = list(self._gpm_ids)
            mg = g.gpm_request
            if mg is None:
                mg = g.gpm_request = pynvml.c_nvmlGpmMetricsGet_t()
                mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = len(cols)
                for i, col in enumerate(cols):
                    mg.metrics[i].metricId = self._gpm_ids[col]
            mg.sample1 = g.gpm_prev
            mg.sample2 = g.gpm_spare
            pynvml.nvmlGpmMetricsGet(mg)
            for i, col in enumerate(cols):
                m = mg.metrics[i]
                if m.nvmlReturn == pynvml.NVML_SUCCESS:
                    row[col] = float(m.value)
        except pynvml.NVMLError as err:
            errors.append(f"gpm: {_err_text(err)}")
            return
        g.gpm_prev, g.gpm_spare = g.gpm_spare, g.gpm_prev
        g.gpm_prev_t = now


def _field_value(f: Any) -> float:
    """The value of an nvmlFieldValue_t by its valueType (nvml.h nvmlValueType_t)."""
    kinds = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return float(getattr(f.value, kinds.get(int(f.valueType), "uiVal")))
