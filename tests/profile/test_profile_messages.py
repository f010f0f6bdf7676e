"""The mistakes people make in a profile, each named in their words: a tab, a number with a unit, a `reason:`
dedented under why, a key without its colon, a knob at the top level."""

from __future__ import annotations

import pytest

from toolkit.core.errors import ToolkitError

WHY = "why:\n  server.tp_size:\n    reason: the whole model needs all 8 GPUs\n"


@pytest.fixture
def text(base_yaml: str) -> str:
    server = base_yaml.replace("server:\n", "server:\n  chunked_prefill_size: 4096\n")
    return server + "gpu:\n  power_limit_w: 400\n" + WHY


def _line(text: str, needle: str) -> int:
    return text.splitlines().index(needle) + 1


@pytest.mark.parametrize(("old", "new", "says", "fix", "at"), [
    ("  tp_size: 8", "\ttp_size: 8", "tab character at line {n}; YAML indents with spaces", "replace the tab",
     "\ttp_size: 8"),
    ("  tp_size: 8", "  tp_size 8", "missing ':' after 'tp_size' at line {n}", "write `tp_size: 8`", "  tp_size 8"),
    ("  chunked_prefill_size: 4096", "  chunked_prefill_size: 8k", "a number with a unit: write 8192",
     "chunked_prefill_size a whole number", "  chunked_prefill_size: 8k"),
    ("  power_limit_w: 400", "  power_limit_w: 450W", "a number with a unit: write 450", "power_limit_w a number",
     "  power_limit_w: 450W"),
    ("    reason: the whole", "  reason: the whole", "'reason' is not a knob", "indent it under why.server.tp_size",
     "  reason: the whole model needs all 8 GPUs"),
    ("  extra_args: [--enable-cache-report]\n", "  extra_args: [--enable-cache-report]\nmax_running_requests: 64\n",
     "unknown key 'max_running_requests'", "did you mean server.max_running_requests?", "max_running_requests: 64"),
])  # fmt: skip
def test_each_mistake_is_named_at_its_own_line(write_profiles, text: str, old: str, new: str, says: str, fix: str,
                                               at: str) -> None:
    assert old in text
    text = text.replace(old, new, 1)
    store = write_profiles({"base": text})
    with pytest.raises(ToolkitError) as err:
        store.resolve("base")
    problem = err.value.problems[0]
    n = _line(text, at)
    assert says.format(n=n) in problem.message and fix in problem.fix and problem.line == n, problem
    assert "quoted number" not in problem.message  # nothing was quoted


def test_the_profile_without_the_mistakes_loads(write_profiles, text: str) -> None:
    assert write_profiles({"base": text}).resolve("base").spec.server.chunked_prefill_size == 4096
