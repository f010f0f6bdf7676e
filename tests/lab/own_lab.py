"""A lab of its own for one test module (a flavour, several hosts): `yield from module_lab(CONFIG)` in a module
fixture. The session's lab, if up, is taken down first and brought back, bare, after the module."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

import toolkit.lab
from toolkit.lab.plan import LabConfig, LabState


def module_lab(config: LabConfig) -> Iterator[LabState]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    before = toolkit.lab.status()
    was_up = bool(before and before.running)
    if before:
        toolkit.lab.down()
    t0 = time.monotonic()
    state = toolkit.lab.up(config=config)
    print(f"\nlab up ({config.flavour}, {config.hosts} host(s)): {time.monotonic() - t0:.1f} s")
    yield state
    toolkit.lab.down()
    if was_up and before:
        toolkit.lab.up(config=before.config)
