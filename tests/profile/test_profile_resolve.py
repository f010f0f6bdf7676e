"""Parsing with line numbers, and extends: resolution (merge rules, cycles, missing parents)."""

from __future__ import annotations

import pytest

from toolkit.core.errors import ToolkitError
from toolkit.core.profile import parse_profile_text
from toolkit.core.profile.resolve import deep_merge


def test_lines_of_nested_keys_and_list_items() -> None:
    src = parse_profile_text("x", "x.yaml", "a: 1\nb:\n  c:\n    - 10\n    - 20\n  d: {e: null}\n")
    assert src.data == {"a": 1, "b": {"c": [10, 20], "d": {"e": None}}}
    assert src.lines[("b", "c", 1)] == 5
    assert src.lines[("b", "d", "e")] == 6
    assert src.line_of(("b", "c", 1, "deeper")) == 5


def test_deep_merge_list_replaces_and_null_removes() -> None:
    base = {"s": {"a": 1, "b": [1, 2], "c": 3}, "t": 1}
    over = {"s": {"b": [9], "c": None, "d": 4}}
    assert deep_merge(base, over) == {"s": {"a": 1, "b": [9], "d": 4}, "t": 1}


def test_child_overrides_and_inherits_with_origins(write_profiles, base_yaml) -> None:
    store = write_profiles(
        {
            "base": base_yaml,
            "child": "schema_version: 1\nname: child\nextends: base\nserver:\n  max_running_requests: 1024\n"
            "  extra_args: [--log-level, info]\n  cuda_graph: null\n",
        }
    )
    r = store.resolve("child")
    assert r.chain == ["child", "base"]
    assert r.server.max_running_requests == 1024
    assert r.server.tp_size == 8  # inherited
    assert r.server.extra_args == ["--log-level", "info"]  # a list replaces
    assert r.server.cuda_graph is True  # null removed the parent's false: back to the default
    assert r.origin("server.max_running_requests").file.endswith("child.yaml")
    assert r.origin("server.max_running_requests").line == 5
    assert r.origin("server.tp_size").file.endswith("base.yaml")
    assert r.origin("server.tp_size").line == 16


def test_results_and_description_are_not_inherited(write_profiles, base_yaml) -> None:
    parent = base_yaml + "description: parent prose\nresults:\n  entries: [{source: manual}]\n"
    store = write_profiles({"base": parent, "child": "schema_version: 1\nname: child\nextends: base\n"})
    r = store.resolve("child")
    assert r.results is None
    assert r.spec.description == ""
    assert store.resolve("base").results.entries == [{"source": "manual"}]


def test_cycle_and_missing_parent_name_the_extends_line(write_profiles) -> None:
    store = write_profiles(
        {
            "a": "schema_version: 1\nname: a\nextends: b\n",
            "b": "schema_version: 1\nname: b\n\nextends: a\n",
            "orphan": "schema_version: 1\nname: orphan\nextends: nowhere\n",
        }
    )
    with pytest.raises(ToolkitError) as err:
        store.resolve("a")
    (p,) = err.value.problems
    assert "cycle" in p.message and p.file.endswith("b.yaml") and p.line == 4 and p.field == "extends"
    with pytest.raises(ToolkitError) as err:
        store.resolve("orphan")
    (p,) = err.value.problems
    assert "'nowhere' not found" in p.message and p.line == 3


def test_a_broken_parent_reports_its_own_error_not_missing(write_profiles) -> None:
    store = write_profiles(
        {
            "base": "schema_version: 1\nname: base\nserver: [\n",
            "child": "schema_version: 1\nname: child\nextends: base\n",
        }
    )
    with pytest.raises(ToolkitError) as err:
        store.resolve("child")
    (p,) = err.value.problems
    assert "not valid YAML" in p.message and p.file.endswith("base.yaml")


def test_every_type_error_is_reported_at_once(write_profiles) -> None:
    store = write_profiles({"bad": "schema_version: 1\nname: bad\nserver:\n  tp_size: x\n  port: 99999\n  nope: 1\n"})
    with pytest.raises(ToolkitError) as err:
        store.resolve("bad")
    got = sorted((p.field, p.line) for p in err.value.problems)
    assert got == [("server.nope", 6), ("server.port", 5), ("server.tp_size", 4)]
