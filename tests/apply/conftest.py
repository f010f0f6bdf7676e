"""The apply lab modules' fixtures: one provisioned container and one copy of the profiles per module (each module
brings its own lab instance's container in CI; see tests/apply/apply_lab_support.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apply_lab_support import REPO, Target  # type: ignore[import-not-found]


@pytest.fixture(scope="module")
def provisioned(lab: Any) -> Target:
    """The container created and its NVIDIA userspace installed (`toolkit host provision`, #6)."""
    inventory = Path(os.environ.get("TOOLKIT_TEST_APPLY_INVENTORY") or lab.inventory_path)
    proc = subprocess.run([sys.executable, "-m", "toolkit", "host", "provision", "pve1", "--containers", "-i",
                           str(inventory)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Target(lab, inventory)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the profiles, so that --record writes there and not into the checkout."""
    root = tmp_path_factory.mktemp("apply")
    shutil.copytree(REPO / "profiles", root / "profiles")
    return root
