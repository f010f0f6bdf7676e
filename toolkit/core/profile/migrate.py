"""Moving a profile to another SGLang release: what changes, why, and the rewritten file (pure).

`plan_migration` compares how the profile renders on its pinned release and on the target one (the typed
knobs keep their values and follow flagmap's spellings), renames `--flags` in `server.extra_args`, drops the
patches SGLang carries itself from the target on (`engine.patches[].upstream`), keeps the ones whose target
file is unchanged, and pins the target release and its lock file. It refuses, with the reason, where the
target has no counterpart: a knob with no spelling there, a value its flag no longer accepts, an extra_args
flag it removed without a successor, a patch written against a file the release changed.

In place, the rewrite edits only the lines that change, so the author's text, comments and layout stay as
they were, and the results block is kept (its entries record the spec they measured). With `new_name` the
profile is left alone and a new one extends it, overriding only what moves, each override with its why.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from toolkit.core.engine_lock import CONTAINER_PYTHONS, lock_path
from toolkit.core.errors import Problem
from toolkit.core.profile.catalogue import Catalogue
from toolkit.core.profile.flagmap import Choice, knob_flags, renamed_flag
from toolkit.core.profile.model import RESULTS_MARKER
from toolkit.core.profile.render import knob_rendering
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.profile.rules import release_in
from toolkit.core.profile.source import Path, ProfileSource


@dataclass(frozen=True)
class Change:
    """One thing that moves: the profile path, what it was, what it becomes, why and on whose word."""

    path: str
    old: str
    new: str
    why: str
    source: str = ""

    def render(self) -> str:
        text = f"{self.path}: {self.old} -> {self.new}\n    why: {self.why}"
        return text + (f"\n    source: {self.source}" if self.source else "")


@dataclass(frozen=True)
class PatchTarget:
    """What the target release's wheel holds at a patch's target path (the adapter reads it)."""

    present: bool
    sha256: str | None = None


@dataclass
class Migration:
    name: str  # the profile written (the same name, or the new one)
    from_version: str | None
    to_version: str
    changes: list[Change] = field(default_factory=list)
    refusals: list[Problem] = field(default_factory=list)
    text: str | None = None  # the new file text; None when refused


def plan_migration(
    source: ProfileSource,
    resolved: ResolvedProfile,
    old: Catalogue | None,
    new: Catalogue,
    *,
    patch_targets: dict[int, PatchTarget],
    new_name: str | None = None,
    history: Sequence[Catalogue] = (),
) -> Migration:
    """The migration of the file `source` (the profile `resolved` resolves) to `new`'s release.

    `patch_targets[i]`: the target release's file at engine.patches[i].target. `history`: the catalogues of the
    releases between, whose deprecations say where a flag went before a later release removed it. The result's
    text is None
    when anything is refused; `changes` then still says what would have moved."""
    to = new.sglang_version
    spec = resolved.spec
    mig = Migration(new_name or resolved.name, spec.engine.sglang_version, to)
    edits = _Edits(source)
    engine: dict[str, str] = {}
    if spec.engine.sglang_version != to:
        mig.changes.append(Change("engine.sglang_version", str(spec.engine.sglang_version), to, "the pin"))
        engine["sglang_version"] = to
    # The venv's lock follows the pin (profiles/requirements/sglang-TO-cpNN.lock): a lock named by hand was the
    # old release's, so it goes.
    drop_requirements = spec.engine.requirements is not None
    if drop_requirements:
        mig.changes.append(
            Change("engine.requirements", str(spec.engine.requirements), "(none)",
                   f"the engine lock follows the pin: {lock_path(to, CONTAINER_PYTHONS[0])} and its siblings")
        )
    _knobs(resolved, old, new, mig)
    extra_args = _extra_args(resolved, [old, *history], new, mig, edits, child=new_name is not None)
    kept = _patches(resolved, to, patch_targets, mig)
    if mig.refusals:
        return mig
    if new_name is not None:
        mig.text = _child_text(resolved, new_name, to, engine, extra_args, kept, mig.changes,
                               drop_requirements=drop_requirements)
        return mig
    for key, value in engine.items():
        edits.set(("engine", key), value)
    if drop_requirements:
        if ("engine", "requirements") not in source.lines:
            mig.refusals.append(resolved.problem("engine.requirements", "the lock is named by a parent profile",
                                                 "migrate the parent that sets engine.requirements first"))
            return mig
        edits.delete(("engine", "requirements"))
    if kept is not None:
        if "patches" in (source.data.get("engine") or {}):
            edits.replace_list(("engine", "patches"), [edits.item_text(("engine", "patches", i)) for i in kept])
        elif kept:
            mig.refusals.append(
                resolved.problem("engine.patches", "some inherited patches move and some stay",
                                 "migrate the parent that sets engine.patches first")
            )
            return mig
        else:
            edits.set(("engine", "patches"), "[]")
    mig.text = edits.apply()
    return mig


def _child_text(
    resolved: ResolvedProfile,
    name: str,
    to: str,
    engine: dict[str, str],
    extra_args: list[str] | None,
    kept: list[int] | None,
    changes: list[Change],
    *,
    drop_requirements: bool = False,
) -> str:
    """A profile that extends the migrated one and overrides only what the migration changes, with a why for
    each override saying what moved (the typed knobs keep their values: the renderer spells them for `to`)."""
    spec = resolved.spec
    doc: dict[str, object] = {"schema_version": 1, "name": name, "extends": resolved.name}
    doc["description"] = (
        f"{resolved.name} on SGLang {to}: the same knobs, spelled as {to} spells them, written by "
        f"`toolkit profile migrate {resolved.name} --sglang-version {to} --as {name}`. Not measured on {to} yet."
    )
    eng: dict[str, object] = dict(engine)
    if drop_requirements:
        eng["requirements"] = None  # the parent's lock is its release's
    if kept is not None:
        eng["patches"] = [spec.engine.patches[i].model_dump(mode="json", exclude_none=True) for i in kept]
    doc["engine"] = eng
    if extra_args is not None:
        doc["server"] = {"extra_args": extra_args}
    moved = [c for c in changes if c.path.startswith("server.")]
    why: dict[str, dict[str, str]] = {
        "engine.sglang_version": {
            "reason": f"moved from {spec.engine.sglang_version} to {to}. "
            + (
                "What renders differently: "
                + "; ".join(f"{c.path} {c.old} -> {c.new} ({c.why})" for c in moved)
                if moved
                else "Every knob renders the same flags."
            )
        }
    }
    dropped = [c for c in changes if c.path.startswith("engine.patches.")]
    if kept is not None:
        why["engine.patches"] = {
            "reason": "; ".join(f"{c.old} dropped: {c.why}" for c in dropped) or "kept as they were",
            **({"link": dropped[0].source} if dropped and dropped[0].source else {}),
        }
    if extra_args is not None:
        why["server.extra_args"] = {
            "reason": "; ".join(f"{c.old} -> {c.new}" for c in changes if c.path.startswith("server.extra_args"))
        }
    doc["why"] = why
    header = f"# {resolved.name}'s setup on SGLang {to}; the knobs and their whys are {resolved.name}'s.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110, default_flow_style=False)


def _knobs(resolved: ResolvedProfile, old: Catalogue | None, new: Catalogue, mig: Migration) -> None:
    before, _ = knob_rendering(dataclasses.replace(resolved, catalogue=old))
    after_res = dataclasses.replace(resolved, catalogue=new)
    after, missing = knob_rendering(after_res)
    for path, choice in missing:
        mig.refusals.append(
            resolved.problem(path, f"no counterpart in SGLang {new.sglang_version}: {choice.reason}",
                             f"unset {path} first (SGLang's default), or stay on {mig.from_version}")
        )

    def by_path(flags: list) -> dict[str, str]:
        out: dict[str, list[str]] = {}
        for rf in flags:
            if rf.path.startswith("server.") and not rf.path.startswith("server.extra_args"):
                out.setdefault(rf.path, []).append(rf.flag + ("" if rf.value is None else f" {rf.value}"))
        return {k: " ".join(v) for k, v in out.items()}

    was, now = by_path(before), by_path(after)
    choices: dict[str, Choice] = knob_flags(new)
    for path in sorted(set(was) | set(now), key=lambda p: list(was).index(p) if p in was else len(was)):
        if was.get(path) == now.get(path):
            continue
        known = choices.get(path.split(".", 1)[1])
        steps = known.steps if known is not None else ()
        why = "; ".join(s.source.split(":", 1)[0] for s in steps) or "the release spells it so"
        source = " | ".join(s.source for s in steps)
        mig.changes.append(Change(path, was.get(path, "(no flag)"), now.get(path, "(no flag)"), why, source))
    for rf in after:
        info = new.get(rf.flag)
        if info is None or not info.choices or rf.value is None or rf.value.startswith("${"):
            continue
        if rf.value not in [str(c) for c in info.choices]:
            mig.refusals.append(
                resolved.problem(
                    rf.path,
                    f"SGLang {new.sglang_version}'s {rf.flag} no longer accepts {rf.value!r}",
                    f"choose one of: {', '.join(str(c) for c in info.choices)} (then migrate again)",
                )
            )


def _extra_args(resolved: ResolvedProfile, history: Sequence[Catalogue | None], new: Catalogue, mig: Migration,
                edits: _Edits, *, child: bool) -> list[str] | None:
    """The renamed extra_args (None: nothing renamed); in place, the renames go to `edits` as well."""
    own = resolved.source is not None and "extra_args" in (resolved.source.data.get("server") or {})
    tokens = list(resolved.spec.server.extra_args)
    renamed = False
    flags = [(i, t.split("=", 1)[0]) for i, t in enumerate(resolved.spec.server.extra_args) if t.startswith("--")]
    for i, flag in flags:
        if new.live(flag):
            continue
        path = f"server.extra_args.{i}"
        step = renamed_flag(flag, new, history)
        if step is not None:
            to_flag = step.new[0][0]
            mig.changes.append(Change(path, flag, to_flag, "renamed", step.source))
            tokens[i] = to_flag + tokens[i][len(flag):]
            renamed = True
            if own:
                edits.rename_token(("server", "extra_args", i), flag, to_flag)
            elif not child:
                where = resolved.origin(path)
                mig.refusals.append(
                    resolved.problem(path, f"{flag} is set by a parent profile ({where.profile if where else '?'})",
                                     "migrate the parent first (an inherited list can only be replaced whole)")
                )
            continue
        info = new.get(flag)
        if info is not None and info.error is None:
            continue  # deprecated and kept: validate warns, and nothing better is known
        why = info.error if info is not None and info.error else f"SGLang {new.sglang_version} has no {flag}"
        mig.refusals.append(
            resolved.problem(path, f"{why}, and no successor is known",
                             f"remove it from server.extra_args, or stay on {mig.from_version}")
        )
    return tokens if renamed else None


def _patches(resolved: ResolvedProfile, to: str, targets: dict[int, PatchTarget], mig: Migration) -> list[int] | None:
    """Indexes of the patches that stay (None: all stay)."""
    patches = resolved.spec.engine.patches
    keep: list[int] = []
    for i, patch in enumerate(patches):
        path = f"engine.patches.{i}"
        if patch.upstream is not None and release_in(to, f">={patch.upstream.release}"):
            mig.changes.append(
                Change(path, patch.name, "(dropped)",
                       f"SGLang {to} makes this change itself (since {patch.upstream.release})", patch.upstream.link)
            )
            continue
        target = targets.get(i)
        if target is not None and target.present and target.sha256 == patch.target_sha256:
            keep.append(i)
            continue
        what = "has no such file" if target is None or not target.present else f"has sha256 {target.sha256}"
        mig.refusals.append(
            resolved.problem(
                path,
                f"patch {patch.name} was written against {patch.target} with sha256 {patch.target_sha256}; "
                f"SGLang {to} {what}",
                f"rebase the patch on SGLang {to}'s file and set its target_sha256, or set "
                "upstream: {release, link} where SGLang makes the change itself",
            )
        )
    return None if len(keep) == len(patches) else keep


# ---- line edits -------------------------------------------------------------------------------

_KEY = re.compile(r"^(\s*)([A-Za-z_][\w.-]*)(\s*:\s*)(.*?)(\s+#.*)?$")


class _Edits:
    """Edits to a profile's text that touch only the lines that change (keys located by the parse)."""

    def __init__(self, source: ProfileSource) -> None:
        self.source = source
        self.lines = source.text.splitlines(keepends=True)
        self._sets: list[tuple[Path, str]] = []
        self._renames: list[tuple[Path, str, str]] = []
        self._lists: list[tuple[Path, list[str]]] = []
        self._deletes: list[Path] = []

    def set(self, path: Path, value: str) -> None:
        self._sets.append((path, value))

    def delete(self, path: Path) -> None:
        self._deletes.append(path)

    def rename_token(self, path: Path, old: str, new: str) -> None:
        self._renames.append((path, old, new))

    def replace_list(self, path: Path, items: list[str]) -> None:
        self._lists.append((path, items))

    def item_text(self, path: Path) -> str:
        start, end = self._span(path)
        return "".join(self.lines[start:end])

    def _span(self, path: Path) -> tuple[int, int]:
        """[start, end) line indexes of a key's or block-list item's block: its line, then every deeper line
        (and, for a key, the `- ` items YAML allows at the key's own indent); comments and blank lines count
        only when something of the block follows them."""
        start = self.source.lines[path] - 1
        indent = _indent(self.lines[start])
        is_item = isinstance(path[-1], int)
        last = start
        for i in range(start + 1, len(self.lines)):
            line = self.lines[i]
            text = line.strip()
            if line.rstrip("\r\n") == RESULTS_MARKER:
                break
            if not text or text.startswith("#"):
                continue
            deeper = _indent(line) > indent
            same_level_item = not is_item and _indent(line) == indent and text.startswith("- ")
            if not (deeper or same_level_item):
                break
            last = i
        return start, last + 1

    def apply(self) -> str:
        ops: list[tuple[int, int, list[str]]] = []  # (start, end, replacement lines)
        for path in self._deletes:
            start, end = self._span(path)
            ops.append((start, end, []))
        for path, items in self._lists:
            start, end = self._span(path)
            key_line = self.lines[start]
            m = _KEY.match(key_line.rstrip("\r\n"))
            assert m is not None
            if items:
                ops.append((start + 1, end, list(items)))
            else:
                ops.append((start, end, [f"{m.group(1)}{m.group(2)}{_sep(m.group(3))}[]\n"]))
        for path, old, new in self._renames:
            i = self.source.lines[path] - 1
            pattern = re.compile(re.escape(old) + r"(?=[\s,'\"=\]]|$)")
            ops.append((i, i + 1, [pattern.sub(new, self.lines[i], count=1)]))
        inserts: dict[Path, list[str]] = {}
        for path, value in self._sets:
            if path in self.source.lines:
                i = self.source.lines[path] - 1
                line = self.lines[i]
                m = _KEY.match(line.rstrip("\r\n"))
                assert m is not None, line
                ending = line[len(line.rstrip("\r\n")) :]
                kept = f"{m.group(1)}{m.group(2)}{_sep(m.group(3))}"
                ops.append((i, i + 1, [f"{kept}{_scalar(value)}{m.group(5) or ''}{ending}"]))
            else:
                inserts.setdefault(path[:-1], []).append(f"{path[-1]}: {_scalar(value)}")
        for section, keys in inserts.items():
            if section in self.source.lines and section:
                i = self.source.lines[section] - 1
                children = [n - 1 for p, n in self.source.lines.items() if len(p) == len(section) + 1
                            and p[:-1] == section]
                pad = " " * (_indent(self.lines[min(children)]) if children else _indent(self.lines[i]) + 2)
                ops.append((i + 1, i + 1, [f"{pad}{k}\n" for k in keys]))
            elif not section:
                at = self._top_insert_line()
                ops.append((at, at, [f"{k}\n" for k in keys]))
            else:
                at = self._top_insert_line()
                ops.append((at, at, [f"{section[0]}:\n", *(f"  {k}\n" for k in keys), "\n"]))
        lines = list(self.lines)
        for start, end, repl in sorted(ops, key=lambda o: (o[0], o[1]), reverse=True):
            lines[start:end] = repl
        return "".join(lines)

    def _top_insert_line(self) -> int:
        """Where a new top-level section goes: before model/server/... (the order of the shipped profiles)."""
        for key in ("model", "server", "env", "bench", "probe", "why"):
            if (key,) in self.source.lines:
                return self.source.lines[(key,)] - 1
        ends = [i for i, line in enumerate(self.lines) if line.rstrip("\r\n") == RESULTS_MARKER]
        return ends[0] if ends else len(self.lines)


def _sep(separator: str) -> str:
    """`key:` followed by a value needs a space after the colon."""
    return separator if separator.endswith(" ") else separator + " "


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _scalar(value: str) -> str:
    """A YAML scalar that reads back as the string `value` (flow `[]` passes as the empty list)."""
    if value == "[]":
        return value
    dumped = yaml.safe_dump(value, default_flow_style=True).strip()
    return dumped[: -len("...")].strip() if dumped.endswith("...") else dumped
