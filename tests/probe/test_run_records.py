"""A probe run's records are written and read by the probe store alone, and an old run directory still loads:
records written before the typed provenance (run.json schema 1, a `data_source` sentence only) are migrated on
read, the committed recorded traces load unchanged, and a newer schema than this toolkit knows is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit.adapters.probe_store import RUN_SCHEMA_VERSION, load_run, read_judged, write_record
from toolkit.app.probe import judge_dir
from toolkit.core.errors import ToolkitError
from toolkit.core.provenance import Provenance, of_record

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
        assert Provenance.from_dict(record["provenance"]) == Provenance("measured", "NVML")
    manifest, summary, verdict, _topology, _bench = read_judged(run_dir)
    assert {of_record(r).kind for r in (manifest, summary, verdict)} == {"measured"}
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before  # reading migrates, it never writes

    # Judged again by today's code, the records carry the typed field; run.json is left as recorded.
    summary, vd = judge_dir(run_dir, write=True)
    assert summary["provenance"] == vd["provenance"] == {"kind": "measured", "detail": "NVML"}
    assert vd["data_source"] == "measured (NVML)"  # the words, as the probe wrote them then
    assert json.loads((run_dir / "verdict.json").read_text())["provenance"]["kind"] == "measured"
    assert (run_dir / "run.json").read_bytes() == before["run.json"]


def test_an_old_lab_run_is_read_as_a_lab_stand_in_never_as_measured(tmp_path: Path) -> None:
    run = load_run(LAB_RUN)
    assert "provenance" not in json.loads((LAB_RUN / "run.json").read_text())
    assert of_record(run.manifest).kind == "stand-in"
    assert run.summary is not None and of_record(run.summary).kind == "stand-in"


def test_records_are_stamped_with_the_version_this_toolkit_writes_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    write_record(tmp_path, "run.json", {"schema_version": 1, "provenance": Provenance("replayed", "x").to_dict()})
    assert json.loads((tmp_path / "run.json").read_text())["schema_version"] == RUN_SCHEMA_VERSION
    with pytest.raises(ValueError, match=r"bench\.json is not a probe run's record"):
        write_record(tmp_path, "bench.json", {})
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 2, "provenance": {"kind": "simulated"}}))
    (tmp_path / "trace.csv").write_text("")
    with pytest.raises(ToolkitError, match=r"run\.json: provenance\.kind") as err:
        load_run(tmp_path)
    assert "use one of measured, imported, stand-in, engine-model, replayed" in str(err.value)
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": RUN_SCHEMA_VERSION + 1}))
    (tmp_path / "trace.csv").write_text("")
    with pytest.raises(ToolkitError, match="newer than this toolkit reads"):
        load_run(tmp_path)
