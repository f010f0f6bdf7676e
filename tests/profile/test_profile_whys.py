"""Whys and acknowledgements belong to the profile that states them: a child's change is not explained by its
parent's reason (validate warns, diff and textconv show none), and a parent's acknowledgement does not cover a
child that breaks the rule again."""

from __future__ import annotations

from toolkit.app.profiles import check
from toolkit.cli.main import main
from toolkit.core.profile.diff import diff_profiles, knob_lines

PARENT_WHY = ("why:\n  server.max_running_requests:\n    reason: the parent's batch size fits its KV cache\n"
              "  server:\n    reason: the parent's server settings as the story ran them\n")


def _child(body: str) -> str:
    return f"schema_version: 1\nname: c\nextends: p\n{body}"


def _parent(base_yaml: str, extra: str = "") -> str:
    return base_yaml.replace("name: base", "name: p").replace("  tp_size: 8\n",
                                                              "  tp_size: 8\n  max_running_requests: 64\n") \
        + PARENT_WHY + extra


def test_a_changed_knob_whose_only_why_is_the_parents_is_a_warning(write_profiles, base_yaml) -> None:
    store = write_profiles({"p": _parent(base_yaml), "c": _child("server:\n  max_running_requests: 128\n")})
    (warning,) = [p for p in check(store.resolve("c")) if p.rule_id == "why-inherited"]
    assert warning.severity == "warning" and warning.field == "server.max_running_requests"
    assert warning.file.endswith("c.yaml") and "p's (why.server.max_running_requests)" in warning.message
    assert "why.server.max_running_requests" in (warning.fix or "")
    # validate fails it with --strict only.
    assert main(["profile", "validate", "c", "--profiles-dir", str(store.dir)]) == 0
    assert main(["profile", "validate", "c", "--profiles-dir", str(store.dir), "--strict"]) == 2


def test_a_knob_the_child_keeps_or_explains_itself_needs_nothing(write_profiles, base_yaml) -> None:
    own = _child("server:\n  max_running_requests: 128\nwhy:\n  server.max_running_requests:\n"
                 "    reason: the child serves shorter prompts\n")
    same = _child("server:\n  max_running_requests: 64\n")  # set again to the parent's value: no change
    for body in (own, same):
        store = write_profiles({"p": _parent(base_yaml), "c": body})
        assert not [p for p in check(store.resolve("c")) if p.rule_id == "why-inherited"], body


def test_diff_and_textconv_never_show_the_parents_reason_for_the_childs_change(write_profiles, base_yaml) -> None:
    store = write_profiles({"p": _parent(base_yaml), "c": _child("server:\n  max_running_requests: 128\n")})
    parent, child = store.resolve("p"), store.resolve("c")
    (change,) = diff_profiles(parent, child).changes
    assert change.path == "server.max_running_requests" and change.why is None
    lines = knob_lines(child).splitlines()
    line = next(x for x in lines if x.startswith("server.max_running_requests"))
    assert "parent's batch size" not in line and "server settings as the story" not in line
    # The parent's own value keeps its reason, and a value the child inherits unchanged keeps the parent's.
    assert "parent's batch size" in next(x for x in knob_lines(parent).splitlines()
                                         if x.startswith("server.max_running_requests"))
    assert "server settings as the story" in next(x for x in lines if x.startswith("server.tp_size"))


def test_a_parents_acknowledgement_does_not_cover_a_child_that_breaks_the_rule_again(write_profiles,
                                                                                      base_yaml) -> None:
    """The parent turns CUDA graphs on and acknowledges it; a child in between turns them off; its child turns them
    on again: the acknowledgement was for the parent's setting, the grandchild needs its own."""
    ack = ("acknowledge:\n  sm120-nsa-cuda-graph: the baseline runs SGLang's defaults as they crashed, on "
           "purpose\n")
    parent = _parent(base_yaml, ack).replace("  cuda_graph: false\n", "  cuda_graph: true\n")
    store = write_profiles({
        "p": parent,
        "c": _child("server:\n  cuda_graph: true\n  max_running_requests: 64\n"),
    })
    own = [p for p in check(store.resolve("p")) if p.rule_id == "sm120-nsa-cuda-graph"]
    assert [p.severity for p in own] == ["acknowledged"]
    (again,) = [p for p in check(store.resolve("c")) if p.rule_id == "sm120-nsa-cuda-graph"]
    assert again.severity == "warning" and again.file.endswith("c.yaml")
    assert "acknowledged by p for its own setting" in again.message
    assert "acknowledge sm120-nsa-cuda-graph here" in (again.fix or "")
    # Its own acknowledgement covers it.
    store = write_profiles({"p": parent, "c": _child("server:\n  cuda_graph: true\n" + ack)})
    (covered,) = [p for p in check(store.resolve("c")) if p.rule_id == "sm120-nsa-cuda-graph"]
    assert covered.severity == "acknowledged"
    # A child that only inherits the parent's setting is covered by the parent's acknowledgement.
    store = write_profiles({"p": parent, "c": _child("server:\n  max_running_requests: 64\n")})
    (inherited,) = [p for p in check(store.resolve("c")) if p.rule_id == "sm120-nsa-cuda-graph"]
    assert inherited.severity == "acknowledged"
