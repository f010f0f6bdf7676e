#!/usr/bin/env python3
"""Lab stand-in for SGLang's HTTP server (`python -m sglang.launch_server`).

The lab has no GPU and no torch, so SGLang's real server cannot start there. This file takes its
place in the lab only, and says so everywhere: on stdout at start and per request (the journal the
deploy reads), in an `X-Lab-Standin` header on every response, and in every JSON body.

It parses its argv as the installed SGLang release's own parser does, from that release's flag catalogue
(toolkit/data/sglang_flags/VERSION.json, which travels in the toolkit's wheel with this file): an unknown or
removed flag, a value outside a flag's choices, a missing value or a missing --model-path exits 2 with
argparse's own message, as `sglang.launch_server` would, so a render the release cannot start fails the
lab's deploy too. It then interprets --host, --port, --api-key, --served-model-name, --model-path, --tp-size
and the scheduler flags (the rest are reported in server_info), and answers what SGLang's clients and the
toolkit use:
  GET  /health, /health_generate          200, or 503 while "starting" or when told to fail
  GET  /get_server_info, /server_info     the parsed server args, `version`, `lab_standin`
  GET  /v1/models                         the served model (owned_by "sglang", as SGLang's ModelCard: SGLang's
                                          router tells an SGLang backend by it)
  GET  /model_info, /get_model_info       the model path, is_generation (the router reads them as it registers a
                                          backend)
  POST /v1/completions, /v1/chat/completions   OpenAI format, `stream: true` as server-sent events
  POST /generate                          SGLang's native API, one prompt (cumulative text, SGLang's meta_info)
  POST /flush_cache                       200 (bench_serving calls it before a run)
  GET  /metrics                           with --enable-metrics: SGLang 0.5.9's names, types and update cadence
                                          (404 without it, as SGLang); no API key needed, as in SGLang
  GET  /v1/loads                          live per-rank load, `max_running_requests` included (always mounted)
  GET  /lab/gpus                          LAB ONLY, not SGLang's: each simulated GPU's power, utilisation and
                                          energy now, and their topology (the lab probe's GPU sampler reads it)

Requests are served by one engine loop (engine_model.py, beside this file): at most --max-running-requests
run, the rest queue; the KV pool follows --mem-fraction-static and the target GPU's memory; a full pool
retracts; every prefill batch and decode step takes the model's time for this --tp-size and batch. Everything
it reports is SIMULATED and labelled so.

Over several nodes (--nnodes N --node-rank r --dist-init-addr HOST:PORT, rendezvous.py beside this file): rank 0
hosts torch.distributed's TCPStore at the init address and starts its HTTP server only once every node has joined;
a node of rank >= 1 serves only SGLang's dummy health server; a node that never joins fails rank 0 after the
timeout with TCPStore's message, and a node that leaves takes the others down with the scheduler's error, as
SGLang's launch-phase SIGQUIT handler does.

Behaviour switches, read from the environment (set by the role's lab drop-in, visible in the unit):
  SGLANG_STANDIN_FAIL_HEALTH=1   /health answers 503 forever (the deploy must fail, naming the service)
  SGLANG_STANDIN_NAN_LOG=1       after the first generation, log the line SGLang's sampler raises on
                                 NaN logits (the deploy must fail with that line)
  SGLANG_STANDIN_STARTUP_S       seconds /health answers 503 after start, as SGLang does while loading (default 1)
  SGLANG_STANDIN_SPEED           this release's speed against the engine model's (0.85: every forward takes
                                 1 / 0.85 as long), from the inventory's toolkit_lab_release_speed
  SGLANG_STANDIN_DIST_TIMEOUT_S  seconds the rendezvous waits when --dist-timeout is not given, in place of
                                 torch's 600 s NCCL default (so a test of a node that never joins is fast)
  SGLANG_STANDIN_FLAGS           a flag catalogue (JSON) to parse against instead of the installed release's
                                 (tests and benchmarks that run this file without SGLang installed)
  SGLANG_STANDIN_GPU_NAME, _GPU_MEMORY_GIB, _GPU_POWER_LIMIT_W, _GPU_IDLE_W, _P2P (0/1), _INTERCONNECT
                                 the profile's target (the engine model's hardware; defaults: the story's
                                 RTX PRO 6000 Blackwell, 96 GiB, 600 W, 87 W idle, PCIe without P2P)
  SGLANG_STANDIN_POWER_LIMITS_FILE
                                 where the lab's driver keeps each GPU's enforced power limit (set on the host
                                 with nvidia-smi -pl, seen here through the container's bind of the host's
                                 module state): reread every POWER_LIMIT_POLL_S, the lowest of this container's
                                 GPUs' limits is the engine model's (a tensor-parallel step waits for the slowest)

At start, before its flags are parsed, it runs the deploy's engine check from the file and inputs the role
wrote beside its venv (VENV/toolkit-engine-check.py, .json) and exits 1 with the check's error when it fails:
a package missing from the venv kills the lab's server as its missing import kills SGLang's.

Standard library only: it runs with the container's python3 or the SGLang venv's python, with no
toolkit installed there.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

# engine_model.py is copied beside this file into the container, where no toolkit package exists; in the checkout
# the same file is imported through the package.
if __package__:
    from toolkit.lab.standin_server import engine_model as em
    from toolkit.lab.standin_server import rendezvous
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import engine_model as em  # type: ignore[import-not-found,no-redef]
    import rendezvous  # type: ignore[import-not-found,no-redef]

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


def catalogue_file(env: dict[str, str], here: str) -> tuple[str | None, str]:
    """(the catalogue to parse against, or None, and how it was chosen). The installed release's, from the
    toolkit's data beside this package (the toolkit's wheel in the engine's venv, or the checkout), or a copy
    beside this file; SGLANG_STANDIN_FLAGS wins."""
    explicit = env.get("SGLANG_STANDIN_FLAGS")
    if explicit:
        return explicit, "SGLANG_STANDIN_FLAGS"
    version = _sglang_version()
    if version == "not installed":
        return None, "no SGLang is installed beside the stand-in and SGLANG_STANDIN_FLAGS is not set"
    for folder in (here, os.path.join(here, "..", "..", "data", "sglang_flags")):
        path = os.path.join(folder, f"{version}.json")
        if os.path.isfile(path):
            return path, f"the installed SGLang {version}"
    return None, f"no flag catalogue {version}.json beside the stand-in for the installed SGLang {version}"


class _Refused(argparse.Action):
    """A flag SGLang retired with a message (its DeprecatedAction(error_message=...)): parser.error(message)."""

    def __init__(self, option_strings: list[str], dest: str, error: str = "", **kwargs: Any) -> None:
        self.error = error
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(self.error)


class _Deprecated(argparse.Action):
    """A deprecated spelling SGLang still takes: it stores, and says so as SGLang's print_deprecated_warning does."""

    def __init__(self, option_strings: list[str], dest: str, switch_value: Any = None, **kwargs: Any) -> None:
        self.switch_value = switch_value
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        log(f"The command line argument '{option_string}' is deprecated and will be removed in future versions.")
        setattr(namespace, self.dest, self.switch_value if self.nargs == 0 else values)


