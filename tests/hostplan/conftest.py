"""Recorded raw outputs of the facts playbook, replayed through the real parser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolkit.core.hostplan.facts import HostFacts, parse_facts, raw_from_json

FIXTURES = Path(__file__).parent / "fixtures"


def load_raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
    return data


@pytest.fixture
def facts_of() -> Callable[..., HostFacts]:
    """facts_of("pve92-homelab", uname="7.0.14-1-pve\\n", ...): the fixture with some outputs replaced
    (a string: its stdout with rc 0; a (rc, stdout) pair; None: absent)."""

    def make(name: str, host: str = "pve1", **changes: Any) -> HostFacts:
        raw = load_raw(name)
        for key, value in changes.items():
            if value is None:
                raw.pop(key, None)
            elif isinstance(value, tuple):
                raw[key] = {"rc": value[0], "stdout": value[1]}
            else:
                raw[key] = {"rc": 0, "stdout": value}
        return parse_facts(host, raw_from_json(raw))

    return make
