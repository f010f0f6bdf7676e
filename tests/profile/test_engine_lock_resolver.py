"""pip's resolver against the committed locks (toolkit/adapters/pip_resolver.py, toolkit/app/engine_lock.py).

The closure test asks the real index (metadata only: pip reads each wheel's PEP 658 metadata, nothing is
installed); it is skipped, saying why, where the index cannot be reached. The parsing tests feed pip's own words.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from toolkit.adapters import pip_resolver
from toolkit.app.engine_lock import CLOSED, lock_release
from toolkit.core.engine_lock import lock_path, parse_lock

REPO = Path(__file__).resolve().parents[2]

# pip 26.3's words for 0.5.23 on CPython 3.13 (the committed refusal), as it printed them.
PIP_REFUSED = """\
Collecting outlines==0.1.11 (from sglang==0.5.23)
  Downloading outlines-0.1.11-py3-none-any.whl.metadata (17 kB)
Collecting outlines_core==0.1.26 (from outlines==0.1.11->sglang==0.5.23)
ERROR: Could not find a version that satisfies the requirement outlines_core==0.1.26 (from outlines) \
(from versions: 0.1.17, 0.2.9, 0.2.10, 0.2.11, 0.2.13, 0.2.14)
ERROR: No matching distribution found for outlines_core==0.1.26
"""
# pip 23.2's, which names no parent version in its Collecting lines for a direct requirement.
PIP_23_REFUSED = """\
Collecting torch==2.14.1
  Downloading torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl (915.2 MB)
ERROR: Could not find a version that satisfies the requirement nvidia-nccl-cu13==2.30.7 (from torch) \
(from versions: 2.28.3)
ERROR: No matching distribution found for nvidia-nccl-cu13==2.30.7
"""

# pip 26.3's words for sglang==0.5.9 under the committed 0.5.9 lock's pins with torch==2.8.0 put in (as it printed
# them, resolving from PyPI): pins that cannot all hold.
PIP_CONFLICT = """\
Collecting torch_memory_saver==0.0.9 (from sglang==0.5.9)
  Obtaining dependency information from torch-memory-saver 0.0.9
ERROR: Cannot install sglang==0.5.9 because these package versions have conflicting dependencies.

The conflict is caused by:
    sglang 0.5.9 depends on torch==2.9.1
    The user requested (constraint) torch==2.8.0

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip to attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""


def test_pins_that_conflict_are_told_in_pips_words_without_its_advice() -> None:
    lines = PIP_CONFLICT.splitlines()
    conflict = pip_resolver.conflict_from_output(lines)
    assert conflict[0].startswith("ERROR: Cannot install sglang==0.5.9")
    assert "    The user requested (constraint) torch==2.8.0" in conflict
    assert not any("loosen" in line or "pip.pypa.io" in line for line in conflict)
    # Not a requirement the index lacks: the check reports the conflict rather than a refusal.
    assert pip_resolver.refusal_from_output(lines, "0.5.9", "3.11", index_url="x", pip_version="26.3") is None
    assert pip_resolver.conflict_from_output(PIP_REFUSED.splitlines()) == ()


@pytest.mark.parametrize(("output", "missing", "by"), [
    (PIP_REFUSED, "outlines_core==0.1.26", "outlines==0.1.11"),
    (PIP_23_REFUSED, "nvidia-nccl-cu13==2.30.7", "torch==2.14.1"),
])
def test_pips_message_names_the_missing_requirement_and_what_pins_it(output: str, missing: str, by: str) -> None:
    refusal = pip_resolver.refusal_from_output(output.splitlines(), "0.5.23", "3.13", index_url="https://pypi.org/simple",
                                               pip_version="26.3")
    assert refusal is not None
    assert (refusal.missing, refusal.required_by) == (missing, by)
    assert refusal.detail.startswith("ERROR: Could not find a version")


def test_a_failure_that_is_not_a_missing_requirement_is_no_refusal() -> None:
    lines = ["WARNING: Retrying (Retry(total=4...)) after connection broken by 'NewConnectionError'",
             "ERROR: Could not install packages due to an OSError: HTTPSConnectionPool(host='pypi.org')"]
    assert pip_resolver.refusal_from_output(lines, "0.5.9", "3.11", index_url="x", pip_version="") is None


def test_pip_runs_without_this_machines_configuration(monkeypatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/xdg/pip/constraints.txt")
    env = pip_resolver.isolated_env()
    assert not {k for k in env if k.startswith("PIP_")} - {"PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK"}
    assert env["PIP_CONFIG_FILE"] == "/dev/null"
    cmd = pip_resolver.resolve_command("0.5.9", "3.11", "https://pypi.org/simple", Path("r.json"), Path("t"))
    assert "--isolated" in cmd and cmd[cmd.index("--index-url") + 1] == "https://pypi.org/simple"
    assert "manylinux_2_27_x86_64" in cmd and "cp311" in cmd
    assert "--constraint" not in cmd
    pinned = pip_resolver.resolve_command("0.5.9", "3.11", "https://pypi.org/simple", Path("r.json"), Path("t"),
                                          constraints=Path("pins.txt"))
    assert pinned[pinned.index("--constraint") + 1] == "pins.txt" and pinned[-1] == "sglang==0.5.9"


@pytest.mark.slow
@pytest.mark.usefixtures("pypi")
def test_pips_resolver_adds_nothing_to_the_committed_0_5_9_lock(tmp_path: Path) -> None:
    """A closed lock: pip, resolving sglang==0.5.9 for CPython 3.11 from PyPI alone under the lock's own pins,
    wants exactly its lines, files included. (Unpinned, it failed the day lxml 6.2.1 shipped: PyPI moves, the
    lock does not, and a re-lock is the way to follow it.)"""
    committed = REPO / lock_path("0.5.9", "3.11")
    (tmp_path / committed.relative_to(REPO)).parent.mkdir(parents=True)
    (tmp_path / committed.relative_to(REPO)).write_bytes(committed.read_bytes())
    started = time.monotonic()
    (outcome,) = lock_release("0.5.9", repo_root=tmp_path, pythons=("3.11",), check=True)
    assert outcome.status == CLOSED, "\n".join(outcome.difference)
    assert outcome.lock is not None and outcome.lock.names == parse_lock(committed.read_text(), "x").names
    assert outcome.lock.get("torch").version == "2.9.1"  # type: ignore[union-attr]
    assert time.monotonic() - started < 300
