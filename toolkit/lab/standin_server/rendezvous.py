"""The stand-in's multi-node start: torch.distributed's TCPStore rendezvous at --dist-init-addr, as SGLang does it.

SGLang started with `--nnodes N --node-rank r --dist-init-addr HOST:PORT` initialises torch.distributed with
`init_method=tcp://HOST:PORT` (model_runner.init_torch_distributed). Node rank 0's ranks host the TCPStore: its
server listens on PORT (every address) and waits until all `world` ranks (tp_size * pp_size, spread evenly over
the nodes) have joined, or until the timeout: `--dist-timeout` seconds, or torch's default for NCCL, 600 s.
A rank that never joins fails rank 0 with TCPStore's own words,
    torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients joined.
(the count includes the server's own ranks; the seconds are whole and past the timeout), logged by the scheduler
as "Scheduler hit an exception: ..." and followed by SGLang's launch-phase SIGQUIT handler, which kills the whole
process tree. Until then rank 0 has no HTTP server at all: SGLang starts it only once its schedulers are ready.
A rank >= 1 connects as the store's client, retrying until the same timeout (torch's message:
`The client socket has timed out after 600000ms while trying to connect to (HOST, PORT).`); once all have joined it
serves no API: SGLang's `launch_dummy_health_check_server` answers /health, /health_generate and /ping with an
empty 200 (and /metrics with --enable-metrics) on --host:--port, everything else 404.

The wire between stand-ins is theirs, not TCPStore's: a client sends one line `join NODE_RANK NNODES RANKS`, the
server answers `ready` once every node is in, and both keep the connection open, so either side sees the other
go (a real NCCL group breaks the same way when a node dies).

LAB KNOB: SGLANG_STANDIN_DIST_TIMEOUT_S stands in for torch's 600 s default when --dist-timeout is not given, so a
test of a rank that never joins takes seconds. --dist-timeout, when given, wins, as it does in SGLang.

Standard library only (copied into the container with server.py).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# torch.distributed's default process-group timeout for NCCL (default_pg_nccl_timeout), which SGLang passes on
# when --dist-timeout is not given.
TORCH_NCCL_DEFAULT_TIMEOUT_S = 600
TIMEOUT_ENV = "SGLANG_STANDIN_DIST_TIMEOUT_S"
_RETRY_S = 0.2


class RendezvousError(Exception):
    """torch.distributed's error, as the scheduler's traceback ends with it (`kind: message`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Plan:
    nnodes: int
    node_rank: int
    host: str
    port: int
    world: int  # torch ranks over all nodes (tp_size * pp_size)
    timeout_s: float

    @property
    def ranks_per_node(self) -> int:
        return self.world // self.nnodes


def split_addr(addr: str) -> tuple[str, int]:
    """HOST:PORT or [V6]:PORT, as SGLang splits --dist-init-addr (PortArgs.init_new): anything else fails as its
    assertion does."""
    if addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
    else:
        parts = addr.split(":")
        if len(parts) != 2:
            raise AssertionError("please provide --dist-init-addr as host:port of head node")
        host, port = parts
    return host, int(port)


def timeout_s(dist_timeout: int | None, env: dict[str, str]) -> float:
    if dist_timeout is not None:
        return float(dist_timeout)
    knob = env.get(TIMEOUT_ENV, "")
    return float(knob) if knob else float(TORCH_NCCL_DEFAULT_TIMEOUT_S)


@dataclass
class Store:
    """Rank 0's side: the listening store and the nodes that joined it (their connections kept open)."""

    plan: Plan
    listener: socket.socket
    peers: dict[int, socket.socket] = field(default_factory=dict)
    # Each peer's address as accept() gave it: getpeername() on a connection the peer already reset fails.
    peer_addrs: dict[int, tuple[str, int]] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)

    def watch(self, on_lost: Callable[[int], None]) -> None:
        """Call on_lost(node_rank) when a joined node's connection closes (its process is gone)."""
        for rank, conn in self.peers.items():
            threading.Thread(target=self._watch_one, args=(rank, conn, on_lost), daemon=True,
                             name=f"store-peer-{rank}").start()

    def _watch_one(self, rank: int, conn: socket.socket, on_lost: Callable[[int], None]) -> None:
        wait_closed(conn)
        self.lost.append(rank)
        on_lost(rank)


def wait_closed(conn: socket.socket) -> None:
    """Block until the other side of a rendezvous connection is gone (it sends nothing after `ready`)."""
    conn.settimeout(None)
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass


LAB_GPUS = "lab-gpus"  # rank 0's simulated GPUs, one JSON line each time: the lab's own word, not torch's


