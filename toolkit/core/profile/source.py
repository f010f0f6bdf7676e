"""YAML text in, data plus the line of every key out (pure: no file access).

PyYAML's node marks give line numbers; we compose the node tree once and build the Python
values from it ourselves, so each value and its line come from the same parse and duplicate
keys (which PyYAML silently lets win) are caught.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from toolkit.core.errors import Problem, ToolkitError

Path = tuple[str | int, ...]


@dataclass
class ProfileSource:
    """One profile file as read: its name, where it is, its text, its data and key lines."""

    name: str
    file: str
    text: str
    data: dict[str, Any]
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None


def dotted(path: Path) -> str:
    return ".".join(str(p) for p in path)


def parse_profile_text(name: str, file: str, text: str) -> ProfileSource:
    """Parse one profile's text. Raises ToolkitError (file, line, fix) for anything not a mapping."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        raise ToolkitError.of(
            f"not valid YAML: {err.problem or err}",
            file=file,
            line=line,
            fix="fix the YAML syntax at that line (indentation, a missing ':' or an unclosed quote)",
        ) from None
    except yaml.YAMLError as err:
        raise ToolkitError.of(f"not valid YAML: {err}", file=file, fix="fix the YAML syntax") from None
    if node is None:
        raise ToolkitError.of(
            "the file is empty",
            file=file,
            line=1,
            fix="start from an existing profile: schema_version, name, target, engine, model, server",
        )
    if not isinstance(node, yaml.MappingNode):
        kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
        raise ToolkitError.of(
            f"a profile must be a mapping of sections, this file holds {kind}",
            file=file,
            line=node.start_mark.line + 1,
            fix="write `key: value` sections at the top level (schema_version:, name:, server:, ...)",
        )
    lines: dict[Path, int] = {(): node.start_mark.line + 1}
    builder = _Builder(file, lines)
    data = builder.build(node, ())
    assert isinstance(data, dict)
    return ProfileSource(name=name, file=file, text=text, data=data, lines=lines)


class _Builder:
    def __init__(self, file: str, lines: dict[Path, int]) -> None:
        self.file = file
        self.lines = lines
        self.constructor = yaml.SafeLoader("")  # only its scalar constructors are used

    def build(self, node: yaml.Node, path: Path) -> Any:
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self.constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    key = str(key)
                child = (*path, key)
                line = key_node.start_mark.line + 1
                if key in out:
                    raise ToolkitError.of(
                        f"key {key!r} appears twice (first on line {self.lines[child]})",
                        file=self.file,
                        line=line,
                        field=dotted(child),
                        fix="keep one of the two; YAML would silently use the last",
                    )
                self.lines[child] = line
                out[key] = self.build(value_node, child)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                child = (*path, i)
                self.lines[child] = item.start_mark.line + 1
                items.append(self.build(item, child))
            return items
        return self.constructor.construct_object(node, deep=True)


def problem_at(source: ProfileSource, path: Path, message: str, fix: str, severity: str = "error") -> Problem:
    return Problem(message, file=source.file, line=source.line_of(path), field=dotted(path), fix=fix, severity=severity)
