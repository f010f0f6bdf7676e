"""SGLang's router itself (the pinned smg, installed from PyPI into a cached venv) in front of two stand-in servers
on localhost: it registers both as SGLang backends, routes requests to both, and shows each backend's share on its
Prometheus exporter and its load on /get_loads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from toolkit.adapters.sglang_catalogue import catalogue_path
from toolkit.adapters.sglang_metrics import parse_exposition
from toolkit.adapters.sglang_router import load_pins, router_venv
from toolkit.core.router import backend_loads, router_argv, router_backends, router_pin
from toolkit.lab.standin_server import SERVER_PATH

REQUESTS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _until(what: str, check: Any, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as err:
            last = err
        time.sleep(0.2)
    raise AssertionError(f"{what}: still {last!r} after {timeout_s} s")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_the_pinned_router_spreads_requests_over_two_stand_ins(release: str,
                                                              procs: list[subprocess.Popen[str]]) -> None:
    pins = load_pins()
    venv = router_venv(router_pin(pins, release))
    env = {**os.environ, "SGLANG_STANDIN_STARTUP_S": "0", "SGLANG_STANDIN_FLAGS": str(catalogue_path(release))}
    backends = [_free_port(), _free_port()]
    for port in backends:
        procs.append(subprocess.Popen(
            [sys.executable, str(SERVER_PATH), "--model-path", "lab/standin-model", "--host", "127.0.0.1",
             "--port", str(port), "--enable-metrics"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    for port in backends:
        _until(f"stand-in {port} healthy", lambda p=port: _http(f"http://127.0.0.1:{p}/health")[0] == 200)

    port, prometheus_port = _free_port(), _free_port()
    argv = router_argv(release, [f"http://127.0.0.1:{p}" for p in backends], "round_robin", "127.0.0.1", port,
                       pins=pins, prometheus_port=prometheus_port)
    argv[0] = str(venv / "bin" / argv[0])
    procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    base = f"http://127.0.0.1:{port}"
    request = {"model": "lab/standin-model", "prompt": "hello from the router test", "max_tokens": 4}
    # The router answers once it has registered a backend (it reads /v1/models, /server_info and /model_info).
    _until("the router's first completion", lambda: _http(base + "/v1/completions", request)[0] == 200, 60)
    for _ in range(REQUESTS - 1):
        status, body = _http(base + "/v1/completions", request)
        assert status == 200, body
        assert json.loads(body)["choices"][0]["finish_reason"] == "length"

    # SGLang's native API goes through the router too.
    status, body = _http(base + "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 3}})
    assert status == 200, body
    native = json.loads(body)
    assert native["meta_info"]["finish_reason"] == {"type": "length", "length": 3} and native["text"]

    served = []
    for p in backends:
        samples = parse_exposition(_http(f"http://127.0.0.1:{p}/metrics")[1].decode())
        served.append(sum(v for name, _, v in samples if name == "sglang:num_requests_total"))
    assert sum(served) == REQUESTS + 1 and all(n >= 1 for n in served), served

    # The router's own view of each backend: its Prometheus exporter and /get_loads.
    # Each backend's share as the router counts it is what the backend itself counted.
    view = router_backends(parse_exposition(_http(f"http://127.0.0.1:{prometheus_port}/metrics")[1].decode()))
    urls = [f"http://127.0.0.1:{p}" for p in backends]
    assert [view[u].finished for u in urls] == served
    assert all(view[u].healthy and view[u].failed == 0 for u in urls)
    loads = backend_loads(json.loads(_http(base + "/get_loads")[1]))
    assert [b.url for b in loads] == sorted(f"http://127.0.0.1:{p}" for p in backends)
    assert all(b.routed_in_flight == 0 for b in loads)
