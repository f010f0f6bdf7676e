"""server_trace.csv and host_trace.csv: writers, readers, reset-safe rates, /proc sampling."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.adapters.host_sampler import HostSampler
from toolkit.cli.main import main
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.host_trace import descendants, host_window, parse_proc_stat, read_host_trace
from toolkit.core.probe.server_trace import (
    COLUMNS,
    counter_rate,
    format_server_row,
    read_server_trace,
    scrape_row,
    server_header,
    server_window,
)

RECORDED = Path(__file__).resolve().parents[1] / "results" / "fixtures" / "run-synthetic-tp8" / "trace.csv"


def _trace_text(rows: list[dict[str, object]]) -> str:
    return server_header({"scrape_hz": "2.0", "source": "http://127.0.0.1:1"}) + "".join(
        format_server_row(r) for r in rows)  # type: ignore[arg-type]


def test_server_trace_round_trips_and_empty_cells_stay_unavailable() -> None:
    rows = [
        {"t_s": 0.0, "ok": True, "num_running_reqs": 64.0, "num_queue_reqs": 96.0, "token_usage": 0.1,
         "realtime_decode_tokens_total": 0.0},
        {"t_s": 0.5, "ok": False, "error": "connection refused, port 8000"},
        {"t_s": 1.0, "ok": True, "num_running_reqs": 64.0, "num_queue_reqs": 50.0,
         "realtime_decode_tokens_total": 880.0},
    ]
    tr = read_server_trace(_trace_text(rows))
    assert tr.meta["schema_version"] == "1" and tr.meta["scrape_hz"] == "2.0"
    assert tr.ok == [True, False, True] and tr.gaps == 1
    assert tr.error[1] == "connection refused; port 8000"  # a comma never splits a cell
    assert tr.column("token_usage") == [0.1, None, None]  # missing is None, never 0
    assert tr.column("num_queue_reqs") == [96.0, None, 50.0]


def test_counter_rate_skips_a_restart_and_steps_over_gaps() -> None:
    rows = [
        {"t_s": 0.0, "ok": True, "realtime_decode_tokens_total": 1000.0},
        {"t_s": 1.0, "ok": True, "realtime_decode_tokens_total": 1900.0},
        {"t_s": 2.0, "ok": False, "error": "timed out"},
        {"t_s": 3.0, "ok": True, "realtime_decode_tokens_total": 3700.0},
        # the server restarted: the counter starts again from 0
        {"t_s": 4.0, "ok": True, "realtime_decode_tokens_total": 50.0, "counter_reset": True},
        {"t_s": 5.0, "ok": True, "realtime_decode_tokens_total": 950.0},
    ]
    tr = read_server_trace(_trace_text(rows))
    rate = counter_rate(tr, "realtime_decode_tokens_total", 0.0, 5.0)
    # pairs 0-1 (900/1 s), 1-3 across the gap (1800/2 s), 4-5 (900/1 s); 3-4 (the restart) skipped
    assert rate == pytest.approx(3600 / 4)
    assert counter_rate(tr, "realtime_decode_tokens_total", 4.5, 5.0) is None  # one row: no rate
    assert tr.resets == 1
    win = server_window(tr, 0.0, 5.0)
    assert win["output_tok_per_s"] == pytest.approx(900.0) and win["gaps"] == 1


def test_a_backwards_counter_without_the_flag_is_still_no_negative_rate() -> None:
    rows = [{"t_s": 0.0, "ok": True, "generation_tokens_total": 500.0},
            {"t_s": 1.0, "ok": True, "generation_tokens_total": 10.0}]
    assert counter_rate(read_server_trace(_trace_text(rows)), "generation_tokens_total", 0, 1) is None


def test_scrape_row_sums_label_sets_and_averages_ratios() -> None:
    samples = [
        ("sglang:num_running_reqs", {"dp_rank": "0"}, 32.0), ("sglang:num_running_reqs", {"dp_rank": "1"}, 30.0),
        ("sglang:token_usage", {"dp_rank": "0"}, 0.5), ("sglang:token_usage", {"dp_rank": "1"}, 0.3),
        ("sglang:num_retracted_reqs", {"pid": "11"}, 1.0), ("sglang:num_retracted_reqs", {"pid": "12"}, 2.0),
        ("sglang:realtime_tokens_total", {"mode": "decode"}, 100.0),
        ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}, 40.0),
        ("sglang:cached_tokens_total", {"cache_source": "device"}, 7.0),
        ("sglang:cached_tokens_total", {"cache_source": "total"}, 9.0),
        ("sglang:time_to_first_token_seconds_sum", {}, 1.5), ("sglang:time_to_first_token_seconds_count", {}, 3.0),
    ]
    row, missing = scrape_row(samples, {"loads": [{"max_running_requests": 64}, {"max_running_requests": 64}]})
    assert row["num_running_reqs"] == 62.0 and row["token_usage"] == pytest.approx(0.4)
    assert row["num_retracted_reqs"] == 3.0 and row["cached_tokens_total"] == 9.0
    assert row["realtime_decode_tokens_total"] == 100.0 and row["max_running_requests"] == 128
    assert row["ttft_sum_s"] == 1.5 and row["ttft_count"] == 3.0
    assert "realtime_prefill_cache_tokens_total" in missing and "num_running_reqs" not in missing


def test_without_metrics_v1_loads_gives_the_gauges_and_counters_stay_unseen() -> None:
    loads = {"loads": [{"num_running_reqs": 5, "num_waiting_reqs": 2, "token_usage": 0.25, "max_running_requests": 8,
                        "num_used_tokens": 100, "max_total_num_tokens": 400, "gen_throughput": 50.0}]}
    row, missing = scrape_row(None, loads)
    assert (row["num_running_reqs"], row["num_queue_reqs"], row["max_running_requests"]) == (5.0, 2.0, 8)
    assert "realtime_decode_tokens_total" in missing and "ttft_count" in missing


def test_server_trace_reader_refuses_newer_schema_and_bad_cells() -> None:
    text = _trace_text([{"t_s": 0.0, "ok": True}])
    with pytest.raises(ToolkitError, match="newer"):
        read_server_trace(text.replace("schema_version=1", "schema_version=9"))
    bad = text + "1.0,1,," + ",".join(["x"] + [""] * (len(COLUMNS) - 4)) + "\n"
    with pytest.raises(ToolkitError, match="num_running_reqs"):
        read_server_trace(bad, "s.csv")
    # a last line without its newline is a cut-off write: the complete rows stand
    assert len(read_server_trace(text + "2.0,1,,5")) == 1


def test_proc_stat_with_spaces_and_parentheses_in_comm() -> None:
    st = parse_proc_stat("4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1 2 3\n")
    assert (st.pid, st.comm, st.state, st.ppid, st.cpu_ticks, st.threads) == (4242, "my (odd) name", "S", 1, 300, 7)
    assert descendants(1, {2: 1, 3: 2, 4: 9, 1: 0}) == [1, 2, 3]


def test_host_sampler_sees_a_busy_thread_of_a_child_process() -> None:
    """Real /proc: a child process whose one thread spins shows that thread as its busiest."""
    code = ("import threading, time\n"
            "def spin():\n    t = time.time()\n    while time.time() - t < 3: pass\n"
            "th = threading.Thread(target=spin); th.start(); time.sleep(3.2)\n")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, "
                               f"'-c', {code!r}])"])
    try:
        host = HostSampler()
        host.set_root("bench", parent.pid)
        t0 = time.monotonic()

        def spinning(lines: list[str]) -> bool:  # the grandchild is there with its second thread started
            rows = read_host_trace(host.header(2.0) + "".join(lines))
            return any(p != parent.pid and (n or 0) >= 2 for p, n in zip(rows.pid, rows.threads, strict=True))

        def timed_tick(t_s: float) -> tuple[list[str], float]:
            start = time.monotonic()
            return host.tick(t_s), time.monotonic() - start

        lines, prev_call_s = timed_tick(0.0)
        t_prev = 0.0
        while time.monotonic() - t0 < 3 and not spinning(lines):
            time.sleep(0.05)
            t_prev = time.monotonic() - t0
            lines, prev_call_s = timed_tick(t_prev)  # every thread has its first sample from here on
        time.sleep(1.0)
        t1 = time.monotonic() - t0
        lines, call_s = timed_tick(t1)
        tr = read_host_trace(host.header(2.0) + "".join(lines))
    finally:
        parent.wait()
    assert len(set(tr.pid)) == 2 and set(tr.role) == {"bench"}
    child = max(range(len(tr)), key=lambda i: tr.cpu_pct[i] or 0.0)
    assert tr.ppid[child] == parent.pid
    # The spinning thread (not the main one, which sleeps) is the busiest, and holds most of the process's CPU.
    assert tr.busiest_tid[child] != tr.pid[child]
    # On a loaded 2-core CI machine the spinner gets what the scheduler gives it; whatever that is, it is nearly
    # all of its process's CPU (the main thread sleeps). The thread can read a little above its process: each
    # count is cut to whole clock ticks, and a tick reads the process before its threads, so the spinner runs on
    # between the two reads, for at most as long as each tick call took (seen: 97.47 against 95.48 under load).
    busiest, total = tr.busiest_thread_cpu_pct[child] or 0.0, tr.cpu_pct[child] or 0.0
    slack_pct = 100 * (2 / os.sysconf("SC_CLK_TCK") + prev_call_s + call_s) / (t1 - t_prev)
    assert busiest > 3 and busiest >= 0.7 * total and total >= busiest - slack_pct, slack_pct
    win = host_window(tr, 0, t1 + 1)
    assert win["bench"]["busiest_thread"]["pid"] == tr.pid[child] and win["server"] is None


def test_plain_probe_run_writes_the_host_timeline(tmp_path: Path) -> None:
    """`toolkit probe run -- python3 load.py` (the GPU box's way) writes host_trace.csv with the load's rows."""
    out = tmp_path / "run"
    rc = main(["probe", "run", "--replay-gpu-trace", str(RECORDED), "--idle-s", "0.5", "--host-hz", "5",
               "--out", str(out), "--json", "--", sys.executable, "-c",
               "import time\ntime.sleep(2)\nwhile time.process_time() < 1.0: pass"])
    assert rc == 0
    tr = read_host_trace((out / "host_trace.csv").read_text())
    assert tr.meta["sample_hz"] == "5.0" and tr.meta["source"] == "proc"
    # The load spends 1 s of CPU however busy the machine is (a wall-clock loop got a sixth of a core at load 12,
    # and a bar on the peak percentage failed): the trace's integral of the load's CPU must find most of it. The
    # load idles 2 s first: a process's CPU before its first sample is not in the trace, and at load 25 the sampler's
    # first tick came 0.8 s after the load started (the integral found 0.60 s).
    t_s, pct = tr.series("bench")
    cpu_s = sum(p / 100 * (t1 - t0) for t0, t1, p in zip(t_s, t_s[1:], pct[1:], strict=False))
    assert cpu_s > 0.6, (t_s, pct)
    import json

    run = json.loads((out / "run.json").read_text())
    assert run["host"]["rows"] == len(tr) and "host_trace.csv" in run["files"]
    assert not (out / "host_trace.csv.partial").exists()
