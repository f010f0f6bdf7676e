"""The numpy path (core/probe/columnar.py) against the list path on every committed probe recording: the same
summary (to float rounding) and the same verdict. The list path is what runs where numpy is missing (the GPU
box's python may lack it); columnar.list_path() forces it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from toolkit.adapters.probe_store import load_run
from toolkit.core.probe import columnar
from toolkit.core.probe.judge import judge_run
from toolkit.core.probe.trace import dump_trace, parse_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "probe"
RUNS = sorted(p.parent.name for p in FIX.glob("*/trace.csv"))


def _close(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _close(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        # values are rounded to 2-3 decimals: summation order may flip the last digit
        return [] if math.isclose(a, b, rel_tol=1e-6, abs_tol=0.011) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.skipif(columnar.np is None, reason="numpy is not installed")
@pytest.mark.parametrize("name", RUNS)
def test_numpy_and_list_paths_agree_on_every_recording(name: str) -> None:
    with columnar.list_path():
        slow_run = load_run(FIX / name)
        assert not isinstance(slow_run.trace.gpus[min(slow_run.trace.gpus)].values, columnar.ColumnValues)
        slow_summary, slow_verdict = judge_run(slow_run)
    fast_run = load_run(FIX / name)
    fast_summary, fast_verdict = judge_run(fast_run)
    if "interrupted" not in name:  # a .partial trace of a cut run may end mid-line: the list path reads it
        assert isinstance(fast_run.trace.gpus[min(fast_run.trace.gpus)].values, columnar.ColumnValues)
    assert _close(slow_summary, fast_summary) == []
    assert fast_verdict.to_dict() == slow_verdict.to_dict() or _close(fast_verdict.to_dict(),
                                                                        slow_verdict.to_dict()) == []
    assert fast_run.trace.gpus == slow_run.trace.gpus  # the lists a reader sees are the same


@pytest.mark.skipif(columnar.np is None, reason="numpy is not installed")
def test_a_column_edited_as_a_list_is_what_the_numpy_path_judges() -> None:
    run = load_run(FIX / "h200c-compute-10hz")
    s = run.trace.gpus[0]
    power = s.values["power_w"]  # materialised as a list: callers may edit it
    for i in range(len(power)):
        power[i] = 1.0
    summary, _ = judge_run(run)
    assert summary.full.gpus["0"]["power_w"]["mean"] == 1.0


@pytest.mark.skipif(columnar.np is None, reason="numpy is not installed")
def test_malformed_text_falls_back_to_the_list_path_and_names_the_line() -> None:
    text = (FIX / "h200e-spin" / "trace.csv").read_text()
    lines = text.split("\n")
    lines[40] = lines[40].replace(",", ",x", 1)
    from toolkit.core.errors import ToolkitError

    with pytest.raises(ToolkitError) as err:
        parse_trace("\n".join(lines), "t.csv")
    assert "t.csv:41: field gpu is 'x0'" in str(err.value)


@pytest.mark.skipif(columnar.np is None, reason="numpy is not installed")
def test_error_cells_survive_the_numpy_parse() -> None:
    text = dump_trace(load_run(FIX / "h200e-launch").trace)
    lines = text.split("\n")
    lines[10] = lines[10] + "GPU is lost"
    trace = parse_trace("\n".join(lines), "t.csv")
    assert isinstance(trace.gpus[0].values, columnar.ColumnValues)
    assert trace.gpus[0].errors[8] == "GPU is lost" and sum(map(bool, trace.gpus[0].errors)) == 1


@pytest.mark.skipif(columnar.np is None, reason="numpy is not installed")
def test_columns_empty_on_every_row_are_cut_not_parsed_with_the_same_values() -> None:
    # The seed-shaped synthetic trace has no GPM and no driver samples: its rows end in empty cells, which the
    # numpy path cuts before parsing. Rows with more empty cells than the first, and a malformed row after the
    # cut, must read as the list path reads them.
    text = dump_trace(load_run(FIX / "seed-synthetic-8gpu").trace)
    lines = text.split("\n")
    body = [i for i, line in enumerate(lines) if line[:1].isdigit()]
    assert lines[body[0]].endswith(",,,,")  # the case under test: empty columns at the end
    cells = lines[body[5]].split(",")
    k = len(cells) // 3
    cells[-k:] = [""] * k  # a row emptier than the first: its last numbers are gone
    lines[body[5]] = ",".join(cells)
    edited = "\n".join(lines)
    with columnar.list_path():
        slow = parse_trace(edited, "t.csv")
    fast = parse_trace(edited, "t.csv")
    assert isinstance(fast.gpus[0].values, columnar.ColumnValues)  # the numpy path took it
    for g, s in slow.gpus.items():
        for c in s.values:
            assert fast.gpus[g].values[c] == s.values[c], (g, c)
    short = lines.copy()
    short[body[7]] = short[body[7]][: short[body[7]].rindex(",", 0, short[body[7]].rstrip(",").rindex(","))] + ","
    from toolkit.core.errors import ToolkitError

    with pytest.raises(ToolkitError) as err:  # one cell short: the list path names the line
        parse_trace("\n".join(short), "t.csv")
    assert f"t.csv:{body[7] + 1}:" in str(err.value)
