"""Trace format (round trip, bad input named by file and line) and the steady-state rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.series import COLUMNS
from toolkit.core.probe.server_trace import counter_series, read_server_trace
from toolkit.core.probe.steady import SteadyParams, SteadyWindow, find_counter_window, find_steady_window
from toolkit.core.probe.trace import TRACE_SCHEMA_VERSION, dump_trace, parse_trace, trace_from_rows

from .synthetic import ramp, seed_run


def _ramp_trace(plateau: tuple[float, float], ramp_s: float = 3.0, hz: float = 10.0, end: float = 40.0):
    rows = []
    for i in range(int(end * hz)):
        t = i / hz
        x = ramp(t, plateau[0] - ramp_s, ramp_s, plateau[1] + ramp_s, ramp_s)
        rows.append({"t_s": t, "gpu": 0, "power_w": 100 + 500 * x, "power_limit_w": 700.0, "util_gpu_pct": 100 * x})
    return trace_from_rows(rows, {"sample_hz": str(hz), "source": "synthetic:ramp"})


def test_round_trip_keeps_values_and_unavailable_cells() -> None:
    trace, *_ = seed_run()
    text = dump_trace(trace)
    back = parse_trace(text, "seed.csv")
    assert sorted(back.gpus) == list(range(8))
    assert back.gpus[3].values["power_w"] == trace.gpus[3].values["power_w"]
    # the seed measured no clocks: unavailable stays None, never 0
    assert set(back.gpus[0].values["sm_clock_mhz"]) == {None}
    assert back.meta["source"] == "synthetic:seed-figures"


def test_truncated_trace_names_file_and_last_line() -> None:
    trace, *_ = seed_run()
    text = dump_trace(trace)
    cut = text[: len(text) - 7]  # a crash mid-write: the last row lacks fields and its line end
    with pytest.raises(ToolkitError) as err:
        parse_trace(cut, "runs/x/trace.csv")
    p = err.value.problems[0]
    assert p.file == "runs/x/trace.csv"
    assert p.line == text.count("\n")  # the last line of the file
    assert "truncated" in p.message or "fields" in p.message


def test_malformed_number_names_line_and_field() -> None:
    trace, *_ = seed_run()
    lines = dump_trace(trace).splitlines(keepends=True)
    cells = lines[10].split(",")
    cells[COLUMNS.index("power_w")] = "lots"
    lines[10] = ",".join(cells)
    with pytest.raises(ToolkitError) as err:
        parse_trace("".join(lines), "t.csv")
    p = err.value.problems[0]
    assert (p.file, p.line) == ("t.csv", 11)
    assert "power_w" in p.message


def test_wrong_field_count_and_foreign_file() -> None:
    trace, *_ = seed_run()
    lines = dump_trace(trace).splitlines(keepends=True)
    lines[5] = lines[5].replace(",", "", 1)
    with pytest.raises(ToolkitError) as err:
        parse_trace("".join(lines), "t.csv")
    assert err.value.problems[0].line == 6
    with pytest.raises(ToolkitError) as err:
        parse_trace("a,b,c\n1,2,3\n", "other.csv")
    assert err.value.problems[0].line == 1


def test_newer_schema_is_refused() -> None:
    text = dump_trace(seed_run()[0]).replace(f"schema_version={TRACE_SCHEMA_VERSION}", "schema_version=9", 1)
    with pytest.raises(ToolkitError, match="newer"):
        parse_trace(text, "t.csv")


def test_steady_window_cuts_ramp_and_drain() -> None:
    trace = _ramp_trace(plateau=(10.0, 30.0))
    w = find_steady_window(trace, 5.0, 38.0, {0: 100.0}, SteadyParams(0.8, 2.0, 5.0))
    assert w.found
    # smoothed activity crosses 0.8 of the peak ~0.6 s before the plateau (3 s ramp, 2 s smoothing)
    assert 8.5 <= w.start_s <= 10.0
    assert 30.0 <= w.end_s <= 31.5


def test_steady_parameters_matter() -> None:
    trace = _ramp_trace(plateau=(10.0, 30.0), ramp_s=8.0)
    loose = find_steady_window(trace, 0.0, 40.0, {0: 100.0}, SteadyParams(0.3, 2.0, 5.0))
    tight = find_steady_window(trace, 0.0, 40.0, {0: 100.0}, SteadyParams(0.95, 2.0, 5.0))
    assert loose.duration_s > tight.duration_s + 5
    short = find_steady_window(trace, 0.0, 40.0, {0: 100.0}, SteadyParams(0.8, 2.0, 60.0))
    assert not short.found and "min_window_s" in short.reason
    assert (short.start_s, short.end_s) == (0.0, 40.0)  # falls back to the whole benchmark window


def test_no_load_has_no_steady_window() -> None:
    rows = [{"t_s": i / 10, "gpu": 0, "power_w": 80.0, "power_limit_w": 700.0, "util_gpu_pct": 0.0}
            for i in range(200)]
    trace = trace_from_rows(rows, {"sample_hz": "10", "source": "synthetic:idle"})
    w = find_steady_window(trace, 5.0, 19.9, {0: 80.0}, SteadyParams())
    assert not w.found and "no load" in w.reason


# --- the steady window from the server's token counter -------------------------------------------------------



def _counter(rate_at, start: float = 10.0, end: float = 40.0, hz: float = 2.0) -> tuple[list[float], list[float]]:
    """Per-second rates between scrapes at `hz` (midpoints), as server_trace.counter_series gives them."""
    n = int((end - start) * hz)
    ts = [start + (i + 0.5) / hz for i in range(n)]
    return ts, [rate_at(t) for t in ts]


def test_counter_window_excludes_the_drain_that_gpu_util_hides() -> None:
    """A plateau at 2,450 tok/s from 12 to 30 s, then the last requests finishing (2,450 -> 50 over 6 s): the
    window ends where the rate falls, not where the benchmark ends."""
    def rate(t: float) -> float:
        if t < 12:
            return 2450 * (t - 10) / 2
        if t < 30:
            return 2450.0 + (60 if int(t * 2) % 3 == 0 else -40)  # scrape jitter
        return max(50.0, 2450 - 400 * (t - 30))

    ts, rs = _counter(rate, end=37.0)
    w = find_counter_window(ts, rs, 10.0, 37.0, SteadyParams())
    assert w is not None and w.found and w.signal == "server token counter"
    assert 12.0 <= w.start_s <= 13.0 and 30.0 <= w.end_s <= 31.0
    inside = [r for t, r in zip(ts, rs, strict=True) if w.start_s <= t <= w.end_s]
    assert min(inside) >= 0.8 * 2450 * 0.98  # no drain (nor ramp) inside


def test_a_late_scrape_on_the_ramp_is_no_edge_of_the_window() -> None:
    """Under load a scrape reads the counter late: the interval before it counts too few tokens and the one after
    too many. On the ramp that split put one sample over the bar (980) with the next one under it (650): the
    window began there, and its first sample inward was below the bar it is held to. It begins where the rate
    holds the bar; the drain's end is trimmed alike."""
    ramp = [600.0, 700.0, 980.0, 650.0]  # 780 and 850 split by a late scrape: 980 + 650
    plateau = [920.0 + (15 if i % 2 else -15) for i in range(40)]
    drain = [650.0, 980.0, 600.0, 300.0]  # and on the drain, 820 and 810
    rs = [400.0, 500.0, *ramp, *plateau, *drain]
    ts = [10.25 + 0.5 * i for i in range(len(rs))]
    w = find_counter_window(ts, rs, 10.0, ts[-1] + 0.25, SteadyParams())
    assert w is not None and w.found
    inside = [(t, r) for t, r in zip(ts, rs, strict=True) if w.start_s <= t <= w.end_s]
    assert inside[0][0] == ts[2 + len(ramp)] and inside[-1][0] == ts[1 + len(ramp) + len(plateau)]
    # Each end and its neighbour hold the bar, so a window rounded to the millisecond keeps an edge at the bar.
    assert all(r >= w.threshold for _, r in inside[:2] + inside[-2:]), (inside[:2], inside[-2:], w.threshold)
    # Before this rule the same trace gave a window that opened on the late scrape's high half.
    assert min(r for t, r in zip(ts, rs, strict=True) if w.start_s <= t <= w.end_s) >= w.threshold


