"""SGLang's own argument list for one version: extracted from that release's server_args.py,
never typed by hand.

Two sources, same output shape:
- `extract_from_source(text)`: a static read of `add_argument(...)` calls with `ast` (works
  without installing SGLang, which needs CUDA wheels), resolving module-level choice lists;
- `extract_from_parser(parser)`: the `ServerArgs.add_cli_args(parser)` walk over `parser._actions`
  where that SGLang version is importable.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from typing import Any

CATALOGUE_SCHEMA_VERSION = 1

_NEW_FLAG_IN_HELP = re.compile(r"[Dd]eprecated[^.]*?(?:use|Use)\s+(--[a-z0-9][a-z0-9-]*)")


@dataclass
class FlagInfo:
    names: list[str]
    dest: str | None = None
    action: str | None = None
    choices: list[Any] | None = None
    default: Any = None
    deprecated: bool = False
    replacement: str | None = None  # the flag to use instead, when SGLang names one
    takes_value: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "dest": self.dest,
            "action": self.action,
            "choices": self.choices,
            "default": self.default,
            "deprecated": self.deprecated,
            "replacement": self.replacement,
            "takes_value": self.takes_value,
        }


@dataclass
class Catalogue:
    sglang_version: str
    flags: list[FlagInfo]
    source: dict[str, Any] = field(default_factory=dict)
    _index: dict[str, FlagInfo] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {name: info for info in self.flags for name in info.names}

    def get(self, flag: str) -> FlagInfo | None:
        return self._index.get(flag)

    def names(self) -> list[str]:
        return sorted(self._index)

    def suggest(self, flag: str) -> list[str]:
        return difflib.get_close_matches(flag, self.names(), n=3, cutoff=0.6)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": CATALOGUE_SCHEMA_VERSION,
            "sglang_version": self.sglang_version,
            "source": self.source,
            "flags": [f.to_json() for f in sorted(self.flags, key=lambda f: f.names[0])],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Catalogue:
        if data.get("schema_version") != CATALOGUE_SCHEMA_VERSION:
            raise ValueError(
                f"catalogue schema_version {data.get('schema_version')!r} is not {CATALOGUE_SCHEMA_VERSION}"
            )
        flags = [FlagInfo(**f) for f in data["flags"]]
        return cls(sglang_version=data["sglang_version"], flags=flags, source=data.get("source", {}))


_SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def extract_from_source(text: str) -> list[FlagInfo]:
    """Every `add_argument("--flag", ...)` in server_args.py, read statically."""
    tree = ast.parse(text)
    constants = _module_constants(tree)
    flags: list[FlagInfo] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "add_argument":
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [n for n in names if n.startswith("-")]
        if not names:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = _action_name(kw.get("action"))
        choices = _resolve(kw.get("choices"), constants)
        if choices is not None:
            try:
                choices = sorted(choices, key=str) if isinstance(choices, set | frozenset) else list(choices)
            except TypeError:
                choices = None
        help_text = _resolve(kw.get("help"), constants)
        help_text = help_text if isinstance(help_text, str) else ""
        new_flag = _resolve(kw.get("new_flag"), constants)
        deprecated = bool(action and "Deprecated" in action) or help_text.lstrip("([ ").lower().startswith("deprecated")
        replacement = new_flag if isinstance(new_flag, str) else None
        if deprecated and replacement is None:
            m = _NEW_FLAG_IN_HELP.search(help_text)
            replacement = m.group(1) if m else None
        dest = _resolve(kw.get("dest"), constants)
        long_names = [n for n in names if n.startswith("--")] or names
        flags.append(
            FlagInfo(
                names=names,
                dest=dest if isinstance(dest, str) else long_names[0].lstrip("-").replace("-", "_"),
                action=action,
                choices=choices,
                default=_json_safe(_resolve(kw.get("default"), constants)),
                deprecated=deprecated,
                replacement=replacement,
                takes_value=_takes_value(action, kw),
            )
        )
    flags.extend(_dataclass_flags(tree, constants))
    return _dedupe(flags)


def _dataclass_flags(tree: ast.Module, constants: dict[str, Any]) -> list[FlagInfo]:
    """Newer SGLang (0.5.13+) declares most flags as `field: A[type, Arg(...)] = default` in the
    ServerArgs dataclass and registers them with `add_cli_args_from_dataclass` (arg_groups/arg_utils.py):
    the flag is `Arg.cli_name` or `--field-name`, plus `Arg.aliases`; a bool is a store_true switch;
    a Literal gives the choices."""
    out: list[FlagInfo] = []
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "ServerArgs"):
            continue
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)):
                continue
            if ann.value.id not in {"A", "Annotated"} or not isinstance(ann.slice, ast.Tuple):
                continue
            elts = ann.slice.elts
            if len(elts) < 2:
                continue
            inner, meta = elts[0], elts[1]
            arg: dict[str, ast.expr] = {}
            if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
                arg = {k.arg: k.value for k in meta.keywords if k.arg}
            elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
                continue
            if isinstance(arg.get("no_cli"), ast.Constant) and arg["no_cli"].value is True:  # type: ignore[attr-defined]
                continue
            name = stmt.target.id
            cli = _resolve(arg.get("cli_name"), constants)
            aliases = _resolve(arg.get("aliases"), constants)
            names = [cli if isinstance(cli, str) else "--" + name.replace("_", "-")]
            if isinstance(aliases, list):
                names += [a for a in aliases if isinstance(a, str)]
            inner_text = ast.unparse(inner)
            action = _action_name(arg.get("action"))
            choices = _resolve(arg.get("choices"), constants)
            literal = _literal_values(inner)
            if choices is None and literal is not None:
                choices = literal
            is_bool = inner_text in {"bool", "Optional[bool]"} and action is None
            help_text = _resolve(arg.get("help"), constants) if arg else getattr(meta, "value", "")
            help_text = help_text if isinstance(help_text, str) else ""
            deprecated = bool(action and "Deprecated" in action) or help_text.lstrip("([ ").lower().startswith(
                "deprecated"
            )
            replacement = None
            if deprecated:
                m = _NEW_FLAG_IN_HELP.search(help_text)
                replacement = m.group(1) if m else None
            default = _resolve(stmt.value, constants) if stmt.value is not None else None
            out.append(
                FlagInfo(
                    names=names,
                    dest=name,
                    action="store_true" if is_bool else action,
                    choices=_json_safe(list(choices)) if isinstance(choices, list | tuple | set) else None,
                    default=_json_safe(default),
                    deprecated=deprecated,
                    replacement=replacement,
                    takes_value=not is_bool,
                )
            )
    return out


def _literal_values(node: ast.expr) -> list[Any] | None:
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id == "Optional":
            return _literal_values(node.slice)
        if node.value.id == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = [e.value for e in elts if isinstance(e, ast.Constant)]
            return values if len(values) == len(elts) else None
    return None


def _takes_value(action: str | None, kw: dict[str, ast.expr]) -> bool:
    if action is None:
        return True
    a = action.lower()
    if a in _SWITCH_ACTIONS or "storetrue" in a or "storeconst" in a or a.endswith("store_true"):
        return False
    if "nargs" in kw and isinstance(kw["nargs"], ast.Constant) and kw["nargs"].value == 0:
        return False
    return a not in {"deprecatedaction"}


def _action_name(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ast.unparse(node)


_UNRESOLVED = object()


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level `NAME = <literal>` (lists, sets, tuples, also `[*OTHER, "x"]`), in order."""
    out: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = _resolve(stmt.value, out)
            if value is not None:
                out[stmt.targets[0].id] = value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            value = _resolve(stmt.value, out)
            if value is not None:
                out[stmt.target.id] = value
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "ServerArgs":
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    value = _resolve(stmt.value, out)
                    if value is not None:
                        out[f"ServerArgs.{stmt.target.id}"] = value
    return out


