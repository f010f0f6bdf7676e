"""Where a figure came from: one type, one word list, one rule of what may be set against what.

Every figure the toolkit shows carries its provenance, declared where the data is made (the GPU source, the
sweep's runner, `results import`), never guessed later from prose:

- `measured`: read from real GPUs (NVML) while the benchmark ran;
- `imported`: typed in from a person's notes (`toolkit results import`): real hardware, conditions unknown;
- `stand-in`: the lab's stand-in server and its simulated GPUs (no GPU, no model);
- `engine-model`: the lab's engine model computed in-process (no server, no benchmark client, no GPU);
- `replayed`: a recorded GPU trace or a table of recorded results played back as if live.

Only like is compared with like (`comparable`): measured with measured, imported with imported, the lab with the
lab (its stand-in and its engine model are one model seen two ways), replayed with replayed. An imported 880
tok/s against a lab stand-in's 1,500 says nothing, so they are shown apart, never as a percentage.

`mark` is the one rendering: the same word on the apply summary, the profile report, the sweep and tune
reports and `results compare`. Standard library only: the probe writes it on the GPU box, which has no pydantic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from toolkit.core.errors import ToolkitError

ProvenanceKind = Literal["measured", "imported", "stand-in", "engine-model", "replayed"]
KINDS: tuple[ProvenanceKind, ...] = get_args(ProvenanceKind)  # also the order groups are shown in

# The words, one place. A mark is short (a table column must never cut it); a label says it in a sentence.
MARK: dict[ProvenanceKind, str] = {"measured": "measured", "imported": "imported", "stand-in": "LAB STAND-IN",
                                   "engine-model": "ENGINE MODEL", "replayed": "REPLAYED"}
LABEL: dict[ProvenanceKind, str] = {"measured": "measured on hardware", "imported": "imported from notes",
                                    "stand-in": "lab stand-in", "engine-model": "lab engine model",
                                    "replayed": "replayed trace"}
# What may be compared: kinds in one group are alike (the rule in the module's docstring).
GROUP: dict[ProvenanceKind, str] = {"measured": "measured", "imported": "imported", "stand-in": "lab",
                                    "engine-model": "lab", "replayed": "replayed"}


@dataclass(frozen=True)
class Provenance:
    kind: ProvenanceKind
    detail: str | None = None  # what exactly it is: the trace file, the lab's note, the import's note

    @property
    def label(self) -> str:
        return LABEL[self.kind]

    @property
    def watermark(self) -> str | None:
        """The word an image of these figures is stamped with; None for a measurement."""
        return None if self.kind == "measured" else MARK[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        kind = data.get("kind")
        if kind not in KINDS:
            raise ToolkitError.of(f"provenance kind {kind!r} is not one of {', '.join(KINDS)}",
                                  field="provenance.kind", fix=f"use one of {', '.join(KINDS)}")
        detail = data.get("detail")
        return cls(cast(ProvenanceKind, kind), None if detail is None else str(detail))


MEASURED = Provenance("measured", "NVML")


def mark(p: Provenance, *, detail: bool = False) -> str:
    """The one rendering of a provenance: its mark ("LAB STAND-IN"), with its detail when asked."""
    return MARK[p.kind] + (f" ({p.detail})" if detail and p.detail else "")


def comparable(a: Provenance, b: Provenance) -> bool:
    return GROUP[a.kind] == GROUP[b.kind]


def stamp(provenances: Iterable[Provenance]) -> str | None:
    """The stamp of an image drawn from several sources: the marks of all that were not measured, joined."""
    marks = sorted({p.watermark for p in provenances if p.watermark})
    return " + ".join(marks) or None


def of_record(*records: Mapping[str, Any]) -> Provenance:
    """A record's provenance (run.json, summary.json, verdict.json, a sweep point), from the first of `records` that
    says: its `provenance` field, or, in a record written before there was one, its `data_source` sentence read once
    (`from_legacy_text`). None says: measured, as the probe's records said then."""
    for data in records:
        raw = data.get("provenance")
        if isinstance(raw, Mapping):
            return Provenance.from_dict(raw)
        text = data.get("data_source")
        if text:
            return from_legacy_text(str(text))
    return MEASURED


def from_legacy_text(text: str) -> Provenance:
    """Migration on read: the kind of an old record's `data_source` sentence, the words its writers used then
    ("measured (NVML)", "nvml", "simulated GPUs: the lab's engine model", "lab engine model (simulated ...)",
    "recorded GPU trace: lab data", "lab data (replay): ...", "recorded run", "synthetic: ..."). Nothing new is
    written this way."""
    s = text.lower()
    tagged = {"(load)": "measured", "(stand-in)": "stand-in", "(replay)": "replayed"}  # "lab data (KIND): ..."
    for tag, kind in tagged.items():
        if tag in s:
            return Provenance(cast(ProvenanceKind, kind), text)
    if s.startswith("nvml"):
        return MEASURED
    if s.startswith("measured"):
        # "measured (NVML)": the kind is the word, the detail what the brackets held
        return Provenance("measured", text[len("measured"):].strip().strip("()").strip() or None)
    if s.startswith(("lab engine model", "engine model")):
        return Provenance("engine-model", text)
    if any(w in s for w in ("simulated", "synthetic", "stand-in")):
        return Provenance("stand-in", text)
    if any(w in s for w in ("replay", "record")):
        return Provenance("replayed", text)
    return Provenance("stand-in", text)  # not said to be measured: never shown as if it were
