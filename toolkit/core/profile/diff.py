"""Semantic diff of two resolved profiles: knobs changed, added, removed (through extends:),
each with its why. `textconv_text` is the same view for one profile, for `git diff`.

Knobs only: toolkit.core.results.profile_diff puts the results beside them (it builds on this module, never
the other way round).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.profile.resolve import ResolvedProfile

# Sections that are not knobs: prose and the toolkit's own block.
NOT_KNOBS = ("name", "description", "extends", "why", "acknowledge", "results", "schema_version")


@dataclass(frozen=True)
class KnobChange:
    path: str
    kind: str  # "changed", "added", "removed"
    old: Any
    new: Any
    why: str | None  # the reason (and link) for the new value, else for the old one

    def render(self) -> str:
        if self.kind == "changed":
            text = f"~ {self.path}: {_show(self.old)} -> {_show(self.new)}"
        elif self.kind == "added":
            text = f"+ {self.path}: {_show(self.new)}"
        else:
            text = f"- {self.path}: {_show(self.old)}"
        return text + (f"\n    why: {self.why}" if self.why else "")


@dataclass
class DiffSection:
    title: str
    lines: list[str]


@dataclass
class ProfileDiff:
    a: str
    b: str
    changes: list[KnobChange]
    sections: list[DiffSection] = field(default_factory=list)

    def render(self) -> str:
        out = [f"profile diff {self.a} -> {self.b}: {len(self.changes)} knob(s) differ"]
        out += [c.render() for c in self.changes]
        for section in self.sections:
            out.append(f"{section.title}:")
            out += [f"  {line}" for line in section.lines]
        return "\n".join(out) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "changes": [c.__dict__ for c in self.changes],
            "sections": [s.__dict__ for s in self.sections],
        }


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaves; lists are leaves (they replace as a whole under extends)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def knobs(resolved: ResolvedProfile) -> dict[str, Any]:
    """Every knob with its effective value (defaults filled in)."""
    return flatten(resolved.spec.model_dump(mode="json", exclude=set(NOT_KNOBS)))


def why_for(resolved: ResolvedProfile, path: str) -> str | None:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        why = resolved.spec.why.get(".".join(parts[:cut]))
        if why is not None:
            return " ".join(why.reason.split()) + (f" ({why.link})" if why.link else "")
    return None


def diff_profiles(a: ResolvedProfile, b: ResolvedProfile) -> ProfileDiff:
    ka, kb = knobs(a), knobs(b)
    changes = []
    for path in sorted(set(ka) | set(kb)):
        old, new = ka.get(path), kb.get(path)
        if old == new:
            continue
        if old is None or old == []:
            kind = "added"
        elif new is None or new == []:
            kind = "removed"
        else:
            kind = "changed"
        changes.append(KnobChange(path, kind, old, new, why_for(b, path) or why_for(a, path)))
    return ProfileDiff(a.name, b.name, changes)


def knob_lines(resolved: ResolvedProfile) -> str:
    """One line per set knob, sorted, with its why: what `git diff` compares for a profile file."""
    out = [
        f"profile {resolved.name}"
        + (f" (extends {' -> '.join(resolved.chain[1:])})" if len(resolved.chain) > 1 else "")
    ]
    if resolved.spec.description:
        out.append(f"description: {resolved.spec.description.strip()}")
    for path, value in knobs(resolved).items():
        if value is None or value == [] or value == {}:
            continue
        why = why_for(resolved, path)
        out.append(f"{path} = {_show(value)}" + (f"    # why: {why}" if why else ""))
    return "\n".join(out) + "\n"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)
