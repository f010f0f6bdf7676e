"""Semantic diff of two resolved profiles: knobs changed, added, removed (through extends:),
each with its why. `textconv_text` is the same view for one profile, for `git diff`.

Knobs only: toolkit.core.results.profile_diff puts the results beside them (it builds on this module, never
the other way round).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.profile.resolve import Origin, ResolvedProfile
from toolkit.core.text import redact_data

# Sections that are not knobs: prose and the toolkit's own block.
NOT_KNOBS = ("name", "description", "extends", "why", "acknowledge", "results", "schema_version")


@dataclass(frozen=True)
class KnobChange:
    path: str
    kind: str  # "changed", "added", "removed"
    old: Any
    new: Any
    why: str | None  # the reason (and link) b gives for its value, from the profile that set it

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


def why_entry(resolved: ResolvedProfile, path: str) -> tuple[str | None, Origin | None]:
    """(the `why` key that explains `path`: the path itself or its nearest section, where that why was set)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        key = ".".join(parts[:cut])
        if key in resolved.spec.why:
            return key, resolved.origins.get(f"why.{key}")
    return None, None


def _lookup(data: Any, path: str) -> tuple[bool, Any]:
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def changed_here(resolved: ResolvedProfile, path: str) -> bool:
    """Whether this profile's own file sets `path` to other than what its parent resolves it to."""
    origin = resolved.origins.get(path)
    if resolved.parent_data is None or origin is None or origin.file != resolved.file:
        return False
    return _lookup(resolved.data, path) != _lookup(resolved.parent_data, path)


def why_for(resolved: ResolvedProfile, path: str) -> str | None:
    """The reason (and link) for `path`'s value, from the profile that set the value (or from this profile): a
    parent's reason is for the parent's value, never the reason for a value a child set."""
    key, origin = why_entry(resolved, path)
    if key is None:
        return None
    value_origin = resolved.origins.get(path)
    if origin is not None and value_origin is not None and origin.profile not in (value_origin.profile,
                                                                                  resolved.name):
        return None
    why = resolved.spec.why[key]
    return " ".join(why.reason.split()) + (f" ({why.link})" if why.link else "")


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
        # A diff shows that a secret changed, never the secret (a reference to one is shown).
        old, new = redact_data(old, path.rsplit(".", 1)[-1]), redact_data(new, path.rsplit(".", 1)[-1])
        # The reason for the change is b's (for its value); a's reason was for the old value, never this change's.
        changes.append(KnobChange(path, kind, old, new, why_for(b, path)))
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
        value = redact_data(value, path.rsplit(".", 1)[-1])
        out.append(f"{path} = {_show(value)}" + (f"    # why: {why}" if why else ""))
    return "\n".join(out) + "\n"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)
