"""Comparing results: staleness, the ranking of `results compare`, and the deltas of `profile diff`.

Pure functions of entries and spec hashes; the commands load the profiles and render the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.core.results.model import ResultsBlock, ResultsEntry


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
    throughput_kind: str  # "steady" or "full": which rate output_tok_per_s is
    output_tok_per_j: float | None
    rank_throughput: int | None  # 1 = best; None when the figure is missing
    rank_tok_per_j: int | None


def _ranks(values: list[float | None]) -> list[int | None]:
    """Competition ranking (1, 2, 2, 4), highest first; missing values get no rank."""
    present = sorted((v for v in values if v is not None), reverse=True)
    return [None if v is None else 1 + sum(1 for p in present if p > v) for v in values]


def rank(rows: list[tuple[str, ResultsEntry, str | None]]) -> list[Ranked]:
    """rows: (profile name, entry, the profile's current spec hash). Sorted by steady-state throughput
    (the full-run rate where no steady window was measured, and the row says so), then tokens per joule."""
    rates = [e.output_tok_per_s() for _, e, _ in rows]
    tpj = [e.energy.output_tok_per_j if e.energy else None for _, e, _ in rows]
    r_tp = _ranks([r[0] for r in rates])
    r_tpj = _ranks(tpj)
    out = [
        Ranked(profile=name, entry=e, stale=is_stale(e, h), output_tok_per_s=rates[i][0], throughput_kind=rates[i][1],
               output_tok_per_j=tpj[i], rank_throughput=r_tp[i], rank_tok_per_j=r_tpj[i])
        for i, (name, e, h) in enumerate(rows)
    ]
    big = 1 << 30
    return sorted(out, key=lambda r: (r.rank_throughput or big, r.rank_tok_per_j or big, r.profile, r.entry.date or ""))


@dataclass(frozen=True)
class Delta:
    """One figure from A to B, for the profile diff."""

    name: str  # e.g. "output throughput (tok/s)"
    a: float | str | None
    b: float | str | None
    change_pct: float | None  # (b - a) / a x 100, None when not computable

    def render(self) -> str:
        def fmt(v: float | str | None) -> str:
            if v is None:
                return "-"
            if isinstance(v, float):
                return f"{v:,.4g}" if abs(v) < 10 else f"{v:,.1f}".rstrip("0").rstrip(".")
            return str(v)

        text = f"{self.name}: {fmt(self.a)} -> {fmt(self.b)}"
        if self.change_pct is not None:
            text += f" ({self.change_pct:+.0f} %)"
        return text


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return round((b - a) / a * 100.0, 1)


def result_deltas(a: ResultsEntry | None, b: ResultsEntry | None) -> list[Delta]:
    """The figures that tell what a change did: throughput, power per GPU, energy per token, verdict."""
    if a is None or b is None:
        return []
    out: list[Delta] = []
    (ra, ka), (rb, kb) = a.output_tok_per_s(), b.output_tok_per_s()
    if ka != kb:
        # Compare like with like: both full-run rates when only one side has a steady window.
        ra, rb = a.throughput.full_run.output_tok_per_s, b.throughput.full_run.output_tok_per_s
        ka = kb = "full"
    label = "steady-state" if ka == "steady" else "full-run"
    out.append(Delta(f"output throughput, {label} (tok/s)", ra, rb, _pct(ra, rb)))
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
