"""The upgrade lab modules' fixture: the lab's container provisioned and a copy of the profiles, per module."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.upgrade.upgrade_lab_support import REPO, Lab


@pytest.fixture(scope="module")
def lab_ct(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    inventory = Path(lab.inventory_path)
    proc = subprocess.run([sys.executable, "-m", "toolkit", "host", "provision", "pve1", "--containers", "-i",
                           str(inventory)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    work = tmp_path_factory.mktemp("upgrade")
    shutil.copytree(REPO / "profiles", work / "profiles")
    return Lab(lab, inventory, work)
