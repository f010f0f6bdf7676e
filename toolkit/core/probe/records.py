"""A probe run's records as types: run.json (`RunRecord`) and summary.json (`Summary`); verdict.json is
toolkit.core.probe.verdict.Verdict. The probe store (toolkit/adapters/probe_store.py) is their one reader and
writer; docs/probe.md has every field.

`from_dict` is the migration on read: a record an older toolkit wrote (no `provenance`, no `gaps`, no `server`)
loads with what it lacks at its default and its provenance read once from its `data_source` sentence. `to_dict`
is the file's content. Standard library only: the probe writes these on the GPU box, which has no pydantic.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict, TypeVar, Union, get_args, get_origin, get_type_hints

from toolkit.core.provenance import MEASURED, Provenance, of_record

T = TypeVar("T")


def build(cls: type[T], data: Mapping[str, Any]) -> T:
    """A record dataclass from its JSON object: nested records built the same way, a missing key at the field's
    default, keys the type does not know dropped (a record keeps them in an `extra` field where it must)."""
    hints = get_type_hints(cls)
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data or f.name == "extra":
            continue
        value = data[f.name]
        nested = _record_type(hints[f.name])
        if nested is Provenance:
            continue  # of_record below: the record's own field or its legacy sentence
        kw[f.name] = build(nested, value) if nested is not None and isinstance(value, Mapping) else value
    if "provenance" in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
        kw["provenance"] = of_record(data)
    return cls(**kw)


def _record_type(hint: Any) -> type | None:
    """The dataclass a field holds (itself, or in `X | None`), else None."""
    if get_origin(hint) in (Union, types.UnionType):
        inner = [a for a in get_args(hint) if a is not type(None)]
        hint = inner[0] if len(inner) == 1 else None
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def as_dict(record: Any) -> dict[str, Any]:
    """A record as its JSON object (an `extra` field's keys beside the typed ones)."""
    data = dataclasses.asdict(record)
    extra = data.pop("extra", None) or {}
    return {**extra, **data}


@dataclass(frozen=True)
class RunRecord:
    """run.json: the run's manifest, written when the run starts (status running) and again when it ends."""

    provenance: Provenance = MEASURED
    data_source: str = "measured"  # the provenance in words, for a person reading the file
    status: str | None = None  # running, finished, interrupted, failed
    error: str | None = None  # why it failed (status failed)
    profile: str | None = None
    # the host's name, or the host timeline's facts when it ran (`hostname` then holds the name)
    host: str | dict[str, Any] | None = None
    hostname: str | None = None
    started_at_utc: str | None = None
    gpus: list[int] = field(default_factory=list)
    sample_hz: float | None = None
    idle_s: float | None = None
    command: list[str] = field(default_factory=list)  # secret-looking values replaced by ***
    target: dict[str, Any] = field(default_factory=dict)  # the profile's target and resolved knobs
    steady_state: dict[str, Any] = field(default_factory=dict)  # the steady-window rule's parameters
    idle_start_s: float = 0.0
    idle_end_s: float | None = None
    bench_start_s: float | None = None
    bench_end_s: float | None = None
    exit_code: int | None = None
    interrupted: bool = False
    stderr_tail: str = ""
    server_log_tail: str = ""
    requests_sent: int | None = None
    failed_requests: int | None = None
    server: dict[str, Any] | None = None  # the server timeline's facts, when it ran
    # Every other key, as written: sampler_cost, files, clock, energy_interval_s, toolkit_version, ... and a key
    # a later release adds before it gets a field here.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        return dataclasses.replace(build(cls, data), extra={k: v for k, v in data.items()
                                                            if k not in known and k != "schema_version"})

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)


class PowerStats(TypedDict):
    mean: float | None
    p50: NotRequired[float | None]
    p95: float | None
    max: float | None