LAB_BASELINE = Path(__file__).resolve().parents[1] / "fixtures" / "probe" / "lab-glm5-baseline"


def _late_read(csv_text: str, row: int, late: float) -> str:
    """The server trace as if its scrape `row` had read the counter `late` (a fraction of the next interval) after
    its own timestamp: the interval before that row gets tokens of the one after it."""
    lines = csv_text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("t_s,"))
    col = lines[first].rstrip("\n").split(",").index("realtime_decode_tokens_total")
    here, after = lines[first + 1 + row].split(","), lines[first + 2 + row].split(",")
    here[col] = str(round(float(here[col]) + late * (float(after[col]) - float(here[col]))))
    lines[first + 1 + row] = ",".join(here)
    return "".join(lines)


def _window_as_the_lab_test_reads_it(csv_text: str, bench: tuple[float, float]
                                     ) -> tuple[SteadyWindow, list[tuple[float, float]], list[float]]:
    """The window from the server trace's counter (as the probe's summary finds it), and the rates inside it and in
    the drain after it, read as the lab test reads summary.json: ends rounded to the millisecond, no allowance."""
    ts, rs = counter_series(read_server_trace(csv_text), "realtime_decode_tokens_total")
    w = find_counter_window(ts, rs, *bench, SteadyParams())
    assert w is not None
    start, end = round(w.start_s, 3), round(w.end_s, 3)
    inside = [(t, r) for t, r in zip(ts, rs, strict=True) if start <= t <= end]
    tail = [r for t, r in zip(ts, rs, strict=True) if end < t <= bench[1]]
    return w, inside, tail


