"""The server timeline against a real local HTTP server: faults are gaps and notes, never a crash.

The server here is a real socket server whose answers a test switches: SGLang 0.5.9's exposition (multiprocess
style: `_sum` before buckets, a `pid` label on mode-less gauges), garbage, a restart (counters from zero), 404.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.sglang_metrics import ServerScraper
from toolkit.cli.main import main
from toolkit.core.probe.server_trace import counter_rate, read_server_trace

RECORDED = Path(__file__).resolve().parents[1] / "results" / "fixtures" / "run-synthetic-tp8" / "trace.csv"
LABELS = 'engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


def exposition(running: int, queued: int, decode_tokens: float, gen_tokens: float) -> str:
    return f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{LABELS}}} {running}.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{LABELS}}} {queued}.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{LABELS}}} 0.12
# HELP sglang:num_retracted_reqs The number of retracted requests.
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{{{LABELS},pid="4242"}} 0.0
# HELP sglang:realtime_tokens_total Total number of tokens processed.
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{{{LABELS},mode="decode"}} {decode_tokens}
sglang:realtime_tokens_total{{{LABELS},mode="prefill_compute"}} 2048.0
sglang:realtime_tokens_total{{{LABELS},mode="prefill_cache"}} 0.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="glm-5"}} {gen_tokens}
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{{model_name="glm-5"}} 3.5
sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="glm-5"}} 1.0
sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="glm-5"}} 8.0
sglang:time_to_first_token_seconds_count{{model_name="glm-5"}} 8.0
"""


