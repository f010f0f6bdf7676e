"""Trace format (round trip, bad input named by file and line) and the steady-state rule."""

from __future__ import annotations

import pytest

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.series import COLUMNS
from toolkit.core.probe.steady import SteadyParams, find_steady_window
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
