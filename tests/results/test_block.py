"""The pure side: block parse/render, migration, keep-last, ranking and the profile-diff deltas."""

from __future__ import annotations

import pytest

from tests.results.conftest import REPO
from toolkit.cli.main import main
from toolkit.core.errors import ToolkitError
from toolkit.core.results.block import add_entry, empty_block, parse_block, render_block, split_results_block
from toolkit.core.results.build import rnd, sig
from toolkit.core.results.compare import rank, result_deltas
from toolkit.core.results.model import Energy, Rates, ResultsEntry, SteadyRates, Throughput


def _entry(run_id: str, date: str, out: float | None = None, steady: float | None = None,
           tpj: float | None = None, source: str = "toolkit", spec: str | None = "h1") -> ResultsEntry:
    return ResultsEntry(
        run_id=run_id, source=source, date=date, spec_hash=spec,  # type: ignore[arg-type]
        throughput=Throughput(full_run=Rates(output_tok_per_s=out),
                              steady_state=SteadyRates(output_tok_per_s=steady) if steady is not None else None),
        energy=Energy(output_tok_per_j=tpj) if tpj is not None else None,
    )


FIXTURES = REPO / "tests" / "results" / "fixtures"


def _repo_block(name: str) -> str:
    return split_results_block((REPO / "profiles" / f"{name}.yaml").read_text())[1] or ""


def _v1_block(name: str) -> str:
    """The block as the profiles importer first wrote it (schema 1), kept as a fixture."""
    return (FIXTURES / f"{name}.v1-block.yaml").read_text()


def test_v1_manual_entries_migrate_to_the_current_schema() -> None:
    assert "schema_version: 1" in _v1_block("glm5-tp8")
    block = parse_block(_v1_block("glm5-tp8"), file="glm5-tp8.yaml")
    assert block.schema_version == 2
    (e,) = block.entries
    assert (e.source, e.run_id) == ("manual", "manual-1")
    assert e.throughput.full_run.output_tok_per_s == 3740
    assert e.throughput.peak_output_tok_per_s == 3945
    assert e.power is not None and e.power.mean_w == 250 and e.power.idle_w == 87
    assert [g.mean_w for g in e.power.per_gpu][:2] == [256.54, 248.95]
    assert e.power.per_gpu[0].mean_of_limit_pct == 42.8  # 256.54 of 600 W
    assert e.verdict is not None and e.verdict.class_ == "busy-but-waiting"
    assert e.bench.input_len == 256 and e.bench.request_rate == "inf"


# What the imported entries gained after the migration: the stamp that lets them go stale (docs/story.md).
STAMP_ADDED = {"date", "spec_hash", "sglang_version", "note"}


@pytest.mark.parametrize("name", ["glm5-baseline", "glm5-tp8"])
def test_the_shipped_blocks_are_current_and_render_stably(name: str) -> None:
    # `toolkit results migrate all` wrote them from the v1 fixture; the imported entries then gained their stamp
    # (date, spec hash, SGLang, GPU model, the story's range ratio) and nothing else changed.
    migrated = parse_block(_v1_block(name), file=name)
    text = _repo_block(name)
    shipped = parse_block(text, file=name)
    assert render_block(shipped) == text
    assert text.startswith("results:\n  schema_version: 2\n  keep_last: 10\n")
    for old, new in zip(migrated.entries, shipped.entries, strict=True):
        a = old.model_dump(exclude=STAMP_ADDED | {"gpu", "bench"})
        b = new.model_dump(exclude=STAMP_ADDED | {"gpu", "bench"})
        assert a == b
        assert new.date == "2026-02" and new.spec_hash and new.sglang_version == "0.5.9"
        assert new.gpu.model == "NVIDIA RTX PRO 6000 Blackwell" and new.bench.range_ratio == 0.0
        assert new.bench.model_dump(exclude={"range_ratio"}) == old.bench.model_dump(exclude={"range_ratio"})
        assert "seed" not in (new.note or "")


def test_unknown_field_in_an_entry_is_named_with_its_line() -> None:
    text = render_block(add_entry(empty_block(), _entry("r1", "2026-01-01T00:00:00Z", 100.0)))
    text = text.replace("    source: toolkit\n", "    source: toolkit\n    tokens_per_s: 5\n")
    with pytest.raises(ToolkitError) as err:
        parse_block(text, file="p.yaml", first_line=41)
    msg = str(err.value)
    assert "results.entries.0.tokens_per_s" in msg
    # line 7 of the block text (after the 5 header lines and run_id/source) + 40 lines above it
    assert "p.yaml:47:" in msg


