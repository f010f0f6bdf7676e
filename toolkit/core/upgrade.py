"""The upgrade's gate: old and new measured in alternation, pair by pair, until the change by the objective is
decided or the budget of pairs is spent. Pure: figures in, a verdict out (toolkit/app/upgrade.py measures, this
decides; benchmarks/bench_upgrade_gate.py runs the same code over a noise model to count runs and errors).

Each pair (old, new) is measured back to back, so the host's drift between pairs is shared by both sides and
cancels in the pair's ratio. After every pair from stats.MIN_PAIRS on, the 95 % interval of the paired change is
decided (stats.decide): a loss stops at once (the old release keeps serving), a gain must also clear the 99 %
interval (each added pair is another look at the data), an interval inside +-the effect that matters is equal.
The budget spent undecided keeps the old release: nothing proved the new one better.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.core import stats
from toolkit.core.errors import Problem
from toolkit.core.hostplan.facts import version_key
from toolkit.core.hostplan.matrix import Matrix
from toolkit.core.provenance import Provenance, mark

PROMOTED, REFUSED, ROLLED_BACK = "promoted", "refused", "rolled-back"
OBJECTIVES = {
    # name -> (what it reads, higher is better)
    "throughput": ("output tok/s", True),
    "tokens-per-joule": ("output tokens per joule", True),
    "j-per-token": ("J per output token", False),
}
DEFAULT_EFFECT = 0.05
DEFAULT_MAX_PAIRS = 6


@dataclass(frozen=True)
class GateVerdict:
    """Where the gate stands after the pairs so far: the decision, the intervals, whether to stop measuring."""

    decision: stats.Decision
    change: stats.Difference | None
    promote_change: stats.Difference | None
    pairs: int
    done: bool

    @property
    def outcome(self) -> str:
        return self.decision.outcome

    def final(self) -> str:
        """promoted or refused (a crash or failed health is rolled-back, decided by the caller before this)."""
        return PROMOTED if self.decision.promote else REFUSED


def oriented(values: Sequence[float], objective: str) -> list[float]:
    """The objective's figures turned so that higher is better (J/token: its reciprocal)."""
    _what, higher = OBJECTIVES[objective]
    return [v if higher else (1 / v if v and math.isfinite(v) and v > 0 else math.nan) for v in values]


def gate(old: Sequence[float], new: Sequence[float], *, objective: str = "throughput",
         effect: float = DEFAULT_EFFECT, accept_equal: bool = False,
         max_pairs: int = DEFAULT_MAX_PAIRS) -> GateVerdict:
    """The verdict on the pairs so far (old[i], new[i]); `done` when decided or `max_pairs` are spent."""
    a, b = oriented(old, objective), oriented(new, objective)
    k = min(len(a), len(b))
    change, strict = stats.paired_relative_changes(a[:k], b[:k])
    decision = stats.decide(change, effect=effect, accept_equal=accept_equal, pairs=k, promote_change=strict)
    done = decision.outcome != stats.UNDECIDED or k >= max_pairs
    if done and decision.outcome == stats.UNDECIDED:
        decision = stats.Decision(stats.UNDECIDED, False, f"{decision.text.split(';')[0]}; the budget of {max_pairs} "
                                  "pairs is spent undecided: nothing proved the new release better, the old one stays")
    return GateVerdict(decision, change, strict, k, done)


def driver_refusal(matrix: Matrix, version: str, driver: str | None, host: str) -> Problem | None:
    """Whether `host`'s loaded driver can run SGLang `version`: the CUDA major its wheels are built for
    (compat sglang_cuda) needs at least its minimum driver (compat cuda_driver). None when it can, or when the
    compatibility data cannot say (no row: the host plan warns of that on provisioning)."""
    row = matrix.cuda_of_sglang(version)
    need = matrix.min_driver(row.cuda) if row else None
    if row is None or need is None:
        return None
    if driver is None:
        return Problem(f"{host} has no NVIDIA driver loaded; SGLang {version} (CUDA {row.cuda}) needs "
                       f"{need.min_driver} or newer", field="--sglang-version",
                       fix=f"provision the host's driver first: toolkit host {host}")
    if version_key(driver) >= version_key(need.min_driver):
        return None
    return Problem(f"{host}'s driver {driver} cannot run SGLang {version}: its wheels are built for CUDA "
                   f"{row.cuda.split('.')[0]} ({row.source.split(';')[0].strip()}), whose runtime needs driver "
                   f"{need.min_driver} or newer ({need.source}); nothing was installed",
                   field="--sglang-version",
                   fix=f"upgrade {host}'s driver to {need.min_driver} or newer (toolkit host {host} -e "
                       f"proxmox_gpu_host_driver_version=...), or stay on a release built for CUDA "
                       f"{int(row.cuda.split('.')[0]) - 1}")


