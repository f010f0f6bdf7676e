"""NVML, the only importer of `pynvml` (package nvidia-ml-py). NVML errors become toolkit errors here.

A metric a GPU does not offer (NVML_ERROR_NOT_SUPPORTED) is recorded as unavailable (empty), never as zero,
and is not asked for again. Any other NVML error of one GPU is written into a row's `error` cell and the run
goes on: a GPU falling off the bus mid-run must not lose the others' data.

The sampler is built on what each NVML call costs and how often the driver refreshes each value, measured on
the H200 (re-measured by benchmarks/bench_probe.py --fleet):

- power: the driver keeps its own 20 ms power samples (nvmlDeviceGetSamples, NVML_TOTAL_POWER_SAMPLES, a ring
  of ~119 samples = ~2.4 s). A drain costs ~0.55 ms of CPU whether it brings 50 samples or 100 (0.25 ms when
  empty; loads/sampler_breakdown.py on the H200), so drains are as rare as the ring allows: its depth is read
  once per GPU at open (everything it holds) and each GPU is drained every RING_DRAIN_FRACTION of it (1.5 s on
  the H200), with a gap after the last sample seen counted as an overrun that shortens the interval. True 50 Hz
  power with the driver's own timestamps: one trace row per driver sample, `power_sample_w` (schema 2).
  Polling instant power at 50 Hz instead aliased to +10.9 % energy on bursty load (research section 2).
- utilization changes every ~200 ms, the SM clock every ~100 ms, the 1 s averaged power every 100 ms: read at
  TICK_HZ (10 Hz, ~1-3 us each) and carried into the rows between reads.
- GPM at GPM_INTERVAL_S (2.5 Hz): pairs closer than ~100 ms silently read 0 with NVML_SUCCESS; two ping-pong
  sample buffers and one metrics request per GPU, reused. A pair costs ~0.14 ms of CPU under load, a third of
  the thread's cost at 5 Hz with 8 GPUs; 2.5 Hz still gives 2-3 readings per 1 s interval of the verdict.
  GRAPHICS_UTIL is never asked for (1.45 ms a call).
  PCIe and NVLink come from GPM rates; nvmlDeviceGetPcieThroughput (it sleeps ~20 ms) is never called.
- the energy counter costs ~3 ms of CPU a read and moves every ~100 ms: read at the benchmark's start, every
  ENERGY_INTERVAL_S and at the end; energy between reads comes from the 20 ms samples (core/probe/energy.py).
- memory clock, temperature, clock-event reasons, the power limit: every SLOW_INTERVAL_S, empty between
  (the limit, a setting, is carried into every row).

Everything runs in one sampler thread (not one per GPU: 8 threads cost +40 %, research section 6); ctypes
releases the GIL during each NVML call. The hot calls go through the library's function pointers with
out-parameters allocated once per GPU: no allocation per tick on the ctypes side.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.sampler import Row
from toolkit.core.provenance import MEASURED

try:  # imported lazily by the CLI only for `probe run` without a replay trace
    import pynvml
except ImportError:  # pragma: no cover - depends on the machine
    pynvml = None

TICK_HZ = 10.0
POWER_DRAIN_INTERVAL_S = 1.0  # where the ring's depth could not be read: well inside the H200's ~2.36 s
RING_DRAIN_FRACTION = 0.65  # of the ring's depth: 1.53 s on the H200, 0.8 s of slack for a late tick
POWER_DRAIN_MIN_S, POWER_DRAIN_MAX_S = 0.2, 2.0  # the max bounds how late rows reach trace.csv
GPM_INTERVAL_S = 0.4
GPM_MIN_INTERVAL_S = 0.1  # nvml.h: "should be greater than 100ms"
SLOW_INTERVAL_S = 1.0
# With 8 GPUs a read every 20 s is 8 x 3 ms / 20 s = 0.12 % of a core; the 20 ms samples integrate to within
# 0.1-0.6 % of the counter on >= 16 s windows (research section 3), and each window's own edges are read.
ENERGY_INTERVAL_S = 20.0
POWER_SAMPLE_HZ = 50.0  # the driver's period (20 ms on the H200, driver 580); written into the trace header
SAMPLE_BUFFER = 128  # > the ring's 119: one call drains it
_ERR_NOT_SUPPORTED, _ERR_NOT_FOUND = 3, 6  # nvml.h nvmlReturn_t
# nvmlSample_t: {unsigned long long timeStamp; nvmlValue_t sampleValue} (8 + an 8-byte union); power samples are
# unsigned int mW. Decoded from the buffer's bytes in one C-level pass rather than one ctypes object per field.
_SAMPLE = struct.Struct("=QI4x")

_TOPOLOGY_NAMES = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}
# pynvml spells NVML_P2P_CAPS_INDEX_READ as `0,` (a tuple) in nvidia-ml-py 12.x/13.x: use the enum values.
_P2P_READ, _P2P_NVLINK = 0, 2


def _samples_of(buf: Any, n: int) -> Any:
    """(timestamp us, mW) of the first n nvmlSample_t in buf, decoded from its bytes in one C-level pass."""
    return _SAMPLE.iter_unpack(ctypes.string_at(ctypes.addressof(buf), n * _SAMPLE.size))


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
    """One GPU's handle, static facts, reused ctypes buffers and what is waiting to be put into rows."""

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
        self.gpm_request: Any = None  # one c_nvmlGpmMetricsGet_t per GPU, reused: it holds 477 metric slots
        self.power_limit_w: float | None = None
        # out-parameters of the hot calls, allocated once (research section 6)
        self.c_power = ctypes.c_uint()
        self.c_clock = ctypes.c_uint()
        self.c_util: Any = pynvml.c_nvmlUtilization_t() if pynvml is not None else None
        self.c_samples: Any = (pynvml.c_nvmlSample_t * SAMPLE_BUFFER)() if pynvml is not None else None
        self.c_count = ctypes.c_uint()
        self.c_value_type = ctypes.c_uint()
        self.c_last_seen = ctypes.c_ulonglong(0)
        self.p_power = ctypes.pointer(self.c_power)
        self.p_clock = ctypes.pointer(self.c_clock)
        self.p_util = ctypes.pointer(self.c_util) if self.c_util is not None else None
        self.p_count = ctypes.pointer(self.c_count)
        self.p_value_type = ctypes.pointer(self.c_value_type)
        self.drain_next = 0.0  # monotonic time of this GPU's next drain (staggered across GPUs)
        self.drain_interval_s = POWER_DRAIN_INTERVAL_S  # set from the ring's depth at open
        self.drain_phase_s = POWER_DRAIN_INTERVAL_S
        self.ring_depth_s: float | None = None
        self.sample_period_us = 20_000  # the driver's, measured with the depth
        self.ring_samples: int | None = None  # how many it holds, where fewer than SAMPLE_BUFFER
        self.seen_sample = False  # c_last_seen is a sample's own stamp (not the run's start)
        self.overruns = 0
        self.samples_ok = True  # False where the driver keeps no power samples: one row per tick instead
        # (t_s, util_gpu, util_mem, sm_clock, power_w) read at TICK_HZ since the last drain; the last is carried
        self.fast: list[tuple[float, float | None, float | None, float | None, float | None]] = []
        self.pending: list[tuple[float, Row]] = []  # slow, GPM and energy cells, put on the first row at/after t
        self.errors: list[str] = []
        self.lost = False