def send_lab_gpus(store: Store, body: dict[str, Any]) -> None:
    """Rank 0's simulated GPUs to every node that joined (LAB ONLY: a pipeline stage's GPUs work when the first
    stage's do, so a follower's /lab/gpus mirrors them). A node gone is the watcher's business, not this."""
    line = f"{LAB_GPUS} {json.dumps(body, separators=(',', ':'))}\n".encode()
    for conn in list(store.peers.values()):
        with contextlib.suppress(OSError):
            conn.sendall(line)


def follow(conn: socket.socket, on_lab_gpus: Callable[[dict[str, Any]], None]) -> None:
    """A follower's side of the open connection until rank 0 is gone (wait_closed's end), handing on each
    lab-gpus line rank 0 sends."""
    conn.settimeout(None)
    buf = b""
    try:
        while chunk := conn.recv(65536):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == LAB_GPUS:
                    with contextlib.suppress(ValueError):
                        on_lab_gpus(json.loads(rest))
    except OSError:
        pass


def _readline(conn: socket.socket, deadline: float) -> str:
    """One handshake line, read a byte at a time: what follows it on the connection (rank 0's lab-gpus lines,
    which may already be there when a loaded follower reads its `ready`) stays there for follow(). Read in
    blocks, `ready` and the next line came as one answer, and the follower took it for a refusal."""
    data = b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        byte = conn.recv(1)
        if not byte:
            break
        data += byte
    return data.decode(errors="replace").strip()


def serve(plan: Plan, log: Callable[[str], None]) -> Store:
    """Rank 0: listen at the init address's port and wait for every other node; the store, or RendezvousError
    with TCPStore's timeout message."""
    listener = socket.create_server(("", plan.port), reuse_port=False)
    listener.settimeout(_RETRY_S)
    store = Store(plan, listener)
    start = time.monotonic()
    log(f"TCPStore server listening on port {plan.port} for {plan.world} ranks over {plan.nnodes} nodes "
        f"(timeout {plan.timeout_s:g} s)")
    while len(store.peers) < plan.nnodes - 1:
        # TCPStore compares whole elapsed seconds with its timeout, hence 601 for 600.
        elapsed = int(time.monotonic() - start)
        if elapsed > plan.timeout_s:
            joined = plan.ranks_per_node * (1 + len(store.peers))
            listener.close()
            for conn in store.peers.values():
                conn.close()
            raise RendezvousError("torch.distributed.DistStoreError",
                                  f"Timed out after {elapsed} seconds waiting for clients. "
                                  f"{joined}/{plan.world} clients joined.")
        try:
            conn, addr = listener.accept()
        except TimeoutError:
            continue
        try:
            words = _readline(conn, time.monotonic() + 5).split()
        except OSError:
            conn.close()
            continue
        if len(words) != 4 or words[0] != "join" or not all(w.isdigit() for w in words[1:]):
            conn.close()
            continue
        rank, nnodes = int(words[1]), int(words[2])
        if nnodes != plan.nnodes or not 1 <= rank < plan.nnodes or rank in store.peers:
            log(f"refused a join from node rank {rank} of {nnodes} nodes (this store: {plan.nnodes} nodes, "
                f"joined: {sorted(store.peers)})")
            conn.close()
            continue
        store.peers[rank], store.peer_addrs[rank] = conn, (str(addr[0]), int(addr[1]))
        log(f"node rank {rank} joined ({plan.ranks_per_node * (1 + len(store.peers))}/{plan.world} ranks)")
    for conn in store.peers.values():
        conn.sendall(b"ready\n")
    return store


def join(plan: Plan, log: Callable[[str], None]) -> socket.socket:
    """Rank >= 1: connect to the store (retrying, as torch's client does) and wait until every node is in; the
    open connection, or RendezvousError with torch's client timeout message."""
    start = time.monotonic()
    deadline = start + plan.timeout_s
    ms = int(plan.timeout_s * 1000)
    while True:
        try:
            conn = socket.create_connection((plan.host, plan.port), timeout=max(0.05, deadline - time.monotonic()))
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    "torch.distributed.DistNetworkError",
                    f"The client socket has timed out after {ms}ms while trying to connect to "
                    f"({plan.host}, {plan.port}).") from None
            time.sleep(_RETRY_S)
    conn.sendall(f"join {plan.node_rank} {plan.nnodes} {plan.ranks_per_node}\n".encode())
    log(f"joined the TCPStore at {plan.host}:{plan.port} as node rank {plan.node_rank}; waiting for every node")
    try:
        answer = _readline(conn, deadline)
    except OSError:
        answer = ""
    if answer != "ready":
        conn.close()
        raise RendezvousError("torch.distributed.DistNetworkError",
                              "Failed to recv, got 0 bytes. Connection was likely closed. "
                              "Did the remote server shutdown or crash?")
    return conn
