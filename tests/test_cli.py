"""The command surface: every command group is documented, help is fast to reach, errors exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from toolkit.cli.main import GROUPS, main

REPO = Path(__file__).resolve().parents[1]


def test_every_command_group_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    documented = set(re.findall(r"`toolkit (\w+)", readme))
    missing = sorted(set(GROUPS) - documented)
    assert not missing, f"command groups missing from README.md: {missing}"


def test_help_lists_groups_without_heavy_imports() -> None:
    # Run in a fresh interpreter so earlier tests' imports do not hide a heavy import.
    code = (
        "import sys, contextlib, io\n"
        "from toolkit.cli.main import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "heavy = [m for m in ('ansible_runner', 'pynvml', 'matplotlib', 'pydantic') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "print(buf.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
    for name in GROUPS:
        assert name in out


def test_group_without_subcommand_exits_2(capsys: object) -> None:
    try:
        code = main([])
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    assert code == 2
