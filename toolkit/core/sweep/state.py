"""The resumable state of one sweep: what was planned, what finished, what failed and why.

Pure data with a versioned dict form. The sweep store adapter writes it atomically after every point,
so an interrupted sweep (Ctrl-C, SIGKILL, a lost SSH session) resumes from the last finished point.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, cast

try:
    # pydantic builds the --json schemas from these and needs typing_extensions' TypedDict before Python 3.12; the
    # probe's venv on a GPU host has only its runtime packages (wheelhouse.PROBE_REQUIREMENTS), and no schema.
    from typing_extensions import TypedDict
except ModuleNotFoundError:  # pragma: no cover - the host's probe venv
    from typing import TypedDict

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.provenance import MEASURED, Provenance, of_record
from toolkit.core.sweep.variants import Axis, PlannedVariant, Scalar, Variant, canonical, format_value

# 2: a point may carry `request_rate` (a capacity search's Poisson rate) and the state `capacity` (the search's
# parameters); a state of schema 1 has neither and reads unchanged.
STATE_SCHEMA_VERSION = 2

# Point statuses.
PENDING = "pending"
DONE = "done"
FAILED = "failed"
# Variant statuses that mean "not measured, on purpose".
INVALID = "invalid"
OVER_BUDGET = "over_budget"
PLANNED = "planned"


def spec_hash(spec: Mapping[str, Any]) -> str:
    """Hash of a resolved spec: resuming against a base profile that changed since would mix two baselines."""
    return hashlib.sha256(canonical(spec).encode()).hexdigest()[:16]


class KnobStepRecord(TypedDict, total=False):
    """One of the verdict's next steps as verdict.json writes it (toolkit.core.probe.knobs.KnobStep.to_dict) and a
    measurement keeps it: what `toolkit tune` turns into its next variants. A recorded table may give only some keys
    (a knob and its proposed values), so none is required."""

    knob: str  # dotted path into the profile
    current: Scalar | None
    current_source: str
    proposed: list[Scalar]
    why: str
    evidence: dict[str, Any]
    together: dict[str, Scalar]  # knobs that change with it
    profiles: list[str]
    profile_why: str | None
    sweep_args: list[str]


class CapacityOfVariant(TypedDict):
    """Where one variant's capacity search starts (req/s), the floor it may not go below, the rate it must beat, and
    whether it is held at its start (a tokens-per-joule candidate at the incumbent's capacity)."""

    start: float | None
    floor: float | None
    beat: float | None
    hold: NotRequired[bool]


class CapacityRecord(TypedDict):
    """The state's `capacity` (toolkit.core.sweep.capacity.CapacityParams.to_dict, and each variant's search): the
    SLO and the search's parameters. Keys only ever added: an older record lacks the later ones."""

    schema: NotRequired[int]
    slo: dict[str, float]  # bound (ms) by latency and percentile: ttft_p99_ms ...
    rate_start: NotRequired[float | None]
    start_fraction: NotRequired[float]
    step: NotRequired[float]
    known_step: NotRequired[float]
    tolerance_pct: NotRequired[float]
    max_rounds: NotRequired[int]
    min_rate: NotRequired[float]
    confirm_runs: NotRequired[int]
    variants: NotRequired[dict[str, CapacityOfVariant]]  # by variant id


@dataclass
class Measurement:
    """What one probe run of one variant at one concurrency level gave (units in the names)."""

    steady_output_tok_per_s: float
    output_tok_per_s: float | None = None  # over the whole run, ramp and drain included
    steady_total_tok_per_s: float | None = None
    tokens_per_j: float | None = None  # output tokens per joule of all GPUs, steady window
    energy_per_output_token_j: float | None = None
    power_w_total: float | None = None  # all GPUs together, mean over the steady window
    gpu_count: int | None = None  # how many GPUs power_w_total is summed over (None: not recorded)
    verdict: str | None = None
    # Where the numbers come from, declared by the runner that made them; shown with them.
    provenance: Provenance = MEASURED
    # "steady" when the probe found a plateau; "full" when it did not and the rate is the whole run's.
    throughput_window: str = "steady"
    # The verdict's machine-readable next steps (verdict.json `knob_steps`) and its headline: what `toolkit tune`
    # turns into its next variants. Empty for a recorded table that has none.
    knob_steps: list[KnobStepRecord] = field(default_factory=list)
    verdict_headline: str | None = None
    # The load: the Poisson request rate bench_serving offered (req/s; None: every request at once, as the seed's
    # `--request-rate inf`), and the requests completed per second over the run.
    request_rate: float | None = None
    request_per_s: float | None = None
    # Latency percentiles from the benchmark's per-request results: {"ttft": {"p50": ms, "p99": ms}, "itl": ...,
    # "e2e": ...}, and where they come from.
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    latency_source: str | None = None
    # Output tok/s of each `interval_s` of the steady window, in order: the run's own spread, for the confidence
    # interval of its throughput (toolkit.core.sweep.noise).
    interval_tok_per_s: list[float] = field(default_factory=list)
    interval_s: float | None = None
    # The power limit each GPU ran under (W), and the server's state where the verdict held (running, cap, queue,
    # KV usage, demand): what the verdict at the SLO's edge reads.
    power_limit_w: float | None = None
    server: dict[str, Any] = field(default_factory=dict)

    def non_finite(self) -> list[str]:
        """Names of numeric fields that are NaN or infinite (a benchmark that produced NaN is a failure)."""
        bad = []
        for name, value in asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                bad.append(name)
        return bad

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        known = {f for f in cls.__dataclass_fields__}
        # A state written before `provenance` says it in its `data_source` sentence: read once, written typed.
        return cls(**{**{k: v for k, v in data.items() if k in known}, "provenance": of_record(data)})


@dataclass
class Point:
    """One variant at one concurrency level."""

    concurrency: int
    status: str = PENDING
    reason: str | None = None
    measurement: Measurement | None = None
    artifacts: str | None = None
    duration_s: float | None = None
    attempts: int = 0  # incremented before each start: a pending point with attempts > 0 was interrupted
    repeat: int = 0  # the n-th measurement of the same variant at the same level (tune measures its base again)
    request_rate: float | None = None  # a capacity search's offered Poisson rate (req/s); None: closed loop

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Point:
        m = data.get("measurement")
        return cls(
            concurrency=int(data["concurrency"]),
            status=str(data.get("status", PENDING)),
            reason=data.get("reason"),
            measurement=Measurement.from_dict(m) if m else None,
            artifacts=data.get("artifacts"),
            duration_s=data.get("duration_s"),
            attempts=int(data.get("attempts", 0)),
            repeat=int(data.get("repeat", 0)),
            request_rate=None if data.get("request_rate") is None else float(data["request_rate"]),
        )


@dataclass
class VariantState:
    index: int
    knobs: list[tuple[str, Scalar]]
    status: str  # planned | invalid | over_budget
    points: list[Point] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)  # validation problems (warnings too)
    failure: str | None = None  # the whole variant failed (e.g. the server did not come up)

    @property
    def variant(self) -> Variant:
        return Variant(index=self.index, knobs=tuple((p, v) for p, v in self.knobs))

    @property
    def id(self) -> str:
        return self.variant.id

    @property
    def label(self) -> str:
        return self.variant.label

    @property
    def outcome(self) -> str:
        """invalid, over_budget, pending, done, failed, or partial (some levels failed)."""
        if self.status != PLANNED:
            return self.status
        statuses = {p.status for p in self.points}
        if PENDING in statuses:
            return PENDING
        if statuses == {DONE}:
            return DONE
        if statuses == {FAILED}:
            return FAILED
        return "partial"

    def rejected_by(self) -> list[str]:
        """The rule ids (or messages) that made this variant invalid."""
        return [str(p.get("rule_id") or p.get("message")) for p in self.problems if p.get("severity") == "error"]