def test_a_block_that_is_not_a_results_mapping_is_refused() -> None:
    with pytest.raises(ToolkitError, match="exactly one mapping"):
        parse_block("- just a list\n", file="p.yaml", first_line=10)


def test_add_entry_replaces_the_same_run_in_place_and_keeps_date_order() -> None:
    b = empty_block()
    b = add_entry(b, _entry("b", "2026-01-02T00:00:00Z", 2.0))
    b = add_entry(b, _entry("a", "2026-01-01T00:00:00Z", 1.0))
    b = add_entry(b, _entry("b", "2026-01-02T00:00:00Z", 3.0))
    assert [(e.run_id, e.throughput.full_run.output_tok_per_s) for e in b.entries] == [("a", 1.0), ("b", 3.0)]


def test_keep_last_never_drops_manual_history() -> None:
    b = add_entry(empty_block(keep_last=1), _entry("m", "2020-01-01", 1.0, source="manual"))
    for i in range(3):
        b = add_entry(b, _entry(f"r{i}", f"2026-01-0{i + 1}", 1.0))
    assert [e.run_id for e in b.entries] == ["m", "r2"]


def test_rounding_by_unit() -> None:
    assert rnd(3740.04999, 1) == 3740.0
    assert rnd(-0.0001, 1) == 0.0
    assert rnd(float("nan"), 1) is None
    assert sig(0.557234) == 0.5572 and sig(0.00512345) == 0.005123 and sig(1234.5678) == 1235.0


def test_rank_steady_first_then_tokens_per_joule_with_ties() -> None:
    rows = [
        ("slow", _entry("1", "d", steady=100.0, tpj=3.0), "h1"),
        ("fast", _entry("2", "d", steady=300.0, tpj=1.0), "h1"),
        ("tie", _entry("3", "d", steady=300.0, tpj=2.0), "h2-old"),
        ("none", _entry("4", "d"), "h1"),
    ]
    ranked = rank([(n, e, "h1") for n, e, _ in rows])
    assert [r.profile for r in ranked] == ["tie", "fast", "slow", "none"]
    assert [r.rank_throughput for r in ranked] == [1, 1, 3, None]
    assert [r.rank_tok_per_j for r in ranked] == [2, 3, 1, None]
    assert {r.throughput_kind for r in ranked} == {"steady"}
    stale = rank([("x", _entry("5", "d", steady=1.0, spec="old"), "new")])
    assert stale[0].stale


def test_deltas_compare_like_with_like() -> None:
    a = _entry("a", "d", out=880.0)
    b = _entry("b", "d", out=3740.0, steady=3900.0)
    (d,) = result_deltas(a, b)  # one side has no steady window: both full-run
    assert d.name.startswith("output throughput, full-run") and d.change_pct == 325.0
    assert d.render() == "output throughput, full-run (tok/s): 880 -> 3,740 (+325 %)"


def test_profile_diff_shows_the_imported_result_deltas(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "diff", "glm5-baseline", "glm5-tp8", "--profiles-dir", str(REPO / "profiles")]) == 0
    out = capsys.readouterr().out
    assert "imported from notes, 1,024 prompts, random 256 in / 128 out (range 0), rate inf" in out
    assert "output throughput, full-run (tok/s): 880 -> 3,740 (+325 %)" in out
    assert "verdict (changed): - -> busy-but-waiting" in out


def test_the_same_run_id_from_two_hosts_is_two_entries() -> None:
    a = _entry("probe-1", "2026-01-01T00:00:00Z", 1.0).model_copy(update={"host": "ct1"})
    b = _entry("probe-1", "2026-01-01T00:00:00Z", 2.0).model_copy(update={"host": "ct2"})
    block = add_entry(add_entry(empty_block(), a), b)
    assert [e.host for e in block.entries] == ["ct1", "ct2"]
    block = add_entry(block, a.model_copy(update={"throughput": b.throughput}))
    assert [(e.host, e.throughput.full_run.output_tok_per_s) for e in block.entries] == [("ct1", 2.0), ("ct2", 2.0)]
