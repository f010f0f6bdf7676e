"""Where a figure came from, what workload produced it, and which figures may be set against each other.

Every figure a report, a ranking or a diff shows carries its provenance (measured on hardware, imported from a
person's notes, a lab stand-in, a replayed trace) and its workload (prompts asked and completed, lengths, rate,
concurrency). Two figures are compared, ranked or turned into a percentage only when they are alike in all three:

- comparable provenance (toolkit.core.provenance): a simulated 1,500 tok/s says nothing about a measured 880;
- the same workload: 160 prompts at once and 1,024 at once load a server differently;
- the same throughput kind: a steady-state rate (ramp and drain cut) against a full-run rate (both included)
  measures the window, not the change.

What is not alike is shown apart, with the reason, never as a percentage. Pure functions of results entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from toolkit.core.provenance import GROUP, KINDS, comparable
from toolkit.core.results.model import ResultsEntry
from toolkit.core.tables import figure


@dataclass(frozen=True)
class Workload:
    """What the benchmark was asked to do, from the entry's bench settings (None: not known)."""

    prompts_asked: int | None
    prompts_completed: int | None
    prompts_failed: int | None
    dataset: str | None
    input_len: int | None
    output_len: int | None
    range_ratio: float | None
    request_rate: float | str | None
    max_concurrency: int | None

    # The fields that make two runs comparable, with the words a reason uses for each.
    KEY_FIELDS = (("prompts_asked", "prompts asked"), ("dataset", "dataset"), ("input_len", "input length"),
                  ("output_len", "output length"), ("range_ratio", "length range ratio"),
                  ("request_rate", "request rate"), ("max_concurrency", "concurrency cap"))

    def key(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f, _ in self.KEY_FIELDS)

    def text(self) -> str:
        """One line: "640 prompts, random 256 in / 128 out (range 0), rate inf, concurrency 128" (failed prompts
        counted where there were any: "160 prompts (154 completed, 6 failed)")."""
        if self.prompts_asked is None and self.dataset is None and self.input_len is None:
            return "workload not recorded"
        bits = []
        if self.prompts_asked is not None:
            done = "" if not self.prompts_failed else (f" ({self.prompts_completed or 0:,} completed, "
                                                       f"{self.prompts_failed:,} failed)")
            bits.append(f"{self.prompts_asked:,} prompts{done}")
        lengths = []
        if self.input_len is not None or self.output_len is not None:
            lengths.append(f"{figure(self.input_len)} in / {figure(self.output_len)} out")
        if self.range_ratio is not None:
            lengths.append(f"(range {figure(self.range_ratio)})")
        if self.dataset or lengths:
            bits.append(" ".join([self.dataset or "dataset ?", *lengths]))
        if self.request_rate is not None:
            bits.append(f"rate {figure(self.request_rate)}" + ("" if self.request_rate == "inf" else " req/s"))
        bits.append("no concurrency cap" if self.max_concurrency is None else f"concurrency {self.max_concurrency}")
        return ", ".join(bits)


def workload(entry: ResultsEntry) -> Workload:
    b = entry.bench
    asked = None if b.num_prompts is None else b.num_prompts + (b.failed or 0)
    return Workload(prompts_asked=asked, prompts_completed=b.num_prompts, prompts_failed=b.failed,
                    dataset=b.dataset, input_len=b.input_len, output_len=b.output_len, range_ratio=b.range_ratio,
                    request_rate=b.request_rate, max_concurrency=b.max_concurrency)


def workload_differences(a: Workload, b: Workload) -> list[str]:
    """What differs between two workloads, in words ("prompts asked 1,024 vs 160")."""
    out = []
    for name, words in Workload.KEY_FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            out.append(f"{words} {_v(va, name)} vs {_v(vb, name)}")
    return out


def _v(value: object, name: str = "") -> str:
    if value is None:
        # bench_serving's --max-concurrency unset is no cap (every request at once), not an unknown value
        return "none" if name == "max_concurrency" else "unknown"
    return figure(value) if isinstance(value, int | float | str) else str(value)


def steady_rate(entry: ResultsEntry) -> float | None:
    """The steady-state output rate, only where a steady window was found."""
    rate, kind = entry.output_tok_per_s()
    return rate if kind == "steady" else None


def full_rate(entry: ResultsEntry) -> float | None:
    return entry.throughput.full_run.output_tok_per_s


def rate_of(entry: ResultsEntry, kind: str) -> float | None:
    return steady_rate(entry) if kind == "steady" else full_rate(entry)


ThroughputKind = Literal["steady", "full"]
KIND_LABEL = {"steady": "steady-state", "full": "full-run"}


def common_kind(entries: list[ResultsEntry]) -> ThroughputKind | None:
    """The throughput kind every entry that has a rate has: steady where all of them have a steady window, else
    full-run where all of them have a full-run rate; None when not even that (or none has a rate). An entry with
    no rate at all does not decide it: it has nothing to rank."""
    rated = [e for e in entries if steady_rate(e) is not None or full_rate(e) is not None]
    if rated and all(steady_rate(e) is not None for e in rated):
        return "steady"
    if rated and all(full_rate(e) is not None for e in rated):
        return "full"
    return None


def differences(a: ResultsEntry, b: ResultsEntry) -> list[str]:
    """Why two entries cannot be compared (empty: they can): provenance, then workload, then throughput."""
    pa, pb = a.provenance(), b.provenance()
    out = []
    if not comparable(pa, pb):
        out.append(f"{pa.label} vs {pb.label}")
    diff = workload_differences(workload(a), workload(b))
    if diff:
        out.append("workload: " + "; ".join(diff))
    if not out and common_kind([a, b]) is None:
        out.append("no throughput of the same kind: " + " vs ".join(_kinds(e) for e in (a, b)))
    return out


def _kinds(e: ResultsEntry) -> str:
    kinds = [k for k in ("steady", "full") if rate_of(e, k) is not None]
    return " and ".join(KIND_LABEL[k] for k in kinds) or "no rate"


ClassKey = tuple[str, tuple[object, ...]]


def class_key(entry: ResultsEntry) -> ClassKey:
    """Entries with equal keys are comparable (the throughput kind is settled per group: `common_kind`)."""
    return GROUP[entry.provenance().kind], workload(entry).key()


# Groups in the order they are shown: what was measured first.
_GROUP_ORDER = list(dict.fromkeys(GROUP[k] for k in KINDS))


def class_order(key: ClassKey) -> int:
    return _GROUP_ORDER.index(key[0]) if key[0] in _GROUP_ORDER else len(_GROUP_ORDER)
