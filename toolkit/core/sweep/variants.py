"""Expanding `--vary path=v1,v2` into the variants of a sweep, and validating each before anything runs.

Pure: a base profile's resolved spec (a plain mapping) and the axes in, variants out. Validation itself
is injected (the profile package's validator), so this module knows nothing of the profile schema
beyond dotted paths into a mapping.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolkit.core.errors import Problem, ToolkitError

Scalar = bool | int | float | str | None

# Top-level sections a sweep may vary. `bench` and `target` are refused: a sweep compares variants on the
# same workload and the same hardware, and changing either would rank unlike with unlike. The identity
# keys (`name`, `extends`, `schema_version`) and the toolkit's own blocks (`results`, `why`) are not knobs.
VARIABLE_SECTIONS = ("server", "env", "engine", "model", "probe", "gpu")
_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_MAX_VARIANTS = 10_000  # a typo in a --vary list should not plan a month of GPU time


@dataclass(frozen=True)
class Axis:
    """One `--vary`: a dotted path into the profile and the values it takes, in the order given."""

    path: str
    values: tuple[Scalar, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "values": list(self.values)}


@dataclass(frozen=True)
class Variant:
    """One combination of axis values, numbered from 1 in the order of the cartesian product."""

    index: int
    knobs: tuple[tuple[str, Scalar], ...]

    @property
    def id(self) -> str:
        return f"v{self.index:02d}"

    @property
    def label(self) -> str:
        """Short, readable: `max_running_requests=512 cuda_graph=off` (the last path segment only)."""
        return " ".join(f"{path.rsplit('.', 1)[-1]}={format_value(value)}" for path, value in self.knobs)

    def knob_dict(self) -> dict[str, Scalar]:
        return dict(self.knobs)


@dataclass
class PlannedVariant:
    """A variant with the result of validating it as a resolved profile."""

    variant: Variant
    spec: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def valid(self) -> bool:
        return not self.errors


# Validates one variant as a resolved profile (the CLI passes the profile package's resolve + validate).
Validator = Callable[[Variant], Sequence[Problem]]


def format_value(value: Scalar) -> str:
    """How a knob value is shown and how `--vary` spells it back: booleans as on/off, None as null."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None:
        return "null"
    return str(value)


_TRUE = {"on", "true", "yes"}
_FALSE = {"off", "false", "no"}


def _parse_scalar(text: str, like: object) -> Scalar:
    """Turn one value of a `--vary` list into a typed value.

    The type of the base profile's value at the same path decides (so `on` is a boolean for a boolean knob
    and stays the string `on` for a string one); where the base has no value, the text's own look decides.
    Raises ValueError when the text cannot be of the base's type.
    """
    low = text.strip().lower()
    if isinstance(like, bool):
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a boolean (use on/off)")
    if low in ("null", "none", "~"):
        return None
    if isinstance(like, int):
        return int(text)
    if isinstance(like, float):
        return float(text)
    if isinstance(like, str):
        return text
    # The base has no value here: infer, as YAML 1.2 would (on/off included because `--vary` users type them).
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return float(text)
    return text


_MISSING = object()


