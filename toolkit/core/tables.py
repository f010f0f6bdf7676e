"""How every report writes a figure and a Markdown table: one number format, one table writer.

The results report, the sweep's and the tune's reports all go through `markdown_table`, so a cell never breaks
a table (a `|` is escaped, a newline becomes a space, runs of whitespace one space) and a failure reason stays on
one line. `figure` is the one way a figure is printed: thousands separators, at most one decimal from 100 up,
four significant digits below, no trailing zeros ("3,740", "1,517.3", "0.5572").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_SPACE = re.compile(r"\s+")


def figure(value: float | int | str | bool | None, *, sig: int = 4) -> str:
    """A figure as every report prints it; "-" when it is missing."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        text = f"{value:,.1f}"
    else:
        digits = max(0, sig - 1 - math.floor(math.log10(abs(value))))
        text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def cell(text: object) -> str:
    """One Markdown table cell: on one line, `|` escaped, empty shown as nothing."""
    s = _SPACE.sub(" ", "" if text is None else str(text)).strip()
    return s.replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[object]],
                   align: Sequence[str] | None = None) -> list[str]:
    """A GitHub-flavoured Markdown table as lines; `align` per column: "l" (default) or "r" (figures)."""
    marks = [("---:" if a == "r" else "---") for a in (align or ["l"] * len(head))]
    out = ["| " + " | ".join(cell(h) for h in head) + " |", "| " + " | ".join(marks) + " |"]
    for row in rows:
        cells = [cell(c) for c in row] + [""] * (len(head) - len(row))
        out.append("| " + " | ".join(cells) + " |")
    return out


def collapse_repeats(rows: Sequence[Sequence[str]], key: int) -> list[list[str]]:
    """Rows equal in every column but `key` become one row whose `key` cell lists them ("c=64, c=256"): the same
    failure of eight points is one line, not eight."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in rows:
        rest = tuple(c for i, c in enumerate(row) if i != key)
        groups.setdefault(rest, []).append(row[key])
    out = []
    for rest, keys in groups.items():
        row = list(rest)
        row.insert(key, ", ".join(dict.fromkeys(keys)))
        out.append(row)
    return out