class NvmlSampler:
    """The real GPUs through NVML, sampled in a thread of its own. Cost: benchmarks/bench_probe.py --fleet."""

    source = "nvml"
    provenance = MEASURED

    def __init__(self, *, gpm: bool = True, energy_interval_s: float = ENERGY_INTERVAL_S,
                 tick_hz: float = TICK_HZ, slow_interval_s: float = SLOW_INTERVAL_S) -> None:
        self._want_gpm = gpm
        self.energy_interval_s = energy_interval_s
        self.tick_hz = tick_hz
        self.slow_interval_s = slow_interval_s
        self.trace_meta = {"sample_hz": f"{POWER_SAMPLE_HZ:g}", "tick_hz": f"{tick_hz:g}",
                           "power_source": "driver_samples"}
        self._gpm_every = max(1, round(GPM_INTERVAL_S * tick_hz))
        self._slow_every = max(1, round(slow_interval_s * tick_hz))
        self._gpus: list[_Gpu] = []
        self._gpm_ids: dict[str, int] = {}
        self._gpm_cols: list[str] = []
        self._open = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rows: list[Row] = []
        self._origin = time.monotonic()
        # No read at the thread's start: the idle baseline needs none. The first is the benchmark's start
        # (bench_started), then every energy_interval_s, and the last at finish: each window's edges.
        self._energy_due = False
        self._energy_last = time.monotonic()
        self._cpu_s = 0.0
        self._ticks = self._late = self._n_samples = self._n_energy = self._n_gpm = 0
        self._first_tick_t = self._last_tick_t = 0.0
        self._states = 0
        self._fn_power: Any = None
        self._fn_util: Any = None
        self._fn_clock: Any = None
        self._fn_samples: Any = None
        self._clock_sm = 0
        self._reasons_fn: Any = None

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
            self._gpm_cols = list(self._gpm_ids)
            self._bind()
            self._gpus = [self._setup(g) for g in chosen]
        except ToolkitError:
            self.close()
            raise
        except pynvml.NVMLError as err:
            self.close()
            raise ToolkitError.of(f"NVML failed while listing GPUs: {_err_text(err)}", field="nvml",
                                  fix="check `nvidia-smi`; a driver/library mismatch needs a reboot") from None
        return chosen

    def _bind(self) -> None:
        """The hot calls' C functions, looked up once (pynvml's wrappers allocate their out-parameters per call)."""
        assert pynvml is not None
        get = pynvml._nvmlGetFunctionPointer
        self._fn_power = get("nvmlDeviceGetPowerUsage")
        self._fn_util = get("nvmlDeviceGetUtilizationRates")
        self._fn_clock = get("nvmlDeviceGetClockInfo")
        self._fn_samples = get("nvmlDeviceGetSamples")
        self._clock_sm = int(pynvml.NVML_CLOCK_SM)
        # Renamed from ...ThrottleReasons in nvidia-ml-py 12.535; older bindings have only the old name.
        self._reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

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
        self._read_ring_depth(g)
        return g

    def _read_ring_depth(self, g: _Gpu) -> None:
        """Everything the driver's power ring holds, once: its depth sets how often this GPU is drained."""
        g.c_count.value = SAMPLE_BUFFER
        g.c_last_seen.value = 0
        ret = self._fn_samples(g.handle, 0, g.c_last_seen, g.p_value_type, g.p_count, g.c_samples)
        n = g.c_count.value
        if ret == _ERR_NOT_SUPPORTED:
            g.samples_ok = False  # no power samples on this GPU: a row per tick, and never asked again
            return
        if ret != 0 or n < 10:
            return  # no samples (the first drain finds out why) or a ring still filling: the default interval
        stamps = [ts for ts, _ in _samples_of(g.c_samples, n)]
        span_us = stamps[-1] - stamps[0]
        if span_us <= 0:
            return
        # A full buffer means a ring at least this deep: the interval stays on the safe side either way.
        g.ring_depth_s = span_us / 1e6
        g.sample_period_us = max(1, span_us // (n - 1))
        g.ring_samples = n if n < SAMPLE_BUFFER else None
        g.drain_interval_s = min(POWER_DRAIN_MAX_S, max(POWER_DRAIN_MIN_S, RING_DRAIN_FRACTION * g.ring_depth_s))

    def close(self) -> None:
        if pynvml is None or not self._open:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
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

    # -- the sampler thread -------------------------------------------------------------------------------------
    def bench_started(self, t_s: float) -> None:
        self._energy_due = True  # a counter read at the benchmark's start: its window's first edge

    def sample(self, t_s: float) -> list[Row]:
        """Rows the sampler thread made since the last call (started on the first call, on the caller's clock).

        Power rows arrive up to a drain interval late (0.65 of the ring: 1.53 s on the H200); `finish` takes
        the rest."""
        if self._thread is None:
            now = time.monotonic()
            self._origin = now - t_s
            self._energy_last = now
            self._states = len(self._gpus)
            for i, g in enumerate(self._gpus):  # the ring holds ~2.4 s from before the run: start from now
                g.c_last_seen.value = time.time_ns() // 1000
                # A first drain at the first tick finds out whether the driver keeps samples; then staggered.
                g.drain_next = now
                g.drain_phase_s = g.drain_interval_s * (1 + i) / len(self._gpus)
            self._thread = threading.Thread(target=self._run, name="toolkit-nvml-sampler", daemon=True)
            self._thread.start()
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def finish(self, t_s: float) -> list[Row]:
        """Stop the thread, read the energy counter once more and drain every GPU: the last rows of the run."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            c0 = time.thread_time()
            self._energy_due = True
            self._tick(-1, final=True)
            self._cpu_s += time.thread_time() - c0
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def cost(self) -> dict[str, Any]:
        """The sampler thread's own CPU time (time.thread_time), for run.json's sampler_cost."""
        wall = (self._last_tick_t - self._first_tick_t) if self._ticks else 0.0
        return {
            "thread": "toolkit-nvml-sampler",
            "thread_cpu_s": round(self._cpu_s, 4),
            "thread_wall_s": round(wall, 3),
            "thread_cpu_share_of_one_core": round(self._cpu_s / wall, 5) if wall > 0 else None,
            "gpu_states": self._states,
            "thread_ticks": self._ticks,
            "thread_late_ticks": self._late,
            "tick_hz": self.tick_hz,
            "power_samples": self._n_samples,
            "energy_reads": self._n_energy,
            "gpm_reads": self._n_gpm,
            "power_ring_depth_s": min((round(g.ring_depth_s, 3) for g in self._gpus if g.ring_depth_s), default=None),
            "power_drain_interval_s": min((round(g.drain_interval_s, 3) for g in self._gpus), default=None),
            "power_ring_overruns": sum(g.overruns for g in self._gpus),
        }

    def _run(self) -> None:
        period = 1.0 / self.tick_hz
        start = time.monotonic()
        self._first_tick_t = start
        k = 0
        while not self._stop.is_set():
            wait = start + k * period - time.monotonic()
            if wait > 0:
                if self._stop.wait(wait):
                    break
            elif -wait > period:
                self._late += 1
                k = int((time.monotonic() - start) / period)  # skip missed ticks rather than burst
            c0 = time.thread_time()
            self._tick(k)
            self._cpu_s += time.thread_time() - c0
            self._ticks += 1
            self._last_tick_t = time.monotonic()
            k += 1

    def _tick(self, k: int, *, final: bool = False) -> None:
        now = time.monotonic()
        t = now - self._origin
        energy = self._energy_due or now - self._energy_last >= self.energy_interval_s
        if energy:
            self._energy_due = False
            self._energy_last = now
        rows: list[Row] = []
        for i, g in enumerate(self._gpus):
            if not self._read_fast(g, t):
                # The error row goes at t, so every power sample before t must be in the trace first: rows of a
                # GPU are in time order (the reader refuses a t_s that goes backwards). Drain what the driver
                # has; if that fails too, skip the samples older than t that it still holds (lost with the
                # failure) rather than emit them after the error row once NVML answers again.
                if g.samples_ok:
                    self._drain(g, rows)
                    g.c_last_seen.value = max(g.c_last_seen.value, time.time_ns() // 1000)
                    g.seen_sample = False  # the skip is not an overrun of the ring
                rows.append({"t_s": t, "gpu": g.index, "error": "; ".join(g.errors)[:300]})
                g.errors.clear()
                continue
            if g.gpm and (final or (k + i) % self._gpm_every == 0):
                self._gpm(g, t, now)
            if final or (k + i) % self._slow_every == 0:
                self._read_slow(g, t)
            if energy:
                self._read_energy(g, t)
            # Drains go by time, not tick count: a skipped tick must not push one past the ring's ~2.4 s.
            if g.samples_ok and (final or now >= g.drain_next):
                g.drain_next = max(g.drain_next + g.drain_phase_s, now + 0.1)
                g.drain_phase_s = g.drain_interval_s
                self._drain(g, rows)
            if not g.samples_ok or (final and (g.pending or g.errors)):
                # No driver samples on this GPU (a row per tick from the polled readings), or the run's last
                # reads came after its last sample: a row of their own at t.
                rows.append(self._tick_row(g, t))
        if rows:
            with self._lock:
                self._rows.extend(rows)

    def _fail(self, g: _Gpu, key: str, ret: int) -> None:
        assert pynvml is not None
        if ret == _ERR_NOT_SUPPORTED:
            g.unsupported.add(key)
        else:
            g.errors.append(f"{key}: {_err_text(pynvml.NVMLError(ret))}")

    def _read_fast(self, g: _Gpu, t: float) -> bool:
        """Power (1 s average), utilization and SM clock; False when the GPU answers nothing (lost)."""
        h = g.handle
        power = util_g = util_m = clock = None
        if "power" not in g.unsupported:
            ret = self._fn_power(h, g.p_power)
            if ret == 0:
                power = g.c_power.value / 1000.0
            elif ret != _ERR_NOT_SUPPORTED:
                # Lost GPU or driver gone: record it once for this tick, not a dozen more failing calls.
                self._fail(g, "power", ret)
                return False
            else:
                g.unsupported.add("power")
        if "util" not in g.unsupported:
            ret = self._fn_util(h, g.p_util)
            if ret == 0:
                util_g, util_m = float(g.c_util.gpu), float(g.c_util.memory)
            else:
                self._fail(g, "util", ret)
        if "sm_clock" not in g.unsupported:
            ret = self._fn_clock(h, self._clock_sm, g.p_clock)
            if ret == 0:
                clock = float(g.c_clock.value)
            else:
                self._fail(g, "sm_clock", ret)
        g.fast.append((t, util_g, util_m, clock, power))
        return True

    def _read(self, g: _Gpu, key: str, fn: Callable[[], Any]) -> Any:
        if key in g.unsupported:
            return None
        assert pynvml is not None
        try:
            return fn()
        except pynvml.NVMLError as err:
            if _not_supported(err):
                g.unsupported.add(key)
            else:
                g.errors.append(f"{key}: {_err_text(err)}")
            return None

    def _read_slow(self, g: _Gpu, t: float) -> None:
        """The readings taken every SLOW_INTERVAL_S: they move slowly or are settings."""
        assert pynvml is not None
        nv = pynvml
        h = g.handle
        lim = self._read(g, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        g.power_limit_w = lim / 1000.0 if lim is not None else None
        cells: Row = {
            "mem_clock_mhz": self._read(g, "mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            "temp_c": self._read(g, "temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        }
        if self._reasons_fn is not None:
            fn = self._reasons_fn
            cells["clock_reasons"] = self._read(g, "reasons", lambda: fn(h))
        g.pending.append((t, cells))

    def _read_energy(self, g: _Gpu, t: float) -> None:
        assert pynvml is not None
        h = g.handle
        e = self._read(g, "energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
        if e is not None:
            self._n_energy += 1
            g.pending.append((t, {"energy_j": e / 1000.0}))

    def _gpm(self, g: _Gpu, t: float, now: float) -> None:
        assert pynvml is not None
        if now - g.gpm_prev_t < GPM_MIN_INTERVAL_S:
            return  # a pair closer than ~100 ms reads 0 with NVML_SUCCESS: skip rather than record a false 0
        try:
            pynvml.nvmlGpmSampleGet(g.handle, g.gpm_spare)
            cols = self._gpm_cols
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
        except pynvml.NVMLError as err:
            g.errors.append(f"gpm: {_err_text(err)}")
            return
        cells: Row = {}
        for i, col in enumerate(cols):
            m = mg.metrics[i]
            if m.nvmlReturn == 0:
                cells[col] = float(m.value)
        g.pending.append((t, cells))
        self._n_gpm += 1
        g.gpm_prev, g.gpm_spare = g.gpm_spare, g.gpm_prev
        g.gpm_prev_t = now

    def _drain(self, g: _Gpu, rows: list[Row]) -> None:
        """Every power sample the driver took since the last drain, one row each, on the run's clock."""
        samples: list[tuple[float, float]] = []
        buf = g.c_samples
        while True:
            g.c_count.value = SAMPLE_BUFFER
            ret = self._fn_samples(g.handle, 0, g.c_last_seen, g.p_value_type, g.p_count, buf)
            if ret == _ERR_NOT_FOUND:
                break  # no sample since lastSeen: 0 new, not an error
            if ret != 0:
                if ret == _ERR_NOT_SUPPORTED:
                    g.samples_ok = False
                else:
                    self._fail(g, "power_samples", ret)
                break
            n = g.c_count.value
            # NVML stamps are wall-clock microseconds; map them onto the run's monotonic clock at this drain.
            shift = time.time() - time.monotonic() + self._origin
            last = first = g.c_last_seen.value
            for ts, mw in _samples_of(buf, n):
                if ts > last:
                    if last == first and g.seen_sample and self._lost(g, n, ts - last):
                        self._overrun(g)
                    samples.append((ts * 1e-6 - shift, mw / 1000.0))
                    last = ts
            if last != first:
                g.seen_sample = True
            g.c_last_seen.value = last
            if n < SAMPLE_BUFFER:
                break  # the oldest come first when more are pending than fit: loop until the rest is in
        self._n_samples += len(samples)
        if samples:
            rows.extend(self._rows_of(g, samples))

    @staticmethod
    def _lost(g: _Gpu, n: int, gap_us: int) -> bool:
        """Whether the ring dropped samples between lastSeen and the first it returned. The driver's stamps jitter
        (gaps of 17-44 ms at a 20 ms period on the H200), so a gap alone says so only past 3 periods; a drain
        that found the ring full says so past 1.5."""
        full = g.ring_samples is not None and n >= g.ring_samples
        return gap_us > (1.5 if full else 3.0) * g.sample_period_us

    def _overrun(self, g: _Gpu) -> None:
        """The ring dropped samples between two drains (the thread was late, or the ring is shallower than it
        read): counted in sampler_cost, and this GPU is drained more often from now on."""
        g.overruns += 1
        g.drain_interval_s = max(POWER_DRAIN_MIN_S, g.drain_interval_s * 0.7)
        g.drain_phase_s = g.drain_interval_s
        g.drain_next = min(g.drain_next, time.monotonic() + g.drain_interval_s)  # already set from the old one

    def _base(self, g: _Gpu, t: float, fast: tuple[float, float | None, float | None, float | None, float | None]
              ) -> Row:
        return {"t_s": t, "gpu": g.index, "power_w": fast[4], "power_limit_w": g.power_limit_w,
                "util_gpu_pct": fast[1], "util_mem_pct": fast[2], "sm_clock_mhz": fast[3],
                "sm_clock_max_mhz": g.sm_max_mhz, "mem_clock_max_mhz": g.mem_max_mhz}

    def _rows_of(self, g: _Gpu, samples: list[tuple[float, float]]) -> list[Row]:
        """Power samples to rows: the polled readings carried from the last read at or before each sample, the
        slow/GPM/energy cells on the first sample at or after their read, errors on the first row."""
        fast, pending = g.fast, g.pending
        fi, pi = 0, 0
        out: list[Row] = []
        for t, p in samples:
            while fi + 1 < len(fast) and fast[fi + 1][0] <= t:
                fi += 1
            row: Row = self._base(g, t, fast[fi]) if fast else {"t_s": t, "gpu": g.index}
            row["power_sample_w"] = p
            while pi < len(pending) and pending[pi][0] <= t:
                row.update(pending[pi][1])
                pi += 1
            out.append(row)
        if g.errors:
            out[0]["error"] = "; ".join(g.errors)[:300]
            g.errors.clear()
        g.fast = fast[fi:] if fast else fast
        g.pending = pending[pi:]
        return out

    def _tick_row(self, g: _Gpu, t: float) -> Row:
        row = self._base(g, t, g.fast[-1])
        for _, cells in g.pending:
            row.update(cells)
        g.pending.clear()
        g.fast = g.fast[-1:]
        if g.errors:
            row["error"] = "; ".join(g.errors)[:300]
            g.errors.clear()
        return row

