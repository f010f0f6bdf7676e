"""Cache entries built by several processes at once: CI's two shards come up on a cold machine at the same
moment and build the same entries (the stand-in installer, the userland, the templates, the mirror, the
debhouse and wheelhouse). Seen in CI before the lock: one shard's clean start removed the other's
half-made payload, and its tar failed with "Cannot open"."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from toolkit.adapters import cache_lock

BUILD_INSTALLER = """
import sys
from pathlib import Path
from toolkit.lab import rootfs, system
rootfs.CACHE_DIR = Path(sys.argv[1])
print(system.build_installer("580.95.05"))
"""


@pytest.mark.skipif(not Path("/usr/bin/gcc").exists(), reason="the stand-in libcuda is compiled with gcc")
def test_four_processes_building_the_installer_at_once_all_get_one_whole_file(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_INSTALLER, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for rc, _, err in results:
        assert rc == 0, err[-2000:]
    paths = {out.strip() for _, out, _ in results}
    assert len(paths) == 1, paths
    run_file = Path(paths.pop())
    # Whole: the stand-in's header and a payload that gzip and tar read to its end, with the library in it.
    data = run_file.read_bytes()
    assert b"lab stand-in" in data[:4096]
    assert "libcuda.so.580.95.05" in _payload_names(data)
    assert not list(tmp_path.glob("*.building")), "a half-made entry was left behind"


def _payload_names(data: bytes) -> list[str]:
    start = data.find(b"\x1f\x8b\x08")
    with tarfile.open(fileobj=io.BytesIO(data[start:]), mode="r:gz") as tar:
        return [Path(name).name for name in tar.getnames()]


def test_a_second_builder_waits_for_the_first_and_a_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    hold = ("import sys, time; from pathlib import Path; from toolkit.adapters import cache_lock\n"
            "with cache_lock.building(Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(float(sys.argv[2]))\n")
    first = subprocess.Popen([sys.executable, "-c", hold, str(entry), "1.5"], stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with cache_lock.building(entry):
        waited_s = time.monotonic() - t0
    first.wait(timeout=10)
    assert 0.8 < waited_s < 10, waited_s
    killed = subprocess.Popen([sys.executable, "-c", hold, str(entry), "60"], stdout=subprocess.PIPE, text=True)
    assert killed.stdout is not None and killed.stdout.readline().strip() == "held"
    killed.kill()
    killed.wait(timeout=10)
    t0 = time.monotonic()
    with cache_lock.building(entry):
        assert time.monotonic() - t0 < 2


def test_build_once_builds_a_missing_entry_and_leaves_a_finished_one(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    calls: list[str] = []

    def build() -> None:
        calls.append("built")
        entry.write_text("done\n")

    assert cache_lock.build_once(entry, entry.is_file, build) is True
    assert cache_lock.build_once(entry, entry.is_file, build) is False
    assert calls == ["built"] and entry.read_text() == "done\n"
