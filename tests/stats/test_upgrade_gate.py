"""The upgrade's gate (toolkit.core.upgrade.gate): pairs in, a verdict out. Pure: milliseconds."""

from __future__ import annotations

import random

from toolkit.core import stats
from toolkit.core.upgrade import PROMOTED, REFUSED, gate


def _alternate(effect: float, seed: int, cv: float = 0.02, max_pairs: int = 10,
               accept_equal: bool = False) -> tuple[list[float], list[float], object]:
    rng = random.Random(seed)
    old: list[float] = []
    new: list[float] = []
    while True:
        old.append(1000.0 * (1 + rng.gauss(0, cv)))
        new.append(1000.0 * (1 + effect) * (1 + rng.gauss(0, cv)))
        v = gate(old, new, max_pairs=max_pairs, accept_equal=accept_equal)
        if v.done:
            return old, new, v


def test_ten_percent_faster_is_promoted_fifteen_percent_slower_refused_each_in_a_few_pairs() -> None:
    _, _, up = _alternate(0.10, seed=3)
    assert up.final() == PROMOTED and up.outcome == stats.GAIN and 3 <= up.pairs <= 6  # type: ignore[attr-defined]
    _, _, down = _alternate(-0.15, seed=3)
    assert down.final() == REFUSED and down.outcome == stats.LOSS and down.pairs == 3  # type: ignore[attr-defined]


def test_nothing_is_decided_before_three_pairs_and_a_spent_budget_keeps_the_old_release() -> None:
    early = gate([1000.0, 1001.0], [1500.0, 1490.0])
    assert not early.done and early.outcome == stats.UNDECIDED
    # A 5 % noise with 3 pairs of budget at a 4 % effect: undecided, and the old release stays.
    spent = gate([1000.0, 1060.0, 950.0], [1090.0, 1040.0, 1000.0], max_pairs=3)
    assert spent.done and spent.final() == REFUSED and "budget of 3 pairs is spent" in spent.decision.text


def test_equal_is_promoted_only_when_accepted_and_j_per_token_is_turned_so_lower_is_better() -> None:
    old, new = [1000.0, 1003.0, 998.0, 1001.0], [1001.0, 1002.0, 999.0, 1000.0]
    assert gate(old, new).outcome == stats.EQUAL and gate(old, new).final() == REFUSED
    assert gate(old, new, accept_equal=True).final() == PROMOTED
    # J/token 10 % lower is a gain.
    j_old, j_new = [0.50, 0.51, 0.49, 0.50], [0.45, 0.455, 0.447, 0.452]
    assert gate(j_old, j_new, objective="j-per-token").outcome == stats.GAIN
    assert gate(j_old, j_new, objective="throughput").outcome == stats.LOSS


def test_a_gain_clearing_95_but_not_99_percent_waits_for_more_pairs() -> None:
    old, new = [1000.0, 1000.0, 1000.0], [1035.0, 1050.0, 1065.0]
    c95, c99 = stats.paired_relative_changes(old, new)
    assert c95 is not None and c99 is not None and c95.low > 0 > c99.low
    v = gate(old, new)
    assert not v.done and "not at the 99 %" in v.decision.text


def test_a_driver_too_old_for_the_releases_cuda_is_refused_with_the_fix_before_anything_installs() -> None:
    from toolkit.adapters.compat_store import read_matrix
    from toolkit.core.upgrade import driver_refusal

    matrix = read_matrix()
    # 0.5.23's wheels are built for CUDA 13 (its lock's pins), whose runtime needs 580.65.06; 0.5.9's for 12.
    refused = driver_refusal(matrix, "0.5.23", "570.172.08", "pve1")
    assert refused is not None and "pve1's driver 570.172.08 cannot run SGLang 0.5.23" in refused.message
    assert "580.65.06 or newer" in refused.message and refused.fix and "toolkit host pve1" in refused.fix
    assert driver_refusal(matrix, "0.5.23", "580.95.05", "pve1") is None
    assert driver_refusal(matrix, "0.5.9", "570.172.08", "pve1") is None
    none = driver_refusal(matrix, "0.5.23", None, "pve1")
    assert none is not None and "no NVIDIA driver loaded" in none.message


def test_the_upgrade_report_marks_where_each_figure_came_from() -> None:
    """report.md and upgrade.json carry each run's provenance mark, as the apply summary and the reports do."""
    import json
    import math

    from toolkit.core.provenance import Provenance
    from toolkit.core.upgrade import Run, report_markdown

    lab = Provenance("stand-in", "the lab's stand-in server")
    runs = [Run("old", 1000.0, "runs/a", None, 12.0, provenance=lab), Run("new", 1100.0, "runs/b", None, 11.0,
                                                                          provenance=lab),
            Run("new", math.nan, None, None, 3.0, "the unit did not start")]
    data = {"profile": "p", "from_version": "0.5.9", "to_version": "0.5.10", "decision": REFUSED, "text": "t",
            "objective": "throughput", "effect_pct": 3.0, "new_profile": "p-0.5.10"}
    md = report_markdown(data, runs)
    assert "- figures: LAB STAND-IN (the lab's stand-in server)" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[3] for row in rows] == ["LAB STAND-IN", "LAB STAND-IN", "-"]
    row = json.loads(json.dumps(runs[0].to_dict()))
    assert row["mark"] == "LAB STAND-IN" and row["provenance"] == {"kind": "stand-in",
                                                                   "detail": "the lab's stand-in server"}
