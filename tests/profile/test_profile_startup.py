"""Commands that only read profiles never import ansible_runner, pynvml or matplotlib (their cost is
measured by benchmarks/bench_cli_start.py, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ["ansible_runner", "ansible", "pynvml", "matplotlib"]

PROBE = """
import json, sys
from toolkit.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy})), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["profile", "validate", "all"], ["profile", "diff", "glm5-baseline", "glm5-tp8"],
     ["profile", "render", "glm5-tp8"]],
)  # fmt: skip
def test_no_heavy_imports(argv: list[str]) -> None:
    code = PROBE.format(heavy=set(HEAVY))
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv, "--profiles-dir", str(REPO / "profiles")]
        if argv[0] == "profile"
        else [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    assert loaded == [], f"{argv} imported {loaded}"
