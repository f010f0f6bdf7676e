"""SGLang's own argument list for one release: read from that release's source, never typed by hand.

SGLang has declared its server arguments in three ways over the 0.5 line, and a release's catalogue
follows whichever it uses (all of them at once where a release mixes them):
- `parser.add_argument("--flag", ...)` calls in `sglang/srt/server_args.py` (all releases; the only
  form up to 0.5.13);
- `name: A[type, Arg(...)] = default` fields of the `ServerArgs` dataclass (0.5.14 to 0.5.19), which
  `add_cli_args_from_dataclass` (arg_groups/arg_utils.py) registers first;
- the same fields spread over namespace classes in `sglang/srt/arg_groups/fields/*.py` (0.5.20+), which
  server_args.py lists in `_INPUT_NAMESPACES` and orders by `POSITIONAL_FIELD_ORDER`.

`extract_from_sources(files)` reads them statically with `ast` (pure: the caller hands in the release's files by
path, a mapping that may read them lazily; the reader starts at server_args.py and opens only what it follows;
SGLang itself needs CUDA wheels to import) and follows `add_cli_args_from_dataclass`'s rules: the flag is
`Arg.cli_name` or `--field-name` plus `Arg.aliases`, a bool is a switch, a `Literal` gives the choices, a list
takes `nargs="+"`. Choice lists are resolved across modules (arg_groups/choices.py, `Backend.ALL` of
cuda_graph_config.py); the few SGLang computes at run time (the reasoning and tool-call parser registries) stay
unknown: None, not checked. `extract_from_parser(parser)` is the runtime walk over `ServerArgs.add_cli_args(parser)`
where that release is importable.

`plausibility_problems` refuses a catalogue that lacks the core flags or is implausibly small: a release
laid out in a way this reader does not know yields a handful of flags, never a wrong catalogue.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

CATALOGUE_SCHEMA_VERSION = 2

SERVER_ARGS = "sglang/srt/server_args.py"

# Every SGLang server since 0.4 has these; a catalogue without them was not read from its arguments.
CORE_FLAGS = (
    "--model-path",
    "--tp-size",
    "--host",
    "--port",
    "--max-running-requests",
    "--mem-fraction-static",
    "--attention-backend",
    "--quantization",
)
# 0.5.9 has 331 flags and later releases more; a reader that misses a layout finds tens at most.
MIN_FLAGS = 250

_NEW_FLAG_IN_HELP = re.compile(r"[Dd]eprecated[^.]*?(?:use|Use)\s+(--[a-z0-9][a-z0-9-]*)")
_DEPRECATED_HELP = re.compile(r"^\W*(deprecated|removed\.)", re.IGNORECASE)
# argparse action classes that take no value unless told otherwise (SGLang's own included).
_SWITCH_ACTIONS = {
    "store_true",
    "store_false",
    "store_const",
    "append_const",
    "count",
    "help",
    "version",
    "BooleanOptionalAction",
    "DeprecatedAction",
    "DeprecatedStoreTrueAction",
    "DeprecatedStoreConstAction",
}


def release_key(version: str) -> tuple[int, ...]:
    """0.5.15.post1 -> (0, 5, 15, 1): a post release sorts after its release and before the next."""
    return tuple(int(part) for part in version.replace(".post", ".").split(".") if part.isdigit())


@dataclass
class FlagInfo:
    """One argparse action of SGLang's server parser, as `parser.add_argument` would register it."""

    names: list[str]
    dest: str | None = None
    action: str | None = None  # argparse's or SGLang's action class; None: plain store
    nargs: int | str | None = None  # argparse's: None = one value, 0 = a switch, "?", "*", "+"
    type: str | None = None  # "int", "float", "str", or the name of SGLang's own parser function
    choices: list[Any] | None = None
    default: Any = None
    required: bool = False
    deprecated: bool = False
    replacement: str | None = None  # what SGLang says to use instead (its `new_flag` or help text), verbatim
    error: str | None = None  # SGLang refuses the flag with this message (a retired flag's DeprecatedAction)

    @property
    def takes_value(self) -> bool:
        return self.nargs != 0

    def to_json(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "dest": self.dest,
            "action": self.action,
            "nargs": self.nargs,
            "type": self.type,
            "choices": self.choices,
            "default": self.default,
            "required": self.required,
            "deprecated": self.deprecated,
            "replacement": self.replacement,
            "error": self.error,
        }


