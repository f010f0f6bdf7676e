"""YAML text in, data plus the line of every key out (pure: no file access).

PyYAML's node marks give line numbers; we compose the node tree once and build the Python
values from it ourselves, so each value and its line come from the same parse and duplicate
keys (which PyYAML silently lets win) are caught.

The loader is bounded: before anything is composed, one pass over the parser's events refuses a file
that is too large, nested too deep, or whose aliases expand to too many values (a few lines of
anchors can stand for billions of values), so a hostile file is refused in milliseconds instead of
hanging the command or overflowing the stack. What YAML 1.1 reads differently from what the
author wrote (a number in octal or base 60, a merge key, a tag naming a type) is refused too.
"""

from __future__ import annotations

import contextlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import yaml

from toolkit.core.errors import ToolkitError
from toolkit.core.profile.model import RESULTS_MARKER

Path = tuple[str | int, ...]

# A profile is a few KiB; its results block keeps `keep_last` entries of about 2 KiB each.
MAX_PROFILE_BYTES = 512 * 1024
# The deepest path of a profile is results.entries.N.power.per_gpu.N.mean_w (7 levels).
MAX_DEPTH = 24
# Values after alias expansion: a profile with a full results block has a few thousand (the shipped ones fewer
# than 1,500); composing 50,000 took a second on a loaded host, so the bound is lower.
MAX_VALUES = 20_000

# The longest whole number a field takes is 10 digits (2**32 - 1, a bench seed); YAML's integers go to int(),
# which refuses more than 4,300 digits and is quadratic below that.
MAX_INT_CHARS = 64

# libyaml's parser when PyYAML was built with it (the wheels are): 20x faster than the pure-Python one,
# and the same events, marks and errors.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TAG = "tag:yaml.org,2002:"
# Tags whose values the profile model knows; anything else (!!binary, !!timestamp, !!set, a local !tag)
# would hand the model a type it never expects, or silently become a mapping or a list.
_PLAIN_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
# An integer as people write one; YAML 1.1 also reads 0700 as octal 448, 0x1F as hex, 1:20 as 80 (base 60).
_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)")

_RESULTS_FIX = (
    "the results block is written by the toolkit: restore it from git (`git checkout -p` on the profile), "
    "or delete everything below the marker line to start a fresh history"
)


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


def marker_line(text: str) -> int | None:
    """The 1-based line of the results marker, or None."""
    for i, line in enumerate(text.split("\n"), start=1):  # "\n" only: the lines YAML and editors count
        if line.rstrip("\r") == RESULTS_MARKER:
            return i
    return None


def too_large(file: str, size: int) -> ToolkitError:
    """The refusal of a file over MAX_PROFILE_BYTES (`size` may be a lower bound: readers stop early)."""
    return ToolkitError.of(
        f"the file is {size:,} bytes or more, more than a profile may be ({MAX_PROFILE_BYTES:,})",
        file=file,
        line=1,
        fix="a profile is a few KiB: move data elsewhere; a long results history shrinks with a lower "
        "results.keep_last",
    )


