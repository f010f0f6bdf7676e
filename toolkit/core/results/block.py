"""The results block as text: where it sits in a profile file, parse (with migration), render (deterministic),
and add an entry.

Layout of a profile file (everything above the marker is the author's and is never rewritten):

    ...author's YAML and comments...
    # --- results: written by toolkit, do not edit below this line ---
    results:
      schema_version: 2
      keep_last: 10
      entries: [...]

The block is the YAML mapping `results: {...}` after the profile's marker line. Rendering is a pure
function of the entries: fixed key order (the models' field order), figures rounded once when the entry
is built, no timestamps of its own. So recording the same run twice gives byte-identical files, and a
git diff of a new run shows the new entry and nothing else.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.model import RESULTS_MARKER
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.source import marker_line
from toolkit.core.results.migrate import migrate_block
from toolkit.core.results.model import DEFAULT_KEEP_LAST, RESULTS_SCHEMA_VERSION, ResultsBlock, ResultsEntry

_FIX_BROKEN = (
    "the results block is written by the toolkit: restore it from git (`git checkout -p` on the profile), "
    "or delete everything below the marker line to start a fresh history"
)


def split_results_block(text: str) -> tuple[str, str | None]:
    """(author_text, block_text or None). author_text is every line above the marker, byte for byte;
    block_text is what follows the marker line. join_results_block(*split_results_block(t)) == t
    for any t that ends with a newline."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\r\n") == RESULTS_MARKER:
            return "".join(lines[:i]), "".join(lines[i + 1 :])
    return text, None


def join_results_block(author_text: str, block_text: str | None) -> str:
    """The file text: the author's part unchanged (a final newline added if missing), the marker, the block.
    An empty or None block leaves no marker behind."""
    author = author_text if not author_text or author_text.endswith("\n") else author_text + "\n"
    if block_text is None or not block_text.strip():
        return author
    block = block_text if block_text.endswith("\n") else block_text + "\n"
    return f"{author}{RESULTS_MARKER}\n{block}"


def empty_block(keep_last: int = DEFAULT_KEEP_LAST) -> ResultsBlock:
    return ResultsBlock(schema_version=RESULTS_SCHEMA_VERSION, keep_last=keep_last, entries=[])


def _line_of(node: Any, path: tuple[Any, ...]) -> int | None:
    """1-based line of `path` inside a composed YAML node tree (None when the path is not there)."""
    line: int | None = node.start_mark.line + 1 if node is not None else None
    for key in path:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            found = node.value[key]
        else:
            found = None
        if found is None:
            break
        node = found
        line = node.start_mark.line + 1
    return line


def parse_block(text: str, *, file: str, first_line: int = 1) -> ResultsBlock:
    """Parse the YAML text below the marker into a current-schema block.

    `first_line` is the file line where `text` starts, so errors point into the profile itself.
    An empty text (a profile that was never recorded) is an empty block.
    """
    if not text.strip():
        return empty_block()
    offset = first_line - 1
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        line = mark.line + 1 + offset if mark is not None else None
        problem = getattr(err, "problem", None) or str(err)
        raise ToolkitError.of(f"the results block is not valid YAML: {problem}", file=file, line=line,
                              field="results", fix=_FIX_BROKEN) from None
    if not isinstance(data, dict) or set(data) != {"results"} or not isinstance(data["results"], dict):
        raise ToolkitError.of("below the marker line there must be exactly one mapping, `results:`",
                              file=file, line=first_line, field="results", fix=_FIX_BROKEN)
    raw = data["results"]
    version_line = _line_of(root, ("results", "schema_version"))
    migrated = migrate_block(raw, file=file, line=(version_line or 1) + offset)
    try:
        return ResultsBlock.model_validate(migrated)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = tuple(e["loc"])
            # Line numbers come from the file as written; after a migration the path may not exist there.
            line = _line_of(root, ("results", *loc))
            problems.append(Problem(
                e["msg"], file=file, line=(line + offset) if line else None,
                field="results." + ".".join(str(p) for p in loc), fix=_FIX_BROKEN))
        raise ToolkitError(problems) from None


