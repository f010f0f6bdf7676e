"""Shared fixtures. `lab`: the lab (toolkit.lab), up once per test session, down at its end.

Tests that use it are marked `lab` automatically (they need root; CI runs them as root). When the
lab was already up before the session (a developer's own), it is reused and left up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lab)
    # tests/lab/test_lifecycle.py takes the lab up and down itself: it runs before anything that
    # uses the shared `lab` fixture, so it never takes down a lab another test is using. The rest of
    # tests/lab/ comes next: it checks the stand-ins on a bare pve1 (no driver, HMM at its default),
    # which the provision and apply tests change for good.
    def rank(item: pytest.Item) -> int:
        if item.nodeid.startswith("tests/lab/test_lifecycle.py"):
            return 0
        return 1 if item.nodeid.startswith("tests/lab/") else 2

    items.sort(key=rank)  # stable: the order within each group stays as collected


@pytest.fixture(scope="session")
def lab() -> Iterator[object]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, mounts, LXC)")
    import toolkit.lab

    before = toolkit.lab.status()
    was_up = bool(before and before.running)
    state = toolkit.lab.up(gpus=before.config.gpus if was_up and before else 8)
    yield state
    if not was_up:
        toolkit.lab.down()
