"""A probe run with server and host timelines: steady throughput from the server's counter, and the report's
server panel under the power plot (synthetic timelines written with the real writers, labelled so)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from toolkit.app.record import load_results
from toolkit.cli.main import main
from toolkit.core.probe.host_trace import format_host_row, host_header
from toolkit.core.probe.server_trace import format_server_row, server_header

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "tests" / "results" / "fixtures" / "run-synthetic-tp8"  # bench 10-50 s, steady 11.8-47.4 s


def _timelines(run: Path) -> None:
    """64 running with a queue draining, 880 decode tok/s from the counter, a server restart at 30 s, a gap."""
    rows = []
    decode = 0.0
    for i in range(0, 121):
        t = i * 0.5
        busy = 10.0 <= t <= 50.0
        decode += 440.0 if busy else 0.0  # the server works on while one scrape gets no answer
        if t == 20.0:
            rows.append({"t_s": t, "ok": False, "error": "/metrics: timed out"})
            continue
        if t == 30.0:
            decode = 440.0  # a restart: the counter starts again
        rows.append({"t_s": t, "ok": True, "num_running_reqs": 64.0 if busy else 0.0,
                     "num_queue_reqs": max(0.0, 900 - 25 * (t - 10)) if busy else 0.0, "token_usage": 0.05,
                     "max_running_requests": 64, "realtime_decode_tokens_total": decode,
                     "realtime_prefill_compute_tokens_total": 0.0, "realtime_prefill_cache_tokens_total": 0.0,
                     "counter_reset": t == 30.0})
    (run / "server_trace.csv").write_text(server_header({"scrape_hz": "2.0", "source": "synthetic:test"}) + "".join(
        format_server_row(r) for r in rows))  # type: ignore[arg-type]
    host = [{"t_s": i * 0.5, "role": "server", "pid": 100, "ppid": 1, "comm": "python3", "cpu_pct": 97.0,
             "threads": 40, "busiest_tid": 101, "busiest_thread": "scheduler", "busiest_thread_cpu_pct": 95.0}
            for i in range(1, 121)]
    (run / "host_trace.csv").write_text(host_header({"sample_hz": "2.0", "source": "proc"}) + "".join(
        format_host_row(r) for r in host))  # type: ignore[arg-type]


def test_steady_throughput_comes_from_the_counter_and_the_report_draws_the_server(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    run = tmp_path / "runs" / RUN.name
    shutil.copytree(RUN, run)
    _timelines(run)
    assert main(["probe", "replay", str(run), "--write", "--json"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    steady = summary["steady"]
    assert steady["throughput"]["output_tok_per_s"] == pytest.approx(880.0)  # the restart is no negative rate
    assert steady["throughput"]["source"].startswith("server counter sglang:realtime_tokens_total")
    assert steady["j_per_output_token"] == pytest.approx(steady["energy_j_total"] / (880.0 * steady["duration_s"]),
                                                         rel=1e-3)
    srv = summary["server"]["steady"]
    assert srv["num_running_reqs"]["max"] == 64 and srv["max_running_requests"] == 64 and srv["gaps"] == 1
    assert summary["server"]["resets"] == 1
    assert summary["host"]["steady"]["server"]["busiest_thread"]["thread"] == "scheduler"

    assert main(["results", "record", str(run), "--profile", "glm5-tp8", "--profiles-dir", str(profiles)]) == 0
    entry = load_results("glm5-tp8", profiles).block.entries[-1]
    assert entry.throughput.steady_state is not None
    assert entry.throughput.steady_state.output_tok_per_s == 880.0
    assert entry.output_tok_per_s() == (880.0, "steady")  # what compare and sweeps rank on

    html_file = tmp_path / "r.html"
    md_file = tmp_path / "r.md"
    assert main(["report", "glm5-tp8", "--profiles-dir", str(profiles), "--html", str(html_file),
                 "--markdown", str(md_file)]) == 0
    page = html_file.read_text()
    assert page.index('id="plot-power"') < page.index('id="plot-server"') < page.index('id="plot-util-gpm"')
    # The counter's steady window is the whole constant-rate span: the drain-free plateau of 880 tok/s.
    assert summary["steady_state"]["signal"] == "server token counter"
    img = Image.open(tmp_path / "r-server.png").convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50 and max(colours)[0] / (img.width * img.height) < 0.95
    assert img.height > Image.open(tmp_path / "r-power.png").height  # four panels under one axis
