#!/usr/bin/env python3
"""Lab stand-in for SGLang's HTTP server (`python -m sglang.launch_server`).

The lab has no GPU and no torch, so SGLang's real server cannot start there. This file takes its
place in the lab only, and says so everywhere: on stdout at start and per request (the journal the
deploy reads), in an `X-Lab-Standin` header on every response, and in every JSON body.

It parses the same flags the rendered SGLang argv carries (--host, --port, --api-key,
--served-model-name, --model-path, ...; unknown flags are accepted and reported in server_info),
and answers what SGLang's clients and the toolkit use:
  GET  /health, /health_generate          200, or 503 while "starting" or when told to fail
  GET  /get_server_info, /server_info     the parsed server args, `version`, `lab_standin`
  GET  /v1/models                         the served model
  POST /v1/completions, /v1/chat/completions   OpenAI format, `stream: true` as server-sent events
  POST /flush_cache                       200 (bench_serving calls it before a run)

Behaviour switches, read from the environment (set by the role's lab drop-in, visible in the unit):
  SGLANG_STANDIN_FAIL_HEALTH=1   /health answers 503 forever (the deploy must fail, naming the service)
  SGLANG_STANDIN_NAN_LOG=1       after the first generation, log the line SGLang's sampler raises on
                                 NaN logits (the deploy must fail with that line)
  SGLANG_STANDIN_STARTUP_S       seconds /health answers 503 after start, as SGLang does while loading (default 1)
  SGLANG_STANDIN_TOKEN_DELAY_S   seconds between streamed tokens of a lone request (default 0.004)
  SGLANG_STANDIN_OUTPUT_TOK_PER_S  the whole server's decode rate, shared by the running requests (default
                                 1500): with N running, each waits max(TOKEN_DELAY_S, N / rate) per token, so a
                                 lab benchmark lasts about total output tokens / rate (160 prompts of up to 128: ~10 s)
                                 whatever its concurrency, long enough for the probe's 5 s steady window
  SGLANG_STANDIN_TTFT_S          seconds before the first token (default 0.02)

Standard library only: it runs with the container's python3 or the SGLang venv's python, with no
toolkit installed there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STANDIN = "lab stand-in"
STANDIN_VERSION = "1"
# The message SGLang's sampler raises when the logits hold NaN (sglang/srt/layers/sampler.py);
# the deploy's log check must catch exactly this kind of line.
NAN_LINE = "ValueError: Detected errors during sampling! NaN in the logits."
WORDS = ("lab", "stand-in", "tokens", "are", "not", "a", "model", "output", "but", "they", "stream", "like", "one")


def _sglang_version() -> str:
    # Report the SGLang that is really installed next to us (the venv's python runs this file),
    # so /get_server_info says which release the unit was rendered for.
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return "not installed"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-standin-server",
        description=f"{STANDIN} for SGLang's launch_server (no GPU, no model: fixed text)",
    )
    parser.add_argument("--version", action="version", version=f"sglang-standin-server {STANDIN_VERSION} ({STANDIN})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--model-path", "--model", dest="model_path", default="standin-model")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    parser.add_argument("--max-running-requests", type=int, default=None)
    return parser


def _parse_rest(rest: list[str]) -> dict[str, Any]:
    """Flags we do not interpret, kept as SGLang's dest names so server_info shows them."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok.startswith("--"):
            key = tok[2:]
            if "=" in key:
                key, val = key.split("=", 1)
                out[key.replace("-", "_")] = val
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                out[key.replace("-", "_")] = rest[i + 1]
                i += 1
            else:
                out[key.replace("-", "_")] = True
        i += 1
    return out


class State:
    def __init__(self, args: argparse.Namespace, rest: list[str]) -> None:
        self.args = args
        self.extra = _parse_rest(rest)
        self.started_at = time.monotonic()
        self.fail_health = os.environ.get("SGLANG_STANDIN_FAIL_HEALTH", "") not in ("", "0")
        self.nan_log = os.environ.get("SGLANG_STANDIN_NAN_LOG", "") not in ("", "0")
        self.startup_s = float(os.environ.get("SGLANG_STANDIN_STARTUP_S", "1"))
        self.token_delay_s = float(os.environ.get("SGLANG_STANDIN_TOKEN_DELAY_S", "0.004"))
        self.ttft_s = float(os.environ.get("SGLANG_STANDIN_TTFT_S", "0.02"))
        self.output_tok_per_s = float(os.environ.get("SGLANG_STANDIN_OUTPUT_TOK_PER_S", "1500"))
        # Like SGLang's scheduler, at most --max-running-requests decode at once; the rest wait their turn.
        mrr = args.max_running_requests
        self.slots = threading.BoundedSemaphore(mrr) if mrr and mrr > 0 else None
        self.running = 0
        self.served_model = args.served_model_name or args.model_path
        self.lock = threading.Lock()
        self.requests_served = 0
        self.nan_logged = False

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "lab_standin": True,
            "standin": f"{STANDIN}: not SGLang; no GPU, no model",
            "version": _sglang_version(),
            "host": self.args.host,
            "port": self.args.port,
            "model_path": self.args.model_path,
            "served_model_name": self.served_model,
            "tp_size": self.args.tp_size,
            "max_running_requests": self.args.max_running_requests,
            "api_key_set": self.args.api_key is not None,
            "internal_states": [],
        }
        info.update(self.extra)
        return info