_TYPES: dict[str, Any] = {"int": int, "float": float}


def sglang_parser(catalogue: dict[str, Any]) -> argparse.ArgumentParser:
    """An ArgumentParser with the release's flags as SGLang registers them: names, dest, nargs, choices, the
    int/float types, required. Its errors are argparse's own (SGLang's parser is a plain ArgumentParser too);
    SGLang's own value parsers (json_list_type, ...) take any string here."""
    parser = argparse.ArgumentParser(prog=catalogue.get("prog") or "launch_server.py")
    for flag in catalogue["flags"]:
        names = flag["names"]
        kwargs: dict[str, Any] = {"dest": flag["dest"]}
        nargs = flag.get("nargs")
        if flag.get("error"):
            kwargs.update(action=_Refused, error=flag["error"], nargs=0 if nargs == 0 else nargs)
            parser.add_argument(*names, **kwargs)
            continue
        if flag.get("action") == "BooleanOptionalAction":
            positive = [n for n in names if not n.startswith("--no-")]
            parser.add_argument(*positive, action=argparse.BooleanOptionalAction, default=flag.get("default"),
                                dest=flag["dest"])
            continue
        if nargs == 0:
            value = flag.get("action") != "store_false"
            if flag.get("deprecated"):
                kwargs.update(action=_Deprecated, nargs=0, switch_value=value)
            else:
                kwargs.update(action="store_const", const=value)
            kwargs["default"] = flag.get("default")
        else:
            if nargs is not None:
                kwargs["nargs"] = nargs
            if flag.get("choices") is not None:
                kwargs["choices"] = flag["choices"]
            if flag.get("type") in _TYPES:
                kwargs["type"] = _TYPES[flag["type"]]
            if flag.get("deprecated"):
                kwargs["action"] = _Deprecated
            kwargs["default"] = flag.get("default")
            kwargs["required"] = bool(flag.get("required"))
        parser.add_argument(*names, **kwargs)
    return parser


