"""The toolkit-written results block never touches the author's text; spec_hash sees knobs only."""

from __future__ import annotations

import pytest
import yaml

from toolkit.core.profile import RESULTS_MARKER, parse_profile_text, spec_hash
from toolkit.core.profile.resolve import resolve
from toolkit.core.results.block import join_results_block, split_results_block

AUTHOR = "# my comment, kept\nschema_version: 1\nname: p\nserver:   # odd spacing, kept\n  tp_size:    8\n\n"


def dump_results_block(block: dict[str, object]) -> str:
    """A block's YAML as the writer lays it out: the `results:` key, sorted, block style."""
    return yaml.safe_dump({"results": block}, sort_keys=True, default_flow_style=False, width=1000)


def test_split_join_round_trip_keeps_author_bytes() -> None:
    block = dump_results_block({"schema_version": 1, "keep_last": 10, "entries": [{"b": 2, "a": 1}]})
    text = join_results_block(AUTHOR, block)
    assert text.startswith(AUTHOR) and f"\n{RESULTS_MARKER}\nresults:\n" in text
    author, got = split_results_block(text)
    assert author == AUTHOR and got == block
    assert join_results_block(author, got) == text
    assert split_results_block(AUTHOR) == (AUTHOR, None)


def test_rewriting_the_block_changes_only_the_block() -> None:
    one = join_results_block(AUTHOR, dump_results_block({"entries": [{"x": 1}]}))
    two = join_results_block(split_results_block(one)[0], dump_results_block({"entries": [{"x": 1}, {"x": 2}]}))
    assert two.startswith(AUTHOR) and split_results_block(two)[0] == AUTHOR


def test_block_parses_as_the_results_key() -> None:
    text = join_results_block(AUTHOR, dump_results_block({"entries": [{"z": 1.5, "a": "x"}], "keep_last": 10}))
    src = parse_profile_text("p", "p.yaml", text)
    assert src.data["results"]["entries"] == [{"a": "x", "z": 1.5}]


def _resolved(text: str):
    src = parse_profile_text("p", "p.yaml", text)
    return resolve("p", lambda name: src)


BASE = "schema_version: 1\nname: p\nserver:\n  tp_size: 8\n"


def test_hash_ignores_prose_why_and_results() -> None:
    h = spec_hash(_resolved(BASE))
    assert len(h) == 64
    prose = BASE + "description: new words\nwhy:\n  server.tp_size: {reason: because}\n"
    assert spec_hash(_resolved(prose)) == h
    assert spec_hash(_resolved(join_results_block(BASE, dump_results_block({"entries": [{"x": 1}]})))) == h


@pytest.mark.parametrize("change", ["  tp_size: 4\n", "  max_running_requests: 64\n"])
def test_hash_changes_with_a_knob(change: str) -> None:
    assert spec_hash(_resolved(BASE)) != spec_hash(_resolved("schema_version: 1\nname: p\nserver:\n" + change))


def test_explicit_default_hashes_like_the_default() -> None:
    # Writing SGLang's default out does not change what runs, so results stay current.
    assert spec_hash(_resolved(BASE)) == spec_hash(_resolved(BASE + "  cuda_graph: true\n"))


def test_a_patchs_upstream_release_does_not_change_the_hash() -> None:
    # Naming the release that carries a patch's change itself changes nothing the pinned release runs; the
    # patch's target does.
    patch = ("engine:\n  patches:\n  - name: x\n    target: sglang/a.py\n    target_sha256: '{sha}'\n"
             "    patch: p.patch\n    reason: r\n    link: https://example.org/p\n")
    upstream = "    upstream: {release: 0.5.13, link: 'https://example.org/x'}\n"
    plain = BASE + patch.format(sha="a" * 64)
    assert spec_hash(_resolved(plain)) == spec_hash(_resolved(plain + upstream))
    assert spec_hash(_resolved(plain)) != spec_hash(_resolved(BASE + patch.format(sha="b" * 64)))


def test_shipped_results_are_imported_history(shipped) -> None:
    # The story's figures are history typed in from its notes (docs/story.md), never presented as toolkit
    # measurements; they carry the hash of the spec that describes their setup, so they go stale when it changes.
    for name in ("glm5-baseline", "glm5-tp8"):
        resolved = shipped.resolve(name)
        entries = resolved.results.entries
        assert entries and all(e["source"] == "manual" and e.get("spec_hash") == spec_hash(resolved)
                               for e in entries)
    text = (shipped.dir / "glm5-tp8.yaml").read_text()
    author, block = split_results_block(text)
    assert yaml.safe_load(block)["results"]["entries"]
    assert "3740" in block and "3945" in block and "busy-but-waiting" in block
    assert "results:" not in author
