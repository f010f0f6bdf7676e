"""`lab up`'s CT template build beside the hosts' start (toolkit.lab.template_job), run as `up` starts it: a
process of its own, placing a built template into each host's appliance index marked pending, and the reason
into each one when the build fails. No lab: a cache with a template built and indexes in a temporary directory."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from toolkit.lab import rootfs, system, template

SUITE = template.DEFAULT_SUITE


def _job(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, rootfs.CACHE_DIR_ENV: str(cache)}
    return subprocess.run([sys.executable, "-m", "toolkit.lab.template_job", *args], capture_output=True, text=True,
                          env=env, check=False, timeout=60)


def _built_template(cache: Path) -> bytes:
    final = rootfs.template_dir(SUITE, cache)
    final.mkdir(parents=True)
    data = b"a CT template's bytes"
    (final / template.APPLIANCES[SUITE].file_name).write_bytes(data)
    (final / ".toolkit-lab-complete").write_text("")
    return data


def test_a_built_template_goes_into_the_pending_indexes_only(tmp_path: Path) -> None:
    cache, pending, unmarked = tmp_path / "cache", tmp_path / "pve1", tmp_path / "pve2"
    data = _built_template(cache)
    for d in (pending, unmarked):
        d.mkdir()
    (pending / system.APLINFO_PENDING).write_text("being built\n")

    done = _job(cache, SUITE, "--into", str(pending), str(unmarked))

    assert done.returncode == 0, done.stderr
    name = template.APPLIANCES[SUITE].file_name
    assert (pending / name).read_bytes() == data
    assert hashlib.sha512(data).hexdigest() in (pending / "aplinfo.dat").read_text()
    assert not (pending / system.APLINFO_PENDING).exists()
    # `up` places an index it marks after the job looked (system._index_if_built): the job leaves it alone.
    assert list(unmarked.iterdir()) == []


def test_a_failed_build_leaves_its_reason_where_pveam_waits(tmp_path: Path) -> None:
    cache, pending = tmp_path / "cache", tmp_path / "pve1"
    pending.mkdir()
    (pending / system.APLINFO_PENDING).write_text("being built\n")

    failed = _job(cache, "no-such-suite", "--into", str(pending))

    assert failed.returncode == 1
    reason = (pending / system.APLINFO_FAILED).read_text()
    assert reason.startswith("lab: building the CT template failed:") and "template-job.log" in reason
    assert not (pending / system.APLINFO_PENDING).exists()
    assert not (pending / "aplinfo.dat").exists()