def test_a_recorded_lab_baseline_run_with_a_late_scrape_anywhere_keeps_each_edge_at_the_bar() -> None:
    """glm5-baseline in the lab on the loaded machine, recorded: 64 running and the rest queued, the decode counter
    moving in a forward's 128 tokens, so the rate between 0.5 s scrapes steps between about 500 and 1,150 tok/s
    around a bar near 690. A scrape that reads the counter late splits two intervals into a high rate and a low
    one. The edge rule before this one let the window end on a sample at the bar with the late scrape's low half
    just inside it; summary.json rounds the end to the millisecond (30.7501 s to 30.750), which can leave the end
    sample itself outside, and the lab test then read the low half (463 tok/s against a bar of 691 here, a scrape
    half an interval late at 30.0 s; 650 against 738 in CI) as the window's edge. With a late read at every row of
    the benchmark, a quarter to nine tenths of an interval late, the window's first and last samples (read without
    the lab test's half-millisecond allowance) are at or above the bar, no fall inside outlasts the smoothing width,
    and the drain comes after it: what the lab test checks holds wherever the late scrape lands."""
    text = (LAB_BASELINE / "server_trace.csv").read_text()
    trace = read_server_trace(text)
    run = json.loads((LAB_BASELINE / "run.json").read_text())
    recorded = json.loads((LAB_BASELINE / "summary.json").read_text())
    bench = (float(run["bench_start_s"]), float(run["bench_end_s"]))
    assert all(trace.ok) and not any(trace.counter_reset)

    w, inside, _ = _window_as_the_lab_test_reads_it(text, bench)
    # The replay finds the window the probe recorded.
    assert (round(w.start_s, 3), round(w.end_s, 3)) == (recorded["steady"]["start_s"], recorded["steady"]["end_s"])
    assert round(w.threshold, 3) == recorded["steady_state"]["threshold"]
    # Some scrape pairs inside sit under the bar already (a forward landing either side of a scrape): one pair each.
    assert any(r < w.threshold for _, r in inside)

    rows = [i for i, t in enumerate(trace.t_s[:-1]) if bench[0] <= t <= bench[1]]
    checked = 0
    for row in rows:
        for late in (0.25, 0.5, 0.75, 0.9):
            w, inside, tail = _window_as_the_lab_test_reads_it(_late_read(text, row, late), bench)
            if not w.found:
                assert "too short for a steady state" in w.reason, (row, late, w.reason)
                continue
            checked += 1
            where = (row, late, inside[:2], inside[-2:], w.threshold)
            assert inside[0][1] >= w.threshold and inside[-1][1] >= w.threshold, where
            below_since = None
            for t, r in inside:
                below_since = (below_since if below_since is not None else t) if r < w.threshold else None
                assert below_since is None or t - below_since <= SteadyParams().smooth_s, (where, t)
            assert tail and min(tail) < w.threshold, where
    assert checked >= 3 * len(rows)  # the window found nearly everywhere, not the checks skipped


def test_a_late_scrape_spike_does_not_set_the_plateau_bar() -> None:
    """One scrape that saw two intervals' tokens (2x the rate) must not lift the threshold above the plateau."""
    def rate(t: float) -> float:
        return 5000.0 if abs(t - 20.25) < 0.01 else 1270.0

    ts, rs = _counter(rate)
    w = find_counter_window(ts, rs, 10.0, 40.0, SteadyParams())
    assert w is not None and w.found and w.end_s - w.start_s > 25


def test_a_burst_that_only_drains_has_no_steady_state() -> None:
    """160 prompts at once: the rate falls from the first second (no queue refills the batch): too short."""
    ts, rs = _counter(lambda t: max(0.0, 2500 * (1 - (t - 10) / 7)), end=17.0)
    w = find_counter_window(ts, rs, 10.0, 17.0, SteadyParams())
    assert w is not None and not w.found
    assert "too short for a steady state" in w.reason and w.reason.endswith("using the full benchmark window")
    assert (w.start_s, w.end_s) == (10.0, 17.0)


def test_too_few_scrapes_leave_it_to_the_gpu_rule() -> None:
    assert find_counter_window([10.5, 11.0], [100.0, 100.0], 10.0, 12.0, SteadyParams()) is None