class FakeSGLang:
    """What the handler answers is `self.metrics` (text, or an int status) and `self.loads`."""

    def __init__(self) -> None:
        self.metrics: str | int = exposition(64, 96, 0.0, 0.0)
        self.loads: dict[str, Any] | int = {"loads": [{"dp_rank": 0, "num_running_reqs": 64, "num_waiting_reqs": 96,
                                                      "token_usage": 0.12, "max_running_requests": 64}]}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                what: str | int | dict[str, Any] = owner.metrics if self.path == "/metrics" else owner.loads
                if isinstance(what, int):
                    self.send_response(what)
                    self.end_headers()
                    return
                body = (what if isinstance(what, str) else json.dumps(what)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.stopped = False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def sglang() -> Iterator[FakeSGLang]:
    s = FakeSGLang()
    yield s
    s.stop()


def _trace(scraper: ServerScraper, lines: list[str]) -> Any:
    return read_server_trace(scraper.header() + "".join(lines))


def test_metrics_gone_mid_run_is_a_gap_and_the_scrape_goes_on(sglang: FakeSGLang) -> None:
    sc = ServerScraper(sglang.url, 2.0, timeout_s=0.5)
    lines = sc.tick(0.0)
    sglang.metrics = exposition(64, 50, 880.0, 0.0)
    lines += sc.tick(1.0)
    sglang.stop()  # the server goes away: connection refused from now on
    lines += sc.tick(1.5) + sc.tick(2.0)
    tr = _trace(sc, lines)
    assert tr.ok == [True, True, False, False]
    assert "/metrics" in tr.error[2] and tr.error[2]
    assert tr.column("num_queue_reqs")[:2] == [96.0, 50.0] and tr.column("max_running_requests")[0] == 64
    assert counter_rate(tr, "realtime_decode_tokens_total", 0, 2) == pytest.approx(880.0)
    assert sc.info()["gaps"] == 2


def test_malformed_exposition_is_a_gap_naming_it(sglang: FakeSGLang) -> None:
    sc = ServerScraper(sglang.url, 2.0)
    sglang.metrics = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank=\"0\" 5.0\n"
    bad = _trace(sc, sc.tick(0.0))
    assert bad.ok == [False] and "malformed exposition" in bad.error[0]
    sglang.metrics = exposition(3, 0, 10.0, 0.0)
    good = _trace(sc, sc.tick(0.5))
    assert good.ok == [True] and good.column("num_running_reqs") == [3.0]


def test_counter_reset_is_recorded_never_a_negative_rate(sglang: FakeSGLang) -> None:
    sc = ServerScraper(sglang.url, 2.0)
    lines = []
    for t, dec in ((0.0, 1000.0), (1.0, 1900.0), (2.0, 30.0), (3.0, 930.0)):  # restart between 1 s and 2 s
        sglang.metrics = exposition(64, 0, dec, dec)
        lines += sc.tick(t)
    tr = _trace(sc, lines)
    assert tr.counter_reset == [False, False, True, False] and sc.info()["resets"] == 1
    assert counter_rate(tr, "realtime_decode_tokens_total", 0, 3) == pytest.approx(900.0)


def test_server_without_enable_metrics_reads_v1_loads_and_says_what_it_missed(sglang: FakeSGLang) -> None:
    sglang.metrics = 404
    sc = ServerScraper(sglang.url, 2.0)
    tr = _trace(sc, sc.tick(0.0) + sc.tick(0.5))
    assert tr.ok == [True, True]
    assert tr.column("num_running_reqs") == [64.0, 64.0] and tr.column("num_queue_reqs") == [96.0, 96.0]
    assert tr.column("realtime_decode_tokens_total") == [None, None]
    info = sc.info()
    assert info["metrics_enabled"] is False
    assert any("--enable-metrics" in n for n in info["what_was_not_seen"])
    assert any("realtime_decode_tokens_total" in n for n in info["what_was_not_seen"])


def test_v1_loads_behind_an_api_key_is_named(sglang: FakeSGLang) -> None:
    sglang.loads = 401
    sc = ServerScraper(sglang.url, 2.0, api_key="")
    tr = _trace(sc, sc.tick(0.0))
    assert tr.ok == [True] and tr.column("max_running_requests") == [None]
    assert any("SGLANG_API_KEY" in n for n in sc.info()["what_was_not_seen"])


def test_probe_run_records_the_server_timeline_through_a_server_dying_mid_run(sglang: FakeSGLang,
                                                                              tmp_path: Path, reliability) -> None:
    out = tmp_path / "run"
    stopper = threading.Timer(1.2, sglang.stop)
    stopper.start()
    try:
        rc = main(["probe", "run", "--replay-gpu-trace", str(RECORDED), "--idle-s", "0.3", "--server-url",
                   sglang.url, "--server-hz", "5", "--out", str(out), "--json", "--", sys.executable, "-c",
                   "import time; time.sleep(2.2)"])
    finally:
        stopper.cancel()
    assert rc == 0
    tr = read_server_trace((out / "server_trace.csv").read_text())
    assert tr.ok[0] and not tr.ok[-1] and len(tr) >= 8
    run = json.loads((out / "run.json").read_text())
    assert run["server"]["rows"] == len(tr) and run["server"]["gaps"] == tr.gaps > 0
    assert run["server"]["metrics_enabled"] is True and "server_trace.csv" in run["files"]
    verdict = json.loads((out / "verdict.json").read_text())
    # The verdict says what it could not see: the server's side from its first failed scrape on.
    assert any(n.startswith("server ") and "scrapes failed" in n for n in verdict["evidence"]["not_seen"])
    assert "(not seen: server " in verdict["headline"]
    first_gap = next(e for ok, e in zip(tr.ok, tr.error, strict=True) if not ok)
    reliability(
        fault="the server's /metrics endpoint gone mid-run (the server stops answering 1.2 s into a 2.2 s benchmark)",
        user_saw=f"exit {rc}; verdict: {verdict['headline']}; the scrape went on: {run['server']['gaps']} of "
        f"{run['server']['rows']} scrapes were gaps ({first_gap[:80]})",
        recorded="server_trace.csv with a gap row per failed scrape (ok=0 and the error), run.json server.gaps",
        next_run="nothing to undo: the probe run finished and judged what it had",
        area="probe",
    )


def test_probe_run_without_prometheus_client_skips_the_server_timeline_saying_so(
        sglang: FakeSGLang, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import toolkit.adapters.sglang_metrics as sm

    monkeypatch.setattr(sm, "text_string_to_metric_families", None)
    out = tmp_path / "run"
    rc = main(["probe", "run", "--replay-gpu-trace", str(RECORDED), "--idle-s", "0", "--server-url", sglang.url,
               "--out", str(out), "--json", "--", sys.executable, "-c", "pass"])
    assert rc in (0, 1)  # the verdict on a 0 s benchmark does not matter here
    assert "server timeline skipped" in capsys.readouterr().err
    assert not (out / "server_trace.csv").exists()
    assert "prometheus-client" in json.loads((out / "run.json").read_text())["server"]["skipped"]
