"""The probe's data model: one GPU's samples as columns (`GpuSeries`), all GPUs' (`Trace`), and the columns
themselves. Plain data with no imports of the probe's other modules, so every module that reads a trace (the
file format in trace.py, the numpy path in columnar.py, the summary and the verdict) depends on this one and
not on each other.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field

# Column order is part of the schema. Units are in the names. Schema 2 = schema 1's columns plus those in
# COLUMNS_ADDED_V2, just before `error`; a schema-1 file reads with the added columns empty.
COLUMNS_V1: tuple[str, ...] = (
    "t_s",  # seconds since the run's start (time.monotonic() of the probe process)
    "gpu",  # NVML index
    "power_w",  # nvmlDeviceGetPowerUsage: a ~1 s average on Ampere and newer
    "power_instant_w",  # NVML_FI_DEV_POWER_INSTANT where offered
    "power_limit_w",  # nvmlDeviceGetEnforcedPowerLimit
    "energy_j",  # nvmlDeviceGetTotalEnergyConsumption (since driver load); energy = deltas of this
    "util_gpu_pct",  # share of time any kernel ran (one spinning kernel reads 100)
    "util_mem_pct",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "mem_clock_max_mhz",
    "clock_reasons",  # nvmlDeviceGetCurrentClocksEventReasons bit mask, decimal
    "temp_c",
    "pcie_tx_kib_s",
    "pcie_rx_kib_s",
    "gpm_sm_util_pct",  # GPM (Hopper and newer), over the interval since the previous GPM sample
    "gpm_sm_occupancy_pct",
    "gpm_tensor_util_pct",
    "gpm_dram_bw_util_pct",
    "gpm_pcie_tx_mib_s",
    "gpm_pcie_rx_mib_s",
    "gpm_nvlink_tx_mib_s",
    "gpm_nvlink_rx_mib_s",
    "error",  # the NVML error of this GPU at this tick, else empty
)
COLUMNS_ADDED_V2: tuple[str, ...] = (
    # The driver's own 20 ms power sample (nvmlDeviceGetSamples, NVML_TOTAL_POWER_SAMPLES) taken at t_s: in
    # schema 2 NVML traces there is one row per such sample (50 Hz), the polled readings carried between reads.
    "power_sample_w",
)
COLUMNS: tuple[str, ...] = COLUMNS_V1[:-1] + COLUMNS_ADDED_V2 + ("error",)
COLUMNS_BY_VERSION: dict[int, tuple[str, ...]] = {1: COLUMNS_V1, 2: COLUMNS}
NUMERIC_COLUMNS: tuple[str, ...] = COLUMNS[2:-1]

# Clock-event reason bits (nvml.h, NVML_CLOCKS_EVENT_REASON_*).
REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass
class GpuSeries:
    """One GPU's samples as columns (parallel lists); None = unavailable."""

    gpu: int
    t_s: list[float] = field(default_factory=list)
    # a dict of lists, or columnar.ColumnValues (numpy arrays behind the same mapping) from the numpy parse
    values: MutableMapping[str, list[float | None]] = field(
        default_factory=lambda: {c: [] for c in NUMERIC_COLUMNS})
    errors: list[str] = field(default_factory=list)  # "" where the tick had no error

    def __len__(self) -> int:
        return len(self.t_s)


@dataclass
class Trace:
    """All GPUs' samples plus the header's metadata (sample_hz, source)."""

    meta: dict[str, str]
    gpus: dict[int, GpuSeries]

    @property
    def recorded(self) -> bool:
        return self.meta.get("source", "nvml") != "nvml"
