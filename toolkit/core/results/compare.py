"""Comparing results: staleness, the ranking of `results compare`, and the deltas of `profile diff`, only ever
between comparable entries (toolkit.core.results.comparable: provenance, workload, throughput kind).

Pure functions of entries and spec hashes; the commands load the profiles and render the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.core.provenance import Provenance
from toolkit.core.results.comparable import (
    KIND_LABEL,
    ClassKey,
    Workload,
    class_key,
    class_order,
    common_kind,
    differences,
    rate_of,
    workload,
)
from toolkit.core.results.model import ResultsBlock, ResultsEntry
from toolkit.core.tables import figure


def is_stale(entry: ResultsEntry, current_spec_hash: str | None) -> bool:
    """An entry measured a spec that is no longer the profile's.

    Entries without a hash (manual imports that predate hashing) cannot be judged and are not stale;
    they are shown as `manual` instead.
    """
    return entry.spec_hash is not None and current_spec_hash is not None and entry.spec_hash != current_spec_hash


def latest(block: ResultsBlock | None, current_spec_hash: str | None = None, *,
           prefer_fresh: bool = True) -> ResultsEntry | None:
    """The entry that stands for the profile: the newest fresh one, else the newest at all."""
    if block is None or not block.entries:
        return None
    by_date = sorted(block.entries, key=lambda e: e.date or "")
    if prefer_fresh:
        fresh = [e for e in by_date if not is_stale(e, current_spec_hash)]
        if fresh:
            return fresh[-1]
    return by_date[-1]


@dataclass(frozen=True)
class Ranked:
    profile: str
    entry: ResultsEntry
    stale: bool
    output_tok_per_s: float | None
    throughput_kind: str  # "steady" or "full": which rate output_tok_per_s is (the group's kind)
    output_tok_per_j: float | None
    rank_throughput: int | None  # 1 = best; None when the figure is missing
    rank_tok_per_j: int | None


def _ranks(values: list[float | None]) -> list[int | None]:
    """Competition ranking (1, 2, 2, 4), highest first; missing values get no rank."""
    present = sorted((v for v in values if v is not None), reverse=True)
    return [None if v is None else 1 + sum(1 for p in present if p > v) for v in values]


def rank(rows: list[tuple[str, ResultsEntry, str | None]], kind: str | None = None) -> list[Ranked]:
    """rows: (profile name, entry, the profile's current spec hash), all of one comparability class. Sorted by
    output throughput of one kind for all (`kind`, else the kind they all have: steady where every row has a
    steady window, else full-run), then tokens per joule."""
    kind = kind or common_kind([e for _, e, _ in rows]) or "full"
    rates = [rate_of(e, kind) for _, e, _ in rows]
    tpj = [e.energy.output_tok_per_j if e.energy else None for _, e, _ in rows]
    r_tp = _ranks(rates)
    r_tpj = _ranks(tpj)
    out = [
        Ranked(profile=name, entry=e, stale=is_stale(e, h), output_tok_per_s=rates[i], throughput_kind=kind,
               output_tok_per_j=tpj[i], rank_throughput=r_tp[i], rank_tok_per_j=r_tpj[i])
        for i, (name, e, h) in enumerate(rows)
    ]
    big = 1 << 30
    return sorted(out, key=lambda r: (r.rank_throughput or big, r.rank_tok_per_j or big, r.profile, r.entry.date or ""))


@dataclass(frozen=True)
class RankGroup:
    """Entries alike in provenance and workload, ranked on one throughput kind. `apart` says why this group is
    not ranked with the first one (None for the first)."""

    provenance: Provenance
    workload: Workload
    throughput_kind: str
    rows: list[Ranked]
    apart: str | None

    @property
    def title(self) -> str:
        return (f"{self.provenance.label}; {self.workload.text()}; ranked by {KIND_LABEL[self.throughput_kind]} "
                "output throughput")


def rank_groups(rows: list[tuple[str, ResultsEntry, str | None]]) -> list[RankGroup]:
    """Every entry in the group of its comparability class (provenance kind, workload), each group ranked on
    its own: measured first, then imported, lab, replayed; within a kind the larger group first."""
    by_class: dict[ClassKey, list[tuple[str, ResultsEntry, str | None]]] = {}
    for row in rows:
        by_class.setdefault(class_key(row[1]), []).append(row)
    keys = sorted(by_class, key=lambda k: (class_order(k), -len(by_class[k]),
                                           workload(by_class[k][0][1]).text()))
    groups: list[RankGroup] = []
    for key in keys:
        members = by_class[key]
        first = members[0][1]
        kind = common_kind([e for _, e, _ in members]) or "full"
        apart = None
        if groups:
            ref = groups[0].rows[0].entry
            apart = "; ".join(differences(ref, first)) or None
        groups.append(RankGroup(first.provenance(), workload(first), kind, rank(members, kind), apart))
    return groups


@dataclass(frozen=True)
class Delta:
    """One figure from A to B, for the profile diff."""

    name: str  # e.g. "output throughput (tok/s)"
    a: float | str | None
    b: float | str | None
    change_pct: float | None  # (b - a) / a x 100, None when not computable

    def render(self) -> str:
        text = f"{self.name}: {figure(self.a)} -> {figure(self.b)}"
        if self.change_pct is not None:
            text += f" ({self.change_pct:+.0f} %)"
        return text


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return round((b - a) / a * 100.0, 1)


def result_deltas(a: ResultsEntry | None, b: ResultsEntry | None) -> list[Delta]:
    """The figures that tell what a change did: throughput, power per GPU, energy per token, verdict. Only for two
    comparable entries (same provenance kind and workload, a throughput of one kind): else none, never a
    percentage between unlike figures."""
    if a is None or b is None or differences(a, b):
        return []
    kind = common_kind([a, b])
    assert kind is not None  # differences() is empty only when there is one
    ra, rb = rate_of(a, kind), rate_of(b, kind)
    out = [Delta(f"output throughput, {KIND_LABEL[kind]} (tok/s)", ra, rb, _pct(ra, rb))]
    pa, pb = (a.power.mean_w if a.power else None), (b.power.mean_w if b.power else None)
    if pa is not None or pb is not None:
        out.append(Delta("power per GPU, mean (W)", pa, pb, _pct(pa, pb)))
    ea = a.energy.j_per_output_tok if a.energy else None
    eb = b.energy.j_per_output_tok if b.energy else None
    if ea is not None or eb is not None:
        out.append(Delta("energy per output token (J)", ea, eb, _pct(ea, eb)))
    va, vb = a.verdict_class(), b.verdict_class()
    if va is not None or vb is not None:
        out.append(Delta("verdict" + (" (changed)" if va != vb else ""), va, vb, None))
    return out


def latest_per_class(block: ResultsBlock | None, current_spec_hash: str | None = None) -> list[ResultsEntry]:
    """Per comparability class, the entry that stands for the profile (its newest fresh one, else its newest),
    oldest class first: the imported figures and the lab's are both shown, each beside its like."""
    if block is None:
        return []
    by_class: dict[ClassKey, list[ResultsEntry]] = {}
    for e in block.entries:
        by_class.setdefault(class_key(e), []).append(e)
    picked = [latest(ResultsBlock(entries=es), current_spec_hash) for es in by_class.values()]
    return sorted((e for e in picked if e is not None), key=lambda e: (class_order(class_key(e)), e.date or ""))


def figures_line(entry: ResultsEntry) -> str:
    """An entry's own figures on one line, each with its kind, for showing apart: "1,517.3 tok/s steady-state,
    1,484.6 tok/s full-run, 247.2 W/GPU, busy-but-waiting"."""
    bits = []
    for kind in ("steady", "full"):
        rate = rate_of(entry, kind)
        if rate is not None:
            bits.append(f"{figure(rate)} tok/s {KIND_LABEL[kind]}")
    if entry.throughput.no_steady_state:
        bits.append(f"no steady state ({entry.throughput.no_steady_state})")
    return ", ".join(bits + power_energy_verdict(entry)) or "no figures"


def power_energy_verdict(entry: ResultsEntry) -> list[str]:
    """The figures after the throughput, as every one-line view prints them: W per GPU, J per token, verdict."""
    bits = []
    if entry.power and entry.power.mean_w is not None:
        bits.append(f"{figure(entry.power.mean_w)} W/GPU")
    if entry.energy and entry.energy.j_per_output_tok is not None:
        bits.append(f"{figure(entry.energy.j_per_output_tok)} J/tok")
    if entry.verdict:
        bits.append(entry.verdict.class_)
    return bits
