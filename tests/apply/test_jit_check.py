"""roles/sglang_venv/files/jit_check.py, the deploy's JIT toolchain check, run for real: it builds and imports a
Python extension the way Triton builds its launcher, and fails (with Triton's own message) without a compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles/sglang_venv/files/jit_check.py"


def _check(env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_builds_and_imports_an_extension_with_the_compiler_here() -> None:
    result = _check(dict(os.environ))
    assert result["ok"] is True, result
    assert any(str(c).startswith("launcher build: ") for c in result["checks"])  # type: ignore[union-attr]


def test_no_compiler_fails_with_tritons_message() -> None:
    result = _check({"PATH": "/nonexistent"})
    assert result["ok"] is False
    assert "Failed to find C compiler. Please specify via CC environment variable." in str(result["error"])
