"""The lab's stand-in SGLang server, run for real as a process and spoken to over HTTP."""

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
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.sglang_catalogue import catalogue_path
from toolkit.lab.standin_server import SERVER_PATH


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json",
                                                                       **(headers or {})}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_healthy(self, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("stand-in never became healthy")

    def stop(self) -> str:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out


# The release the stand-in parses as when no SGLang is installed beside it (here): the seed's pin.
FLAGS_0_5_9 = str(catalogue_path("0.5.9"))


def _start(*flags: str, env: dict[str, str] | None = None) -> Server:
    port = _free_port()
    full_env = {**os.environ, "SGLANG_STANDIN_STARTUP_S": "0.5", "SGLANG_STANDIN_FLAGS": FLAGS_0_5_9, **(env or {})}
    model = [] if "--model-path" in flags else ["--model-path", "lab/standin-model"]
    proc = subprocess.Popen(
        [sys.executable, str(SERVER_PATH), "--host", "127.0.0.1", "--port", str(port), *model, *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
    )
    server = Server(proc, port)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return server


@pytest.fixture
def server() -> Iterator[Server]:
    s = _start("--served-model-name", "glm-5", "--model-path", "lukealonso/GLM-5-NVFP4", "--tp-size", "8",
               "--nsa-decode-backend", "trtllm", "--disable-cuda-graph", "--max-running-requests", "1024")
    yield s
    s.stop()


def test_version_says_stand_in() -> None:
    out = subprocess.run([sys.executable, str(SERVER_PATH), "--version"], capture_output=True, text=True, check=True)
    assert "lab stand-in" in out.stdout


def test_health_is_503_while_starting_then_200(server: Server) -> None:
    code, headers, body = server.get("/health")
    assert code == 503 and json.loads(body)["reason"] == "starting"
    server.wait_healthy()
    code, headers, body = server.get("/health")
    assert code == 200
    assert headers["X-Lab-Standin"] == "lab stand-in"


def test_server_info_carries_the_rendered_flags(server: Server) -> None:
    for path in ("/get_server_info", "/server_info"):
        code, _headers, body = server.get(path)
        info = json.loads(body)
        assert code == 200 and info["lab_standin"] is True
        assert info["tp_size"] == 8 and info["served_model_name"] == "glm-5"
        assert info["nsa_decode_backend"] == "trtllm" and info["disable_cuda_graph"] is True
        assert info["max_running_requests"] == 1024


def test_streaming_completion_in_openai_format(server: Server) -> None:
    server.wait_healthy()
    code, raw = server.post("/v1/completions", {"model": "glm-5", "prompt": "a b c", "max_tokens": 5, "stream": True})
    assert code == 200
    events = [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks]
    assert sum(1 for t in texts if t) == 5  # one chunk per token, then the usage chunk
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(c["lab_standin"] for c in chunks)


def test_native_generate_streams_cumulative_text_and_sglangs_meta_info(server: Server) -> None:
    server.wait_healthy()
    code, raw = server.post("/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": 4}, "stream": True})
    assert code == 200
    events = [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    outs = [json.loads(e) for e in events[:-1]]
    assert [len(o["text"].split()) for o in outs] == sorted(len(o["text"].split()) for o in outs)  # cumulative
    last = outs[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 4} and last["completion_tokens"] == 4
    assert last["prompt_tokens"] == 3 and all(o["meta_info"]["finish_reason"] is None for o in outs[:-1])
    assert server.post("/generate", {"text": ["x", "y"]})[0] == 400


def test_chat_completion_streaming_and_plain(server: Server) -> None:
    server.wait_healthy()
    code, raw = server.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True})
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in raw.decode().splitlines()
              if line.startswith("data: {")]
    assert code == 200 and deltas[0]["role"] == "assistant" and "".join(d.get("content", "") for d in deltas)
    code, raw = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    body = json.loads(raw)
    assert body["choices"][0]["message"]["content"].split() == ["lab", "stand-in", "tokens"]
    assert body["usage"]["completion_tokens"] == 3


