"""Results beside the spec in `toolkit profile diff A B` and in the git textconv view.

Builds on toolkit.core.profile.diff (the knobs) and adds the results; pure (resolved profiles in, lines out).
"""

from __future__ import annotations

from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.profile.diff import DiffSection, ProfileDiff, diff_profiles, knob_lines
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.results.comparable import class_key, differences, workload
from toolkit.core.results.compare import (
    figures_line,
    is_stale,
    latest_per_class,
    power_energy_verdict,
    result_deltas,
)
from toolkit.core.results.migrate import migrate_block
from toolkit.core.results.model import ResultsBlock, ResultsEntry
from toolkit.core.tables import figure


def block_of(resolved: ResolvedProfile) -> ResultsBlock | None:
    """The profile's own results block, migrated to the current schema (None when it has none)."""
    raw = resolved.spec.results
    if raw is None:
        return None
    data: dict[str, Any] = raw.model_dump(mode="python")
    return ResultsBlock.model_validate(migrate_block(data, file=resolved.file, line=None))


def _describe(entry: ResultsEntry, stale: bool) -> str:
    bits = [entry.run_id]
    if entry.date:
        bits.append(entry.date)
    if stale:
        bits.append("STALE: measured an older spec")
    return ", ".join(bits)


def results_section(a: ResolvedProfile, b: ResolvedProfile) -> DiffSection | None:
    """Per comparability class (provenance kind and workload) present on both sides, the deltas between each
    profile's latest entry of that class; the entries without a like on the other side are shown apart, with
    the reason, and never as a percentage."""
    try:
        block_a, block_b = block_of(a), block_of(b)
    except (ToolkitError, ValueError) as err:
        return DiffSection("results", [f"(results not comparable: {err})"])
    hash_a, hash_b = spec_hash(a), spec_hash(b)
    la, lb = latest_per_class(block_a, hash_a), latest_per_class(block_b, hash_b)
    if not la and not lb:
        return None
    lines: list[str] = []
    by_b = {class_key(e): e for e in lb}
    paired = set()
    for ea in la:
        eb = by_b.get(class_key(ea))
        if eb is None:
            continue
        paired.add(class_key(ea))
        p = ea.provenance()
        lines.append(f"{p.label}, {workload(ea).text()}:")
        lines.append(f"  {a.name}: {_describe(ea, is_stale(ea, hash_a))}")
        lines.append(f"  {b.name}: {_describe(eb, is_stale(eb, hash_b))}")
        deltas = result_deltas(ea, eb)
        lines += [f"  {d.render()}" for d in deltas] or [f"  not compared: {'; '.join(differences(ea, eb))}"]
    apart = [(a.name, e, lb) for e in la if class_key(e) not in paired]
    apart += [(b.name, e, la) for e in lb if class_key(e) not in paired]
    if apart:
        lines.append("shown apart, not compared (no entry of the same provenance and workload on the other side):")
        for name, e, others in apart:
            why = "; ".join(differences(others[0], e)) if others else "the other profile has no results"
            lines.append(f"  {name}: {e.provenance().label}, {workload(e).text()}: {figures_line(e)}")
            lines.append(f"    ({_describe(e, False)}; {why})")
    return DiffSection(f"results ({a.name} -> {b.name}, latest entry of each provenance and workload)", lines)


def entry_line(entry: ResultsEntry, current_hash: str | None) -> str:
    """One entry as one line of figures: a textconv diff shows which figure moved."""
    rate, kind = entry.output_tok_per_s()
    parts = [f"{entry.run_id} [{entry.provenance().label}]"]
    if entry.date:
        parts.append(entry.date)
    parts.append(workload(entry).text())
    if rate is not None:
        parts.append(f"{figure(rate)} tok/s ({'steady' if kind == 'steady' else 'full run'})")
    parts += power_energy_verdict(entry)
    if is_stale(entry, current_hash):
        parts.append("STALE")
    return " | ".join(parts)


def textconv_lines(resolved: ResolvedProfile) -> list[str]:
    try:
        block = block_of(resolved)
    except (ToolkitError, ValueError) as err:
        return [f"results: (unreadable: {err})"]
    if block is None:
        return []
    current = spec_hash(resolved)
    n = len(block.entries)
    return [f"results: {n} entr{'y' if n == 1 else 'ies'} (schema {block.schema_version}, keep_last "
            f"{block.keep_last})"] + ["  " + entry_line(e, current) for e in block.entries]


def profile_diff(a: ResolvedProfile, b: ResolvedProfile) -> ProfileDiff:
    """`toolkit profile diff A B`: the knobs changed, then the deltas of the latest results."""
    diff = diff_profiles(a, b)
    section = results_section(a, b)
    if section is not None:
        diff.sections.append(section)
    return diff


def textconv_text(resolved: ResolvedProfile) -> str:
    """What `git diff` compares for a profile file: one line per set knob with its why, then the results block
    as one line of figures per entry, so a diff shows which figure moved."""
    return knob_lines(resolved) + "".join(f"{line}\n" for line in textconv_lines(resolved))
