"""`extends:` resolution: deep merge (a list replaces, `null` removes), cycles and missing parents refused.

Pure: the caller passes a `loader(name) -> ProfileSource`; the filesystem lives in
toolkit.adapters.profile_store.
"""

from __future__ import annotations

import copy
import difflib
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.catalogue import Catalogue
from toolkit.core.profile.model import Profile
from toolkit.core.profile.source import Path, ProfileSource, dotted
from toolkit.core.text import secret_name

Loader = Callable[[str], ProfileSource]

# Keys that belong to one file and are never inherited from a parent.
OWN_KEYS = ("name", "description", "extends", "results", "schema_version")


class ProfileNotFound(ToolkitError):
    """The loader has no profile of that name (as opposed to one that fails to parse)."""


@dataclass(frozen=True)
class Origin:
    """Where a merged value was set: the file, its line, and the profile's name."""

    profile: str
    file: str
    line: int | None


@dataclass
class ResolvedProfile:
    """The merged spec of a profile and its `extends:` chain."""

    name: str
    file: str
    spec: Profile
    chain: list[str]  # this profile first, then its parent, grandparent, ...
    data: dict[str, Any]  # the merged data the spec was validated from
    origins: dict[str, Origin] = field(default_factory=dict)  # dotted path -> where it was set
    source: ProfileSource | None = None
    # The pinned release's flag catalogue (the store attaches it): rendering spells each knob as that release
    # does. None: no catalogue known, each knob renders its first (0.5.9) spelling and validate() says so.
    catalogue: Catalogue | None = field(default=None, repr=False)
    # The parent's merged data and where each of its values was set (None: no parent): what this profile
    # changes, and whose why a knob has.
    parent_data: dict[str, Any] | None = field(default=None, repr=False)
    parent_origins: dict[str, Origin] = field(default_factory=dict, repr=False)

    # Section shortcuts, so callers write resolved.server.tp_size.
    @property
    def target(self) -> Any:
        return self.spec.target

    @property
    def engine(self) -> Any:
        return self.spec.engine

    @property
    def model(self) -> Any:
        return self.spec.model

    @property
    def server(self) -> Any:
        return self.spec.server

    @property
    def env(self) -> dict[str, str]:
        return self.spec.env

    @property
    def bench(self) -> Any:
        return self.spec.bench

    @property
    def probe(self) -> Any:
        return self.spec.probe

    @property
    def why(self) -> Any:
        return self.spec.why

    @property
    def results(self) -> Any:
        return self.spec.results

    def origin(self, path: str) -> Origin | None:
        """Where `path` (dotted) or its nearest ancestor was set."""
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            hit = self.origins.get(".".join(parts[:cut]))
            if hit is not None:
                return hit
        return None

    def problem(
        self, path: str, message: str, fix: str, severity: str = "error", rule_id: str | None = None
    ) -> Problem:
        """A Problem located where `path` was set (or, if never set, in this profile's file: at the section it
        belongs in when the file has one, else at its first line)."""
        where = self.origin(path)
        own_line = self.source.line_of(tuple(path.split("."))) if self.source is not None else None
        return Problem(
            message,
            file=where.file if where else self.file,
            line=where.line if where else own_line,
            field=path,
            fix=fix,
            severity=severity,
            rule_id=rule_id,
        )


def strip_nulls(value: Any) -> Any:
    """Drop `key: null` (a merge directive: remove) so a file alone can be type-checked."""
    if isinstance(value, dict):
        return {k: strip_nulls(v) for k, v in value.items() if v is not None}
    return value


def deep_merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; a list or scalar replaces; `null` removes the key."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = deep_merge(out[key], value)
            else:
                out[key] = value
        return out
    return over


def check_file(source: ProfileSource) -> Profile:
    """Type-check one file on its own, reporting every problem with its line."""
    data = strip_nulls(source.data)
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        fields = _by_field(err, data)
        problems = [_pydantic_problem(source, loc, errors) for loc, errors in fields[:MAX_PROBLEMS]]
        raise ToolkitError(problems + _more(source.file, len(fields) - MAX_PROBLEMS)) from None


