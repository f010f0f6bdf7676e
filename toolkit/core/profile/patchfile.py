"""A profile's patch file, read as `patch` would read it, so a patch changes its declared target and nothing else.

The deploy role applies each patch to one explicit file (`patch --strip=1 FILE PATCH`, a dry run first), so the
only file `patch` writes is the target; this check makes sure the patch means that too: every file section is a
unified diff of `a/<target>` to `b/<target>`, and anything `patch` might read as another kind of diff (a context
or ed diff, a git rename, copy, mode change or binary patch, a file created or deleted) is refused, so what the
check read is what `patch` applies. Pure: the caller reads the file (capped) and hands over its text.
"""

from __future__ import annotations

import re

# A patch is a few KiB; a larger one is not read (a sparse file of a GiB would otherwise be read whole).
MAX_PATCH_BYTES = 1024 * 1024

# The end of a problem about a file other than the target (the profile's `target` may be what is wrong).
OTHER_FILE = " (is target the file the patch changes?)"

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
# What GNU patch takes for the start of a diff of another kind, or for a file to create, delete, rename or copy.
_OTHER_FORMS = (
    ("*** ", "a context diff"), ("***************", "a context diff"), ("Index:", "an Index: line"),
    ("Prereq:", "a Prereq: line"), ("rename from", "a git rename"), ("rename to", "a git rename"),
    ("copy from", "a git copy"), ("copy to", "a git copy"), ("new file mode", "a new file"),
    ("deleted file mode", "a deleted file"), ("old mode", "a mode change"), ("new mode", "a mode change"),
    ("GIT binary patch", "a git binary patch"), ("Binary files", "a binary file"),
    ("similarity index", "a git rename or copy"), ("dissimilarity index", "a git rewrite"),
)
_ED_COMMAND = re.compile(r"^\d+(,\d+)?[acd]$")
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")


def _stripped(path: str) -> str:
    """A header's path as `--strip=1` reads it (the a/ or b/ dropped), without a trailing timestamp."""
    name = path.split("\t")[0].strip()
    return name.split("/", 1)[1] if "/" in name else name


def patch_problem(text: str, target: str) -> str | None:
    """Why the patch `text` may change a file other than `target` (relative to site-packages), or may be read by
    `patch` otherwise than here; None when it is unified diffs of `target` alone. A problem that names another
    file ends with OTHER_FILE."""
    lines = text.split("\n")
    sections = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        number = i + 1
        git = _GIT_HEADER.match(line)
        if git is not None:
            for side in git.groups():
                if _stripped(side) != target:
                    return f"line {number}: its git header names {_stripped(side)}, not {target}{OTHER_FILE}"
            i += 1
            continue
        for prefix, form in _OTHER_FORMS:
            if line.startswith(prefix):
                return f"line {number}: {form}, which this check does not read (only unified diffs of {target})"
        if _ED_COMMAND.match(line):
            return f"line {number}: {line!r} reads as an ed script command, which patch would run"
        if line.startswith("+++ ") or line.startswith("@@ "):
            return f"line {number}: {line[:3]} without a `--- a/{target}` line before it"
        if not line.startswith("--- "):
            i += 1  # text before or between file sections (a commit message): patch skips it too
            continue
        old = _stripped(line[4:])
        new_line = lines[i + 1] if i + 1 < len(lines) else ""
        if not new_line.startswith("+++ "):
            return f"line {number + 1}: a `+++ b/{target}` line must follow `--- a/{target}`"
        new = _stripped(new_line[4:])
        if line.startswith("--- /dev/null") or new_line.startswith("+++ /dev/null"):
            return f"line {number}: the patch creates or deletes a file; it may only change {target}"
        for side, name in (("---", old), ("+++", new)):
            if name != target:
                return f"line {number}: it changes {name} ({side}), not {target}{OTHER_FILE}"
        sections += 1
        i += 2
        hunks = 0
        while i < len(lines):
            hunk = _HUNK.match(lines[i])
            if hunk is None:
                break
            hunks += 1
            old_left = int(hunk.group(2)) if hunk.group(2) is not None else 1
            new_left = int(hunk.group(4)) if hunk.group(4) is not None else 1
            i += 1
            while old_left > 0 or new_left > 0:
                if i >= len(lines):
                    return f"line {i}: the hunk ends before its {old_left} old and {new_left} new lines"
                body = lines[i]
                kind = body[:1]
                if kind == " " or body == "":
                    old_left, new_left = old_left - 1, new_left - 1
                elif kind == "-":
                    old_left -= 1
                elif kind == "+":
                    new_left -= 1
                elif kind != "\\":
                    return f"line {i + 1}: {body[:40]!r} is no line of a unified hunk"
                if old_left < 0 or new_left < 0:
                    return f"line {i + 1}: the hunk has more lines than its @@ header says"
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
        if hunks == 0:
            return f"line {number}: a file section with no @@ hunk"
    if sections == 0:
        return f"no unified diff of {target} in it (no `--- a/{target}` / `+++ b/{target}` lines)"
    return None
