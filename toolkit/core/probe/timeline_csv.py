"""The CSV layout the probe's side timelines share (server_trace.csv, host_trace.csv).

Line 1 is `<magic> schema_version=N key=value ...`, line 2 the column header, then one row per record.
An empty cell is "unavailable", never zero; cells never hold a comma or a newline (writers strip them).
Pure: text in, rows out. trace.csv keeps its own faster parser (core/probe/trace.py): it is 100x larger.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.core.errors import ToolkitError


def cell(v: float | int | str | bool | None) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:.4f}".rstrip("0").rstrip(".") if v == v else ""
    return str(v).replace(",", ";").replace("\n", " ").replace("\r", " ")


def header_line(magic: str, version: int, meta: dict[str, str]) -> str:
    items = {"schema_version": str(version), **{k: v for k, v in meta.items() if k != "schema_version"}}
    return magic + " " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in items.items()) + "\n"


def row_line(columns: Sequence[str], row: dict[str, float | int | str | bool | None]) -> str:
    return ",".join(cell(row.get(c)) for c in columns) + "\n"


def parse_rows(text: str, *, magic: str, version: int, columns: Sequence[str], file: str,
               what: str) -> tuple[dict[str, str], list[list[str]]]:
    """(header metadata, rows as cell lists). A truncated last line (an interrupted write) is dropped."""
    lines = text.split("\n")
    first = lines[0] if lines else ""
    if not first.startswith(magic):
        raise ToolkitError.of(f"not a toolkit {what} (missing the {magic!r} header)", file=file, line=1,
                              fix=f"give the {what} that `toolkit probe run` wrote")
    meta: dict[str, str] = {}
    for token in first[len(magic):].split():
        key, sep, value = token.partition("=")
        if not sep:
            raise ToolkitError.of(f"header token {token!r} is not key=value", file=file, line=1,
                                  fix="restore the file's first line")
        meta[key] = value
    v = meta.get("schema_version", "")
    if not v.isdigit():
        raise ToolkitError.of("header has no schema_version", file=file, line=1, fix="restore the file's first line")
    if int(v) > version:
        raise ToolkitError.of(f"{what} schema_version {v} is newer than this toolkit reads ({version})", file=file,
                              line=1, field="schema_version", fix="upgrade the toolkit")
    if len(lines) < 2 or not lines[1].strip():
        raise ToolkitError.of(f"{what} is truncated: no column header", file=file, line=2, fix="re-record the run")
    head = lines[1].rstrip("\r").split(",")
    # Schema 1 may grow columns at the end: the known ones must come first, in order.
    if tuple(head[: len(columns)]) != tuple(columns):
        missing = [c for c in columns if c not in head]
        raise ToolkitError.of(f"column header does not match schema {version} (missing: {missing or 'order differs'})",
                              file=file, line=2, fix="give a file written by `toolkit probe run`")
    body = lines[2:]
    if body and body[-1] == "":
        body = body[:-1]
    elif body:
        body = body[:-1]  # no line end: the writer was cut mid-row; the complete rows before it stand
    rows: list[list[str]] = []
    for i, line in enumerate(body):
        cells = line.rstrip("\r").split(",")
        if len(cells) < len(head):
            raise ToolkitError.of(f"row has {len(cells)} fields, expected {len(head)}", file=file, line=i + 3,
                                  fix="re-record the run, or cut the file before this line")
        rows.append(cells[: len(columns)])
    return meta, rows


def number(cells: str, file: str, line: int, column: str) -> float | None:
    if not cells:
        return None
    try:
        return float(cells)
    except ValueError:
        raise ToolkitError.of(f"field {column} is {cells!r}, not a number", file=file, line=line,
                              fix="re-record the run, or repair this line") from None