@dataclass
class SweepState:
    run_id: str
    profile: str
    base_spec_hash: str
    axes: list[Axis]
    concurrency: list[int]
    created: str
    runner: str
    budget: int | None = None
    variants: list[VariantState] = field(default_factory=list)
    schema_version: int = STATE_SCHEMA_VERSION
    # `toolkit tune`'s own record (its steps, noise band, failed directions; toolkit.core.tune.log), plain data so
    # this module needs nothing of the tune; None for a sweep.
    tune: dict[str, Any] | None = None
    # The capacity search's parameters (toolkit.core.sweep.capacity: the SLO, the start, the steps, the tolerance,
    # the rounds), None when the objective needs none.
    capacity: CapacityRecord | None = None

    # -- queries -----------------------------------------------------------------------------------------

    def planned(self) -> list[VariantState]:
        return [v for v in self.variants if v.status == PLANNED]

    def pending(self) -> list[tuple[VariantState, Point]]:
        return [(v, p) for v in self.planned() for p in v.points if p.status == PENDING]

    def finished_points(self) -> list[tuple[VariantState, Point]]:
        return [(v, p) for v in self.planned() for p in v.points if p.status != PENDING]

    def variant(self, index: int) -> VariantState:
        for v in self.variants:
            if v.index == index:
                return v
        raise KeyError(index)

    # -- dict form ---------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Stable key order and plain types, so two saves of the same state are byte-identical."""
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "profile": self.profile,
            "base_spec_hash": self.base_spec_hash,
            "created": self.created,
            "runner": self.runner,
            "budget": self.budget,
            "axes": [a.to_dict() for a in self.axes],
            "concurrency": list(self.concurrency),
            "variants": [
                {
                    "index": v.index,
                    "id": v.id,
                    "knobs": [[p, val] for p, val in v.knobs],
                    "status": v.status,
                    "failure": v.failure,
                    "problems": v.problems,
                    "points": [_point_dict(p) for p in v.points],
                }
                for v in self.variants
            ],
            **({"capacity": self.capacity} if self.capacity is not None else {}),
            **({"tune": self.tune} if self.tune is not None else {}),
        }