class GpuWindowStats(TypedDict):
    """One GPU over one window (toolkit.core.probe.summary.gpu_window_stats): a JSON object in summary.json,
    declared so every read of it is checked. power_sample_w and energy_integrated_sample_j came with the driver's
    20 ms samples (trace schema 2): an older summary lacks them."""

    samples: int
    error_samples: int
    errors_seen: list[str]
    power_w: PowerStats
    power_limit_w: float | None
    power_of_limit: float | None
    idle_power_w: float | None
    energy_j: float | None
    energy_source: str | None
    energy_integrated_j: float | None
    energy_integrated_instant_j: float | None
    energy_integrated_sample_j: NotRequired[float | None]
    power_sample_w: NotRequired[PowerStats | None]
    util_gpu_pct: float | None
    util_mem_pct: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    sm_clock_of_max: float | None
    mem_clock_mhz: float | None
    mem_clock_max_mhz: float | None
    temp_c_max: float | None
    pcie_tx_kib_s: float | None
    pcie_rx_kib_s: float | None
    clock_reasons_seen: dict[str, float]  # reason -> share of the samples
    gpm: dict[str, float | None] | None  # None: GPM unavailable (never zeros)


@dataclass(frozen=True)
class Throughput:
    output_tok_per_s: float | None = None
    total_tok_per_s: float | None = None
    request_per_s: float | None = None
    source: str = ""  # where the rate came from: the benchmark, the server's counter, or why none


@dataclass(frozen=True)
class Window:
    """One window's figures: the whole benchmark (`full`) or the judged window (`steady`)."""

    start_s: float | None = None
    end_s: float | None = None
    duration_s: float | None = None
    throughput: Throughput = field(default_factory=Throughput)
    latency_ms: dict[str, Any] = field(default_factory=dict)  # the benchmark's (whole run only)
    power_w_total_mean: float | None = None
    energy_j_total: float | None = None
    output_tokens: float | None = None
    j_per_output_token: float | None = None
    output_tokens_per_j: float | None = None
    # per GPU (its index as a string): toolkit.core.probe.summary.gpu_window_stats
    gpus: dict[str, GpuWindowStats] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchmarkPart:
    exit_code: int | None = None
    interrupted: bool = False
    stderr_tail: str = ""
    server_log_tail: str = ""
    duration_s: float | None = None
    completed: float | None = None
    requests_sent: int | None = None
    failed_requests: int | None = None
    total_output_tokens: float | None = None
    peak_output_tok_per_s: float | None = None
    keys_present: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class IdlePart:
    start_s: float = 0.0
    end_s: float | None = None
    power_w: dict[str, float | None] = field(default_factory=dict)  # per GPU, the idle baseline's median


@dataclass(frozen=True)
class SteadyStatePart:
    found: bool = False
    reason: str = ""
    signal: str = "gpu activity"
    peak_activity: float | None = None
    threshold: float | None = None
    peak_output_tok_per_s: float | None = None
    gpu_rule: dict[str, Any] | None = None  # what the GPU rule alone found, when the counter decided
    rule: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Summary:
    """summary.json: full-run and judged-window figures (toolkit.core.probe.summary.summarize)."""

    provenance: Provenance = MEASURED
    data_source: str = "measured"
    gpus: list[int] = field(default_factory=list)
    sample_hz: float = 0.0
    benchmark: BenchmarkPart = field(default_factory=BenchmarkPart)
    idle: IdlePart = field(default_factory=IdlePart)
    steady_state: SteadyStatePart = field(default_factory=SteadyStatePart)
    full: Window = field(default_factory=Window)
    steady: Window = field(default_factory=Window)  # the judged window (steady, or the busy span without one)
    server: dict[str, Any] | None = None  # SGLang's own view (server_trace.csv), when recorded
    host: dict[str, Any] | None = None  # the host's CPU (host_trace.csv), when recorded
    gpu_errors: list[dict[str, Any]] = field(default_factory=list)
    gpu_error_count: int = 0
    gaps: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        return build(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return as_dict(self)

    @property
    def judged(self) -> Window:
        """The window a figure is read from: the steady window when found, else the whole run."""
        return self.steady if self.steady_state.found else self.full
