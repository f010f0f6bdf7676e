"""bench_probe's install phase for real (ansible-runner, connection=local), from the probe's real wheels: pip runs
for a venv that lacks a runtime package or something one of them requires, and not otherwise (every probe apply
ran it before, about a second of CPU each, to be told "Requirement already satisfied").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.adapters.ansible import PlaybookResult, run_playbook
from toolkit.adapters.wheelhouse import ProbeWheels, probe_wheels

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
REPO = HERE.parents[1]
PYTHON = "/usr/bin/python3"
TASK = "The probe's runtime packages"


@pytest.fixture(scope="module")
def wheels(pypi: None) -> ProbeWheels:
    version = subprocess.run([PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    return probe_wheels(version, repo_root=REPO)


def _run(tmp: Path, wheels: ProbeWheels) -> PlaybookResult:
    inventory = tmp / "inventory.ini"
    inventory.write_text(f"[local]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return run_playbook(str(HERE / "playbooks" / "probe_install_local.yml"), inventory=inventory,
                        private_data_dir=tmp / "runner",
                        extravars={"bench_probe_venv_path": str(tmp / "venv"), "bench_probe_python": PYTHON,
                                   "bench_probe_wheelhouse_dir": str(wheels.runtime[0].parent),
                                   "bench_probe_toolkit_wheel_src": str(wheels.toolkit_wheel)})


def _ran(result: PlaybookResult, task: str) -> list[str]:
    return [e.kind for e in result.events if e.task == task and e.kind in ("ok", "changed", "skipped")]


def _has(tmp: Path, module: str) -> bool:
    return subprocess.run([str(tmp / "venv" / "bin" / "python"), "-c", f"import {module}"]).returncode == 0


def test_pip_runs_only_for_a_venv_that_lacks_a_runtime_package_or_what_it_requires(tmp_path: Path,
                                                                                  wheels: ProbeWheels) -> None:
    first = _run(tmp_path, wheels)
    assert first.rc == 0, first.failures
    assert _ran(first, TASK) == ["changed"]
    assert all(_has(tmp_path, m) for m in ("rich", "pynvml", "yaml", "prometheus_client", "toolkit"))

    again = _run(tmp_path, wheels)
    assert again.rc == 0, again.failures
    assert _ran(again, TASK) == ["skipped"] and again.hosts["localhost"].changed == 0

    # A dependency of a dependency (rich -> markdown-it-py -> mdurl) gone: pip runs and brings it back.
    subprocess.run([str(tmp_path / "venv" / "bin" / "pip"), "uninstall", "-q", "-y", "mdurl"], check=True)
    assert not _has(tmp_path, "mdurl")
    repaired = _run(tmp_path, wheels)
    assert repaired.rc == 0, repaired.failures
    assert _ran(repaired, TASK) == ["changed"] and _has(tmp_path, "mdurl")