def _clean(value: Any) -> Any:
    """Model dump -> plain YAML-able data: drop unset fields (None, empty groups), keep the field order.

    Reading fills the defaults back in, so a dropped field and a default one are the same entry.
    """
    if isinstance(value, dict):
        out = {k: _clean(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


class _BlockDumper(yaml.SafeDumper):
    """Block style for mappings, flow style for short lists of scalars (a window_s pair) and for
    one GPU's power figures (one line per GPU: eight GPUs stay eight lines in a diff)."""


class _FlowMap(dict):
    pass


def _represent_flow_map(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, int | float | str | bool) for v in data) and len(data) <= 4
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_BlockDumper.add_representer(list, _represent_list)
_BlockDumper.add_representer(_FlowMap, _represent_flow_map)


def _entry_data(entry: ResultsEntry) -> dict[str, Any]:
    data: dict[str, Any] = _clean(entry.model_dump(mode="python", by_alias=True))
    power = data.get("power")
    if isinstance(power, dict) and isinstance(power.get("per_gpu"), list):
        power["per_gpu"] = [_FlowMap(g) for g in power["per_gpu"]]
    return data


def render_block(block: ResultsBlock) -> str:
    """The block as YAML text (ending in a newline), deterministic for equal blocks."""
    data = {"results": {
        "schema_version": block.schema_version,
        "keep_last": block.keep_last,
        "entries": [_entry_data(e) for e in block.entries],
    }}
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False,
                     width=10_000, allow_unicode=True, indent=2)


def add_entry(block: ResultsBlock, entry: ResultsEntry, keep_last: int | None = None) -> ResultsBlock:
    """A new block with `entry` recorded: replaced in place when its run (run_id and host) is there, else inserted
    (entries are kept oldest first, by date); then only the last `keep_last` toolkit entries are kept.

    Manual entries are never pruned: they are imported history (the story's figures) that no artifact
    directory can regenerate.
    """
    keep = keep_last if keep_last is not None else block.keep_last
    entries = list(block.entries)
    for i, old in enumerate(entries):
        # A run is its directory's name on its host: `apply --record` fetches one run id from several hosts.
        if (old.run_id, old.host) == (entry.run_id, entry.host):
            entries[i] = entry
            break
    else:
        entries.append(entry)
        # A stable sort: entries of equal date keep the order they were recorded in.
        entries.sort(key=lambda e: e.date or "")
    return ResultsBlock(schema_version=RESULTS_SCHEMA_VERSION, keep_last=keep, entries=prune(entries, keep))


def prune(entries: list[ResultsEntry], keep_last: int) -> list[ResultsEntry]:
    """Keep every manual entry and the newest `keep_last` toolkit entries, in their order."""
    toolkit_ids = [id(e) for e in entries if e.source == "toolkit"]
    kept = set(toolkit_ids[-keep_last:]) if keep_last > 0 else set()
    return [e for e in entries if e.source == "manual" or id(e) in kept]


def block_problems(resolved: ResolvedProfile) -> list[Problem]:
    """The toolkit's results block, read as `toolkit results record` reads it: what it could not read, it could
    not add to either. A block from a newer toolkit is a warning (the profile itself is fine)."""
    source = resolved.source
    if source is None:
        return []
    author, block_text = split_results_block(source.text)
    if block_text is None:
        if "results" in source.data:
            return [
                resolved.problem(
                    "results",
                    "a results block without the marker line above it: `toolkit results record` would add a "
                    "second one",
                    "remove the block (the toolkit writes it), or put the marker line above it: "
                    "# --- results: written by toolkit, do not edit below this line ---",
                )
            ]
        return []
    marker = marker_line(source.text) or 0
    if "results" in source.data and (source.lines.get(("results",)) or 0) < marker:
        return [
            resolved.problem(
                "results",
                f"results is above the marker line {marker}: only the toolkit writes below it",
                "move the block below the marker line, or remove it",
            )
        ]
    try:
        parse_block(block_text, file=source.file, first_line=author.count("\n") + 2)
    except ToolkitError as err:
        newer = any("newer" in p.message for p in err.problems)
        return [
            Problem(
                p.message if p.message.startswith("the results block") else f"the results block: {p.message}",
                file=p.file,
                line=p.line,
                field=p.field or "results",
                fix=p.fix,
                severity="warning" if newer else "error",
            )
            for p in err.problems
        ]
    return []