def _resolve(node: ast.expr | None, constants: dict[str, Any]) -> Any:
    """A literal, a known constant, or None when it cannot be known statically."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return constants.get(f"{node.value.id}.{node.attr}")
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items: list[Any] = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                inner = _resolve(elt.value, constants)
                if not isinstance(inner, list | tuple | set):
                    return None
                items.extend(inner)
            else:
                value = _resolve(elt, constants)
                if value is None:
                    return None
                items.append(value)
        return set(items) if isinstance(node, ast.Set) else items
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"list", "sorted"}
        and len(node.args) == 1
    ):
        inner = _resolve(node.args[0], constants)
        if isinstance(inner, list | tuple | set):
            return sorted(inner, key=str) if node.func.id == "sorted" else list(inner)
    if isinstance(node, ast.JoinedStr):
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _resolve(node.left, constants), _resolve(node.right, constants)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(left, list) and isinstance(right, list):
            return left + right
    return None


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=str)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return repr(value)


def _dedupe(flags: list[FlagInfo]) -> list[FlagInfo]:
    """The same flag registered twice (platform branches): keep the first."""
    seen: set[str] = set()
    out = []
    for info in flags:
        if any(n in seen for n in info.names):
            continue
        seen.update(info.names)
        out.append(info)
    return out


def extract_from_parser(parser: Any) -> list[FlagInfo]:
    """The runtime walk: `ServerArgs.add_cli_args(parser)` then `parser._actions`."""
    import argparse

    out = []
    for action in parser._actions:
        names = [n for n in action.option_strings if n.startswith("-")]
        if not names or "--help" in names:
            continue
        kind = type(action).__name__
        help_text = action.help if isinstance(action.help, str) else ""
        deprecated = "Deprecated" in kind or help_text.lstrip("([ ").lower().startswith("deprecated")
        replacement = getattr(action, "new_flag", None)
        if deprecated and replacement is None:
            m = _NEW_FLAG_IN_HELP.search(help_text)
            replacement = m.group(1) if m else None
        default = None if action.default is argparse.SUPPRESS else _json_safe(action.default)
        out.append(
            FlagInfo(
                names=names,
                dest=action.dest,
                action=kind,
                choices=_json_safe(list(action.choices)) if action.choices is not None else None,
                default=default,
                deprecated=deprecated,
                replacement=replacement,
                takes_value=action.nargs != 0,
            )
        )
    return out
