"""A write killed half-way leaves the original file intact: a real child process, a real SIGKILL.

The child runs the real `write_atomic`; a wrapper around os.write (or os.replace) in the child lets the
first half of the new text reach the temporary file, says so on stdout, and then blocks, so the parent
kills it at exactly that point, not at a moment picked by a timer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit.adapters.files import stale_temp_files, write_atomic

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from toolkit.adapters.files import write_atomic

    target, new_text_file, stop_at = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    new_text = new_text_file.read_text()
    real_write, real_replace = os.write, os.replace

    def half_write(fd, data):
        # Let half of the first chunk through, then stop: the temp file holds a torn copy.
        n = real_write(fd, bytes(data[: max(1, len(data) // 2)]))
        print("STOPPED", n, flush=True)
        time.sleep(120)
        return n

    def blocked_replace(src, dst):
        print("STOPPED", os.path.getsize(src), flush=True)
        time.sleep(120)
        return real_replace(src, dst)

    if stop_at == "write":
        os.write = half_write
    else:
        os.replace = blocked_replace
    write_atomic(target, new_text)
    print("FINISHED", flush=True)
    """
)


def _kill_child_at(stop_at: str, target: Path, new_text: str, tmp_path: Path) -> int:
    new_file = tmp_path / "new.txt"
    new_file.write_text(new_text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target), str(new_file), stop_at],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert line and line[0] == "STOPPED", f"child did not reach the stop point: {line}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        return int(line[1])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("stop_at", ["write", "replace"])
def test_sigkill_mid_write_leaves_the_original(tmp_path: Path, stop_at: str) -> None:
    target = tmp_path / "glm5-tp8.yaml"
    original = "# the author's comment\nname: glm5-tp8\nserver: {tp_size: 8}\n"
    target.write_text(original)
    os.chmod(target, 0o640)
    new_text = original + "# --- results ---\n" + "results: {}\n" * 5000

    written = _kill_child_at(stop_at, target, new_text, tmp_path)

    assert target.read_text() == original, "the killed write changed the original"
    assert target.stat().st_mode & 0o777 == 0o640
    leftovers = stale_temp_files(target)
    assert len(leftovers) == 1, "the torn copy should be in a temp file beside the target"
    torn = leftovers[0].read_bytes()
    assert len(torn) == written
    if stop_at == "write":
        assert 0 < len(torn) < len(new_text.encode()), "the child was killed half-way through the write"
    else:
        assert torn == new_text.encode(), "killed after the write, before the rename"

    # The next write succeeds, cleans the leftover and keeps the mode.
    write_atomic(target, new_text)
    assert target.read_text() == new_text
    assert stale_temp_files(target) == []
    assert target.stat().st_mode & 0o777 == 0o640


def test_atomic_write_keeps_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "p.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]
    fresh = tmp_path / "q.yaml"
    write_atomic(fresh, "x\n")
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh.stat().st_mode & 0o777) == 0o666 & ~umask


def test_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "p.yaml"
    target.write_text("old\n")
    with pytest.raises(TypeError):
        write_atomic(target, None)  # type: ignore[arg-type]
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


def test_an_explicit_mode_holds_for_an_existing_file_and_a_json_file_reads_like_a_csv(tmp_path: Path) -> None:
    """A secret is written 0600 even over a 0644 file; a JSON artifact gets the mode open() gives a CSV."""
    from toolkit.adapters.files import write_json

    secret = tmp_path / "key.env"
    secret.write_text("old\n")
    secret.chmod(0o644)
    write_atomic(secret, "KEY=x\n", mode=0o600)
    assert (secret.stat().st_mode & 0o777) == 0o600
    write_json(tmp_path / "run.json", {"b": 1, "a": 2})
    with open(tmp_path / "trace.csv", "w") as f:
        f.write("t_s\n")
    assert (tmp_path / "run.json").stat().st_mode & 0o777 == (tmp_path / "trace.csv").stat().st_mode & 0o777
    assert (tmp_path / "run.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_a_concurrent_writers_temp_file_is_no_leftover(tmp_path: Path) -> None:
    """Another live process's temp file is a write in flight: the next write of the same file leaves it, so that
    writer's rename still lands (CI: shards writing one lab lock file into a cold wheelhouse at once)."""
    target = tmp_path / "lab.lock"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as writer:
        try:
            in_flight = tmp_path / f".lab.lock.{writer.pid}.0a1b2c3d.tmp"
            in_flight.write_text("the other writer's bytes")
            write_atomic(target, "ours")
            assert in_flight.exists() and stale_temp_files(target) == []
            os.replace(in_flight, target)  # the other writer's rename, as write_atomic does it
            assert target.read_text() == "the other writer's bytes"
        finally:
            writer.kill()
    # Once its writer is gone, a temp file is a leftover, and the next write removes it.
    gone = tmp_path / f".lab.lock.{writer.pid}.0a1b2c3d.tmp"
    gone.write_text("torn")
    assert stale_temp_files(target) == [gone]
    write_atomic(target, "ours again")
    assert not gone.exists() and target.read_text() == "ours again"