# Problems of one file reported in full; past them, one line says how many more (each costs a lookup, a "did
# you mean" and a line of output: a file of 20,000 unknown keys would otherwise take seconds and megabytes).
MAX_PROBLEMS = 20


def _more(file: str, count: int) -> list[Problem]:
    if count <= 0:
        return []
    return [Problem(f"{count:,} more problems of this file are not shown", file=file, line=1,
                    fix="fix the ones shown first (a profile has a few dozen keys: so many problems are usually one "
                    "mistake repeated)")]


def _by_field(err: ValidationError, data: Any) -> list[tuple[Path, list[Any]]]:
    """pydantic's errors grouped by the profile path they are about, in order. A value checked against a union
    (`float | "inf"`) gets one error per member, each with the member's name appended to its loc: those are one
    problem of one field."""
    grouped: dict[Path, list[Any]] = {}
    for error in err.errors():
        grouped.setdefault(_data_path(tuple(error["loc"]), data), []).append(error)
    return list(grouped.items())


def _data_path(loc: Path, data: Any) -> Path:
    """The part of `loc` that names a place in the input: keys and indexes that exist there, plus a missing
    key of a mapping; what follows a plain value (a union member's name) is dropped."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            out.append(part)
            if part not in node:
                break
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        else:
            break
    return tuple(out)


def _pydantic_problem(source: ProfileSource, loc: Path, errors: list[Any]) -> Problem:
    error = errors[0]
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        allowed = _allowed_keys(parent)
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        if not close and not parent:  # a knob dedented to the top: name the section it belongs to
            sections = [f"{name}.{key}" for name in allowed if key in (_allowed_keys((name,)) or ())]
            if sections:
                hint = f"did you mean {sections[0]}? (indent it under {sections[0].split('.')[0]}:) "
        return Problem(
            f"unknown key {key!r}",
            file=source.file,
            line=source.line_of(loc),
            field=dotted(loc),
            fix=f"{hint}allowed here: {', '.join(sorted(allowed))}" if allowed else "remove it",
        )
    if loc[:1] == ("why",) and len(loc) == 2 and loc[1] in ("reason", "link") and kind in ("model_type", "dict_type"):
        # `reason:` at the level of the knobs under why: YAML made it a knob named reason
        knobs = [k for k in (source.data.get("why") or {}) if k not in ("reason", "link")]
        before = knobs[-1] if knobs else "KNOB"
        return Problem(
            f"{loc[1]!r} is not a knob: it belongs to a knob's why and is indented at the knobs' level",
            file=source.file,
            line=source.line_of(loc),
            field=dotted(loc),
            fix=f"indent it under why.{before} (two more spaces than `{before}:`)",
        )
    if kind == "missing":
        return Problem(
            "required key is missing",
            file=source.file,
            line=source.line_of(loc[:-1]),
            field=dotted(loc),
            fix=f"add `{loc[-1]}:`",
        )
    if error["loc"][-1] == "[key]" and loc[:1] == ("env",):
        return Problem(
            f"{loc[-1]!r} is not an environment variable name (ASCII letters, digits and '_', no digit first)",
            file=source.file,
            line=source.line_of(loc),
            field=dotted(loc),
            fix="rename it: systemd and shells take no other names",
        )
    return Problem(
        value_message(errors, loc),
        file=source.file,
        line=source.line_of(loc),
        field=dotted(loc),
        fix=_type_fix(loc),
    )


def value_message(errors: list[Any], loc: Path = ()) -> str:
    """One message for the errors of one value: what pydantic says, what YAML made of the text, and what it got
    (cut short when long; never the value of a secret field at `loc`)."""
    got = errors[0].get("input")
    parts: list[str] = []
    for e in errors:
        text = str(e["msg"]).removeprefix("Value error, ")
        if parts:
            text = text.removeprefix("Input should ")
        if text not in parts:
            parts.append(text)
    kinds = {e["type"] for e in errors}
    if kinds == {"string_pattern_mismatch"}:
        parts = ["Text not of the form this field takes (see the fix)"]
    message = " or ".join(parts)
    if isinstance(got, bool) and kinds & _NUMBER_TYPES:
        message += "; YAML 1.1 reads yes/no/on/off/true/false as booleans, not numbers"
    elif isinstance(got, float) and "int_type" in kinds:
        message += "; a fraction is no whole number (write 8, not 8.0)"
    elif isinstance(got, str) and kinds & _NUMBER_TYPES and _UNIT.match(got):
        message += f"; a number with a unit: write {_unit_free(got)}"
    elif isinstance(got, str) and kinds & _NUMBER_TYPES:
        message += "; a quoted number is text (write it without quotes)"
    elif "finite_number" in kinds:
        message += "; .nan and .inf are no values here"
    return f"{message} (got {shown_value(got, loc)})"


# What an error shows of a value: enough to recognise it, never a whole file's worth.
MAX_SHOWN_CHARS = 80


def shown_value(value: Any, loc: Path = ()) -> str:
    """A value as an error shows it: its type for a collection, masked for a secret field, else its repr cut to
    MAX_SHOWN_CHARS (its length said)."""
    if isinstance(value, dict | list):
        return type(value).__name__
    if loc and secret_field(loc):
        return f"{type(value).__name__}, not shown: a secret field"
    text = repr(value) if not isinstance(value, int) or len(str(value)) < 100 else f"a {len(str(value))}-digit number"
    if len(text) > MAX_SHOWN_CHARS:
        text = f"{text[:MAX_SHOWN_CHARS - 20]}... ({len(text):,} characters)"
    return text


def secret_field(loc: Path) -> bool:
    """A field whose value is a secret or may be one: the API key reference (a literal key is the mistake it is
    checked for) and any environment variable whose name says secret."""
    dotted_loc = dotted(loc)
    return dotted_loc == "server.api_key_secret" or (len(loc) >= 2 and loc[0] == "env" and secret_name(str(loc[1])))


_NUMBER_TYPES = {"int_type", "float_type", "int_parsing", "float_parsing", "int_from_float"}
# `8k`, `450W`, `0.9 GiB`: a number with a unit or a multiplier, which YAML reads as text.
_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z%]+)\s*$")
_MULTIPLIERS = {"k": 1024, "K": 1024, "m": 1024**2, "M": 1024**2}


def _unit_free(text: str) -> str:
    """What to write instead: `8k` -> 8192 (SGLang's sizes are counts of tokens), `450W` -> 450."""
    match = _UNIT.match(text)
    assert match
    number, unit = match.groups()
    if unit in _MULTIPLIERS and "." not in number:
        return str(int(number) * _MULTIPLIERS[unit])
    return number


def _field_model(parent: Path) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Profile
    for part in parent:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _model_in(info.annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(parent: Path) -> list[str]:
    model = _field_model(parent)
    return list(model.model_fields) if model else []


def _type_fix(loc: Path) -> str:
    if loc == ("schema_version",):
        return "write schema_version: 1, or upgrade the toolkit to read files written by a newer one"
    model = _field_model(loc[:-1])
    if model is not None and isinstance(loc[-1], str) and loc[-1] in model.model_fields:
        info = model.model_fields[loc[-1]]
        text = f"give {loc[-1]} {_type_name(info)}"
        if info.description:
            text += f" ({info.description})"
        return text
    if loc and loc[0] == "env":
        return 'environment values are strings: quote the value, e.g. NCCL_P2P_DISABLE: "1"'
    return "correct the value's type"


def _type_name(info: Any) -> str:
    """What a field takes, in words: its type and its range."""
    return _describe(info.annotation, info.metadata)


def _describe(annotation: Any, metadata: Any = ()) -> str:
    nested = _model_in(annotation) if isinstance(annotation, type) else None
    if nested is not None:
        return f"a mapping of {nested.__name__} keys ({', '.join(nested.model_fields)})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _describe(args[0], args[1:])
    if origin in (typing.Union, types.UnionType):
        named = [_describe(a, metadata) for a in args if a is not type(None)]
        return " or ".join(named)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ')}s" if args else "a list"
    if origin is dict:
        return "a mapping of names to " + _describe(args[1]).removeprefix("a ") if args else "a mapping"
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
    text = words.get(annotation, str(annotation).replace("typing.", ""))
    bounds = []
    for meta in [m for given in metadata for m in getattr(given, "metadata", [given])]:  # Field(...) holds its own
        for name, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, name, None)
            if value is not None:
                bounds.append(f"{sign} {value:,}")
    return text + (f" {' and '.join(bounds)}" if bounds else "")


# A chain is a few profiles deep (the shipped ones: 3); each link is a file of at most MAX_PROFILE_BYTES, so
# without these a chain of files each within its own cap would take unbounded memory and time.
MAX_EXTENDS_DEPTH = 16
MAX_CHAIN_BYTES = 1024 * 1024


@dataclass
class _Merged:
    """A profile's inheritable data merged over its parents' (what a child of it starts from)."""

    data: dict[str, Any]
    origins: dict[str, Origin]


@dataclass
class ResolveMemo:
    """What resolving one profile learns about its parents, kept for the next profile of the same store: each
    file is type-checked once and each parent's merge is done once, so resolving every profile of a deep chain
    costs the chain, not its square. Only valid while the files do not change (the store drops it then)."""

    checked: set[str] = field(default_factory=set)
    merged: dict[str, _Merged] = field(default_factory=dict)


def _chain_error(child: ProfileSource, message: str, fix: str) -> ToolkitError:
    return ToolkitError.of(message, file=child.file, line=child.line_of(("extends",)), field="extends", fix=fix)


def load_chain(name: str, loader: Loader, memo: ResolveMemo | None = None) -> list[ProfileSource]:
    """`name` and its parents, child first: each file type-checked, its name its file's, no cycle, and the chain
    within MAX_EXTENDS_DEPTH links and MAX_CHAIN_BYTES of text."""
    memo = memo if memo is not None else ResolveMemo()
    chain: list[ProfileSource] = []
    seen: list[str] = []
    total_bytes = 0
    current: str | None = name
    child: ProfileSource | None = None
    while current is not None:
        if current in seen:
            assert child is not None
            cycle = " -> ".join([*seen, current])
            raise _chain_error(child, f"extends forms a cycle: {cycle}",
                               f"make one profile in {cycle} stand on its own (remove its extends:)")
        if child is not None and len(chain) >= MAX_EXTENDS_DEPTH:
            raise _chain_error(child, f"the extends chain is more than {MAX_EXTENDS_DEPTH} profiles deep "
                               f"({' -> '.join(seen[:3])} -> ... -> {seen[-1]})",
                               "extend a profile nearer the base: a chain is a few profiles (base, hardware, variant)")
        try:
            source = loader(current)
        except ProfileNotFound as err:
            if child is None:
                raise
            raise _chain_error(child, f"parent profile {current!r} not found",
                               f"create profiles/{current}.yaml or extend an existing profile "
                               f"({err.problems[0].message}; {err.problems[0].fix})") from None
        total_bytes += len(source.text.encode("utf-8", "surrogatepass"))
        if child is not None and total_bytes > MAX_CHAIN_BYTES:
            raise _chain_error(child, f"the extends chain from {name} holds {total_bytes:,} bytes or more of "
                               f"profiles, more than a chain may ({MAX_CHAIN_BYTES:,})",
                               "a chain is a few profiles of a few KiB: trim the parents' results blocks "
                               "(results.keep_last) or shorten the chain")
        if current not in memo.checked:
            check_file(source)
            memo.checked.add(current)
        declared = source.data.get("name")
        if declared != source.name:
            raise ToolkitError.of(
                f"name is {declared!r} but the file is {source.name}.yaml",
                file=source.file,
                line=source.line_of(("name",)),
                field="name",
                fix=f"set `name: {source.name}` (a profile's name is its file name)",
            )
        seen.append(current)
        chain.append(source)
        parent = source.data.get("extends")
        child, current = source, parent if isinstance(parent, str) else None
    return chain


def _merge_chain(chain: list[ProfileSource], memo: ResolveMemo) -> tuple[_Merged, _Merged | None]:
    """(the inheritable merge of the whole chain, that of the parent's chain or None), each parent's merge done
    once per memo."""
    start = len(chain)
    for i, source in enumerate(chain):
        if source.name in memo.merged:
            start = i
            break
    acc = memo.merged[chain[start].name] if start < len(chain) else _Merged({}, {})
    for source in reversed(chain[:start]):
        inheritable = {k: v for k, v in source.data.items() if k not in OWN_KEYS}
        origins = dict(acc.origins)
        _drop_removed(origins, inheritable, ())
        for path, line in source.lines.items():
            if path and path[0] not in OWN_KEYS:
                origins[dotted(path)] = Origin(source.name, source.file, line)
        acc = _Merged(deep_merge(acc.data, inheritable), origins)
        memo.merged[source.name] = acc
    parent = memo.merged.get(chain[1].name) if len(chain) > 1 else None
    return acc, parent


def resolve(name: str, loader: Loader, catalogues: Callable[[str], Catalogue | None] | None = None,
            memo: ResolveMemo | None = None) -> ResolvedProfile:
    """Load `name` and its parents, merge them child-over-parent and validate the result's types.
    `catalogues(version)` gives the pinned release's flag catalogue to attach (rendering follows it). `memo`:
    what resolving earlier profiles of the same files learnt (each parent checked and merged once)."""
    memo = memo if memo is not None else ResolveMemo()
    chain = load_chain(name, loader, memo)
    whole, parent = _merge_chain(chain, memo)
    merged = copy.deepcopy(whole.data)  # the memo's data is shared with other profiles: callers get their own
    origins = dict(whole.origins)
    own = chain[0]
    for key in OWN_KEYS:
        if key in own.data and own.data[key] is not None:
            merged[key] = own.data[key]
    for path, line in own.lines.items():
        if path and path[0] in OWN_KEYS:
            origins[dotted(path)] = Origin(own.name, own.file, line)
    try:
        spec = Profile.model_validate(merged)
    except ValidationError as err:  # a combination only the merge creates
        problems = []
        fields = _by_field(err, merged)
        for loc, errors in fields[:MAX_PROBLEMS]:
            where = origins.get(dotted(loc))
            problems.append(
                Problem(
                    f"after merging extends: {value_message(errors, loc)}",
                    file=where.file if where else own.file,
                    line=where.line if where else None,
                    field=dotted(loc),
                    fix="correct the value in the file that sets it",
                )
            )
        raise ToolkitError(problems + _more(own.file, len(fields) - MAX_PROBLEMS)) from None
    version = spec.engine.sglang_version
    return ResolvedProfile(
        name=own.name,
        file=own.file,
        spec=spec,
        chain=[s.name for s in chain],
        data=merged,
        origins=origins,
        source=own,
        catalogue=catalogues(version) if catalogues is not None and version else None,
        parent_data=copy.deepcopy(parent.data) if parent is not None else None,
        parent_origins=dict(parent.origins) if parent is not None else {},
    )


def _drop_removed(origins: dict[str, Origin], over: dict[str, Any], path: Path) -> None:
    for key, value in over.items():
        child = (*path, key)
        if value is None or isinstance(value, list):
            prefix = dotted(child) + "."
            for existing in [k for k in origins if k.startswith(prefix)]:
                del origins[existing]
        elif isinstance(value, dict):
            _drop_removed(origins, value, child)
