"""Like with like: figures of different provenance, workload or throughput kind are shown apart with the reason,
never set against each other as a ranking or a percentage (toolkit.core.results.comparable, compare,
profile_diff; `toolkit profile diff` and `toolkit results compare` through the real CLI)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.results.conftest import REPO, Scratch
from toolkit.cli.main import main
from toolkit.core.provenance import mark
from toolkit.core.results.comparable import differences, workload
from toolkit.core.results.compare import rank_groups, result_deltas
from toolkit.core.results.model import (
    BenchSettings,
    LabNote,
    Rates,
    ResultsEntry,
    SteadyRates,
    Throughput,
)

SEED_BENCH = BenchSettings(backend="sglang-oai", dataset="random", num_prompts=1024, input_len=256, output_len=128,
                           range_ratio=0.0, request_rate="inf")
LAB_BENCH = SEED_BENCH.model_copy(update={"num_prompts": 160})


def _e(run_id: str, *, full: float | None = None, steady: float | None = None, source: str = "toolkit",
       lab: str | None = None, bench: BenchSettings = SEED_BENCH, no_steady: str | None = None) -> ResultsEntry:
    return ResultsEntry(
        run_id=run_id, source=source, date="2026-12-01", bench=bench,  # type: ignore[arg-type]
        lab=LabNote(kind=lab, note="simulated GPUs") if lab else None,  # type: ignore[arg-type]
        throughput=Throughput(full_run=Rates(output_tok_per_s=full),
                              steady_state=SteadyRates(output_tok_per_s=steady) if steady is not None else None,
                              no_steady_state=no_steady))


IMPORTED = _e("manual-1", full=880.0, source="manual")
LAB = _e("probe-1", full=1484.6, steady=1517.3, lab="stand-in", bench=LAB_BENCH)


def test_provenance_kinds() -> None:
    assert IMPORTED.provenance().kind == "imported"
    assert LAB.provenance().kind == "stand-in" and mark(LAB.provenance()) == "LAB STAND-IN"
    assert _e("r", full=1.0, lab="replay").provenance().kind == "replayed"
    assert _e("r", full=1.0).provenance().kind == "measured"
    # Real GPUs under a load script: measured, with the note that says what its "tokens" are.
    load = _e("r", full=1.0).model_copy(update={"lab": LabNote(kind="load", note="its tokens are loop iterations")})
    assert load.provenance().kind == "measured" and "loop" in (load.provenance().detail or "")


def test_lab_against_imported_is_no_percentage() -> None:
    why = differences(IMPORTED, LAB)
    assert why[0] == "imported from notes vs lab stand-in"
    assert "prompts asked 1,024 vs 160" in why[1]
    assert result_deltas(IMPORTED, LAB) == []


def test_different_workloads_of_one_provenance_are_not_compared() -> None:
    a, b = _e("a", full=3000.0), _e("b", full=3100.0, bench=SEED_BENCH.model_copy(update={"max_concurrency": 128}))
    assert differences(a, b) == ["workload: concurrency cap none vs 128"]
    assert result_deltas(a, b) == []
    c = _e("c", full=3100.0, bench=SEED_BENCH.model_copy(update={"range_ratio": None}))
    assert differences(a, c) == ["workload: length range ratio 0 vs unknown"]


def test_steady_against_full_run_falls_back_to_full_run_for_both() -> None:
    a, b = _e("a", full=3000.0), _e("b", full=3300.0, steady=3600.0)
    (d,) = result_deltas(a, b)
    assert d.render() == "output throughput, full-run (tok/s): 3,000 -> 3,300 (+10 %)"
    # Only a steady rate on one side and only a full-run rate on the other: nothing of one kind to compare.
    only_steady = _e("s", steady=3600.0)
    assert differences(a, only_steady) == ["no throughput of the same kind: full-run vs steady-state"]
    assert result_deltas(a, only_steady) == []


def test_a_run_without_a_steady_state_is_never_ranked_as_steady() -> None:
    old = _e("old", full=1484.6, lab="stand-in", bench=LAB_BENCH).model_copy(update={"throughput": Throughput(
        full_run=Rates(output_tok_per_s=1484.6), steady_state=SteadyRates(
            output_tok_per_s=1517.3, source="server counter over the whole benchmark window (no steady window "
            "found)"))})
    assert old.output_tok_per_s() == (1484.6, "full")  # recorded before no_steady_state: its source says so
    new = _e("new", full=1484.6, lab="stand-in", bench=LAB_BENCH, no_steady="plateau 1.5 s < 5 s")
    assert new.output_tok_per_s() == (1484.6, "full")


def test_rank_groups_keep_unlike_entries_apart_with_the_reason() -> None:
    rows = [("glm5-tp8", LAB, None), ("glm5-tp8", _e("manual-1", full=3740.0, source="manual"), None),
            ("glm5-baseline", IMPORTED, None)]
    groups = rank_groups(rows)
    assert [g.provenance.kind for g in groups] == ["imported", "stand-in"]
    imported, lab = groups
    assert [(r.profile, r.rank_throughput, r.throughput_kind) for r in imported.rows] == [
        ("glm5-tp8", 1, "full"), ("glm5-baseline", 2, "full")]
    assert imported.apart is None
    assert [(r.profile, r.rank_throughput, r.throughput_kind) for r in lab.rows] == [("glm5-tp8", 1, "steady")]
    assert lab.apart == "imported from notes vs lab stand-in; workload: prompts asked 1,024 vs 160"


def _scratch_with_lab_entry(tmp_path: Path) -> Path:
    """The shipped profiles plus one lab entry in glm5-tp8 (the synthetic stand-in run, 1,024 prompts)."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    run = tmp_path / "runs" / "run-synthetic-tp8"
    shutil.copytree(REPO / "tests" / "results" / "fixtures" / "run-synthetic-tp8", run)
    assert main(["results", "record", str(run), "--profile", "glm5-tp8", "--profiles-dir",
                 str(tmp_path / "profiles")]) == 0
    return tmp_path / "profiles"


