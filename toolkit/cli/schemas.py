"""The JSON Schema of every `--json` kind (docs/schemas/KIND.schema.json), generated from the types here.

`scripts/json_schemas.py` rewrites docs/schemas/; `--check` exits 1 when a committed schema differs from the
generated one (tests/cli/test_json_contract.py runs it). A kind's data is described by the type its command builds
it from: the pydantic model where there is one (a results entry), else a TypedDict or dataclass written here or in
core. A kind marked open (`dict[str, Any]`) promises its envelope only, until its data gets a type.

Imported by the generator and the tests only, never by a command: `toolkit probe` runs where pydantic is not.
"""

from __future__ import annotations

import dataclasses
import json
from types import GenericAlias
from typing import Any, Literal, NotRequired, get_type_hints

from pydantic import TypeAdapter
from typing_extensions import TypedDict

from toolkit.cli.envelope import SCHEMA_VERSIONS
from toolkit.core.doctor import Check
from toolkit.core.engine_lock import LockRefusal
from toolkit.core.errors import Problem
from toolkit.core.hostplan import plan as hostplan
from toolkit.core.hostplan.facts import HostFacts
from toolkit.core.profile.diff import KnobChange, ProfileDiff
from toolkit.core.profile.migrate import Change
from toolkit.core.profile.model import Profile
from toolkit.core.provenance import ProvenanceKind
from toolkit.core.results.comparable import Workload
from toolkit.core.results.model import ResultsEntry
from toolkit.core.sweep import ranking
from toolkit.core.sweep.state import KnobStepRecord
from toolkit.core.sweep.variants import Scalar
from toolkit.core.tune import log as tune_log

Open = dict[str, Any]  # data not typed yet: the envelope is the promise


class ErrorData(TypedDict):
    code: Literal["bad_input", "failed", "interrupted", "usage", "error"]
    exit_code: int
    message: str
    field: str | None
    fix: str | None
    problems: list[Problem]


class ProfileRow(TypedDict):
    name: str
    extends: str | None
    sglang_version: str | None
    description: str


class UnreadableProfileRow(TypedDict):
    name: str
    error: str


class ResolvedProfileData(TypedDict):
    name: str
    file: str
    chain: list[str]
    spec: Profile  # the merged spec, every knob given (defaults included)
    origins: dict[str, str]  # knob path -> FILE:LINE


class ProfileChangeData(TypedDict):
    """toolkit.app.profiles.ProfileChange."""

    name: str
    status: Literal["changed", "added", "removed", "unresolved"]
    knobs: list[KnobChange]
    render_changed: list[str]  # which renders differ: argv, env, unit, config
    note: str


# toolkit.app.profile_migrate.MigrateResult with its Migration ("from" is not a Python name).
MigrateData = TypedDict("MigrateData", {
    "profile": str,
    "from": str | None,
    "to": str,
    "changes": list[Change],
    "refusals": list[Problem],
    "problems": dict[str, list[Problem]],
    "written": bool,
    "lock_files": list[str],
    "locks_missing": list[str],
    "locks_written": list[str],
    "lock_refusals": list[LockRefusal],
})


class LockData(TypedDict):
    """toolkit.app.engine_lock.LockOutcome, one per container CPython."""

    sglang_version: str
    python: str
    status: Literal["written", "unchanged", "refused", "closed", "differs"]
    path: str
    packages: int | None
    duration_s: float
    refusal: LockRefusal | None
    difference: list[str]


class RankedRow(TypedDict):
    profile: str
    run_id: str
    source: Literal["toolkit", "manual"]
    stale: bool
    provenance: ProvenanceKind
    output_tok_per_s: float | None
    throughput_kind: Literal["steady", "full"]
    output_tok_per_j: float | None
    rank_throughput: int | None
    rank_tok_per_j: int | None
    verdict: str | None


class CompareGroup(TypedDict):
    provenance: ProvenanceKind
    workload: Workload
    throughput_kind: Literal["steady", "full"]
    apart: str | None  # why this group is not ranked with the first
    ranked: list[RankedRow]


class CompareData(TypedDict):
    groups: list[CompareGroup]
    no_results: list[str]  # profiles with no entry to compare


class RecordData(TypedDict):
    profile: str
    file: str
    action: Literal["added", "replaced", "unchanged"]
    run_id: str
    dropped: list[str]
    entry: ResultsEntry


