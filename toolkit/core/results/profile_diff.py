"""Results beside the spec in `toolkit profile diff A B` and in the git textconv view.

Builds on toolkit.core.profile.diff (the knobs) and adds the results; pure (resolved profiles in, lines out).
"""

from __future__ import annotations

from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.profile.diff import DiffSection, ProfileDiff, diff_profiles, knob_lines
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.results.compare import is_stale, latest, result_deltas
from toolkit.core.results.migrate import migrate_block
from toolkit.core.results.model import ResultsBlock, ResultsEntry


def block_of(resolved: ResolvedProfile) -> ResultsBlock | None:
    """The profile's own results block, migrated to the current schema (None when it has none)."""
    raw = resolved.spec.results
    if raw is None:
        return None
    data: dict[str, Any] = raw.model_dump(mode="python")
    return ResultsBlock.model_validate(migrate_block(data, file=resolved.file, line=None))


def _describe(entry: ResultsEntry, stale: bool) -> str:
    bits = [entry.run_id, entry.source]
    if entry.date:
        bits.append(entry.date)
    if entry.lab:
        bits.append(f"lab data: {entry.lab.kind}")
    if stale:
        bits.append("STALE: measured an older spec")
    return ", ".join(bits)


def results_section(a: ResolvedProfile, b: ResolvedProfile) -> DiffSection | None:
    """The deltas between each profile's latest (fresh, where there is one) entry."""
    try:
        block_a, block_b = block_of(a), block_of(b)
    except (ToolkitError, ValueError) as err:
        return DiffSection("results", [f"(results not comparable: {err})"])
    hash_a, hash_b = spec_hash(a), spec_hash(b)
    ea, eb = latest(block_a, hash_a), latest(block_b, hash_b)
    if ea is None and eb is None:
        return None
    lines = [
        f"{a.name}: {_describe(ea, is_stale(ea, hash_a)) if ea else 'no results'}",
        f"{b.name}: {_describe(eb, is_stale(eb, hash_b)) if eb else 'no results'}",
    ]
    lines += [d.render() for d in result_deltas(ea, eb)]
    return DiffSection(f"results ({a.name} -> {b.name}, latest entries)", lines)


def entry_line(entry: ResultsEntry, current_hash: str | None) -> str:
    """One entry as one line of figures: a textconv diff shows which figure moved."""
    rate, kind = entry.output_tok_per_s()
    parts = [f"{entry.run_id} [{entry.source}{', ' + entry.lab.kind if entry.lab else ''}]"]
    if entry.date:
        parts.append(entry.date)
    if rate is not None:
        parts.append(f"{rate:g} tok/s ({'steady' if kind == 'steady' else 'full run'})")
    if entry.power and entry.power.mean_w is not None:
        parts.append(f"{entry.power.mean_w:g} W/GPU")
    if entry.energy and entry.energy.j_per_output_tok is not None:
        parts.append(f"{entry.energy.j_per_output_tok:g} J/tok")
    if entry.verdict:
        parts.append(entry.verdict.class_)
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