def _point_dict(p: Point) -> dict[str, Any]:
    d = asdict(p)
    if p.request_rate is None:
        del d["request_rate"]  # a closed-loop point, as every point of schema 1
    if p.duration_s is not None:
        d["duration_s"] = round(p.duration_s, 3)
    return d


def problem_dict(p: Problem) -> dict[str, Any]:
    return {"rule_id": p.rule_id, "severity": p.severity, "field": p.field, "message": p.message, "fix": p.fix}


def new_state(
    *,
    run_id: str,
    profile: str,
    base_spec: Mapping[str, Any],
    axes: Sequence[Axis],
    planned: Sequence[PlannedVariant],
    concurrency: Sequence[int],
    created: str,
    runner: str,
    budget: int | None = None,
) -> SweepState:
    """A fresh state: valid variants planned (the first `budget` of them), invalid ones kept with their rules."""
    levels = check_concurrency(concurrency)
    if budget is not None and budget < 1:
        raise ToolkitError.of(f"budget {budget} measures nothing", field="--budget", fix="give at least 1")
    state = SweepState(
        run_id=run_id,
        profile=profile,
        base_spec_hash=spec_hash(base_spec),
        axes=list(axes),
        concurrency=levels,
        created=created,
        runner=runner,
        budget=budget,
    )
    for pv in planned:
        v = VariantState(
            index=pv.variant.index,
            knobs=list(pv.variant.knobs),
            status=PLANNED if pv.valid else INVALID,
            problems=[problem_dict(p) for p in pv.problems],
        )
        state.variants.append(v)
    apply_budget(state, budget)
    return state


def apply_budget(state: SweepState, budget: int | None) -> None:
    """Plan the first `budget` valid variants (all when None); the rest wait as over_budget.

    A resume may raise the budget: variants over the old one are planned then, finished ones are kept.
    """
    state.budget = budget
    allowed = 0
    for v in state.variants:
        if v.status == INVALID:
            continue
        started = any(p.status != PENDING or p.attempts for p in v.points)
        if budget is None or allowed < budget or started:
            allowed += 1
            if v.status != PLANNED or not v.points:
                v.status = PLANNED
                v.points = [Point(concurrency=c) for c in state.concurrency]
        else:
            v.status = OVER_BUDGET
            v.points = []


def retry_failed(state: SweepState) -> int:
    """Make every failed point pending again (a resume after fixing the host); returns how many."""
    n = 0
    for v in state.planned():
        v.failure = None
        for p in v.points:
            if p.status == FAILED:
                p.status, p.reason, p.measurement, p.duration_s = PENDING, None, None, None
                n += 1
    return n


