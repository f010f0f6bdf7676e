"""`results check`: the newest entry against a reference, under the rules an upgrade decides by.

A configuration is what a run measured: the profile's spec (its hash) on one SGLang release. The candidate is the
newest entry's configuration, the reference is another's (a named run's, the last promoted release's, or by
default the newest other configuration); each side is every comparable entry of its configuration (the same
provenance, workload and throughput kind: toolkit.core.results.comparable), so repeats narrow the interval.
When both are the same configuration, the newest run is set against the ones before it. The change is decided by
toolkit.core.stats.decide: a significant loss is a regression. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.core import stats
from toolkit.core.errors import ToolkitError
from toolkit.core.results.comparable import common_kind, differences, rate_of
from toolkit.core.results.model import ResultsEntry

OBJECTIVES = ("throughput", "tokens-per-joule")
LAST_PROMOTED = "last-promoted"
DEFAULT_EFFECT = 0.05  # a change under 5 % is inside what matters for a serving host's capacity


@dataclass(frozen=True)
class CheckResult:
    objective: str
    candidate: list[ResultsEntry]
    reference: list[ResultsEntry]
    change: stats.Difference | None
    decision: stats.Decision

    @property
    def regression(self) -> bool:
        return self.decision.outcome == stats.LOSS

    def text(self) -> str:
        c, r = self.candidate[-1], self.reference[-1]
        return (f"{self.objective}: {_config_text(c)} ({len(self.candidate)} run(s)) against {_config_text(r)} "
                f"({len(self.reference)} run(s)): {self.decision.text}"
                + (f" ({self.change.method})" if self.change else ""))

    def to_dict(self) -> dict[str, object]:
        return {"objective": self.objective, "regression": self.regression,
                "outcome": self.decision.outcome, "text": self.decision.text,
                "change": self.change.to_dict() if self.change else None,
                "candidate_runs": [e.run_id for e in self.candidate],
                "reference_runs": [e.run_id for e in self.reference]}


def _config(e: ResultsEntry) -> tuple[str | None, str | None]:
    return e.spec_hash, e.sglang_version


def _config_text(e: ResultsEntry) -> str:
    return f"SGLang {e.sglang_version or '?'} spec {(e.spec_hash or '?')[:12]}"


def objective_value(e: ResultsEntry, objective: str, kind: str) -> float | None:
    """The figure the objective ranks by, higher better (tokens per joule, not J/token)."""
    if objective == "tokens-per-joule":
        return e.energy.output_tok_per_j if e.energy else None
    return rate_of(e, kind)


def check_entries(entries: list[ResultsEntry], *, against: str | None = None, objective: str = "throughput",
                  effect: float = DEFAULT_EFFECT, profile: str = "") -> CheckResult:
    """The newest entry's configuration against the reference's (see the module's docstring)."""
    if objective not in OBJECTIVES:
        raise ToolkitError.of(f"unknown objective {objective!r}", field="--objective",
                              fix=f"use one of {', '.join(OBJECTIVES)}")
    ordered = sorted((e for e in entries if e.source == "toolkit"), key=lambda e: e.date or "")
    if len(ordered) < 2:
        raise ToolkitError.of(f"{profile or 'the profile'} has {len(ordered)} toolkit-measured entr"
                              f"{'y' if len(ordered) == 1 else 'ies'}: nothing to check against",
                              field="results.entries", fix="apply (or probe and record) it at least twice")
    newest = ordered[-1]
    alike = [e for e in ordered if not differences(newest, e)]
    if against == LAST_PROMOTED:
        promoted = [e for e in alike if e.gate and e.gate.decision == "promoted" and e.gate.side == "new"]
        if not promoted:
            raise ToolkitError.of("no comparable entry of a promoted upgrade", field="--against",
                                  fix="run `toolkit upgrade` first, or name a run: --against RUN_ID")
        ref_config = _config(promoted[-1])
    elif against:
        named = [e for e in ordered if e.run_id == against]
        if not named:
            raise ToolkitError.of(f"no entry {against!r} in {profile or 'the profile'}'s results", field="--against",
                                  fix="one of: " + ", ".join(e.run_id for e in ordered[-5:]) + " or last-promoted")
        why = differences(newest, named[0])
        if why:
            raise ToolkitError.of(f"{against} is not comparable with the newest entry {newest.run_id}: "
                                  + "; ".join(why), field="--against", fix="name a run of the same workload and kind")
        ref_config = _config(named[0])
    else:
        others = [e for e in alike if _config(e) != _config(newest)]
        ref_config = _config(others[-1]) if others else _config(newest)
    if ref_config == _config(newest):
        candidate, reference = [newest], [e for e in alike if _config(e) == ref_config and e is not newest]
    else:
        candidate = [e for e in alike if _config(e) == _config(newest)]
        reference = [e for e in alike if _config(e) == ref_config]
    kind = common_kind([*candidate, *reference]) or "full"
    old = [v for v in (objective_value(e, objective, kind) for e in reference) if v is not None]
    new = [v for v in (objective_value(e, objective, kind) for e in candidate) if v is not None]
    change = stats.unpaired_relative_change(old, new)
    decision = stats.decide(change, effect=effect)
    if change is None:
        decision = stats.Decision(stats.UNDECIDED, False, f"{len(old)} reference and {len(new)} candidate run(s) "
                                  "with a figure: no run-to-run spread measured, nothing to decide")
    return CheckResult(objective, candidate, reference, change, decision)