# argparse names the program after sys.argv[0]; `python -m sglang.launch_server` runs .../sglang/launch_server.py.
DEFAULT_PROG = "launch_server.py"


@dataclass
class Catalogue:
    sglang_version: str
    flags: list[FlagInfo]
    source: dict[str, Any] = field(default_factory=dict)
    prog: str = DEFAULT_PROG  # the parser's program name, as its usage and error lines print it
    _index: dict[str, FlagInfo] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {name: info for info in self.flags for name in info.names}

    def get(self, flag: str) -> FlagInfo | None:
        return self._index.get(flag)

    def names(self) -> list[str]:
        return sorted(self._index)

    def suggest(self, flag: str) -> list[str]:
        return difflib.get_close_matches(flag, self.names(), n=3, cutoff=0.6)

    def live(self, flag: str) -> bool:
        """The flag exists, is not deprecated and is not refused."""
        info = self.get(flag)
        return info is not None and not info.deprecated and info.error is None

    def to_json(self) -> dict[str, Any]:
        # Registration order (argparse's, so a usage line built from it reads as SGLang's).
        return {
            "schema_version": CATALOGUE_SCHEMA_VERSION,
            "sglang_version": self.sglang_version,
            "prog": self.prog,
            "source": self.source,
            "flags": [f.to_json() for f in self.flags],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Catalogue:
        version = data.get("schema_version")
        if version == 1:
            data = _migrate_v1(data)
        elif version != CATALOGUE_SCHEMA_VERSION:
            raise ValueError(
                f"catalogue schema_version {version!r} is not one this toolkit reads (1, {CATALOGUE_SCHEMA_VERSION})"
            )
        flags = [FlagInfo(**f) for f in data["flags"]]
        return cls(
            sglang_version=data["sglang_version"],
            flags=flags,
            source=data.get("source", {}),
            prog=data.get("prog") or DEFAULT_PROG,
        )


def _migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 had `takes_value` where 2 has argparse's `nargs` (and no type, required or error)."""
    flags = []
    for f in data["flags"]:
        f = dict(f)
        f["nargs"] = None if f.pop("takes_value", True) else 0
        flags.append(f)
    return {**data, "schema_version": CATALOGUE_SCHEMA_VERSION, "flags": flags}


def plausibility_problems(flags: list[FlagInfo]) -> list[str]:
    """What makes an extracted flag list unfit to be a catalogue (empty when it is fit)."""
    names = {n for f in flags for n in f.names}
    missing = [f for f in CORE_FLAGS if f not in names]
    out = []
    if missing:
        out.append(f"the core flags {', '.join(missing)} are missing")
    if len(flags) < MIN_FLAGS:
        out.append(f"{len(flags)} flags is implausibly few (every release since 0.5.9 has more than {MIN_FLAGS})")
    return out


def removed_between(older: Catalogue, newer: Catalogue) -> list[str]:
    """Flags the older release accepts and the newer one does not (gone, or refused with an error)."""
    gone = []
    for name in older.names():
        before, info = older.get(name), newer.get(name)
        if before is not None and before.error is None and (info is None or info.error is not None):
            gone.append(name)
    return gone


# ---- the static reader ----------------------------------------------------------------------


def extract_from_source(text: str) -> list[FlagInfo]:
    """Every flag one file declares, read statically (server_args.py alone, or bench_serving.py)."""
    return extract_from_sources({SERVER_ARGS: text})


def extract_from_sources(files: Mapping[str, str]) -> list[FlagInfo]:
    """Every server flag of a release: `files` maps wheel paths (sglang/srt/...) to their text and must
    hold server_args.py; the arg_groups package is read where the release has one."""
    mods = _Modules(files)
    flags = [_field_flag(name, stmt, mods, module) for module, name, stmt in _field_declarations(mods)]
    flags += _add_argument_flags(mods)
    return _dedupe([f for f in flags if f is not None])


_UNRESOLVED: Any = object()
_MISSING: Any = object()


class _Scope:
    """Names a module (or a function in it) binds to values this reader can know: its own literal assignments,
    class attributes as `Class.NAME`, and names imported from files of the release, looked up when asked."""

    def __init__(self, mods: _Modules | None = None, parent: _Scope | None = None) -> None:
        self.mods = mods
        self.parent = parent
        self.values: dict[str, Any] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (file, name there)
        self.hidden: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.hidden:
            return default
        if key in self.values:
            return self.values[key]
        head, dot, rest = key.partition(".")
        if head in self.imports and self.mods is not None:
            path, name = self.imports[head]
            return self.mods.scope(path).get(name + dot + rest, default)
        return self.parent.get(key, default) if self.parent is not None else default

    def child(self) -> _Scope:
        return _Scope(self.mods, self)

    def bind(self, name: str, value: Any) -> None:
        if value is None:
            self.hidden.add(name)
            self.values.pop(name, None)
        else:
            self.hidden.discard(name)
            self.values[name] = value


class _Modules:
    """The files of the release this reader was handed (a mapping that may read them lazily), parsed on demand."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.files = files
        self._trees: dict[str, ast.Module] = {}
        self._scopes: dict[str, _Scope] = {}

    def tree(self, path: str) -> ast.Module | None:
        if path not in self.files:
            return None
        if path not in self._trees:
            self._trees[path] = ast.parse(self.files[path])
        return self._trees[path]

    @staticmethod
    def path_of(module: str) -> list[str]:
        base = module.replace(".", "/")
        return [base + ".py", base + "/__init__.py"]

    def find(self, module: str) -> str | None:
        return next((p for p in self.path_of(module) if p in self.files), None)

    def scope(self, path: str) -> _Scope:
        """The module's names, built once: literal assignments in source order, class bodies, imports."""
        if path in self._scopes:
            return self._scopes[path]
        scope = self._scopes[path] = _Scope(self)  # registered first: an import cycle sees what is built so far
        tree = self.tree(path)
        for stmt in tree.body if tree is not None else []:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                source = self.find(stmt.module)
                for alias in stmt.names if source is not None else []:
                    scope.imports[alias.asname or alias.name] = (source, alias.name)  # type: ignore[assignment]
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                scope.bind(stmt.targets[0].id, _resolve(stmt.value, scope))
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                scope.bind(stmt.target.id, _resolve(stmt.value, scope))
            elif isinstance(stmt, ast.ClassDef):
                inner = scope.child()  # a class body sees its own earlier names (ALL = (FULL, DISABLED))
                for item in stmt.body:
                    if isinstance(item, ast.Assign) and len(item.targets) == 1:
                        target, node = item.targets[0], item.value
                    elif isinstance(item, ast.AnnAssign) and item.value is not None:
                        target, node = item.target, item.value
                    else:
                        continue
                    if isinstance(target, ast.Name):
                        value = _resolve(node, inner)
                        inner.bind(target.id, value)
                        if value is not None:
                            scope.values[f"{stmt.name}.{target.id}"] = value
        return scope

    def constants(self, path: str) -> _Scope:
        return self.scope(path)

    def class_in(self, path: str, name: str) -> ast.ClassDef | None:
        tree = self.tree(path)
        if tree is None:
            return None
        return next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)

    def imported_from(self, path: str, name: str) -> str | None:
        """The file `name` is imported from in `path` (None: not imported from a file we have)."""
        tree = self.tree(path)
        for stmt in tree.body if tree else []:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and any(
                (a.asname or a.name) == name for a in stmt.names
            ):
                return self.find(stmt.module)
        return None


