"""The stand-in server over two nodes on localhost: SGLang's --nnodes/--node-rank/--dist-init-addr start, with
torch.distributed's TCPStore rendezvous and its messages (toolkit/lab/standin_server/rendezvous.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from toolkit.adapters.sglang_catalogue import catalogue_path
from toolkit.lab.standin_server import SERVER_PATH

FLAGS = str(catalogue_path("0.5.23"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int, rank: int, init_port: int, *extra: str, env: dict[str, str] | None = None
           ) -> subprocess.Popen[str]:
    argv = [sys.executable, str(SERVER_PATH), "--model-path", "lab/standin-model", "--host", "127.0.0.1",
            "--port", str(port), "--tp-size", "2", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", f"127.0.0.1:{init_port}", *extra]
    full_env = {**os.environ, "SGLANG_STANDIN_STARTUP_S": "0", "SGLANG_STANDIN_FLAGS": FLAGS, **(env or {})}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait_status(port: int, path: str, want: int, *procs: subprocess.Popen[str], timeout_s: float = 90) -> None:
    """Until `path` answers `want`. Generous: a CI run beside seven lab shards (load 10 on 2 cores) once saw 15 s
    pass before rank 0 served, where a quiet machine takes about 1 s; a server that exits instead fails at once,
    with its output."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if _get(port, path)[0] == want:
                return
        except OSError:
            pass
        for proc in procs:
            if proc.poll() is not None:
                out, err = proc.communicate(timeout=5)
                raise AssertionError(f"{proc.args!r} exited {proc.returncode} before {path} on "
                                     f"{port} answered {want}:\n{out[-2000:]}\n{err[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{path} on {port} never answered {want} in {timeout_s:g} s")


def _refused(port: int) -> bool:
    try:
        _get(port, "/health")
    except urllib.error.URLError as err:
        return isinstance(err.reason, ConnectionRefusedError)
    return False


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
    return proc.communicate(timeout=15)


@pytest.mark.slow
def test_rank_0_serves_only_once_rank_1_has_joined_and_rank_1_serves_only_health() -> None:
    init_port, port0, port1 = _free_port(), _free_port(), _free_port()
    rank0 = _start(port0, 0, init_port)
    rank1: subprocess.Popen[str] | None = None
    try:
        time.sleep(1.5)
        assert rank0.poll() is None
        # SGLang starts its HTTP server only after the schedulers joined the group: nothing listens yet.
        assert _refused(port0)
        rank1 = _start(port1, 1, init_port)
        _wait_status(port0, "/health", 200, rank0, rank1)
        info = _get(port0, "/server_info")[1].decode()
        assert '"nnodes": 2' in info and '"node_rank": 0' in info
        # Rank 1 runs SGLang's dummy health server: an empty 200 for health, FastAPI's 404 for the API.
        _wait_status(port1, "/health", 200, rank0, rank1)
        assert _get(port1, "/health_generate") == (200, b"")
        assert _get(port1, "/v1/models") == (404, b'{"detail":"Not Found"}')
        # LAB ONLY: rank 1's simulated GPUs are rank 0's as it last sent them (a pipeline stage works when the
        # first does), so a fleet probe samples both hosts' GPUs.
        _wait_status(port1, "/lab/gpus", 200, rank0, rank1)
        mine, first = (json.loads(_get(p, "/lab/gpus")[1]) for p in (port1, port0))
        assert [g["gpu"] for g in mine["gpus"]] == [g["gpu"] for g in first["gpus"]] == [0, 1]
        assert "node rank 1 mirrors node rank 0's GPUs" in mine["simulated"] and mine["topology"]["gpus"]
        # A node that goes breaks the group: rank 0's scheduler fails on the closed gloo pair, and SGLang's SIGQUIT
        # handler kills the server.
        rank1.send_signal(signal.SIGKILL)
        rank0.wait(timeout=15)
        out0, err0 = rank0.communicate(timeout=5)
        assert rank0.returncode == -signal.SIGKILL
        assert "Connection closed by peer [127.0.0.1]" in err0
        assert "Received sigquit from a child process. It usually means the child failed." in err0
        assert "node rank 1 joined (2/2 ranks)" in out0
    finally:
        for proc in (rank0, rank1):
            if proc is not None:
                _stop(proc)


