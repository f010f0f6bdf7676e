"""Shared fixtures. `lab`: the lab (toolkit.lab), up once per test session, down at its end.

Tests that use it are marked `lab` automatically (they need root; CI runs them as root). When the
lab was already up before the session (a developer's own), it is reused and left up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# A shell without job control starts background commands (`pytest ... &`, as scripts/test runs its second shard)
# with SIGINT ignored, and an ignored signal stays ignored through fork and exec: every toolkit process a test
# starts would then shrug off the SIGINT the interrupt tests send it. A handler (not SIG_IGN) is reset to the
# default at exec, so the children start as they would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The reliability table (docs/reliability.md): fault tests record what the user saw, what was recorded and what
# the next run did through the `reliability` fixture. A row is kept only when its test passed in this run; with
# TOOLKIT_RELIABILITY_ROWS=FILE set, the session merges its rows into FILE (a test that failed loses its row), and
# `python scripts/reliability_table.py FILE > docs/reliability.md` renders the table.
ROWS_ENV = "TOOLKIT_RELIABILITY_ROWS"
_ROWS = pytest.StashKey[dict[str, dict[str, object]]]()
_FAILED = pytest.StashKey[set[str]]()


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the markers added here must count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lab)
        if "reliability" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.reliability)
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


@pytest.fixture(scope="session")
def pypi() -> None:
    """Skips, saying why, where pypi.org cannot be reached (CI reaches it): tests that ask the real index."""
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError as err:
        pytest.skip(f"pypi.org:443 is unreachable from here ({err}); CI reaches it")


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Iterator[Callable[..., None]]:
    """`reliability(fault=..., user_saw=..., recorded=..., next_run=...)`: this test's row of the reliability
    table. Pass what the test observed (the message the user got, the files it found), not what it expects."""
    rows: list[dict[str, object]] = []

    def row(*, fault: str, user_saw: str, recorded: str, next_run: str, area: str = "") -> None:
        rows.append({"fault": fault, "user_saw": user_saw, "recorded": recorded, "next_run": next_run,
                     "area": area or request.node.nodeid.split("/")[1], "test": request.node.nodeid})

    yield row
    request.node.stash[_ROWS] = {f"{r['test']}#{i}": r for i, r in enumerate(rows)}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if "reliability" not in getattr(item, "fixturenames", ()):
        return
    if report.failed:
        item.config.stash.setdefault(_FAILED, set()).add(item.nodeid)
    elif report.when == "teardown" and item.nodeid not in item.config.stash.get(_FAILED, set()):
        item.config.stash.setdefault(_ROWS, {}).update(item.stash.get(_ROWS, {}))


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(ROWS_ENV)
    if not target:
        return
    path = Path(target)
    rows: dict[str, dict[str, object]] = json.loads(path.read_text()) if path.exists() else {}
    ran = session.config.stash.get(_FAILED, set()) | {k.split("#")[0] for k in session.config.stash.get(_ROWS, {})}
    rows = {k: v for k, v in rows.items() if k.split("#")[0] not in ran}  # this run's outcome replaces the last
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    for key, row in session.config.stash.get(_ROWS, {}).items():
        rows[key] = {**row, "date": stamp, "commit": commit}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
