"""benchmarks/probe_confusion.py: every labelled recording gets its class, the labels are the tests' own, and
docs/probe.md shows exactly what the script prints."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from . import test_h200_fixtures, test_h200_intervals

ROOT = Path(__file__).resolve().parents[2]


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("probe_confusion", ROOT / "benchmarks" / "probe_confusion.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_labels_are_the_replay_tests_expectations() -> None:
    labels = json.loads((ROOT / "tests" / "fixtures" / "probe" / "labels.json").read_text())["labels"]
    for name, cls in {**test_h200_fixtures.EXPECTED, **test_h200_intervals.EXPECTED}.items():
        assert labels[name] == cls, name
    assert labels["seed-synthetic-8gpu"] == "busy-but-waiting"


def test_every_labelled_run_is_right_and_the_doc_holds_the_table() -> None:
    mod = _script()
    table = mod.rows()
    assert [r["run"] for r in table if not r["ok"]] == []
    assert mod.markdown(table) in (ROOT / "docs" / "probe.md").read_text()
