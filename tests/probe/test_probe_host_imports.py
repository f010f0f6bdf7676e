"""The probe runs on the GPU host from a venv of the toolkit's wheel and its few runtime packages
(wheelhouse.PROBE_REQUIREMENTS), not the controller's: a probe run there imports nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from toolkit.adapters.wheelhouse import PROBE_REQUIREMENTS

RECORDED = Path(__file__).resolve().parents[1] / "results" / "fixtures" / "run-synthetic-tp8" / "trace.csv"
# PROBE_REQUIREMENTS' import names, and what they bring (rich: markdown-it-py, mdurl, pygments).
IMPORT_NAMES = {"rich": "rich", "nvidia-ml-py": "pynvml", "pyyaml": "yaml", "prometheus-client": "prometheus_client"}
BROUGHT = {"markdown_it", "mdurl", "pygments"}

# Runs `toolkit probe run` with every module refused that is neither the standard library, the toolkit, nor the
# probe venv's packages: what a host's venv lacks fails here as ModuleNotFoundError, as it would there.
SCRIPT = """
import importlib.abc, json, sys
allowed = set(json.loads(sys.argv[1])) | set(sys.stdlib_module_names) | {"toolkit"}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the probe's venv)", name=name)
        return None
sys.meta_path.insert(0, Refuse())
from toolkit.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_probe_run_needs_only_the_probe_venvs_packages(tmp_path: Path) -> None:
    assert set(IMPORT_NAMES) == set(PROBE_REQUIREMENTS)
    allowed = sorted(set(IMPORT_NAMES.values()) | BROUGHT)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(allowed), "probe", "run", "--replay-gpu-trace", str(RECORDED),
         "--idle-s", "0.2", "--out", str(out), "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "run.json").exists() and (out / "verdict.json").exists()
