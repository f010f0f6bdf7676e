"""The tune's record (`SweepState.tune`, schema 1) as types: every key the tune loop and its report read is
declared here, so a type checker holds each read to the record's shape, and `tune --json`'s schema is generated
from the same declaration (toolkit/cli/schemas.py).

TypedDicts, not classes: the record is the state file's own JSON, written after every point and read back on a
resume unchanged, so a tune state written before this module loads as it is. Keys only ever added: those a later
release added are NotRequired (an older record lacks them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, cast

try:
    # pydantic builds the --json schemas from these and needs typing_extensions' TypedDict before Python 3.12; the
    # probe's venv on a GPU host has only its runtime packages (wheelhouse.PROBE_REQUIREMENTS), and no schema.
    from typing_extensions import TypedDict
except ModuleNotFoundError:  # pragma: no cover - the host's probe venv
    from typing import TypedDict

from toolkit.core.sweep.state import KnobStepRecord
from toolkit.core.sweep.variants import Scalar

# The keys that are not Python names ("class", "from") make these two functional.
StepVerdict = TypedDict("StepVerdict", {
    "variant": str,  # the incumbent the step started from
    "class": str | None,  # its verdict's class at its scored load
    "headline": str | None,
    "artifacts": str | None,  # the probe run the verdict was read from
    "concurrency": int,
    "request_rate": float | None,
})


class Ladder(TypedDict):
    """One knob step of the verdict: its values not tried yet, the boldest first."""

    knob: str
    why: str | None
    together: dict[str, Scalar]  # knobs that change with it
    profiles: list[str]
    values: list[Scalar]


class Candidate(TypedDict):
    """A variant a step measures: the incumbent's knobs plus one rung of a ladder."""

    variant: int  # its index in the state
    id: str
    knob: str | None  # None: step 0's base
    ladder: NotRequired[int]  # the ladder's index in the step
    change: dict[str, list[Scalar]]  # path -> [old, new]
    why: str | None
    profiles: list[str]
    status: str  # planned, invalid, failed, below, measured
    reason: NotRequired[str]  # why it was not measured, failed, or was not eligible
    value: NotRequired[float]  # in the objective's unit
    concurrency: NotRequired[int]
    request_rate: NotRequired[float | None]
    gain_pct: NotRequired[float]
    verdict: NotRequired[str | None]
    interval: NotRequired[dict[str, float | str] | None]  # toolkit.core.sweep.noise.Interval.to_dict
    goodput: NotRequired[float]


class Skipped(TypedDict):
    knob: str
    value: Scalar
    reason: str


class Remeasured(TypedDict):
    variants: list[str]
    why: str


class IncumbentMoved(TypedDict):
    from_request_rate: float | None
    to_request_rate: float | None
    runs: int
    text: str


class StepResult(TypedDict):
    """What a measured step concluded: the base measured (step 0), an improvement, no gain, or nothing new."""

    decision: str  # base, improved, no-gain, nothing-new, failed
    text: str
    value: NotRequired[float]
    concurrency: NotRequired[int]
    request_rate: NotRequired[float | None]
    goodput: NotRequired[float | None]
    interval: NotRequired[dict[str, float | str] | None]
    incumbent: NotRequired[str]
    incumbent_value: NotRequired[float | None]
    incumbent_interval: NotRequired[dict[str, float | str] | None]
    incumbent_moved: NotRequired[IncumbentMoved]
    band_pct: NotRequired[float]
    best: NotRequired[str]
    gain_pct: NotRequired[float]


class EdgeRecord(TypedDict):
    """toolkit.core.tune.edge.EdgeVerdict.to_dict: the latency that bounds the capacity and the knob it names."""

    binding: str | None  # ttft, itl, e2e; None when nothing could be read
    cause: str
    text: str
    knob_steps: list[KnobStepRecord]


Step = TypedDict("Step", {
    "step": int,
    "from": str | None,  # None: step 0, the base
    "verdict": StepVerdict | None,
    "ladders": NotRequired[list[Ladder]],  # step 0 (the base) has none
    "candidates": list[Candidate],
    "skipped": list[Skipped],
    "result": StepResult | None,
    "edge": NotRequired[EdgeRecord],  # under an SLO
    "remeasured": NotRequired[list[Remeasured]],
})


class RunToRunData(TypedDict):
    cv: float
    df: int


class SloRatioData(TypedDict):
    values: list[float]
    cv: float
    df: int


class NoiseBand(TypedDict):
    """The base's repeated measurements: the band a gain must clear, the run-to-run spread."""

    values: list[float]
    concurrency: int
    request_rate: float | None
    median: float
    spread_pct: float
    band_pct: float
    min_gain_pct: float
    run_to_run: RunToRunData | None
    slo_ratio: SloRatioData | None


class FailedDirection(TypedDict):
    knob: str
    direction: str  # up, down, or =VALUE
    reason: str
    variant: str


StopKind = Literal["converged", "nothing-new", "budget", "base-failed"]


class Stop(TypedDict):
    kind: StopKind
    reason: str


class TuneLog(TypedDict):
    schema_version: int
    objective: str  # throughput, tokens-per-joule, goodput
    repeats: int
    max_repeats: NotRequired[int]
    max_goodput_loss_pct: NotRequired[float]
    min_gain_pct: float
    budget_points: int | None
    incumbent: int | None  # a variant's index
    incumbent_rate: NotRequired[float | None]  # its capacity when it became the incumbent (or last moved)
    noise: NoiseBand | None
    steps: list[Step]
    failed_directions: list[FailedDirection]
    budget_hit: NotRequired[bool]  # a rung was left out for the budget
    repeated: NotRequired[bool]  # the base's capacity measured `repeats` times (under an SLO)
    stop: Stop | None


def as_state(log: TuneLog) -> dict[str, Any]:
    """The record as `SweepState.tune` holds it: plain data, so the sweep's state needs nothing of the tune."""
    return cast(dict[str, Any], log)


def of_state(tune: Mapping[str, Any] | None) -> TuneLog:
    """A state's tune record to read (`SweepState.tune`: the record itself, not a copy); a sweep's state has
    none, and reads as a record with no key, so a report's `.get()` finds nothing."""
    return cast(TuneLog, tune if tune is not None else {})
