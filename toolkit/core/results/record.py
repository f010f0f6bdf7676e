"""Recording into a profile's text: the file's text and a new entry in, the new text out. Pure.

The author's part above the marker is kept byte for byte (checked again on the new text: the toolkit never
reflows it); only the results block is rendered anew, deterministically, so the same run recorded twice gives
the same bytes and a git diff of a new run shows the new entry and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.core.errors import ToolkitError
from toolkit.core.results.block import add_entry, join_results_block, parse_block, render_block, split_results_block
from toolkit.core.results.model import ResultsBlock, ResultsEntry


def read_block(text: str, *, file: str) -> ResultsBlock:
    """The parsed (migrated) results block of a profile file's text; an empty one when it has none. A block
    that does not parse raises ToolkitError naming the file and line: nothing is written over what cannot be
    read."""
    author, block_text = split_results_block(text)
    first_line = author.count("\n") + 2  # the line after the marker
    return parse_block(block_text or "", file=file, first_line=first_line)


@dataclass(frozen=True)
class RecordChange:
    """The new text and what changed. `action`: "added", "replaced" (same run, new figures) or "unchanged"."""

    text: str
    action: str
    dropped: list[str]  # run_ids pruned by keep_last
    block: ResultsBlock

    @property
    def changed(self) -> bool:
        return self.action != "unchanged"


def with_entry(text: str, entry: ResultsEntry, *, file: str, keep_last: int | None = None) -> RecordChange:
    """`text` with `entry` in its results block (a run already there, on the same host, is replaced)."""
    block = read_block(text, file=file)
    author, _ = split_results_block(text)
    was_there = any((e.run_id, e.host) == (entry.run_id, entry.host) for e in block.entries)
    new_block = add_entry(block, entry, keep_last)
    kept = {(e.run_id, e.host) for e in new_block.entries}
    dropped = [e.run_id for e in (*block.entries, entry) if (e.run_id, e.host) not in kept]
    new_text = _joined(author, render_block(new_block), file)
    if new_text == text:
        return RecordChange(text, "unchanged", [], new_block)
    return RecordChange(new_text, "replaced" if was_there else "added", dropped, new_block)


def migrated(text: str, *, file: str) -> str:
    """`text` with its results block rewritten in the current schema (the same text when it has none)."""
    author, block_text = split_results_block(text)
    if block_text is None:
        return text
    return _joined(author, render_block(read_block(text, file=file)), file)


def _joined(author: str, block_text: str, file: str) -> str:
    new_text = join_results_block(author, block_text)
    if split_results_block(new_text)[0] != author:  # never reflow the author's text
        raise ToolkitError.of("internal error: the author's part would change; nothing was written", file=file,
                              exit_code=1)
    return new_text