@dataclass(frozen=True)
class Run:
    """One measured run of the alternation: its side, its figure by the objective (NaN: it failed), its run
    directory, whether it met the SLO (None: no SLO), and how long its apply and probe took."""

    side: str  # old or new
    value: float
    run_dir: str | None
    slo_met: bool | None
    wall_s: float
    failure: str | None = None
    provenance: Provenance | None = None  # where its figure came from (the probe run's records); None: no figure

    def to_dict(self) -> dict[str, Any]:
        """upgrade.json's and `--json`'s row: the provenance as its record, and as the mark every surface shows."""
        return {"side": self.side, "value": self.value, "run_dir": self.run_dir, "slo_met": self.slo_met,
                "wall_s": self.wall_s, "failure": self.failure,
                "provenance": self.provenance.to_dict() if self.provenance else None,
                "mark": mark(self.provenance) if self.provenance else None}


def slo_rates(runs: Sequence[Run]) -> tuple[stats.PassRate, stats.PassRate] | None:
    """Each side's SLO attainment (runs that met it) as a Wilson pass rate; None without an SLO."""
    judged = [r for r in runs if r.slo_met is not None]
    if not judged:
        return None
    old = [r for r in judged if r.side == "old"]
    new = [r for r in judged if r.side == "new"]
    return (stats.wilson(sum(bool(r.slo_met) for r in old), len(old)),
            stats.wilson(sum(bool(r.slo_met) for r in new), len(new)))


def report_markdown(data: Mapping[str, object], runs: Sequence[Run]) -> str:
    """The upgrade's report: what was decided and why, the interval, every run behind it."""
    lines = [f"# Upgrade {data['profile']}: SGLang {data['from_version']} -> {data['to_version']}", "",
             f"**Decision: {data['decision']}.** {data['text']}", "",
             f"- objective: {data['objective']} ({OBJECTIVES[str(data['objective'])][0]}), effect that matters: "
             f"+-{data['effect_pct']:g} %" + (", equal accepted" if data.get("accept_equal") else ""),
             f"- the new release's profile: {data['new_profile']}; the old one's: {data['profile']}"]
    change = data.get("change")
    if isinstance(change, Mapping):
        lines.append(f"- change (new against old, higher better): {float(change['value']) * 100:+.1f} %, 95 % "
                     f"[{float(change['low']) * 100:+.1f} %, {float(change['high']) * 100:+.1f} %] "
                     f"({change['method']})")
    if data.get("slo"):
        lines.append(f"- SLO: {data['slo']} ({data.get('slo_definition')}); attainment {data.get('slo_text')}")
    if data.get("rollback_s") is not None:
        lines.append(f"- rolled back in {float(str(data['rollback_s'])):.1f} s: the unit on the old venv again, "
                     "health 200, the smoke generation answered")
    marks = sorted({mark(r.provenance, detail=True) for r in runs if r.provenance is not None})
    if marks:
        lines.append("- figures: " + ", ".join(marks))
    lines += ["", "| # | side | figure | data | SLO met | wall s | run | failure |",
              "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, start=1):
        fig = "-" if not math.isfinite(r.value) else f"{r.value:,.4g}"
        met = "-" if r.slo_met is None else ("yes" if r.slo_met else "no")
        data_mark = mark(r.provenance) if r.provenance is not None else "-"
        lines.append(f"| {i} | {r.side} | {fig} | {data_mark} | {met} | {r.wall_s:.1f} | {r.run_dir or '-'} "
                     f"| {r.failure or ''} |")
    return "\n".join(lines) + "\n"