def parser_prog(files: Mapping[str, str]) -> str:
    """The `prog=` of the ArgumentParser `prepare_server_args` builds (0.5.13+: "sglang serve"), else argparse's
    default for `python -m sglang.launch_server`."""
    tree = _Modules(files).tree(SERVER_ARGS)
    for fn in ast.walk(tree) if tree is not None else []:
        if isinstance(fn, ast.FunctionDef) and fn.name == "prepare_server_args":
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and _name(node.func) == "ArgumentParser":
                    prog = next((k.value for k in node.keywords if k.arg == "prog"), None)
                    if isinstance(prog, ast.Constant) and isinstance(prog.value, str):
                        return prog.value
    return DEFAULT_PROG


def _field_declarations(mods: _Modules) -> Iterator[tuple[str, str, ast.AnnAssign]]:
    """(module path, field name, statement) of every ServerArgs field, in add_cli_args_from_dataclass order."""
    tree = mods.tree(SERVER_ARGS)
    if tree is None:
        return
    namespaces: list[str] = []
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in stmt.targets)
            and isinstance(stmt.value, ast.List | ast.Tuple)
        ):
            namespaces = [e.id for e in stmt.value.elts if isinstance(e, ast.Name)]
    declared: list[tuple[str, str, ast.AnnAssign]] = []
    for ns in namespaces:
        path = mods.imported_from(SERVER_ARGS, ns)
        cls = mods.class_in(path, ns) if path else None
        if cls is not None and path is not None:
            declared += [(path, n, s) for n, s in _annotated_fields(cls)]
    server_args = mods.class_in(SERVER_ARGS, "ServerArgs")
    if server_args is not None:
        declared += [(SERVER_ARGS, n, s) for n, s in _annotated_fields(server_args)]
    if namespaces:
        # collect_input_fields: the frozen positional order first, then the rest as declared.
        order_path = mods.find("sglang.srt.arg_groups.field_order")
        order = mods.constants(order_path).get("POSITIONAL_FIELD_ORDER") if order_path else None
        if isinstance(order, list | tuple):
            rank = {name: i for i, name in enumerate(order)}
            declared.sort(key=lambda d: rank.get(d[1], len(rank)))
    yield from declared