def check_concurrency(levels: Sequence[int]) -> list[int]:
    out: list[int] = []
    for c in levels:
        if int(c) < 1:
            raise ToolkitError.of(
                f"concurrency {c} is not a positive count", field="--concurrency", fix="e.g. 64,256,1024"
            )
        if int(c) in out:
            raise ToolkitError.of(f"concurrency {c} is listed twice", field="--concurrency", fix="list each level once")
        out.append(int(c))
    if not out:
        raise ToolkitError.of("no concurrency levels", field="--concurrency", fix="e.g. --concurrency 64,256,1024")
    return out


def parse_concurrency(text: str) -> list[int]:
    try:
        return check_concurrency([int(x) for x in text.split(",") if x.strip()])
    except ValueError:
        raise ToolkitError.of(
            f"{text!r} is not a list of whole numbers", field="--concurrency", fix="e.g. --concurrency 64,256,1024"
        ) from None


def state_from_dict(data: Any, *, file: str) -> SweepState:
    """Read a state file's contents, migrating older schema versions and refusing newer ones."""
    if not isinstance(data, Mapping):
        raise ToolkitError.of("a sweep state must be a JSON object", file=file, fix="restore it or start a new sweep")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise ToolkitError.of("no schema_version", file=file, field="schema_version", fix="start a new sweep")
    if version > STATE_SCHEMA_VERSION:
        raise ToolkitError.of(
            f"written by a newer toolkit (schema {version}; this one reads up to {STATE_SCHEMA_VERSION})",
            file=file,
            field="schema_version",
            fix="upgrade the toolkit to resume this sweep",
        )
    try:
        axes = [Axis(path=str(a["path"]), values=tuple(a["values"])) for a in data["axes"]]
        variants = [
            VariantState(
                index=int(v["index"]),
                knobs=[(str(p), val) for p, val in v["knobs"]],
                status=str(v["status"]),
                points=[Point.from_dict(p) for p in v.get("points", [])],
                problems=list(v.get("problems", [])),
                failure=v.get("failure"),
            )
            for v in data["variants"]
        ]
        return SweepState(
            run_id=str(data["run_id"]),
            profile=str(data["profile"]),
            base_spec_hash=str(data["base_spec_hash"]),
            axes=axes,
            concurrency=[int(c) for c in data["concurrency"]],
            created=str(data.get("created", "")),
            runner=str(data.get("runner", "")),
            budget=data.get("budget"),
            variants=variants,
            schema_version=STATE_SCHEMA_VERSION,
            tune=dict(data["tune"]) if isinstance(data.get("tune"), Mapping) else None,
            capacity=cast(CapacityRecord, dict(data["capacity"])) if isinstance(data.get("capacity"), Mapping)
            else None,
        )
    except ToolkitError as err:  # a value the state's types refuse (a provenance kind): name the file
        for problem in err.problems:
            problem.file = file
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ToolkitError.of(
            f"malformed sweep state ({type(exc).__name__}: {exc})", file=file, fix="restore it or start a new sweep"
        ) from None


def check_resume(
    state: SweepState,
    *,
    file: str,
    base_spec: Mapping[str, Any],
    axes: Sequence[Axis] | None,
    concurrency: Sequence[int] | None,
) -> None:
    """Refuse to resume a sweep whose definition would change under it (mixed results would be ranked)."""
    problems: list[Problem] = []
    if spec_hash(base_spec) != state.base_spec_hash:
        problems.append(
            Problem(
                f"profile {state.profile} changed since this sweep started (spec hash {spec_hash(base_spec)}, "
                f"the sweep measured {state.base_spec_hash})",
                file=file,
                field="base_spec_hash",
                fix="restore the profile as it was, or start a new sweep",
            )
        )
    if axes is not None and [a.to_dict() for a in axes] != [a.to_dict() for a in state.axes]:
        was = " ".join(f"--vary {a.path}={','.join(format_value(x) for x in a.values)}" for a in state.axes)
        problems.append(
            Problem("--vary differs from the sweep being resumed", file=file, field="axes", fix=f"use {was}")
        )
    if concurrency is not None and list(concurrency) != state.concurrency:
        problems.append(
            Problem(
                "--concurrency differs from the sweep being resumed",
                file=file,
                field="concurrency",
                fix=f"use --concurrency {','.join(map(str, state.concurrency))} or leave it out",
            )
        )
    if problems:
        raise ToolkitError(problems)
