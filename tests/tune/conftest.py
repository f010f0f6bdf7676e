"""Shared pieces of the tune tests: the shipped profiles, their validator, and a tune state of glm5-baseline."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.profiles import check
from toolkit.core.sweep.promote import base_spec, profile_validator
from toolkit.core.sweep.run import RunVariant
from toolkit.core.sweep.state import SweepState, new_state, state_from_dict
from toolkit.core.tune.loop import new_tune_log, run_tune

REPO = Path(__file__).resolve().parents[2]
BASE = "glm5-baseline"


@pytest.fixture(scope="session")
def profiles() -> ProfileStore:
    return ProfileStore(REPO / "profiles")


def fresh(profiles: ProfileStore, *, levels: list[int] | None = None, repeats: int = 3, budget: int | None = None,
          objective: str = "throughput", run_id: str = "glm5-baseline-t") -> tuple[SweepState, dict[str, Any]]:
    spec = base_spec(profiles.resolve(BASE))
    state = new_state(run_id=run_id, profile=BASE, base_spec=spec, axes=[], planned=[], concurrency=levels or [1024],
                      created="", runner="test")
    state.tune = new_tune_log(objective=objective, repeats=repeats, min_gain_pct=1.0, budget_points=budget)
    return state, spec


class Saves:
    """The store's save without a disk: every save is the state's JSON text, the way the store writes it."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, state: SweepState) -> None:
        self.texts.append(json.dumps(state.to_dict()))

    def last(self) -> SweepState:
        return state_from_dict(json.loads(self.texts[-1]), file="state.json")


def tune(profiles: ProfileStore, state: SweepState, spec: dict[str, Any], runner: RunVariant,
         saves: Callable[[SweepState], None] | None = None, on_step: Callable[[str], None] | None = None
         ) -> SweepState:
    validate = profile_validator(BASE, state.run_id, profiles.source, check)
    return run_tune(state, spec, runner, validate=validate, save=saves or (lambda _s: None), clock=time.monotonic,
                    on_step=on_step or (lambda _m: None))