def _annotated_fields(cls: ast.ClassDef) -> Iterator[tuple[str, ast.AnnAssign]]:
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            yield stmt.target.id, stmt


def _arg_metadata(ann: ast.expr) -> tuple[ast.expr, dict[str, ast.expr]] | None:
    """(inner type, Arg keywords) of `A[T, "help" | Arg(...), ...]`; None when the field has no CLI metadata."""
    if not (isinstance(ann, ast.Subscript) and _name(ann.value) in {"A", "Annotated"}):
        return None
    if not isinstance(ann.slice, ast.Tuple) or len(ann.slice.elts) < 2:
        return None
    inner, *meta = ann.slice.elts
    for m in meta:  # arg_utils._unwrap_annotated: the first Arg or bare string wins
        if isinstance(m, ast.Call) and _name(m.func) == "Arg":
            return inner, {k.arg: k.value for k in m.keywords if k.arg}
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            return inner, {"help": m}
    return None


def _field_flag(name: str, stmt: ast.AnnAssign, mods: _Modules, module: str) -> FlagInfo | None:
    """The argparse registration add_cli_args_from_dataclass makes of one field (None: no CLI)."""
    found = _arg_metadata(stmt.annotation)
    if found is None:
        return None
    inner, arg = found
    constants = mods.constants(module)

    def kw(key: str) -> Any:
        return _resolve(arg.get(key), constants)

    if kw("no_cli") is True:
        return None
    cli = kw("cli_name")
    aliases = kw("aliases")
    names = [cli if isinstance(cli, str) else "--" + name.replace("_", "-")]
    names += [a for a in aliases if isinstance(a, str)] if isinstance(aliases, list) else []
    default = _field_default(stmt.value, constants)
    help_text = kw("help") if isinstance(kw("help"), str) else ""
    base: dict[str, Any] = {"names": names, "dest": name,
                            "default": None if default is _MISSING else _json_safe(default)}
    action = _action_name(arg.get("action"))
    if action is not None:
        extra: dict[str, Any] = {}
        kwargs_node = arg.get("action_kwargs")
        if isinstance(kwargs_node, ast.Dict):
            for k, v in zip(kwargs_node.keys, kwargs_node.values, strict=True):
                key = _resolve(k, constants) if k is not None else None
                if isinstance(key, str):
                    extra[key] = _python_type(ast.unparse(v)) if key == "type" else _resolve(v, constants)
        nargs = extra.get("nargs", 0 if action in _SWITCH_ACTIONS else None)
        if action == "BooleanOptionalAction":
            base["names"] = names + ["--no-" + n[2:] for n in names if n.startswith("--")]
        info = FlagInfo(**base, action=action, nargs=nargs, type=extra.get("type"))
        return _finish(info, help_text, extra.get("new_flag"), None)
    choices = kw("choices")
    type_parser = _name(arg.get("type_parser")) if arg.get("type_parser") is not None else None
    nargs = kw("nargs")
    core, _ = _unwrap_optional(inner)
    literal = _literal_values(core)
    if literal is not None:
        info = FlagInfo(
            **base,
            type=type_parser or _python_type(type(literal[0]).__name__ if literal else "str"),
            # Arg(choices=...) wins over the Literal; one this reader cannot resolve leaves the choices unknown.
            choices=_choices(choices) if "choices" in arg else _json_safe(literal),
        )
        return _finish(info, help_text, None, None)
    if _is_list(core) and type_parser is None:
        elem = core.slice if isinstance(core, ast.Subscript) else None
        info = FlagInfo(
            **base,
            nargs=nargs or "+",
            type=_python_type(ast.unparse(elem)) if elem is not None else "str",
            choices=_choices(choices),
        )
        return _finish(info, help_text, None, None)
    if ast.unparse(core) == "bool":
        return _finish(FlagInfo(**base, action="store_true", nargs=0), help_text, None, None)
    required = kw("required")
    info = FlagInfo(
        **base,
        type=type_parser or _python_type(ast.unparse(core)),
        choices=_choices(choices),
        nargs=nargs,
        required=required is True or (required is None and default is _MISSING),
    )
    return _finish(info, help_text, None, None)


