"""Shared pieces of the sweep tests: the base spec, the recorded 3 x 2 table, a sweep state over it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolkit.core.errors import Problem
from toolkit.core.sweep.state import SweepState, new_state
from toolkit.core.sweep.variants import Variant, parse_axes, plan

FIXTURES = Path(__file__).parent / "fixtures"
VARY = ["server.max_running_requests=256,512,1024", "server.cuda_graph=on,off"]
LEVELS = [64, 256, 1024]


def base_spec() -> dict[str, Any]:
    return {"name": "glm5-tp8", "server": {"tp": 8, "max_running_requests": 1024, "cuda_graph": False}}


def no_problems(_variant: Variant) -> list[Problem]:
    return []


@pytest.fixture
def table() -> dict[str, Any]:
    return json.loads((FIXTURES / "sweep_3x2_results.json").read_text())


@pytest.fixture
def fresh_state() -> SweepState:
    base = base_spec()
    axes = parse_axes(VARY, base)
    return new_state(
        run_id="glm5-tp8-test",
        profile="glm5-tp8",
        base_spec=base,
        axes=axes,
        planned=plan(base, axes, no_problems),
        concurrency=LEVELS,
        created="2026-12-02T16:00:00Z",
        runner="test table",
    )