# A verdict as toolkit.core.probe.verdict.Verdict.to_dict writes it ("class" is not a Python name).
VerdictData = TypedDict("VerdictData", {
    "schema_version": int,
    "class": str,
    "headline": str,
    "confidence": float,
    "confidence_label": Literal["high", "medium", "low"],
    "basis": str,
    "signals": list[str],
    "disagreements": list[str],
    "power_capped": bool | None,
    "slow_gpu": int | None,
    "evidence": dict[str, Any],
    "next_steps": list[str],
    "knob_steps": list[KnobStepRecord],
    "mix": Any,
    "phases": list[dict[str, Any]] | None,
    "timeline": dict[str, Any] | None,
    "window_mean": dict[str, Any] | None,
    "per_gpu": dict[str, dict[str, Any]],
    "data_source": str,
    "provenance": "ProvenanceData",  # where the figures came from, as a record (kind, detail)
})


class FleetProbeData(TypedDict):
    dir: str  # the fleet run's directory
    replay: bool  # judged again from the directory (`probe replay`)
    verdict: Open  # fleet_verdict.json (docs/probe.md, A fleet)


class ProbeData(TypedDict):
    dir: str  # the run directory
    data_source: str
    verdict: VerdictData


class HostRecapData(TypedDict):
    ok: int
    changed: int
    failed: int
    unreachable: int
    skipped: int


class FailureData(TypedDict):
    host: str
    task: str
    message: str


class HostProbeData(TypedDict):
    """toolkit.app.apply.HostProbe: the host's probe run fetched here, its verdict as verdict.json holds it."""

    run_dir: str
    verdict: VerdictData | None


class FleetRunData(TypedDict):
    """toolkit.app.apply.ApplyOutcome.fleet_probe: the fleet run's directory here and its fleet_verdict.json."""

    run_dir: str
    verdict: Open


class ApplyData(TypedDict):
    """toolkit.app.apply.ApplyOutcome.summary."""

    profile: str
    rc: int
    status: str
    check: bool
    hosts: dict[str, HostRecapData]
    changed: int
    unreachable: list[str]
    failed_hosts: list[str]
    failures: list[FailureData]
    notes: list[str]
    artifacts_dir: str
    ansible_artifacts_dir: str | None
    probe: NotRequired[dict[str, HostProbeData]]  # with --probe
    fleet_probe: NotRequired[FleetRunData]  # with --probe over several hosts (instead of probe)
    record: NotRequired[dict[str, Any]]  # with --record: what was recorded per host


class ProvenanceData(TypedDict):
    kind: ProvenanceKind
    detail: str | None


class UpgradeRunData(TypedDict):
    """toolkit.core.upgrade.Run.to_dict."""

    side: Literal["old", "new"]
    value: float  # NaN where the run gave no figure (its failure says why)
    run_dir: str | None
    slo_met: bool | None
    wall_s: float
    failure: str | None
    provenance: ProvenanceData | None  # None: the run gave no figure
    mark: str | None  # toolkit.core.provenance.mark of `provenance`


class DifferenceData(TypedDict):
    """toolkit.core.stats.Difference.to_dict: the new release against the old, higher better."""

    value: float
    low: float
    high: float
    method: str


class CheckData(TypedDict):
    """toolkit.core.results.check.CheckResult.to_dict, under the profile's name."""

    profile: str
    objective: Literal["throughput", "tokens-per-joule"]
    regression: bool
    outcome: str  # toolkit.core.stats' gain, loss, equal or undecided
    text: str
    change: DifferenceData | None  # the candidate's runs against the reference's, higher better
    candidate_runs: list[str]
    reference_runs: list[str]


class UpgradeData(TypedDict):
    """toolkit.app.upgrade.UpgradeOutcome.to_dict."""

    decision: Literal["promoted", "refused", "rolled-back"]
    profile: str
    new_profile: str
    from_version: str
    to_version: str
    objective: str
    effect_pct: float
    accept_equal: bool
    text: str
    pairs: int
    change: DifferenceData | None
    change_99: DifferenceData | None
    outcome: str | None
    rollback_s: float | None
    slo: str | None
    slo_definition: str | None
    slo_text: str | None
    runs: list[UpgradeRunData]
    report: str | None
    recorded: dict[str, str]  # run id -> what was recorded where
    wall_s: float


def typed_dict(name: str, fields: dict[str, Any]) -> Any:
    """TypedDict(name, fields) made at run time (a type checker sees Any: it cannot follow a computed type)."""
    make: Any = TypedDict
    return make(name, fields)


def fields_of(cls: type, **added: Any) -> Any:
    """A TypedDict of a dataclass's fields, as `{**row.__dict__, ...}` prints them, with the keys `added` (name:
    type) that the printing adds: the schema follows the dataclass, no copy of its fields to keep."""
    hints = get_type_hints(cls)
    return typed_dict(f"{cls.__name__}Data", {**{f.name: hints[f.name] for f in dataclasses.fields(cls)}, **added})


SweepRows = GenericAlias(list, (fields_of(ranking.RankedRow),))  # list[...] of a computed type