def _finish(info: FlagInfo, help_text: str, new_flag: Any, error: Any) -> FlagInfo:
    """Deprecation, replacement and refusal from the action class, `new_flag` and the help text."""
    action = info.action or ""
    info.deprecated = "Deprecated" in action or bool(_DEPRECATED_HELP.match(help_text))
    if isinstance(new_flag, str):
        info.replacement = new_flag
    elif info.deprecated:
        m = _NEW_FLAG_IN_HELP.search(help_text)
        info.replacement = m.group(1) if m else None
    if isinstance(error, str):
        info.error = error
    return info


def _add_argument_flags(mods: _Modules) -> list[FlagInfo]:
    """Every `add_argument("--flag", ...)` of server_args.py, in source order."""
    tree = mods.tree(SERVER_ARGS)
    if tree is None:
        return []
    constants = mods.constants(SERVER_ARGS)
    defaults = _all_field_defaults(mods)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
    ]
    enclosing = _enclosing_functions(tree)
    out = []
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        names = [n for n in names if n.startswith("-")]
        if not names:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        scope = _local_constants(enclosing.get(id(node)), node.lineno, constants)

        def value(key: str, kw: dict[str, ast.expr] = kw, scope: _Scope = scope) -> Any:
            node = kw.get(key)
            if isinstance(node, ast.Call) and _name(node.func) == "_declared_default" and node.args:
                return defaults.get(_resolve(node.args[0], scope), None)
            return _resolve(node, scope)

        action = _action_name(kw.get("action"))
        nargs = value("nargs") if "nargs" in kw else (0 if action in _SWITCH_ACTIONS else None)
        if action in ("store_true", "store_false", "store_const", "count") or action == "BooleanOptionalAction":
            nargs = 0
        if action == "BooleanOptionalAction":
            names = names + ["--no-" + n[2:] for n in names if n.startswith("--")]
        choices = value("choices")
        if isinstance(choices, set | frozenset):
            choices = sorted(choices, key=str)
        long_names = [n for n in names if n.startswith("--")] or names
        dest = value("dest")
        type_node = kw.get("type")
        info = FlagInfo(
            names=names,
            dest=dest if isinstance(dest, str) else long_names[0].lstrip("-").replace("-", "_"),
            action=action,
            nargs=nargs if isinstance(nargs, int | str) else None,
            type=_python_type(ast.unparse(type_node)) if type_node is not None else (None if nargs == 0 else "str"),
            choices=_choices(choices),
            default=_json_safe(value("default")),
            required=value("required") is True,
        )
        if info.default is None and action in ("store_true", "DeprecatedStoreTrueAction"):
            info.default = False  # argparse's default for a store_true it was given no default for
        elif info.default is None and action == "store_false":
            info.default = True
        help_text = value("help")
        out.append(_finish(info, help_text if isinstance(help_text, str) else "", value("new_flag"),
                           value("error_message")))
    return out