def test_models_lists_the_served_name(server: Server) -> None:
    code, _, body = server.get("/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == "glm-5"


def test_api_key_is_required_when_set_but_not_for_health() -> None:
    s = _start("--api-key", "k-123")
    try:
        s.wait_healthy()
        assert s.get("/v1/models")[0] == 401
        assert s.get("/v1/models", {"Authorization": "Bearer k-123"})[0] == 200
        assert s.post("/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 401
        info = json.loads(s.get("/get_server_info", {"Authorization": "Bearer k-123"})[2])
        assert info["api_key_set"] is True and "k-123" not in json.dumps(info)
    finally:
        out = s.stop()
    assert "k-123" not in out


def test_told_to_fail_health_stays_503_and_says_why() -> None:
    s = _start(env={"SGLANG_STANDIN_FAIL_HEALTH": "1"})
    try:
        time.sleep(0.8)
        code, _, body = s.get("/health")
        assert code == 503 and "SGLANG_STANDIN_FAIL_HEALTH" in json.loads(body)["reason"]
    finally:
        out = s.stop()
    assert "told to fail its health check" in out


def test_told_to_exit_at_start_exits_with_status_1_and_says_why() -> None:
    proc = subprocess.run([sys.executable, str(SERVER_PATH), "--host", "127.0.0.1", "--port", str(_free_port()),
                           "--model-path", "lab/standin-model"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SGLANG_STANDIN_FLAGS": FLAGS_0_5_9, "SGLANG_STANDIN_EXIT_AT_START": "1"})
    assert proc.returncode == 1
    assert "told to exit at start (SGLANG_STANDIN_EXIT_AT_START=1)" in proc.stderr


def test_told_to_log_nan_prints_sglangs_line_once() -> None:
    s = _start(env={"SGLANG_STANDIN_NAN_LOG": "1"})
    try:
        s.wait_healthy()
        for _ in range(2):
            assert s.post("/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
    finally:
        out = s.stop()
    assert out.count("NaN in the logits") == 1
    assert "lab stand-in" in out.splitlines()[0]


def test_server_file_needs_only_the_standard_library() -> None:
    # They are copied into the container and run by a python with no toolkit installed (server.py imports the
    # toolkit's package only when it is imported as one, in the checkout).
    import ast

    for path in (Path(SERVER_PATH), *(Path(SERVER_PATH).with_name(n) for n in ("engine_model.py", "rendezvous.py"))):
        tree = ast.parse(path.read_text())
        mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        ours = {"__future__", "engine_model", "rendezvous", "toolkit"}
        assert mods <= set(sys.stdlib_module_names) | ours, (path, mods)


def test_listen_backlog_takes_a_whole_benchmark_at_once() -> None:
    """bench_serving with --request-rate inf connects every request at once; a backlog of 5 made the late
    ones wait out SYN retransmits (1, 3, 7, ... 63 s) and a 14 s lab benchmark took two minutes."""
    s = _start()
    try:
        port = s.base.rsplit(":", 1)[1]
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True)
        send_q = int(out.stdout.split()[2])  # for a listening socket, Send-Q is its backlog
        assert send_q >= 1024, out.stdout
    finally:
        s.stop()


def _stream_tokens(base: str, max_tokens: int) -> float:
    t0 = time.monotonic()
    body = json.dumps({"prompt": "x", "max_tokens": max_tokens, "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert b"[DONE]" in r.read()
    return time.monotonic() - t0


def _all_at_once_s(base: str, requests: int, max_tokens: int) -> float:
    """Wall seconds for `requests` streamed completions sent together (bench_serving's --request-rate inf)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=requests) as pool:
        list(pool.map(lambda _: _stream_tokens(base, max_tokens), range(requests)))
    return time.monotonic() - t0


def _loads(s: Server) -> dict[str, Any]:
    return dict(json.loads(s.get("/v1/loads")[2])["loads"][0])


def test_max_running_requests_queues_the_rest_and_v1_loads_shows_it() -> None:
    s = _start("--max-running-requests", "2", "--tp-size", "8")
    try:
        s.wait_healthy()
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=7) as pool:
            done = pool.map(lambda _: _stream_tokens(s.base, 40), range(6))
            time.sleep(0.4)
            mid = _loads(s)
            list(done)
        after = _loads(s)
    finally:
        s.stop()
    assert mid["num_running_reqs"] == 2 and mid["num_waiting_reqs"] == 4 and mid["max_running_requests"] == 2
    assert after["num_running_reqs"] == after["num_waiting_reqs"] == 0


def test_metrics_only_with_enable_metrics_and_without_the_api_key() -> None:
    s = _start("--api-key", "k-1")
    try:
        s.wait_healthy()
        assert s.get("/metrics")[0] == 404  # SGLang mounts /metrics only with --enable-metrics
        assert s.get("/v1/loads")[0] == 401  # /v1/loads is behind the key, as in SGLang
    finally:
        s.stop()
    s = _start("--api-key", "k-1", "--enable-metrics")
    try:
        s.wait_healthy()
        assert s.post("/v1/completions", {"prompt": "a b c", "max_tokens": 3},
                      {"Authorization": "Bearer k-1"})[0] == 200
        code, headers, body = s.get("/metrics")  # no key: SGLang lets /metrics through (srt/utils/auth.py)
    finally:
        s.stop()
    assert code == 200 and headers["Content-Type"].startswith("text/plain")
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert fams["sglang:realtime_tokens"].type == "counter"
    assert {s.labels["mode"] for s in fams["sglang:realtime_tokens"].samples} == {
        "prefill_compute", "prefill_cache", "decode"}
    assert fams["sglang:time_to_first_token_seconds"].type == "histogram"
    gen = next(s for s in fams["sglang:generation_tokens"].samples)
    assert gen.name == "sglang:generation_tokens_total" and gen.value == 3.0


def test_weights_that_leave_no_kv_pool_fail_at_start_with_sglangs_message() -> None:
    proc = subprocess.run([sys.executable, str(SERVER_PATH), "--port", str(_free_port()), "--model-path",
                           "lukealonso/GLM-5-NVFP4", "--tp-size", "1"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SGLANG_STANDIN_FLAGS": FLAGS_0_5_9})
    assert proc.returncode == 1
    assert "Not enough memory. Please try to increase --mem-fraction-static." in proc.stderr


def test_lab_gpus_follow_the_engine_and_say_simulated() -> None:
    s = _start("--tp-size", "8", "--model-path", "lukealonso/GLM-5-NVFP4",
               env={"SGLANG_STANDIN_GPU_POWER_LIMIT_W": "600", "SGLANG_STANDIN_GPU_IDLE_W": "87"})
    try:
        s.wait_healthy()
        idle = json.loads(s.get("/lab/gpus")[2])
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=32) as pool:
            done = pool.map(lambda _: _stream_tokens(s.base, 60), range(32))
            time.sleep(1.5)
            busy = json.loads(s.get("/lab/gpus")[2])
            list(done)
    finally:
        s.stop()
    assert "simulated" in idle["simulated"] and len(idle["gpus"]) == 8
    assert idle["gpus"][0]["util_gpu_pct"] == 0 and idle["gpus"][0]["power_instant_w"] < 90
    g = busy["gpus"][0]
    # Decoding over PCIe without P2P: busy the whole time, power well under the limit (communication-bound)
    assert g["util_gpu_pct"] == 100 and 90 < g["power_w"] < 300 and g["gpm_sm_util_pct"] < 40
    assert all(not link["p2p_read_ok"] for link in busy["topology"]["links"])


def _refusal(argv: list[str], version: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLANG_STANDIN_FLAGS": str(catalogue_path(version)), "SGLANG_STANDIN_STARTUP_S": "0"}
    return subprocess.run([sys.executable, str(SERVER_PATH), *argv], capture_output=True, text=True, env=env,
                          timeout=30)


@pytest.mark.parametrize(
    ("version", "argv", "message"),
    [
        # argparse's own words, with SGLang's program name: launch_server.py (0.5.9) or sglang serve (0.5.10+).
        ("0.5.9", ["--model-path", "m", "--tp-sise", "8"],
         "launch_server.py: error: unrecognized arguments: --tp-sise 8"),
        ("0.5.23", ["--model-path", "m", "--nsa-decode-backend", "trtllm"],
         "sglang serve: error: unrecognized arguments: --nsa-decode-backend trtllm"),
        ("0.5.9", ["--model-path", "m", "--nsa-decode-backend", "flashinfer"],
         "launch_server.py: error: argument --nsa-decode-backend: invalid choice: 'flashinfer' (choose from "
         "'flashmla_sparse', 'flashmla_kv', 'flashmla_auto', 'fa3', 'tilelang', 'aiter', 'trtllm')"),
        ("0.5.9", ["--model-path", "m", "--tp-size"],
         "launch_server.py: error: argument --tensor-parallel-size/--tp-size: expected one argument"),
        ("0.5.23", ["--model-path", "m", "--tp-size", "eight"],
         "sglang serve: error: argument --tp-size/--tensor-parallel-size: invalid int value: 'eight'"),
        ("0.5.23", ["--tp-size", "8"],
         "sglang serve: error: the following arguments are required: --model-path/--model"),
    ],
)
def test_it_refuses_what_the_release_refuses_with_argparse_words(version: str, argv: list[str], message: str) -> None:
    proc = _refusal(argv, version)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == message
    assert proc.stderr.startswith(f"usage: {'launch_server.py' if version == '0.5.9' else 'sglang serve'} [-h]")


def test_a_deprecated_spelling_still_starts_and_says_so() -> None:
    s = _start("--nsa-decode-backend", "trtllm", env={"SGLANG_STANDIN_FLAGS": str(catalogue_path("0.5.15"))})
    try:
        s.wait_healthy()
        info = json.loads(s.get("/get_server_info")[2])
    finally:
        out = s.stop()
    assert info["nsa_decode_backend"] == "trtllm"
    assert "The command line argument '--nsa-decode-backend' is deprecated" in out


def test_without_a_catalogue_it_does_not_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_STANDIN_FLAGS"}
    proc = subprocess.run([sys.executable, str(SERVER_PATH), "--model-path", "m"], capture_output=True, text=True,
                          env=env, timeout=30)
    assert proc.returncode == 2 and "cannot check the flags as SGLang would" in proc.stderr


def test_the_unmigrated_render_is_refused_and_the_migrated_one_parses() -> None:
    """glm5-tp8's 0.5.9 render under SGLang 0.5.23's parser fails as the real server would; glm5-tp8-0.5.23
    (the same knobs, migrated) starts and serves."""
    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.core.profile.render import render_launch_argv
    from toolkit.lab.deploy_overlay import standin_argv

    profiles = ProfileStore(Path(__file__).resolve().parents[2] / "profiles")
    old = standin_argv(render_launch_argv(profiles.resolve("glm5-tp8")))[3:]
    proc = _refusal(old, "0.5.23")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "sglang serve: error: unrecognized arguments: --nsa-decode-backend trtllm"
    new = standin_argv(render_launch_argv(profiles.resolve("glm5-tp8-0.5.23")))[3:]
    assert "--dsa-decode-backend" in new and "--disable-cuda-graph" not in new
    port = _free_port()
    new[new.index("--port") + 1] = str(port)
    env = {**os.environ, "SGLANG_STANDIN_FLAGS": str(catalogue_path("0.5.23")), "SGLANG_STANDIN_STARTUP_S": "0"}
    server = Server(subprocess.Popen([sys.executable, str(SERVER_PATH), *new], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env), port)
    try:
        server.wait_healthy()
        info = json.loads(server.get("/get_server_info")[2])
    finally:
        server.stop()
    assert info["dsa_decode_backend"] == "trtllm" and info["cuda_graph_backend_decode"] == "disabled"


def test_refuses_to_start_when_the_deploys_engine_check_fails_in_its_venv(tmp_path: Path) -> None:
    """The same check file and inputs the role wrote beside the venv: a package removed from the venv kills the
    stand-in at start, naming it, as the missing import kills SGLang's server."""
    import shutil

    from tests.apply.test_engine_check import SCRIPT, make_venv, make_wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "torch", "2.9.1")
    venv = make_venv(tmp_path, wheels, "torch==2.9.1")
    shutil.copy(SCRIPT, venv / "toolkit-engine-check.py")
    inputs = {"schema": 1, "lock": "sglang-0.5.9-cp311.lock", "lock_digest": "d" * 64,
              "distributions": {"torch": "2.9.1"}, "imports": [{"module": "torch", "distribution": "torch"}]}
    (venv / "toolkit-engine-check.json").write_text(json.dumps(inputs))
    ok = subprocess.run([str(venv / "bin/python"), str(SERVER_PATH), "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and "lab stand-in" in ok.stdout, ok.stderr

    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "uninstall", "-q", "-y",
                    "torch"], check=True)
    port = _free_port()
    refused = subprocess.run([str(venv / "bin/python"), str(SERVER_PATH), "--model-path", "m", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert "the engine check failed" in refused.stderr and "missing torch==2.9.1" in refused.stderr
    assert ("import torch failed (ModuleNotFoundError: No module named 'torch'); the lock line that should bring "
            "it: torch==2.9.1 in sglang-0.5.9-cp311.lock") in refused.stderr


def test_a_release_made_slower_on_purpose_takes_longer_in_proportion() -> None:
    """SGLANG_STANDIN_SPEED (the lab's toolkit_lab_release_speed for the applied release) scales every forward."""
    times = {}
    for speed in ("1", "0.5"):
        s = _start("--tp-size", "8", env={"SGLANG_STANDIN_SPEED": speed})
        try:
            s.wait_healthy()
            _stream_tokens(s.base, 5)  # the first request pays the engine's warm-up
            times[speed] = min(_stream_tokens(s.base, 60) for _ in range(2))
        finally:
            s.stop()
    assert 1.6 < times["0.5"] / times["1"] < 2.4, times
    bad = _start(env={"SGLANG_STANDIN_SPEED": "0"})
    assert bad.proc.wait(timeout=10) != 0 and "not a positive factor" in bad.stop()