def get_path(spec: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or the module's _MISSING sentinel when any segment is absent."""
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def set_path(spec: dict[str, Any], path: str, value: Scalar) -> None:
    """Set a dotted path in place, creating the mappings on the way."""
    parts = path.split(".")
    node = spec
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_vary(text: str, base: Mapping[str, Any], *, source: str = "--vary") -> Axis:
    """Parse `server.max_running_requests=256,512,1024` against the base profile's resolved spec."""

    def bad(message: str, fix: str) -> ToolkitError:
        return ToolkitError([Problem(message, file=source, field=text, fix=fix, rule_id="sweep.vary")])

    if "=" not in text:
        raise bad(
            "a --vary needs a path and values", "write it as PATH=V1,V2, e.g. server.max_running_requests=256,512"
        )
    path, _, values_text = text.partition("=")
    path = path.strip()
    if not _PATH_RE.match(path):
        raise bad(f"{path!r} is not a dotted path into the profile", "use e.g. server.cuda_graph or env.NCCL_ALGO")
    section = path.split(".", 1)[0]
    if section not in VARIABLE_SECTIONS:
        raise bad(
            f"section {section!r} cannot be varied: a sweep compares variants on the same workload and hardware",
            f"vary a knob under one of {', '.join(VARIABLE_SECTIONS)}; use --concurrency for load levels",
        )
    raw_values = [v.strip() for v in values_text.split(",")]
    if not values_text.strip() or any(v == "" for v in raw_values):
        raise bad(f"{path}: an empty value in {values_text!r}", "list the values separated by commas, none empty")
    like = get_path(base, path)
    like = None if like is _MISSING else like
    if section == "env":
        like = ""  # environment values are strings, even when they look like numbers (NCCL_P2P_DISABLE=0,1)
    if isinstance(like, Mapping | list):
        raise bad(f"{path} is a {type(like).__name__} in the base profile, not a knob", "vary one of its keys instead")
    values: list[Scalar] = []
    for raw in raw_values:
        try:
            value = _parse_scalar(raw, like)
        except ValueError as exc:
            raise bad(f"{path}: {exc}", f"give values of the base's type ({type(like).__name__})") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise bad(f"{path}: {raw!r} is not a finite number", "give finite values")
        if any(type(v) is type(value) and v == value for v in values):
            raise bad(f"{path}: the value {raw!r} is listed twice", "list each value once")
        values.append(value)
    return Axis(path=path, values=tuple(values))


def parse_axes(texts: Iterable[str], base: Mapping[str, Any]) -> list[Axis]:
    axes: list[Axis] = []
    for text in texts:
        axis = parse_vary(text, base)
        if any(a.path == axis.path for a in axes):
            raise ToolkitError.of(
                f"{axis.path} is varied twice", file="--vary", field=axis.path, fix="give each path one --vary"
            )
        axes.append(axis)
    if not axes:
        raise ToolkitError.of(
            "a sweep needs at least one --vary",
            file="--vary",
            fix="add e.g. --vary server.max_running_requests=256,512",
        )
    total = math.prod(len(a.values) for a in axes)
    if total > _MAX_VARIANTS:
        raise ToolkitError.of(
            f"{total} variants is more than {_MAX_VARIANTS}", file="--vary", fix="vary fewer knobs or fewer values"
        )
    return axes


def expand(axes: Sequence[Axis]) -> list[Variant]:
    """The cartesian product, the first axis varying slowest, numbered from 1."""
    combos = itertools.product(*[[(a.path, v) for v in a.values] for a in axes])
    return [Variant(index=i, knobs=tuple(combo)) for i, combo in enumerate(combos, start=1)]


def variant_spec(base: Mapping[str, Any], variant: Variant) -> dict[str, Any]:
    """The base's resolved spec with the variant's knobs set (a deep copy; the base is not touched)."""
    spec = copy.deepcopy(dict(base))
    for path, value in variant.knobs:
        set_path(spec, path, value)
    return spec


def changed_knobs(base: Mapping[str, Any], variant: Variant) -> dict[str, Scalar]:
    """The variant's knobs whose value differs from the base's (what a promotion has to write)."""
    out: dict[str, Scalar] = {}
    for path, value in variant.knobs:
        current = get_path(base, path)
        if current is _MISSING or current != value or type(current) is not type(value):
            out[path] = value
    return out


def plan(base: Mapping[str, Any], axes: Sequence[Axis], validate: Validator) -> list[PlannedVariant]:
    """Every variant, each validated as a resolved profile; invalid ones keep the problems that rejected them."""
    planned: list[PlannedVariant] = []
    for variant in expand(axes):
        spec = variant_spec(base, variant)
        planned.append(PlannedVariant(variant=variant, spec=spec, problems=list(validate(variant))))
    return planned


def canonical(value: object) -> str:
    """A stable text form for hashing and comparing plans (sorted keys, no whitespace)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