@pytest.mark.slow
def test_a_rank_that_never_joins_fails_rank_0_with_tcpstores_message_after_the_timeout() -> None:
    init_port, port0 = _free_port(), _free_port()
    started = time.monotonic()
    rank0 = _start(port0, 0, init_port, env={"SGLANG_STANDIN_DIST_TIMEOUT_S": "2"})
    try:
        time.sleep(1)
        assert _refused(port0)  # never healthy: no HTTP server while the rendezvous waits
        rank0.wait(timeout=15)
        took_s = time.monotonic() - started
        _, err = rank0.communicate(timeout=5)
    finally:
        _stop(rank0)
    assert rank0.returncode == -signal.SIGKILL
    assert "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. 1/2 clients joined." \
        in err
    assert "Scheduler hit an exception" in err
    assert 2 <= took_s < 10


@pytest.mark.slow
def test_dist_timeout_wins_over_the_lab_knob_and_a_lone_rank_1_fails_as_torchs_client() -> None:
    init_port, port1 = _free_port(), _free_port()
    rank1 = _start(port1, 1, init_port, "--dist-timeout", "1", env={"SGLANG_STANDIN_DIST_TIMEOUT_S": "60"})
    try:
        rank1.wait(timeout=15)
        _, err = rank1.communicate(timeout=5)
    finally:
        _stop(rank1)
    assert rank1.returncode == -signal.SIGKILL
    assert (f"torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to "
            f"connect to (127.0.0.1, {init_port}).") in err


def test_what_the_stand_in_cannot_place_exits_2_and_says_why() -> None:
    init_port, port = _free_port(), _free_port()
    for extra, words in ((["--node-rank", "2"], "is not a rank of --nnodes 2"),):
        argv = [sys.executable, str(SERVER_PATH), "--model-path", "m", "--host", "127.0.0.1", "--port", str(port),
                "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{init_port}", *extra]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              env={**os.environ, "SGLANG_STANDIN_FLAGS": FLAGS})
        assert proc.returncode == 2 and words in proc.stderr
    proc = subprocess.run([sys.executable, str(SERVER_PATH), "--model-path", "m", "--port", str(port), "--nnodes", "2"],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "SGLANG_STANDIN_FLAGS": FLAGS})
    assert proc.returncode == 2 and "without --dist-init-addr" in proc.stderr


def test_a_follower_slow_to_read_ready_still_joins_and_keeps_rank_0s_next_line() -> None:
    """Under load rank 0 may have sent `ready` and its first lab-gpus line before rank 1 reads: rank 1 must take
    `ready` alone (once it read both as one answer, took that for a refusal, and the group fell apart) and hand
    the lab-gpus line on to follow()."""
    import threading

    from toolkit.lab.standin_server import rendezvous

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    joined: list[str] = []

    def rank_0() -> None:
        conn, _ = listener.accept()
        joined.append(rendezvous._readline(conn, time.monotonic() + 10))
        conn.sendall(b'ready\nlab-gpus {"gpus": [0, 1]}\n')  # both before the follower reads anything
        time.sleep(0.3)
        conn.close()

    thread = threading.Thread(target=rank_0)
    thread.start()
    plan = rendezvous.Plan(nnodes=2, node_rank=1, host="127.0.0.1", port=port, world=2, timeout_s=10)
    conn = rendezvous.join(plan, lambda _: None)
    got: list[dict[str, object]] = []
    rendezvous.follow(conn, got.append)  # returns when rank 0 closes
    thread.join()
    listener.close()
    assert joined == ["join 1 2 1"]
    assert got == [{"gpus": [0, 1]}]
