"""`toolkit upgrade glm5-tp8 --sglang-version 0.5.23` in the lab, for real: the lab's stand-in made twice as fast or
25 % slower for 0.5.23 through the inventory (toolkit_lab_release_speed), the 0.5.23 venv installed beside
0.5.9's, old and new applied and probed in alternation, the decision, the rollback. A release whose health fails
is tests/upgrade/test_upgrade_rollback_lab.py: another module, so CI runs it on another lab instance beside this
one (this module's pairs are the suite's longest shard).

One module, one lab (TOOLKIT_LAB_INSTANCE), one provisioned container (tests/upgrade/conftest.py); the cases run
in file order and each ends with a known unit serving. Each case's wall time and its rollback's are printed (-s)
for docs/upgrade.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.upgrade.upgrade_lab_support import NEW, REPO, Lab, record_times

pytestmark = [pytest.mark.lab, pytest.mark.slow]

TIMES: dict[str, float] = {}


def test_twice_as_fast_is_promoted_and_keeps_serving(lab_ct: Lab) -> None:
    # Twice, not 10 % or 50 %: the engine model runs on the CI machine's CPU, and beside seven shards its throughput
    # drifted by 5 % over the run; +10 % showed as +6.1 %, 99 % [-1.2 %, +13.8 %] after 6 pairs: refused, rightly.
    # +25 % was promoted only after 5 pairs at load 10-12. On a slower machine at load 14, +50 % showed as +27.4 %,
    # 99 % [-8.2 %, +76.8 %] after 6 pairs: undecided, so refused, rightly again. The test is of the promotion, its
    # serving and its records; the gate's power for smaller effects is benchmarks/bench_upgrade_gate.py's to show.
    inv = lab_ct.inventory_with(toolkit_lab_release_speed={NEW: 2.0})
    rc, out, err, wall = lab_ct.upgrade(inv)
    TIMES["promoted_s"] = wall
    print(f"\ntwice as fast: {out.get('decision')} in {wall:.0f} s, {out.get('pairs')} pairs: {out.get('text')}")
    assert rc == 0 and out["decision"] == "promoted", err[-4000:]
    assert out["change"]["low"] > 0 and out["rollback_s"] is None
    assert lab_ct.serving() == (200, NEW)
    new_entries = [e for e in lab_ct.entries(f"glm5-tp8-{NEW}") if e.get("gate")]
    assert new_entries and all(e["gate"]["decision"] == "promoted" and e["gate"]["side"] == "new"
                               for e in new_entries)
    assert Path(out["report"]).is_file() and "Decision: promoted" in Path(out["report"]).read_text()


def test_a_quarter_slower_is_refused_and_rolled_back_with_no_entry_claiming_it_better(lab_ct: Lab) -> None:
    before = len(lab_ct.entries(f"glm5-tp8-{NEW}"))
    inv = lab_ct.inventory_with(toolkit_lab_release_speed={NEW: 0.75})
    rc, out, err, wall = lab_ct.upgrade(inv)
    TIMES["refused_s"], TIMES["refused_rollback_s"] = wall, float(out.get("rollback_s") or 0)
    print(f"\n25 % slower: {out.get('decision')} in {wall:.0f} s, {out.get('pairs')} pairs, rollback "
          f"{out.get('rollback_s')} s: {out.get('text')}")
    assert rc == 1 and out["decision"] == "refused", err[-4000:]
    assert out["change"]["high"] < 0 and out["rollback_s"] is not None
    assert lab_ct.serving() == (200, "0.5.9")  # the old unit serves
    fresh = lab_ct.entries(f"glm5-tp8-{NEW}")[before:]
    assert fresh and all(e["gate"]["decision"] == "refused" and e["gate"]["change"]["high"] < 0 for e in fresh)
    # results check agrees: the new release against the old's runs is a regression.
    check = subprocess.run([sys.executable, "-m", "toolkit", "results", "check", f"glm5-tp8-{NEW}",
                            "--profiles-dir", str(lab_ct.work / "profiles")], capture_output=True, text=True,
                           cwd=REPO)
    print(check.stdout)
    record_times(TIMES)
