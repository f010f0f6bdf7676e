"""Host locks across real processes (toolkit.adapters.host_lock): a second run waits naming the holder or refuses
with --no-wait; a lock left by a kill -9 is taken over and said so; a sweep's own applies (in its thread) re-enter,
while another thread or process does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from toolkit.adapters.host_lock import host_locks, lock_path, read_holder
from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]
HOST = {"ct": "10.0.0.9:22"}

HOLDER = """
import sys, time
from pathlib import Path
from toolkit.adapters.host_lock import host_locks
directory, hold_s = Path(sys.argv[1]), float(sys.argv[2])
with host_locks({"ct": "10.0.0.9:22"}, purpose="test holder", directory=directory) as held:
    print("held", held.taken, flush=True)
    time.sleep(hold_s)
"""


def _holder(directory: Path, hold_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), str(hold_s)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("held ['ct']")
    return proc


def test_second_run_waits_naming_the_holder(tmp_path: Path, reliability) -> None:
    holder = _holder(tmp_path, 1.5)
    messages: list[str] = []
    started = time.monotonic()
    with host_locks(HOST, purpose="second", directory=tmp_path, on_message=messages.append) as held:
        waited = time.monotonic() - started
        assert held.taken == ["ct"] and held.took_over == []
        assert read_holder(lock_path(HOST["ct"], tmp_path)).pid == os.getpid()  # type: ignore[union-attr]
    assert holder.wait(timeout=10) == 0
    assert waited >= 1.0
    assert f"pid {holder.pid}" in messages[0] and "test holder" in messages[0] and "waiting" in messages[0]
    assert lock_path(HOST["ct"], tmp_path).read_text() == ""  # a clean release leaves no holder behind
    reliability(
        fault="two runs on one host at once (a second apply or sweep while one holds the host)",
        user_saw=messages[0] + f"; then '{messages[1]}'",
        recorded="the lock file names its holder (pid, command, start time); emptied on release",
        next_run="the waiting run went ahead as soon as the holder ended",
        area="apply",
    )


def test_no_wait_refuses_naming_the_holder(tmp_path: Path, reliability) -> None:
    holder = _holder(tmp_path, 30)
    try:
        with pytest.raises(ToolkitError) as err, host_locks(HOST, purpose="second", directory=tmp_path, wait=False):
            pass
    finally:
        holder.kill()
        holder.wait()
    text = str(err.value)
    assert err.value.exit_code == 2 and f"pid {holder.pid}" in text and "nothing was changed" in text
    reliability(
        fault="a second run with --no-wait while the host is held",
        user_saw=f"exit {err.value.exit_code}: {text.splitlines()[0]}",
        recorded="nothing: refused before any playbook ran",
        next_run="(not a fault of the host: the holder's run is untouched)",
        area="apply",
    )


def test_a_lock_left_by_kill_9_is_taken_over_and_said_so(tmp_path: Path, reliability) -> None:
    holder = _holder(tmp_path, 60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    messages: list[str] = []
    started = time.monotonic()
    with host_locks(HOST, purpose="after the kill", directory=tmp_path, wait=False,
                    on_message=messages.append) as held:
        assert time.monotonic() - started < 1.0
    assert len(held.took_over) == 1 and f"pid {holder.pid}" in held.took_over[0]
    assert "no longer running" in messages[0]
    reliability(
        fault="a stale lock: the holder was killed (kill -9) while holding the host",
        user_saw=messages[0],
        recorded="the kernel dropped the flock with the process; the dead holder's record was replaced",
        next_run="took the lock at once (even with --no-wait) and said whose it had been",
        area="apply",
    )


def test_a_sweeps_apply_reenters_in_its_thread_while_another_thread_and_process_are_refused(tmp_path: Path) -> None:
    path = lock_path(HOST["ct"], tmp_path)
    with host_locks(HOST, purpose="toolkit sweep", directory=tmp_path) as sweep:
        assert sweep.taken == ["ct"]
        # A point's apply, in the sweep's thread: goes ahead at once (even with --no-wait), takes nothing.
        with host_locks(HOST, purpose="toolkit apply", directory=tmp_path, wait=False) as point:
            assert point.reentered == ["ct"] and point.taken == []
        # Its end released nothing: the sweep still holds the host for its next point.
        assert read_holder(path).purpose == "toolkit sweep"  # type: ignore[union-attr]
        refused: list[str] = []

        def other_thread() -> None:
            try:
                with host_locks(HOST, purpose="thread", directory=tmp_path, wait=False):
                    refused.append("taken")
            except ToolkitError as err:
                refused.append(str(err))

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=10)
        assert refused and f"in use by pid {os.getpid()}" in refused[0]
        code = ("import sys; from pathlib import Path; from toolkit.adapters.host_lock import host_locks\n"
                "with host_locks({'ct': '10.0.0.9:22'}, purpose='stranger', directory=Path(sys.argv[1]), wait=False):"
                " pass")
        stranger = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                                  cwd=REPO, timeout=30)
        assert stranger.returncode != 0 and f"in use by pid {os.getpid()}" in stranger.stderr
    assert path.read_text() == ""  # the sweep's end released it
    with host_locks(HOST, purpose="after", directory=tmp_path, wait=False) as after:
        assert after.taken == ["ct"]


def test_sweep_with_no_wait_refuses_when_an_apply_holds_the_host(tmp_path: Path, capsys, monkeypatch) -> None:
    from toolkit.cli.main import main

    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  children:\n    gpu_containers:\n      hosts:\n"
                         "        ct: {ansible_host: 10.0.0.9}\n")
    monkeypatch.setenv("TOOLKIT_LOCK_DIR", str(tmp_path / "locks"))
    holder = _holder(tmp_path / "locks", 30)
    try:
        code = main(["sweep", "glm5-tp8", "--vary", "server.max_running_requests=64,128", "--concurrency", "8",
                     "-i", str(inventory), "--no-wait", "--sweeps-dir", str(tmp_path / "sweeps"), "--json"])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2 and f"host ct is in use by pid {holder.pid}" in err
    assert not list((tmp_path / "sweeps").glob("*/points/*/apply.log"))  # no variant was deployed
