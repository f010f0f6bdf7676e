"""The toolkit-written block at the end of a profile file.

Layout (everything above the marker is the author's and is never rewritten):

    ...author's YAML and comments...
    # --- results: written by toolkit, do not edit below this line ---
    results:
      schema_version: 1
      keep_last: 10
      entries: [...]
"""

from __future__ import annotations

from toolkit.core.profile.model import RESULTS_MARKER


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


def dump_results_block(block: dict[str, object]) -> str:
    """The block's YAML, deterministic (sorted keys, block style) so a re-run diffs only what changed."""
    import yaml

    return yaml.safe_dump({"results": block}, sort_keys=True, default_flow_style=False, allow_unicode=True, width=1000)
