"""A probe run's records are written and read by the probe store alone, and an old run directory still loads:
records written before the typed provenance (run.json schema 1, a `data_source` sentence only) are migrated on
read, the committed recorded traces load unchanged, and a newer schema than this toolkit knows is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit.adapters.probe_store import (
    RUN_SCHEMA_VERSION,
    load_run,
    read_judged,
    read_run_record,
    read_summary,
    read_verdict,
    write_run_record,
)
from toolkit.app.probe import judge_dir
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.verdict import Verdict
from toolkit.core.provenance import Provenance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "probe"
LAB_RUN = Path(__file__).resolve().parents[1] / "results" / "fixtures" / "run-synthetic-tp8"


def test_an_old_format_run_directory_loads_with_its_provenance_migrated(tmp_path: Path) -> None:
    run_dir = tmp_path / "h200-spin"
    shutil.copytree(FIXTURES / "h200-spin", run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    raw = json.loads((run_dir / "run.json").read_text())
    assert raw["schema_version"] == 1 and "provenance" not in raw  # the old format, as committed

    run = load_run(run_dir)
    assert run.summary is not None and run.verdict is not None
    for record in (run.manifest, run.summary, run.verdict):
        assert record.provenance == Provenance("measured", "NVML")
    manifest, summary, verdict, _topology, _bench = read_judged(run_dir)
    assert {r.provenance.kind for r in (manifest, summary, verdict)} == {"measured"}
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # reading migrates, it never writes

    # Judged again by today's code, the records carry the typed field; run.json is left as recorded.
    judged, again = judge_dir(run_dir, write=True)
    vd = again.to_dict()
    assert judged.to_dict()["provenance"] == vd["provenance"] == {"kind": "measured", "detail": "NVML"}
    assert vd["data_source"] == "measured (NVML)"  # the words, as the probe wrote them then
    assert json.loads((run_dir / "verdict.json").read_text())["provenance"]["kind"] == "measured"
    assert (run_dir / "run.json").read_bytes() == before["run.json"]


def test_an_old_lab_run_is_read_as_a_lab_stand_in_never_as_measured(tmp_path: Path) -> None:
    run = load_run(LAB_RUN)
    assert "provenance" not in json.loads((LAB_RUN / "run.json").read_text())
    assert run.manifest.provenance.kind == "stand-in"
    assert run.summary is not None and run.summary.provenance.kind == "stand-in"


def test_records_are_stamped_with_the_version_this_toolkit_writes_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    write_run_record(tmp_path, RunRecord(provenance=Provenance("replayed", "x")))
    assert json.loads((tmp_path / "run.json").read_text())["schema_version"] == RUN_SCHEMA_VERSION
    assert read_run_record(tmp_path).provenance == Provenance("replayed", "x")
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 2, "provenance": {"kind": "simulated"}}))
    (tmp_path / "trace.csv").write_text("")
    with pytest.raises(ToolkitError, match=r"run\.json: provenance\.kind") as err:
        load_run(tmp_path)
    assert "use one of measured, imported, stand-in, engine-model, replayed" in str(err.value)
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": RUN_SCHEMA_VERSION + 1}))
    (tmp_path / "trace.csv").write_text("")
    with pytest.raises(ToolkitError, match="newer than this toolkit reads"):
        load_run(tmp_path)


# Every committed run directory: the recorded H200 runs (run.json schema 1, no provenance), the lab's, a
# synthetic one without its summary.
RUN_DIRS = sorted(p for p in FIXTURES.iterdir() if (p / "run.json").is_file())


def _holds(got: object, want: object) -> bool:
    """`got` has every key of `want`, with its value (a key added since, at its default, is allowed)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(_holds(got.get(k), v) for k, v in want.items())
    return got == want


@pytest.mark.parametrize("run_dir", RUN_DIRS, ids=lambda p: p.name)
def test_every_committed_run_directory_loads_as_its_types_and_loses_nothing(run_dir: Path) -> None:
    raw = {name: json.loads((run_dir / name).read_text()) for name in ("run.json", "summary.json", "verdict.json")
           if (run_dir / name).is_file()}
    run = read_run_record(run_dir)
    summary, verdict = read_summary(run_dir), read_verdict(run_dir)
    assert isinstance(run, RunRecord) and run.provenance.kind in ("measured", "stand-in", "replayed")
    assert (summary is None) == ("summary.json" not in raw) and (verdict is None) == ("verdict.json" not in raw)
    # Written back, each typed record holds every key the file had, with its value: the types drop nothing.
    # (The verdict's timeline keeps its figures, not the judgements they were made from: Verdict.from_dict.)
    for name, record in (("run.json", run), ("summary.json", summary), ("verdict.json", verdict)):
        if record is None:
            continue
        again = record.to_dict()
        lost = {k for k, v in raw[name].items()
                if k not in ("schema_version", "timeline") and not _holds(again.get(k), v)}
        assert not lost, f"{run_dir.name}/{name}: {sorted(lost)}"
        assert again["provenance"]["kind"] == run.provenance.kind  # one provenance for the run's three records
    if (run_dir / "trace.csv").is_file():  # the whole run, as the report and the sweep's runner load it
        assert load_run(run_dir).manifest == run


def test_a_record_s_keys_this_toolkit_does_not_type_are_kept_on_rewrite(tmp_path: Path) -> None:
    """A key a later probe adds (a host's clock offsets) survives a rewrite by this toolkit (`status: failed`)."""
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 2, "status": "running",
                                                   "clocks": [{"host": "a", "offset_s": 0.002}]}))
    run = read_run_record(tmp_path)
    write_run_record(tmp_path, RunRecord.from_dict({**run.to_dict(), "status": "failed"}))
    again = json.loads((tmp_path / "run.json").read_text())
    assert again["clocks"] == [{"host": "a", "offset_s": 0.002}] and again["status"] == "failed"


def test_summary_and_verdict_round_trip_through_their_types() -> None:
    summary = read_summary(FIXTURES / "h200i-compute")
    verdict = read_verdict(FIXTURES / "h200i-compute")
    assert summary is not None and verdict is not None
    assert Summary.from_dict(summary.to_dict()) == summary
    assert Verdict.from_dict(verdict.to_dict()).to_dict() == verdict.to_dict()
    raw = json.loads((FIXTURES / "h200i-compute" / "summary.json").read_text())
    assert summary.steady.throughput.output_tok_per_s == raw["steady"]["throughput"]["output_tok_per_s"] > 0
    assert summary.steady_state.found is raw["steady_state"]["found"] is True
