"""bench_probe's run phase for real (ansible-runner, connection=local): the probe's run directory comes to the
controller as the same files under the same names, in one archive and one fetch, and nothing else is left behind;
a run of the same id replaces the directory whole; a probe that fails before writing anything fails the role
with its own message.

The probe is a stand-in script in the venv's place: what is under test is the role's fetch, not the probe.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.ansible import PlaybookResult, run_playbook

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
RUN_ID = "20261206T120000Z-glm5-tp8"

# `toolkit probe run --out DIR ...`: a probe's kind of directory (files and a subdirectory), or a failure first.
PROBE = """#!/bin/sh
out=$4
if [ "$5" = --server-url ]; then echo "probe: the server at http://x:30000 did not answer" >&2; exit 3; fi
mkdir -p "$out/timeline"
for f in bench.jsonl gpu_samples.csv verdict.json probe.log; do echo "$f of $out" > "$out/$f"; done
head -c 4096 /dev/urandom > "$out/timeline/gpu.parquet"
"""


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _run(tmp: Path, run_id: str = RUN_ID, fail: bool = False) -> PlaybookResult:
    venv = tmp / "venv"
    if not venv.exists():
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "toolkit").write_text(PROBE)
        (venv / "bin" / "toolkit").chmod(0o755)
    inventory = tmp / "inventory.ini"
    inventory.write_text(f"[local]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    extravars: dict[str, Any] = {
        "bench_probe_venv_path": str(venv),
        "bench_probe_runs_dir": str(tmp / "host" / "runs"),
        "bench_probe_fetch_dir": str(tmp / "controller"),
        "bench_probe_run_id": run_id,
        "bench_probe_bench_argv": ["python3", "-m", "sglang.bench_serving"],
        "bench_probe_hf_home": str(tmp / "hf"),
        "bench_probe_probe_args": ["--server-url", "http://x:30000"] if fail else [],
    }
    return run_playbook(str(HERE / "playbooks" / "probe_local.yml"), inventory=inventory,
                        private_data_dir=tmp / "runner", extravars=extravars)


def _leftovers(tmp: Path) -> list[str]:
    """Anything but run directories: the archive on either side, a scratch directory of the unpacking."""
    return sorted(str(p.relative_to(tmp)) for side in (tmp / "host" / "runs", tmp / "controller" / "localhost")
                  if side.exists() for p in side.iterdir() if p.name.startswith("."))


def test_the_run_directory_arrives_whole_under_the_same_names_and_nothing_else_is_left(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.rc == 0, result.failures
    host = tmp_path / "host" / "runs" / RUN_ID
    fetched = tmp_path / "controller" / "localhost" / RUN_ID
    assert sorted(_tree(host)) == ["bench.jsonl", "gpu_samples.csv", "probe.log", "timeline/gpu.parquet",
                                   "verdict.json"]
    assert _tree(fetched) == _tree(host)
    assert _leftovers(tmp_path) == []


def test_a_run_of_the_same_id_replaces_the_directory_whole(tmp_path: Path) -> None:
    assert _run(tmp_path).rc == 0
    fetched = tmp_path / "controller" / "localhost" / RUN_ID
    (fetched / "from-an-earlier-run.json").write_text("{}")

    again = _run(tmp_path)
    assert again.rc == 0, again.failures
    assert _tree(fetched) == _tree(tmp_path / "host" / "runs" / RUN_ID)
    assert not (fetched / "from-an-earlier-run.json").exists()
    assert _leftovers(tmp_path) == []


def test_a_probe_that_fails_before_writing_fails_the_role_with_its_own_message(tmp_path: Path) -> None:
    result = _run(tmp_path, fail=True)
    assert result.rc != 0
    message = "\n".join(f.message for f in result.failures)
    assert "toolkit probe run exited 3 on localhost" in message, message
    assert "the server at http://x:30000 did not answer" in message, message
    assert not (tmp_path / "controller" / "localhost" / RUN_ID).exists()
    assert _leftovers(tmp_path) == []