def parse_like_sglang(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    """argv through the release's own parser: argparse exits 2 with its message for anything SGLang refuses.
    Without a catalogue the stand-in cannot know what the release accepts, and refuses to start (exit 2)."""
    path, how = catalogue_file(env, os.path.dirname(os.path.abspath(__file__)))
    if path is None:
        print(f"[{STANDIN}] cannot check the flags as SGLang would: {how}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    with open(path, encoding="utf-8") as f:
        catalogue = json.load(f)
    log(f"parsing the flags as SGLang {catalogue.get('sglang_version')}'s parser does ({how})")
    return sglang_parser(catalogue).parse_args(argv)


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
    parser.add_argument("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    parser.add_argument("--dist-timeout", type=int, default=None)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--chunked-prefill-size", type=int, default=None)
    parser.add_argument("--decode-log-interval", type=int, default=em.DEFAULT_DECODE_LOG_INTERVAL)
    parser.add_argument("--enable-metrics", action="store_true")
    return parser


def hardware_from_env(env: dict[str, str]) -> em.Hardware:
    """The profile's target, passed by the role's lab drop-in (the engine model's GPUs)."""
    d = em.Hardware()

    def f(key: str, default: float) -> float:
        v = env.get(key, "")
        return float(v) if v else default

    return em.Hardware(
        gpu_name=env.get("SGLANG_STANDIN_GPU_NAME") or d.gpu_name,
        gpu_memory_gib=f("SGLANG_STANDIN_GPU_MEMORY_GIB", d.gpu_memory_gib),
        power_limit_w=f("SGLANG_STANDIN_GPU_POWER_LIMIT_W", d.power_limit_w),
        default_limit_w=f("SGLANG_STANDIN_GPU_POWER_LIMIT_W", d.power_limit_w),
        idle_power_w=f("SGLANG_STANDIN_GPU_IDLE_W", d.idle_power_w),
        p2p=env.get("SGLANG_STANDIN_P2P", "0") not in ("", "0", "false", "False"),
        interconnect=env.get("SGLANG_STANDIN_INTERCONNECT") or d.interconnect,
    )


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
        self.served_model = args.served_model_name or args.model_path
        self.hardware = hardware_from_env(dict(os.environ))
        # Raises em.NotEnoughMemory (SGLang's message) when the weights leave no KV pool: main() exits with it.
        self.engine = em.Engine(em.EngineConfig(
            tp_size=args.tp_size, max_running_requests=args.max_running_requests,
            mem_fraction_static=args.mem_fraction_static, chunked_prefill_size=args.chunked_prefill_size,
            decode_log_interval=args.decode_log_interval, model_name=self.served_model), self.hardware,
            em.facts_for(args.model_path))
        speed = float(os.environ.get("SGLANG_STANDIN_SPEED") or 1.0)
        if not speed > 0:
            raise SystemExit(f"SGLANG_STANDIN_SPEED={speed:g} is not a positive factor")
        self.engine.pace = 1.0 / speed
        self.t0 = time.monotonic()
        # One lock for the engine; the condition wakes the streams when a forward ends or a request arrives.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
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
            "pp_size": self.args.pp_size,
            "nnodes": self.args.nnodes,
            "node_rank": self.args.node_rank,
            "dist_init_addr": self.args.dist_init_addr,
            "max_running_requests": self.args.max_running_requests,
            "api_key_set": self.args.api_key is not None,
            "enable_metrics": self.args.enable_metrics,
            "simulated": em.MODEL_NOTE,
            "internal_states": [{"effective_max_running_requests_per_dp": self.engine.max_running_requests,
                                 "memory_usage": {"token_capacity": self.engine.max_total_num_tokens},
                                 "last_gen_throughput": self.engine.gauges.gen_throughput}],
        }
        info.update(self.extra)
        return info


POWER_LIMIT_POLL_S = 2.0


def enforced_limit_w(path: str, default_w: float, dev: str = "/dev") -> float:
    """The lowest enforced limit among the GPUs this process sees (/dev/nvidiaN), the board's default for a GPU whose
    limit was not set (the file lists only those, by bus id: the driver's `gpus` beside it names minor N's)."""
    try:
        with open(path) as fh:
            limits = {str(k): float(v) for k, v in json.load(fh).items()}
    except (OSError, ValueError):
        limits = {}
    try:
        with open(os.path.join(os.path.dirname(path), "gpus")) as fh:
            buses = fh.read().split("\n")
    except OSError:
        buses = []
    try:
        mine = [int(n[len("nvidia"):]) for n in os.listdir(dev)
                if n.startswith("nvidia") and n[len("nvidia"):].isdigit()]
    except OSError:
        mine = []
    return min((limits.get(buses[i] if i < len(buses) and buses[i] else str(i), default_w) for i in mine),
               default=default_w)


def power_limit_loop(state: State, path: str) -> None:
    """Follow the host's power limit (the GPUs' clocks follow it on a real host, whatever runs on them)."""
    eng = state.engine
    while True:
        limit = enforced_limit_w(path, state.hardware.default_limit_w or state.hardware.power_limit_w)
        if limit != eng.power_limit_w:
            with state.lock:
                eng.set_power_limit(limit)
            log(f"power limit {limit:.0f} W per GPU (simulated clock {eng.clock:.0%} of max in compute)")
        time.sleep(POWER_LIMIT_POLL_S)


def log(msg: str) -> None:
    print(f"[{STANDIN}] {msg}", flush=True)


def engine_loop(state: State) -> None:
    """The scheduler's loop in real time: decide a forward under the lock, take its modelled time outside it
    (so /metrics and new requests are served meanwhile), then apply it and wake the streams."""
    eng = state.engine
    while True:
        with state.cond:
            fwd = eng.next_forward(time.monotonic() - state.t0)
            if fwd is None:
                state.cond.wait(timeout=1.0)  # a new request, or the idle refresh's clock
                continue
        time.sleep(fwd.duration_s)
        with state.cond:
            eng.finish_forward(time.monotonic() - state.t0)
            lines, eng.log_lines = eng.log_lines, []
            state.cond.notify_all()
        for line in lines:
            if line.startswith("KV cache pool is full") or "Decode batch" in line:
                print(f"[{STANDIN} (simulated)] {line}", flush=True)


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def send_body(handler: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str | None) -> None:
    """One response, marked as the stand-in's (X-Lab-Standin), with no Content-Type where SGLang sends none (an
    empty 200 of the dummy health server)."""
    handler.send_response(code)
    if content_type:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("X-Lab-Standin", STANDIN)
    handler.end_headers()
    handler.wfile.write(body)


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sglang-lab-standin/" + STANDIN_VERSION
        protocol_version = "HTTP/1.0"  # close-delimited bodies: simplest correct streaming

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per generation below is enough; access logs would drown the journal

        def _send_json(self, code: int, body: dict[str, Any]) -> None:
            body = {**body, "lab_standin": True}
            send_body(self, code, json.dumps(body).encode(), "application/json")

        def _authorized(self) -> bool:
            if state.args.api_key is None:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {state.args.api_key}":
                return True
            self._send_json(401, {"error": "Unauthorized"})
            return False

        def _start_event_stream(self, *, cache_control: str | None = None) -> None:
            """A streamed response's head: its events follow as they are made, the body closed with the connection."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            if cache_control:
                self.send_header("Cache-Control", cache_control)
            self.send_header("X-Lab-Standin", STANDIN)
            self.end_headers()

        def _send_text(self, code: int, text: str) -> None:
            send_body(self, code, text.encode(), PROMETHEUS_TEXT)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                # SGLang mounts /metrics only with --enable-metrics, and lets it through without the API key.
                if not state.args.enable_metrics:
                    self._send_json(404, {"detail": "Not Found"})
                    return
                with state.lock:
                    text = state.engine.exposition()
                self._send_text(200, text)
                return
            if path == "/lab/gpus":
                self._send_json(200, lab_gpus_body(state))
                return
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
                                # SGLang's ModelCard: owned_by "sglang" is how its router tells an SGLang backend
                                "id": state.served_model,
                                "object": "model",
                                "owned_by": "sglang",
                                "root": state.served_model,
                                "max_model_len": int(state.extra.get("context_length") or 0) or None,
                                "created": int(time.time()),
                            }
                        ],
                    },
                )
            elif path == "/v1/loads":
                with state.lock:
                    loads = state.engine.loads()
                self._send_json(200, {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      "version": _sglang_version(), **loads})
            elif path in ("/get_model_info", "/model_info"):
                self._send_json(200, {"model_path": state.args.model_path, "tokenizer_path": state.args.model_path,
                                      "is_generation": True, "has_image_understanding": False,
                                      "has_audio_understanding": False, "model_type": None, "architectures": None,
                                      "preferred_sampling_params": None, "weight_version": "default"})
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
            elif path == "/generate":
                self._native_generate(body)
            else:
                self._send_json(404, {"error": f"not found: {path}"})

        def _submit(self, prompt_tokens: int, max_tokens: int) -> em.Req:
            req = em.Req(uuid.uuid4().hex, prompt_tokens, max_tokens, time.monotonic() - state.t0)
            with state.cond:
                state.engine.add_request(req)
                state.cond.notify_all()
            return req

        def _wait_tokens(self, req: em.Req, sent: int) -> int:
            """Block until the engine has generated more than `sent` tokens of req (or finished it)."""
            with state.cond:
                while req.generated <= sent and req.finished_s is None:
                    state.cond.wait(timeout=5.0)
                return req.generated

        def _native_generate(self, body: dict[str, Any]) -> None:
            """SGLang's own /generate (what its router forwards for that path): one prompt as `text` or
            `input_ids`, `sampling_params.max_new_tokens`; the answer's `text` is cumulative, also when streamed, and
            `meta_info` carries SGLang's fields (finish_reason {"type": "length", "length": N} at the end)."""
            text_in, ids_in = body.get("text"), body.get("input_ids")
            if isinstance(text_in, list) or (isinstance(ids_in, list) and ids_in and isinstance(ids_in[0], list)):
                self._send_json(400, {"error": {"message": "the lab stand-in takes one prompt per /generate"}})
                return
            params = body.get("sampling_params") or {}
            max_tokens = max(1, int(params.get("max_new_tokens") or 128))
            prompt_tokens = max(1, len(ids_in) if isinstance(ids_in, list) else len(str(text_in or "").split()))
            rid = body.get("rid") or uuid.uuid4().hex
            started = time.time()
            req = self._submit(prompt_tokens, max_tokens)

            def out(upto: int, done: bool) -> dict[str, Any]:
                meta: dict[str, Any] = {"id": rid, "finish_reason": {"type": "length", "length": max_tokens}
                                        if done else None, "prompt_tokens": prompt_tokens,
                                        "weight_version": "default", "total_retractions": 0,
                                        "completion_tokens": upto, "cached_tokens": 0}
                if done:
                    meta["e2e_latency"] = time.time() - started
                return {"text": "".join(WORDS[i % len(WORDS)] + " " for i in range(upto)),
                        "output_ids": [i % len(WORDS) for i in range(upto)], "meta_info": meta,
                        "lab_standin": True}

            if body.get("stream"):
                self._start_event_stream()
                sent = 0
                while sent < max_tokens:
                    sent = min(max_tokens, self._wait_tokens(req, sent))
                    self.wfile.write(b"data: " + json.dumps(out(sent, sent >= max_tokens)).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            else:
                sent = 0
                while sent < max_tokens:
                    sent = self._wait_tokens(req, sent)
                self._send_json(200, out(max_tokens, True))
            with state.lock:
                state.requests_served += 1

        def _generate(self, body: dict[str, Any], *, chat: bool) -> None:
            max_tokens = max(1, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
            if chat:
                messages = body.get("messages") or []
                prompt_text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            else:
                prompt = body.get("prompt", "")
                prompt_text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
            prompt_tokens = max(1, len(prompt_text.split()))
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
            created = int(time.time())
            model = body.get("model") or state.served_model
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens + max_tokens,
            }
            obj = "chat.completion" if chat else "text_completion"
            # bench_serving sets ignore_eos: every request generates exactly max_tokens, as the engine model does.
            req = self._submit(prompt_tokens, max_tokens)
            if body.get("stream"):
                self._start_event_stream(cache_control="no-cache")
                sent = 0
                while sent < max_tokens:
                    upto = min(max_tokens, self._wait_tokens(req, sent))
                    for i in range(sent, upto):
                        tok = WORDS[i % len(WORDS)] + " "
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
                    sent = upto
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
                sent = 0
                while sent < max_tokens:
                    sent = self._wait_tokens(req, sent)
                text = "".join(WORDS[i % len(WORDS)] + " " for i in range(max_tokens))
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


# SGLang's launch-phase SIGQUIT handler (entrypoints/engine.py): a scheduler that raises SIGQUITs its parent, which
# logs this and kills its whole process tree, itself included.
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."


def scheduler_failed(error: str) -> NoReturn:
    """A scheduler's exception while starting or serving, as SGLang ends: the scheduler logs its traceback, the
    parent its SIGQUIT line, and the tree dies by SIGKILL (kill_process_tree includes the parent)."""
    print(f"[{STANDIN} (simulated)] Scheduler hit an exception: Traceback (most recent call last):\n"
          f"  (the stand-in has no scheduler process; this is the error SGLang's scheduler raises here)\n{error}",
          file=sys.stderr, flush=True)
    print(f"[{STANDIN}] {SIGQUIT_LINE}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(1)  # not reached


def peer_closed(addr: tuple[str, int]) -> str:
    """The error SGLang's scheduler raises when a node of its group goes: its next broadcast_pyobj over the gloo
    CPU group fails on the closed pair. The address is taken while the pair was up: once the peer has reset the
    connection, getpeername() fails."""
    host, port = addr
    return (f"RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            f"[{host}]:{port}")


def distributed_plan(args: argparse.Namespace, env: dict[str, str]) -> rendezvous.Plan | None:
    """The rendezvous of a multi-node start, None on one node. What the stand-in cannot model exits 2 and says so."""
    if args.nnodes <= 1:
        return None
    if not 0 <= args.node_rank < args.nnodes:
        print(f"[{STANDIN}] --node-rank {args.node_rank} is not a rank of --nnodes {args.nnodes}", file=sys.stderr,
              flush=True)
        raise SystemExit(2)
    if not args.dist_init_addr:
        # SGLang would rendezvous at 127.0.0.1 on every node and wait out its timeout; nothing to learn from that.
        print(f"[{STANDIN}] --nnodes {args.nnodes} without --dist-init-addr: every node would wait at its own "
              "127.0.0.1 until torch's timeout; the stand-in refuses at once", file=sys.stderr, flush=True)
        raise SystemExit(2)
    world = args.tp_size * args.pp_size
    if world < args.nnodes or world % args.nnodes:
        print(f"[{STANDIN}] tp_size * pp_size = {world} ranks do not spread evenly over {args.nnodes} nodes",
              file=sys.stderr, flush=True)
        raise SystemExit(2)
    host, port = rendezvous.split_addr(args.dist_init_addr)
    return rendezvous.Plan(nnodes=args.nnodes, node_rank=args.node_rank, host=host, port=port, world=world,
                           timeout_s=rendezvous.timeout_s(args.dist_timeout, env))


def make_dummy_handler(enable_metrics: bool, lab_gpus: Callable[[], dict[str, Any] | None] = lambda: None
                       ) -> type[BaseHTTPRequestHandler]:
    """What a node of rank >= 1 serves: SGLang's launch_dummy_health_check_server (FastAPI): /health,
    /health_generate and /ping answer an empty 200, /metrics only with --enable-metrics (this node's schedulers
    export nothing: only the first attention-TP rank's do), anything else FastAPI's 404 or 405. Beside them, LAB
    ONLY as on rank 0: /lab/gpus, this node's simulated GPUs (rank 0's as it last sent them: a pipeline stage
    works when the first does), 503 until rank 0 has sent any."""

    class DummyHandler(BaseHTTPRequestHandler):
        server_version = "sglang-lab-standin/" + STANDIN_VERSION
        protocol_version = "HTTP/1.0"
        routes = {"/health", "/health_generate", "/ping"} | ({"/metrics"} if enable_metrics else set())

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            send_body(self, code, body, content_type if body else None)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/lab/gpus":
                body = lab_gpus()
                self._send(200, json.dumps(body).encode()) if body is not None else \
                    self._send(503, b'{"detail":"rank 0 has sent no GPU state yet"}')
            elif path not in self.routes:
                self._send(404, b'{"detail":"Not Found"}')
            elif path == "/metrics":
                self._send(200, b"", PROMETHEUS_TEXT)
            else:
                self._send(200, b"")

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in self.routes:
                self._send(405, b'{"detail":"Method Not Allowed"}')
            else:
                self._send(404, b'{"detail":"Not Found"}')

    return DummyHandler


LAB_GPUS_PERIOD_S = 0.1  # a follower's /lab/gpus is this stale at most: one tick of the probe's default 10 Hz


def lab_gpus_body(state: Any) -> dict[str, Any]:
    """/lab/gpus's answer (LAB ONLY): each simulated GPU's figures now, and the topology."""
    with state.lock:
        now = time.monotonic() - state.t0
        return {"simulated": em.MODEL_NOTE, "t_s": round(now, 4), "gpus": state.engine.gpu_rows(now),
                "topology": state.engine.topology()}


def lab_gpus_to_followers(state: Any, store: rendezvous.Store) -> None:
    while True:
        rendezvous.send_lab_gpus(store, lab_gpus_body(state))
        time.sleep(LAB_GPUS_PERIOD_S)


def serve_follower(args: argparse.Namespace, conn: socket.socket) -> NoReturn:
    """Node rank >= 1 once every node has joined: no API, SGLang's dummy health server, and the schedulers' wait
    until the group breaks (rank 0 gone), which ends this node as SGLang's scheduler error does."""
    latest: list[dict[str, Any]] = []

    def mirrored(body: dict[str, Any]) -> None:
        latest[:] = [{**body, "simulated": f"{body.get('simulated') or em.MODEL_NOTE}; node rank "
                      f"{args.node_rank} mirrors node rank 0's GPUs (a pipeline stage works when the first does)"}]

    server = _Server((args.host, args.port), make_dummy_handler(args.enable_metrics,
                                                                lambda: latest[0] if latest else None))
    threading.Thread(target=server.serve_forever, name="health-check-server", daemon=True).start()
    log(f"Dummy health check server started in background thread at {args.host}:{args.port}")
    try:
        host, port = conn.getpeername()[:2]
    except OSError:  # rank 0 already gone: the address it was reached at
        host, port = rendezvous.split_addr(args.dist_init_addr)
    rendezvous.follow(conn, mirrored)
    scheduler_failed(peer_closed((str(host), int(port))))


# Written beside the venv by the deploy (roles/sglang_venv: the engine check and its inputs).
ENGINE_CHECK_SCRIPT = "toolkit-engine-check.py"
ENGINE_CHECK_INPUTS = "toolkit-engine-check.json"


def engine_check(prefix: str) -> str | None:
    """The deploy's engine check, run again at start from the same file with the same inputs the role wrote beside
    this venv, as `sglang.launch_server` fails at its first import on a venv that lacks what it imports: None when
    it passes (or when no deploy wrote them: a test run outside a venv), else its error."""
    script, inputs = os.path.join(prefix, ENGINE_CHECK_SCRIPT), os.path.join(prefix, ENGINE_CHECK_INPUTS)
    if not os.path.isfile(inputs):
        return None
    import subprocess

    proc = subprocess.run([sys.executable, script, inputs], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr.strip()[-600:]}
    return None if proc.returncode == 0 and result.get("ok") else str(result.get("error"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    refused = engine_check(sys.prefix)
    if refused is not None:
        print(f"[{STANDIN}] the engine check failed, as SGLang's server would at its imports: {refused}",
              file=sys.stderr, flush=True)
        return 1
    if argv != ["--version"]:
        parse_like_sglang(argv, dict(os.environ))
    args, rest = build_parser().parse_known_args(argv)
    if os.environ.get("SGLANG_STANDIN_EXIT_AT_START", "") not in ("", "0"):
        # A server that dies while starting (a module missing from the venv, a bad flag): the deploy must see
        # the process gone, not wait out its health timeout.
        print(f"[{STANDIN}] told to exit at start (SGLANG_STANDIN_EXIT_AT_START=1): exiting with status 1",
              file=sys.stderr, flush=True)
        return 1
    plan = distributed_plan(args, dict(os.environ))
    store: rendezvous.Store | None = None
    if plan is not None:
        # SGLang's schedulers join the torch.distributed group before the model loads and before any HTTP server
        # starts: until every node is in, nothing answers on --port.
        try:
            if plan.node_rank == 0:
                store = rendezvous.serve(plan, log)
            else:
                serve_follower(args, rendezvous.join(plan, log))
        except rendezvous.RendezvousError as err:
            scheduler_failed(str(err))
        except OSError as err:
            scheduler_failed("torch.distributed.DistNetworkError: The server socket has failed to listen on any "
                             f"local network address. port: {plan.port}, useIpv6: false, code: -{err.errno}, "
                             f"name: {errno.errorcode.get(err.errno or 0, '?')}, "
                             f"message: {(err.strerror or '').lower()}")
    try:
        state = State(args, rest)
    except em.NotEnoughMemory as err:
        # What SGLang's model_runner raises at start when the weights leave no room for the KV pool.
        print(f"[{STANDIN} (simulated)] RuntimeError: {err}", file=sys.stderr, flush=True)
        return 1
    threading.Thread(target=engine_loop, args=(state,), name="engine", daemon=True).start()
    limits_file = os.environ.get("SGLANG_STANDIN_POWER_LIMITS_FILE", "")
    if limits_file:
        threading.Thread(target=power_limit_loop, args=(state, limits_file), name="power-limit", daemon=True).start()
    server = _Server((args.host, args.port), make_handler(state))
    if store is not None:
        # A node that leaves breaks the group: rank 0's next broadcast fails and takes the server down.
        store.watch(lambda rank: scheduler_failed(peer_closed(store.peer_addrs[rank])))
        threading.Thread(target=lab_gpus_to_followers, args=(state, store), name="lab-gpus", daemon=True).start()
    log(
        f"SGLang server replaced by the {STANDIN} (no GPU in the lab): serving {state.served_model!r} "
        f"on {args.host}:{args.port}; flags not interpreted: {sorted(state.extra)}"
    )
    eng = state.engine
    hw = state.hardware
    log(f"simulated engine: {eng.facts.name}, tp {eng.tp} on {hw.gpu_name} ({hw.gpu_memory_gib:g} GiB), "
        f"max_total_num_tokens={eng.max_total_num_tokens}, chunked_prefill_size={eng.chunked_prefill_size}, "
        f"max_running_requests={eng.max_running_requests}, metrics {'on' if args.enable_metrics else 'off'}")
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