def test_profile_diff_shows_the_lab_entry_apart_and_never_as_a_percentage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = _scratch_with_lab_entry(tmp_path)
    capsys.readouterr()
    assert main(["profile", "diff", "glm5-baseline", "glm5-tp8", "--profiles-dir", str(profiles)]) == 0
    out = capsys.readouterr().out
    results = out[out.index("results (glm5-baseline -> glm5-tp8"):]
    assert "output throughput, full-run (tok/s): 880 -> 3,740 (+325 %)" in results  # imported against imported
    apart = results[results.index("shown apart"):]
    assert "glm5-tp8: lab stand-in, 1,024 prompts" in apart and "3,554 tok/s steady-state" in apart
    assert "imported from notes vs lab stand-in" in apart
    # The only percentage is the imported pair's.
    assert re.findall(r"\([+-]\d+ %\)", results) == ["(+325 %)"]


def test_results_compare_ranks_each_group_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = _scratch_with_lab_entry(tmp_path)
    capsys.readouterr()
    assert main(["results", "compare", "all", "--json", "--profiles-dir", str(profiles)]) == 0
    out = json.loads(capsys.readouterr().out)["data"]
    groups = out["groups"]
    assert [(g["provenance"], g["throughput_kind"]) for g in groups] == [("imported", "full"), ("stand-in", "steady")]
    assert [(r["profile"], r["output_tok_per_s"], r["rank_throughput"]) for r in groups[0]["ranked"]] == [
        ("glm5-tp8", 3740.0, 1), ("glm5-baseline", 880.0, 2)]
    assert [(r["profile"], r["rank_throughput"]) for r in groups[1]["ranked"]] == [("glm5-tp8", 1)]
    # the synthetic run fixes its lengths (range ratio 1): the workload differs too
    assert groups[1]["apart"] == "imported from notes vs lab stand-in; workload: length range ratio 0 vs 1"
    assert out["no_results"] == ["glm5-2node", "glm5-ep8", "glm5-tp4-pp2", "glm5-tp8-0.5.23", "glm5-tp8-x2"]


@pytest.mark.parametrize("width", [80, 100])
def test_compare_never_cuts_a_figure_or_a_mark(tmp_path: Path, width: int, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """At 80 and 100 columns (a terminal) and piped (no terminal: as wide as the table needs), every figure and
    every provenance mark is whole."""
    profiles = _scratch_with_lab_entry(tmp_path)
    for terminal in (True, False):
        monkeypatch.setenv("COLUMNS", str(width))
        monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self, on=terminal: on))
        capsys.readouterr()
        assert main(["results", "compare", "all", "--profiles-dir", str(profiles)]) == 0
        out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # rich's colours on a terminal
        for whole in ("3,740", "880", "3,554", "imported", "LAB", "1.795"):
            assert whole in out, f"{whole!r} cut at {width} columns (terminal={terminal}):\n{out}"
        assert "…" not in out
        if terminal:
            assert max(len(line) for line in out.splitlines()) <= width


def test_workload_text() -> None:
    w = workload(_e("x", full=1.0, bench=LAB_BENCH.model_copy(update={"failed": 6, "num_prompts": 154,
                                                                      "max_concurrency": 128})))
    assert w.text() == "160 prompts (154 completed, 6 failed), random 256 in / 128 out (range 0), rate inf, " \
        "concurrency 128"
    assert w.prompts_asked == 160


def test_the_shipped_imported_entries_can_go_stale(scratch: Scratch, capsys: pytest.CaptureFixture[str]) -> None:
    """The imported figures carry the spec hash of the profile that describes their setup: changing the spec
    marks them stale like any measured entry."""
    path = scratch.profiles / "glm5-tp8.yaml"
    capsys.readouterr()
    assert main(["results", "compare", "glm5-tp8", "--json", "--profiles-dir", str(scratch.profiles)]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["groups"][0]["ranked"][0]["stale"] is False
    path.write_text(path.read_text().replace("max_running_requests: 1024", "max_running_requests: 512", 1))
    assert main(["results", "compare", "glm5-tp8", "--json", "--profiles-dir", str(scratch.profiles)]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["groups"][0]["ranked"][0]["stale"] is True