def log(msg: str) -> None:
    print(f"[{STANDIN}] {msg}", flush=True)


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sglang-lab-standin/" + STANDIN_VERSION
        protocol_version = "HTTP/1.0"  # close-delimited bodies: simplest correct streaming

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per generation below is enough; access logs would drown the journal

        def _send_json(self, code: int, body: dict[str, Any]) -> None:
            body = {**body, "lab_standin": True}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Lab-Standin", STANDIN)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if state.args.api_key is None:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {state.args.api_key}":
                return True
            self._send_json(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                starting = time.monotonic() - state.started_at < state.startup_s
                if state.fail_health or starting:
                    why = "told to fail (SGLANG_STANDIN_FAIL_HEALTH)" if state.fail_health else "starting"
                    self._send_json(503, {"status": "unhealthy", "reason": why})
                else:
                    self._send_json(200, {"status": "ok"})
                return
            if not self._authorized():
                return
            if path in ("/get_server_info", "/server_info"):
                self._send_json(200, state.server_info())
            elif path == "/v1/models":
                self._send_json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": state.served_model,
                                "object": "model",
                                "owned_by": STANDIN,
                                "root": state.args.model_path,
                                "created": int(time.time()),
                            }
                        ],
                    },
                )
            elif path == "/get_model_info":
                self._send_json(200, {"model_path": state.args.model_path, "is_generation": True})
            else:
                self._send_json(404, {"error": f"not found: {path}"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                return
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError as err:
                self._send_json(400, {"error": f"invalid JSON body: {err}"})
                return
            if path == "/flush_cache":
                self._send_json(200, {"flushed": True})
            elif path in ("/v1/completions", "/v1/chat/completions"):
                self._generate(body, chat=path.endswith("chat/completions"))
            else:
                self._send_json(404, {"error": f"not found: {path}"})

        def _token_delay_s(self) -> float:
            with state.lock:
                running = state.running
            rate = state.output_tok_per_s
            return max(state.token_delay_s, running / rate if rate > 0 else 0.0)

        @contextlib.contextmanager
        def _decoding(self) -> Iterator[None]:
            """One running request: a --max-running-requests slot held, counted in the shared decode rate."""
            if state.slots is not None:
                state.slots.acquire()
            with state.lock:
                state.running += 1
            try:
                yield
            finally:
                with state.lock:
                    state.running -= 1
                if state.slots is not None:
                    state.slots.release()

        def _generate(self, body: dict[str, Any], *, chat: bool) -> None:
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            if chat:
                messages = body.get("messages") or []
                prompt_text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            else:
                prompt = body.get("prompt", "")
                prompt_text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            prompt_tokens = max(1, len(prompt_text.split()))
            tokens = [WORDS[i % len(WORDS)] + " " for i in range(max_tokens)]
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
            created = int(time.time())
            model = body.get("model") or state.served_model
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens + max_tokens,
            }
            obj = "chat.completion" if chat else "text_completion"
            with self._decoding():
                time.sleep(state.ttft_s)
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("X-Lab-Standin", STANDIN)
                    self.end_headers()
                    for i, tok in enumerate(tokens):
                        if i:
                            time.sleep(self._token_delay_s())
                        choice: dict[str, Any] = {"index": 0, "finish_reason": None, "logprobs": None}
                        if chat:
                            choice["delta"] = {"role": "assistant", "content": tok} if i == 0 else {"content": tok}
                        else:
                            choice["text"] = tok
                        chunk = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                                 "model": model, "choices": [choice], "system_fingerprint": STANDIN,
                                 "lab_standin": True, "usage": None}
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        self.wfile.flush()
                    last: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
                    if chat:
                        last["delta"] = {}
                    else:
                        last["text"] = ""
                    final = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created, "model": model,
                             "choices": [last], "system_fingerprint": STANDIN, "lab_standin": True, "usage": usage}
                    self.wfile.write(b"data: " + json.dumps(final).encode() + b"\n\n")
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                else:
                    time.sleep(self._token_delay_s() * max(0, len(tokens) - 1))
                    text = "".join(tokens)
                    choice = {"index": 0, "finish_reason": "length", "logprobs": None}
                    if chat:
                        choice["message"] = {"role": "assistant", "content": text}
                    else:
                        choice["text"] = text
                    self._send_json(200, {"id": rid, "object": obj, "created": created, "model": model,
                                          "choices": [choice], "usage": usage, "system_fingerprint": STANDIN})
            with state.lock:
                state.requests_served += 1
                served = state.requests_served
                emit_nan = state.nan_log and not state.nan_logged
                state.nan_logged = state.nan_logged or emit_nan
            if served == 1 or served % 256 == 0:
                log(f"generated {max_tokens} fixed tokens for request {served} (not a model)")
            if emit_nan:
                # Told to: print what SGLang's scheduler logs when decode produces NaN.
                print(f"[{STANDIN}] scheduler exception (simulated): {NAN_LINE}", flush=True)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # bench_serving opens every request at once with --request-rate inf. A class attribute, because
    # TCPServer calls listen() inside __init__: set on the instance afterwards, the backlog stays at 5, the
    # kernel drops the overflowing SYNs and those requests arrive 1, 3, 7, 15, 31, 63 s late.
    request_queue_size = 2048


def main(argv: list[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    state = State(args, rest)
    server = _Server((args.host, args.port), make_handler(state))
    log(
        f"SGLang server replaced by the {STANDIN} (no GPU in the lab): serving {state.served_model!r} "
        f"on {args.host}:{args.port}; flags not interpreted: {sorted(state.extra)}"
    )
    if state.fail_health:
        log("told to fail its health check (SGLANG_STANDIN_FAIL_HEALTH=1): /health will answer 503")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