class NotMeasuredRow(TypedDict):
    variant: str
    knobs: str
    reason: str  # why it is not ranked: invalid, over budget, failed


# toolkit.core.sweep.report.to_json: what ranking.json holds too.
SweepData = typed_dict("SweepData", {
    "schema_version": int,
    "run_id": str,
    "profile": str,
    "runner": str,
    "by_throughput": SweepRows,
    "slo": NotRequired[dict[str, Any]],  # with a capacity search
    "by_goodput": NotRequired[SweepRows],  # with a capacity search
    "by_tokens_per_j": SweepRows,
    "pareto_front": list[ranking.ParetoPoint],
    "not_measured": list[NotMeasuredRow],
})


class TuneBestData(TypedDict):
    variant: str
    knobs: dict[str, Scalar]
    value: float  # in the objective's unit
    concurrency: int
    request_rate: float | None
    goodput: float | None


class CapacityOfVariant(TypedDict):
    status: str
    lo: float | None  # the highest rate that met the SLO
    hi: float | None  # the lowest that missed it
    goodput: float | None
    rates: list[tuple[float, bool]]  # [rate, met] in the order tried


class TuneCapacityData(TypedDict):
    slo: dict[str, float]  # the SLO's bounds (ms), by latency and percentile
    variants: dict[str, CapacityOfVariant]


# toolkit.core.tune.report.to_json: what tune.json holds too; the steps, noise band and stop are the tune's record
# (toolkit.core.tune.log). Made at run time: its ranking is the sweep's computed type.
TuneData = typed_dict("TuneData", {
    "schema_version": int,
    "run_id": str,
    "profile": str,
    "runner": str,
    "objective": str | None,
    "best": TuneBestData | None,
    "points_run": int,
    "noise": tune_log.NoiseBand | None,
    "capacity": TuneCapacityData | None,
    "stop": tune_log.Stop | None,
    "steps": list[tune_log.Step],
    "failed_directions": list[tune_log.FailedDirection],
    "ranking": SweepData,
})


class HostPlanData(TypedDict):
    """toolkit.core.hostplan.plan.Plan.to_json."""

    schema: int
    host: str
    profile: str | None
    resolved: bool
    stack: dict[str, Any]  # each choice's value by what it chose
    choices: list[hostplan.Choice]
    changes: list[hostplan.Change]
    refusals: list[hostplan.Refusal]
    warnings: list[hostplan.Refusal]
    extravars: dict[str, Any]  # what the roles are given, toolkit_plan_digest included
    unknown: list[str]  # what could not be read on the host


class RebootData(TypedDict):
    duration_s: float
    failed_units: list[str]


# kind -> the type of its data. Every kind of toolkit.cli.envelope.SCHEMA_VERSIONS, no other.
DATA_TYPES: dict[str, Any] = {
    "apply": ApplyData,
    "doctor": list[Check],
    "error": ErrorData,
    "host.facts": HostFacts,
    "host.plan": HostPlanData,
    "host.provision": Open,
    "host.reproduce": Open,
    "lab.reboot": RebootData,
    "lab.state": Open,
    "probe.fleet": FleetProbeData,
    "probe.replay": ProbeData,
    "probe.run": ProbeData,
    "profile.changes": list[ProfileChangeData],
    "profile.diff": ProfileDiff,
    "profile.list": list[ProfileRow | UnreadableProfileRow],
    "profile.lock": list[LockData],
    "profile.migrate": MigrateData,
    "profile.render": Any,  # every part (an object), or the one --only names (a list or a string)
    "profile.resolved": ResolvedProfileData,
    "profile.show": Profile,  # the file as loaded: only what it sets
    "profile.validate": dict[str, list[Problem]],
    "results.check": CheckData,
    "results.compare": CompareData,
    "results.record": RecordData,
    "sweep": SweepData,
    "tune": TuneData,
    "upgrade": UpgradeData,
}


def schema(kind: str) -> dict[str, Any]:
    """The envelope of `kind`, its data described by DATA_TYPES[kind] (its $defs lifted to the top, where the
    data's references point)."""
    data = TypeAdapter(DATA_TYPES[kind]).json_schema(mode="serialization")
    defs = data.pop("$defs", None)
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"toolkit --json: {kind}",
        "description": "docs/json.md: within a schema_version keys are only added",
        "type": "object",
        "required": ["kind", "schema_version", "data"],
        "properties": {
            "kind": {"const": kind},
            "schema_version": {"const": SCHEMA_VERSIONS[kind]},
            "data": data,
        },
    }
    if defs:
        out["$defs"] = defs
    return out


def text(kind: str) -> str:
    return json.dumps(schema(kind), indent=2, sort_keys=True) + "\n"