def _enclosing_functions(tree: ast.Module) -> dict[int, ast.FunctionDef]:
    """id(call node) -> the innermost function that contains it."""
    out: dict[int, ast.FunctionDef] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                out[id(node)] = fn  # inner functions come later in the walk and overwrite: innermost wins
    return out


def _local_constants(fn: ast.FunctionDef | None, before_line: int, constants: _Scope) -> _Scope:
    """The module's names plus the function's own `name = <resolvable>` lines above `before_line`
    (SGLang builds some choice lists in add_cli_args: `choices = set(SAMPLING_BACKEND_CHOICES)`)."""
    if fn is None:
        return constants
    scope = constants.child()
    for stmt in fn.body:
        if stmt.lineno >= before_line:
            break
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            scope.bind(stmt.targets[0].id, _resolve(stmt.value, scope))
    return scope


def _all_field_defaults(mods: _Modules) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for module, name, stmt in _field_declarations(mods):
        default = _field_default(stmt.value, mods.constants(module))
        if default is not _MISSING:
            out[name] = _json_safe(default)
    return out


def _field_default(node: ast.expr | None, constants: _Scope) -> Any:
    if node is None:
        return _MISSING
    if isinstance(node, ast.Call) and _name(node.func) == "field":  # msgspec.field / dataclasses.field
        kws = {k.arg: k.value for k in node.keywords if k.arg}
        if "default" in kws:
            return _resolve(kws["default"], constants)
        factory = _name(kws.get("default_factory"))
        return {"list": [], "dict": {}, "set": [], "tuple": []}.get(factory or "")
    return _resolve(node, constants)


def _name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _unwrap_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    if isinstance(node, ast.Subscript) and _name(node.value) == "Optional":
        return node.slice, True
    if isinstance(node, ast.Subscript) and _name(node.value) == "Union" and isinstance(node.slice, ast.Tuple):
        rest = [e for e in node.slice.elts if ast.unparse(e) != "None"]
        if len(rest) == 1 and len(node.slice.elts) == 2:
            return rest[0], True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if ast.unparse(node.right) == "None":
            return node.left, True
        if ast.unparse(node.left) == "None":
            return node.right, True
    return node, False


def _literal_values(node: ast.expr) -> list[Any] | None:
    if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        values = [e.value for e in elts if isinstance(e, ast.Constant)]
        return values if len(values) == len(elts) else None
    return None