def parse_profile_text(name: str, file: str, text: str) -> ProfileSource:
    """Parse one profile's text. Raises ToolkitError (file, line, field, fix) for anything that is not a
    mapping of plain YAML values within the loader's bounds."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PROFILE_BYTES:
        raise too_large(file, size)
    hidden = _HIDDEN.search(text)
    if hidden is not None:
        char = hidden.group()
        line = text.count("\n", 0, hidden.start()) + 1
        raise ToolkitError.of(
            f"U+{ord(char):04X} ({_UNNAMED.get(char) or unicodedata.name(char, '')}) on this line: "
            + ("YAML reads it as a line break where editors and git show none, so what follows it is read as YAML "
               "that no reviewer saw" if char in _YAML_BREAKS else
               "it reorders how the text is shown, so what a reviewer reads is not what YAML reads"),
            file=file,
            line=line,
            field=dotted(_path_of_line(text, line)) or None,
            fix="remove it (pasted text carries such characters; `cat -A` or `grep -P '[\\x{2028}\\x{202e}]'` "
            "shows them)",
        )
    lone = _SURROGATE.search(text)
    if lone is not None:
        # libyaml takes the text as UTF-8, which cannot hold a lone surrogate: refused here, located, rather
        # than as a UnicodeEncodeError from inside the parser.
        line = text.count("\n", 0, lone.start()) + 1
        raise ToolkitError.of(
            f"U+{ord(lone.group()):04X} (a lone surrogate: not a character, and no UTF-8 file can hold it) on this "
            "line",
            file=file,
            line=line,
            field=dotted(_path_of_line(text, line)) or None,
            fix="re-save the file as UTF-8 (the text came from a broken encoding or a lossy copy)",
        )
    _scan(file, text)
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as err:  # the scan parsed the same text; kept so no YAML error escapes as a traceback
        raise _yaml_error(file, text, err, ()) from None
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
    if node.tag != _TAG + "map":
        raise ToolkitError.of(
            f"a profile must be a mapping of sections, this file is tagged {node.tag.replace(_TAG, '!!')}",
            file=file,
            line=node.start_mark.line + 1,
            fix="remove the tag before the first key",
        )
    lines: dict[Path, int] = {(): node.start_mark.line + 1}
    builder = _Builder(file, lines)
    data = builder.build(node, ())
    assert isinstance(data, dict)
    return ProfileSource(name=name, file=file, text=text, data=data, lines=lines)


@dataclass
class _Frame:
    path: Path
    mapping: bool
    anchor: str | None
    start: int  # the value count when the collection opened
    items: int = 0  # keys and values (mapping) or items (sequence) seen so far
    key: str | int | None = None


def _scan(file: str, text: str, spans: list[tuple[int, Path]] | None = None) -> None:
    """One pass over the parser's events (libyaml's parser keeps its own stack: no recursion here), refusing
    nesting deeper than MAX_DEPTH, an alias inside its own anchor, and more than MAX_VALUES values once
    every alias is expanded (each alias counts the values of its anchor, so nothing is expanded to count).
    `spans`, when given, collects (0-based line, path) of every key and value, to name the field of a line."""
    stack: list[_Frame] = []
    sizes: dict[str, int] = {}
    values = 0
    aliased = False

    def path() -> Path:
        if not stack:
            return ()
        top = stack[-1]
        return (*top.path, top.key) if top.key is not None else top.path

    def refuse(message: str, event: Any, fix: str) -> ToolkitError:
        where = path()
        return ToolkitError.of(
            message, file=file, line=event.start_mark.line + 1, field=dotted(where) or None, fix=fix
        )

    def added(event: Any) -> None:
        """Note a finished value (scalar, alias or collection) in its parent: a mapping alternates key, value."""
        if not stack:
            return
        top = stack[-1]
        if top.mapping:
            if top.items % 2 == 0:
                key = event.value if isinstance(event, yaml.ScalarEvent) else "?"
                top.key = key
            top.items += 1
        else:
            top.key = top.items
            top.items += 1

    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if spans is not None and isinstance(event, yaml.NodeEvent):
                top = stack[-1] if stack else None
                line = event.start_mark.line if event.start_mark is not None else 0
                if top is not None and top.mapping and top.items % 2 == 0:
                    spans.append((line, (*top.path, getattr(event, "value", "?"))))
                elif top is not None and not top.mapping:
                    spans.append((line, (*top.path, top.items)))
                else:
                    spans.append((line, path()))
            if isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
                if stack and not stack[-1].mapping:
                    stack[-1].key = stack[-1].items
                if isinstance(event, yaml.AliasEvent):
                    if any(f.anchor == event.anchor for f in stack):
                        raise refuse(
                            f"the alias *{event.anchor} refers to a value that contains it: it never ends",
                            event,
                            "refer to a finished anchor, or write the value out",
                        )
                    values += sizes.get(event.anchor or "", 1)
                    aliased = True
                else:
                    values += 1
                    if event.anchor:
                        sizes[event.anchor] = 1
                if values > MAX_VALUES:
                    if aliased:
                        raise refuse(
                            f"the aliases expand to more than {MAX_VALUES:,} values",
                            event,
                            "write the values out or use fewer aliases (an alias stands for every value of its anchor)",
                        )
                    raise refuse(f"the file holds more than {MAX_VALUES:,} values", event,
                                 "a profile holds a few hundred values: move data elsewhere; a long results history "
                                 "shrinks with a lower results.keep_last")
                added(event)
            elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                if stack and not stack[-1].mapping:
                    stack[-1].key = stack[-1].items
                values += 1
                stack.append(_Frame(path(), isinstance(event, yaml.MappingStartEvent), event.anchor, values))
                if len(stack) > MAX_DEPTH:
                    raise refuse(
                        f"nested more than {MAX_DEPTH} levels deep",
                        event,
                        "a profile is a few levels of sections and keys: flatten the value",
                    )
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                frame = stack.pop()
                if frame.anchor:
                    sizes[frame.anchor] = values - frame.start + 1
                added(event)
    except yaml.YAMLError as err:
        if spans is not None:  # reading for spans: what was read up to the error is all there is
            return
        raise _yaml_error(file, text, err, path()) from None


def _yaml_error(file: str, text: str, err: yaml.YAMLError, where: Path) -> ToolkitError:
    line: int | None = None
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        what = err.problem or str(err)
    elif isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        code = err.character if isinstance(err.character, int) else ord(err.character)
        what = f"the character U+{code:04X} is not allowed in YAML"
        where = where or _path_of_line(text, line)
    else:
        what = str(err)
    if "nesting depth" in what:  # libyaml's own limit (1000 levels), met before the scan's MAX_DEPTH
        return ToolkitError.of(
            f"nested more than {MAX_DEPTH} levels deep",
            file=file,
            line=line,
            field=dotted(where) or None,
            fix="a profile is a few levels of sections and keys: flatten the value",
        )
    if not where and line is not None:  # outside the document's mapping: the nearest key says where
        where = _path_of_line(text, line)
    marker = marker_line(text)
    if marker is not None and line is not None and line > marker:
        return ToolkitError.of(
            f"the results block is not valid YAML: {what} (the block starts below the marker, line {marker})",
            file=file,
            line=line,
            field=dotted(where) if where[:1] == ("results",) else "results",
            fix=_RESULTS_FIX,
        )
    named = _named_syntax_error(text, line, what)
    if named is not None:
        line, message, fix = named
        return ToolkitError.of(message, file=file, line=line, field=dotted(_path_of_line(text, line)) or None,
                               fix=fix)
    return ToolkitError.of(
        f"not valid YAML: {what}",
        file=file,
        line=line,
        field=dotted(where) or None,
        fix="remove the character (control characters are invisible in most editors; pasted text carries them)"
        if isinstance(err, yaml.reader.ReaderError)
        else "fix the YAML syntax at that line (indentation, a missing ':' or an unclosed quote)",
    )


_KEY_WITHOUT_COLON = re.compile(r"^(\s*)([A-Za-z_][\w.-]*)[ \t]+([^\s:#][^:#]*?)\s*$")


def _named_syntax_error(text: str, line: int | None, what: str) -> tuple[int, str, str] | None:
    """(line, message, fix) for the YAML mistakes people make, in their words rather than the parser's: a tab in
    the indentation, a key without its colon (which YAML reports at the line after it)."""
    if line is None:
        return None
    lines = text.splitlines()
    for n in (line, line - 1):
        indent = lines[n - 1][: len(lines[n - 1]) - len(lines[n - 1].lstrip())] if 0 < n <= len(lines) else ""
        if "\t" in indent or ("tab" in what and 0 < n <= len(lines) and "\t" in lines[n - 1]):
            return (n, f"tab character at line {n}; YAML indents with spaces",
                    "replace the tab with spaces, as many as the lines around it are indented")
    if "mapping values are not allowed" in what or "could not find expected ':'" in what:
        for n in range(line - 1, max(0, line - 3), -1):
            match = _KEY_WITHOUT_COLON.match(lines[n - 1]) if 0 < n <= len(lines) else None
            if match:
                key, value = match.group(2), match.group(3)
                return (n, f"missing ':' after {key!r} at line {n}",
                        f"write `{key}: {value}`")
    return None


# Characters that make a file read differently from how it looks, refused anywhere in it (comments included):
# NEL and the line and paragraph separators are line breaks to YAML 1.1 but not to editors or git, and the
# bidirectional embeddings, overrides and isolates reorder what is shown (CVE-2021-42574, "Trojan Source").
# A carriage return not followed by a newline is one too (old Mac line ends; most editors show it as nothing).
_YAML_BREAKS = "\r\x85\u2028\u2029"
_HIDDEN = re.compile("[\x85\u2028\u2029\u202a-\u202e\u2066-\u2069]|\r(?!\n)")
_UNNAMED = {"\r": "CARRIAGE RETURN", "\x85": "NEXT LINE"}
_SURROGATE = re.compile("[\ud800-\udfff]")
# What YAML may not hold at all (its "printable" set, YAML 1.1 section 5.1); the reader refuses the stream before
# the parser sees any key, so the field of such a character is found on a copy without them (same lines).
_UNPRINTABLE = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _path_of_line(text: str, line: int) -> Path:
    """The key or value that starts last at or before `line` (1-based), read from a copy of `text` without the
    characters YAML refuses (none of them a line break, so every line keeps its number)."""
    spans: list[tuple[int, Path]] = []
    with contextlib.suppress(ToolkitError):  # too deep or too many values: the spans read so far are enough
        _scan("", _HIDDEN.sub("", _UNPRINTABLE.sub("", text)), spans)
    if not any(path for _, path in spans):  # YAML gave up before the first key: lines that look like `key:` say
        spans = _key_lines(text)
    before = [path for start, path in spans if start < line and path]
    after = [path for start, path in spans if path]
    return before[-1] if before else after[0] if after else ()


def _key_lines(text: str) -> list[tuple[int, Path]]:
    """(0-based line, dotted path by indentation) of every line that looks like a block mapping key."""
    out: list[tuple[int, Path]] = []
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(text.split("\n")):
        m = re.match(r"( *)([A-Za-z_][\w.-]*):(\s|$)", line)
        if m is None:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        out.append((i, tuple(key for _, key in stack)))
    return out


class _Builder:
    def __init__(self, file: str, lines: dict[Path, int]) -> None:
        self.file = file
        self.lines = lines
        self.constructor = yaml.SafeLoader("")  # only its scalar constructors are used

    def refuse(self, node: yaml.Node, path: Path, message: str, fix: str) -> ToolkitError:
        return ToolkitError.of(message, file=self.file, line=node.start_mark.line + 1, field=dotted(path) or None,
                               fix=fix)

    def build(self, node: yaml.Node, path: Path) -> Any:
        if node.tag not in _PLAIN_TAGS:
            shown = node.tag.replace(_TAG, "!!")
            if node.tag == _TAG + "timestamp":
                raise self.refuse(node, path, f"{node.value!r} is read by YAML as a date",
                                  f"quote it if it is text: '{node.value}'")
            raise self.refuse(node, path, f"the YAML tag {shown} is not allowed in a profile",
                              "remove the tag: a profile holds plain text, numbers, booleans, lists and mappings")
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = self._key(key_node, path)
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
        if node.tag == _TAG + "int" and len(node.value) > MAX_INT_CHARS:
            # int() refuses more than 4,300 digits (CVE-2020-10735) and no field takes more than 10: refused here,
            # located, rather than as a ValueError from the constructor.
            raise self.refuse(node, path, f"a whole number of {len(node.value):,} characters: no field takes a "
                              f"number this large", "write the number the field takes (see its range), or quote "
                              "it if it is text")
        if node.tag == _TAG + "int" and not _DECIMAL_INT.fullmatch(node.value):
            value = self.constructor.construct_object(node, deep=True)
            digits = node.value.lstrip("+-").lower()
            kind = {"0x": "hex", "0b": "binary"}.get(digits[:2], "base 60" if ":" in digits else "octal")
            raise self.refuse(node, path, f"{node.value} is read by YAML 1.1 as {value} ({kind})",
                              f"write the number in decimal ({value}), or quote it if it is text")
        if node.tag == _TAG + "float" and ":" in node.value:
            value = self.constructor.construct_object(node, deep=True)
            raise self.refuse(node, path, f"{node.value} is read by YAML 1.1 as {value} (base 60)",
                              f"write the number in decimal ({value}), or quote it if it is text")
        return self.constructor.construct_object(node, deep=True)

    def _key(self, node: yaml.Node, path: Path) -> str:
        """A mapping key is a name: text, never a number, a boolean, null, a list or a merge (<<)."""
        if node.tag == _TAG + "merge":
            raise self.refuse(node, (*path, "<<"), "YAML merge keys (<<) are not supported in a profile",
                              "share settings through extends: (a parent profile), or write them out")
        if not isinstance(node, yaml.ScalarNode) or node.tag != _TAG + "str":
            shown = node.value if isinstance(node, yaml.ScalarNode) else "a " + (
                "mapping" if isinstance(node, yaml.MappingNode) else "list")
            kind = node.tag.replace(_TAG, "")
            # The field is the key as written (a list or a mapping as a key has no text: its kind stands in).
            raise self.refuse(node, (*path, shown), f"the key {shown!r} is not text (YAML reads it as {kind})",
                              f"keys are names: quote it if it is one, e.g. '{shown}':")
        key = self.constructor.construct_object(node, deep=True)
        assert isinstance(key, str)
        hidden = next((c for c in key if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")), None)
        if hidden is not None:  # a key is printed as it is (show, diff, textconv, every error's field)
            shown = ascii(key)[1:-1]  # the field names it with the character escaped, never the character
            raise self.refuse(node, (*path, shown), f"the key {key!r} holds U+{ord(hidden):04X}, a character that "
                              "does not show or drives the terminal", "write the key in plain text")
        return key
