#!/usr/bin/env python3
"""Write the SGLang release tables of docs/profiles.md from the shipped catalogues and the rendering data.

    .venv/bin/python scripts/sglang_releases_doc.py            # rewrite the section in docs/profiles.md
    .venv/bin/python scripts/sglang_releases_doc.py --check    # exit 1 when the section is not what it would write

The section between the BEGIN and END markers is this script's: the catalogues (release, flags, deprecated,
removed since the previous release, the wheel they were read from), how each typed knob is spelled on each
release (toolkit/core/profile/flagmap.py), the renames table with its sources, and the releases each hardware rule
applies to. Edit the catalogues, flagmap.py or rules.py, not the section.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from doc_section import section_main  # noqa: E402

from toolkit.adapters.sglang_catalogue import available_versions, load_catalogue  # noqa: E402
from toolkit.core.profile.catalogue import Catalogue, removed_between  # noqa: E402
from toolkit.core.profile.flagmap import RENAMES, SERVER_KNOBS, knob_flags  # noqa: E402
from toolkit.core.profile.rules import RULES  # noqa: E402

DOC = REPO / "docs" / "profiles.md"
BEGIN = "<!-- BEGIN sglang-releases: written by scripts/sglang_releases_doc.py, do not edit by hand -->"
END = "<!-- END sglang-releases -->"


def cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _ranges(rows: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """[(release, value)] in release order -> [(first, last, value)] runs of equal values."""
    out: list[tuple[str, str, str]] = []
    for release, value in rows:
        if out and out[-1][2] == value:
            out[-1] = (out[-1][0], release, value)
        else:
            out.append((release, release, value))
    return out


def catalogues_table(catalogues: list[Catalogue]) -> list[str]:
    lines = ["| release | flags | deprecated | removed since the previous release | read from |",
             "|---|---|---|---|---|"]
    previous: Catalogue | None = None
    for cat in catalogues:
        removed = removed_between(previous, cat) if previous is not None else []
        shown = ", ".join(f"`{f}`" for f in removed) if removed else "none" if previous is not None else "(first)"
        wheel = f"{cat.source.get('wheel', '?')} (sha256 {str(cat.source.get('wheel_sha256', ''))[:12]})"
        lines.append(f"| {cat.sglang_version} | {len(cat.flags)} | {sum(f.deprecated for f in cat.flags)} | "
                     f"{shown} | {cell(wheel)} |")
        previous = cat
    return lines


def knobs_table(catalogues: list[Catalogue]) -> list[str]:
    lines = ["| knob | flags by release |", "|---|---|"]
    per_release = [(cat.sglang_version, knob_flags(cat)) for cat in catalogues]
    for knob in SERVER_KNOBS:
        rows = []
        for version, choices in per_release:
            choice = choices[knob.field]
            text = " ".join(f if v is None else f"{f} {v.replace('{value}', 'V')}" for f, v in choice.spelling or ())
            rows.append((version, (text or "no counterpart") + (" (deprecated)" if choice.deprecated else "")))
        runs = _ranges(rows)
        if len(runs) == 1:
            continue
        shown = "; ".join(f"`{v}` ({a}{'' if a == b else f' to {b}'})" for a, b, v in runs)
        lines.append(f"| `server.{knob.field}` | {shown} |")
    return lines


def renames_table() -> list[str]:
    lines = ["| old flag | new spelling | source |", "|---|---|---|"]
    for r in RENAMES:
        new = " ".join(f if v is None else f"{f} {v.replace('{value}', 'V')}" for f, v in r.new)
        drops = f" (and no {', '.join(r.drops)})" if r.drops else ""
        lines.append(f"| `{r.old}` | `{new}`{drops} | {cell(r.source)} |")
    return lines


def rules_table() -> list[str]:
    lines = ["| id | severity | releases | source |", "|---|---|---|---|"]
    for rule in RULES:
        lines.append(f"| `{rule.id}` | {rule.severity} | {rule.releases or 'all'} | {cell(rule.source)} |")
    return lines


def section() -> str:
    catalogues = [c for c in (load_catalogue(v) for v in available_versions()) if c is not None]
    parts = [
        BEGIN,
        "",
        f"Catalogues shipped ({len(catalogues)}, `toolkit/data/sglang_flags/`); regenerate this section with "
        "`.venv/bin/python scripts/sglang_releases_doc.py`.",
        "",
        *catalogues_table(catalogues),
        "",
        "How each typed knob is spelled on each release (only the knobs whose spelling changes; V is the knob's "
        "value):",
        "",
        *knobs_table(catalogues),
        "",
        "The renames table (`RENAMES` in `toolkit/core/profile/flagmap.py`), for what a release that already "
        "removed the old flag no longer says:",
        "",
        *renames_table(),
        "",
        "The releases each hardware rule applies to (`Rule.releases` in `toolkit/core/profile/rules.py`):",
        "",
        *rules_table(),
        "",
        END,
    ]
    return "\n".join(parts)


def rewrite(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers are missing; put {BEGIN!r} and {END!r} where the section goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + section() + tail


def main() -> int:
    return section_main(DOC, rewrite, __doc__.split("\n")[0], "scripts/sglang_releases_doc.py")


if __name__ == "__main__":
    sys.exit(main())
