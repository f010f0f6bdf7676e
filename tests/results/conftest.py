"""A scratch repository per test: a copy of profiles/ and of the recorded run fixture, nothing shared."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run-synthetic-tp8"


@dataclass
class Scratch:
    root: Path
    profiles: Path
    run: Path

    def snapshot(self) -> dict[str, tuple[bytes, int]]:
        """Every file under root: its bytes and mtime, to prove that nothing was written."""
        return {str(p.relative_to(self.root)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in sorted(self.root.rglob("*")) if p.is_file()}


@pytest.fixture
def scratch(tmp_path: Path) -> Scratch:
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    shutil.copytree(RUN_FIXTURE, tmp_path / "runs" / RUN_FIXTURE.name)
    return Scratch(tmp_path, tmp_path / "profiles", tmp_path / "runs" / RUN_FIXTURE.name)