def _is_list(node: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and _name(node.value) in {"List", "list"}


def _python_type(text: str) -> str:
    """argparse's `type=` as SGLang gives it: int, float and str by name; anything else is a parser
    function of SGLang's (json_list_type, nullable_str, ...), kept by name. An annotation that is not one
    of the three becomes str, as arg_utils._infer_type_func makes it."""
    text = text.rsplit(".", 1)[-1]
    if text in {"int", "float", "str"}:
        return text
    return text if text and text[0].islower() and text not in {"bool", "dict", "list"} else "str"


def _action_name(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return _name(node) or ast.unparse(node)


def _resolve(node: ast.expr | None, constants: _Scope | Mapping[str, Any]) -> Any:
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
    if isinstance(node, ast.Dict):
        keys = [_resolve(k, constants) if k is not None else None for k in node.keys]
        values = [_resolve(v, constants) for v in node.values]
        if all(isinstance(k, str) for k in keys):
            return dict(zip(keys, values, strict=True))
        return None
    if isinstance(node, ast.Call) and _name(node.func) in {"list", "sorted", "tuple", "set"} and len(node.args) == 1:
        inner = _resolve(node.args[0], constants)
        if isinstance(inner, dict):
            inner = list(inner)
        if isinstance(inner, list | tuple | set):
            if _name(node.func) == "set":
                return set(inner)  # kept a set: whoever lists it sorts it (hash order differs per process)
            return sorted(inner, key=str) if _name(node.func) == "sorted" else list(inner)
    if isinstance(node, ast.BinOp):
        left, right = _resolve(node.left, constants), _resolve(node.right, constants)
        if isinstance(node.op, ast.Add):
            if isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(left, list | tuple) and isinstance(right, list | tuple):
                return list(left) + list(right)
        numbers = isinstance(left, int | float) and isinstance(right, int | float)
        numbers = numbers and not isinstance(left, bool) and not isinstance(right, bool)
        if numbers and isinstance(node.op, ast.Mult):
            return left * right
        if numbers and isinstance(node.op, ast.Pow) and abs(right) < 64:
            return left**right
        if numbers and isinstance(node.op, ast.Sub):
            return left - right
    return None


def _choices(value: Any) -> list[Any] | None:
    """A choice list as argparse checks it: a list keeps its order, a set is sorted (its iteration order is the
    process's hash order, so SGLang's own usage line differs run to run); anything else is unknown (None)."""
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=str) or None
    if isinstance(value, list | tuple | dict):
        return [_json_safe(v) for v in value] or None
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
    """The same flag registered twice (platform branches, a field and a manual registration): keep the first."""
    seen: set[str] = set()
    out = []
    for info in flags:
        if any(n in seen for n in info.names):
            continue
        seen.update(info.names)
        out.append(info)
    return out


# ---- the runtime walk -----------------------------------------------------------------------


def extract_from_parser(parser: Any) -> list[FlagInfo]:
    """The runtime walk: `ServerArgs.add_cli_args(parser)` then `parser._actions`."""
    import argparse

    out = []
    for action in parser._actions:
        names = [n for n in action.option_strings if n.startswith("-")]
        if not names or "--help" in names:
            continue
        cls = type(action).__name__.lstrip("_")
        kind = {"StoreAction": None, "StoreTrueAction": "store_true", "StoreFalseAction": "store_false",
                "StoreConstAction": "store_const"}.get(cls, cls)
        help_text = action.help if isinstance(action.help, str) else ""
        default = None if action.default is argparse.SUPPRESS else _json_safe(action.default)
        type_name = getattr(action.type, "__name__", None) if action.type is not None else None
        info = FlagInfo(
            names=names,
            dest=action.dest,
            action=kind,
            nargs=action.nargs,
            type=_python_type(type_name) if type_name else (None if action.nargs == 0 else "str"),
            choices=_choices(action.choices) if action.choices is not None else None,
            default=default,
            required=bool(action.required),
        )
        out.append(_finish(info, help_text, getattr(action, "new_flag", None), getattr(action, "error_message", None)))
    return out

