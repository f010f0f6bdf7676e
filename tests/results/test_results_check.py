"""`results check`: the newest configuration against a reference under the upgrade's rules; exit 1 on a
significant regression (pure on entries, and the command on a profile whose block records one)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.cli.test_json_contract import SCHEMAS, _closed
from toolkit.cli.main import main
from toolkit.core.errors import ToolkitError
from toolkit.core.results.check import check_entries
from toolkit.core.results.model import Gate, Rates, ResultsEntry, Throughput
from toolkit.core.results.record import with_entry

from .conftest import Scratch


def _entry(i: int, version: str, tok_per_s: float, gate: Gate | None = None) -> ResultsEntry:
    return ResultsEntry(run_id=f"run-{i:02d}", source="toolkit", date=f"2026-12-06T05:{i:02d}:00Z",
                        spec_hash="a" * 64, sglang_version=version,
                        throughput=Throughput(full_run=Rates(output_tok_per_s=tok_per_s)), gate=gate)


SCHEMA = SCHEMAS / "results.check.schema.json"
OLD = [1000.0, 1012.0, 990.0, 1005.0]


def test_a_significant_loss_is_a_regression_a_change_inside_noise_is_not() -> None:
    slower = [_entry(i, "0.5.22", v) for i, v in enumerate(OLD)] + [
        _entry(10 + i, "0.5.23", v) for i, v in enumerate([850.0, 861.0, 842.0])]
    r = check_entries(slower)
    assert r.regression and r.change is not None and r.change.high < 0 < -r.change.low
    assert [e.run_id for e in r.reference] == ["run-00", "run-01", "run-02", "run-03"]
    assert "SGLang 0.5.23" in r.text() and "significant loss" in r.text()
    same = [_entry(i, "0.5.22", v) for i, v in enumerate(OLD)] + [_entry(10, "0.5.23", 1003.0)]
    r = check_entries(same)
    assert not r.regression and r.change is not None and r.change.low < 0 < r.change.high
    # The newest run of an unchanged configuration against the runs before it: 20 % down is a regression.
    assert check_entries([_entry(i, "0.5.22", v) for i, v in enumerate([*OLD, 800.0])]).regression


def test_against_names_a_run_or_the_last_promoted_release_and_refuses_what_is_not_there() -> None:
    gate = Gate(decision="promoted", side="new", from_version="0.5.21", to_version="0.5.22", objective="throughput",
                pairs=4)
    entries = ([_entry(i, "0.5.21", 700.0 + i) for i in range(3)]
               + [_entry(5 + i, "0.5.22", v, gate) for i, v in enumerate(OLD)]
               + [_entry(20 + i, "0.5.23", v) for i, v in enumerate([990.0, 1001.0])])
    promoted = check_entries(entries, against="last-promoted")
    assert {e.sglang_version for e in promoted.reference} == {"0.5.22"} and not promoted.regression
    # Against 0.5.21 (a run of it named) the newest is a significant gain, not a regression.
    gain = check_entries(entries, against="run-00")
    assert gain.decision.outcome == "gain" and {e.sglang_version for e in gain.reference} == {"0.5.21"}
    with pytest.raises(ToolkitError, match="no entry 'nope'"):
        check_entries(entries, against="nope")
    with pytest.raises(ToolkitError, match="no comparable entry of a promoted upgrade"):
        check_entries(entries[:3] + entries[-2:], against="last-promoted")
    with pytest.raises(ToolkitError, match="nothing to check against"):
        check_entries(entries[:1])


def test_the_command_exits_1_on_a_recorded_regression_and_prints_the_interval(
        scratch: Scratch, capsys: pytest.CaptureFixture[str]) -> None:
    path: Path = scratch.profiles / "glm5-tp8.yaml"
    for i, v in enumerate(OLD):
        path.write_text(with_entry(path.read_text(), _entry(i, "0.5.22", v), file=str(path)).text)
    args = ["results", "check", "glm5-tp8", "--profiles-dir", str(scratch.profiles)]
    path.write_text(with_entry(path.read_text(), _entry(10, "0.5.23", 1004.0), file=str(path)).text)
    assert main(args) == 0
    assert "inside +-5 %" in capsys.readouterr().out
    # The next release, 15 % slower, twice, against 0.5.22's four runs.
    for i, v in enumerate([850.0, 861.0]):
        path.write_text(with_entry(path.read_text(), _entry(11 + i, "0.5.24", v), file=str(path)).text)
    args += ["--against", "run-00"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert out.startswith("REGRESSION throughput: SGLang 0.5.24") and "significant loss" in out and "% [" in out
    assert main([*args, "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    # The data as docs/schemas/results.check.schema.json describes it, and no key it does not.
    jsonschema.Draft202012Validator(_closed(json.loads(SCHEMA.read_text()))).validate(printed)
    got = printed["data"]
    assert got["regression"] is True and got["change"]["high"] < 0
    assert got["candidate_runs"] == ["run-11", "run-12"] and len(got["reference_runs"]) == 4
