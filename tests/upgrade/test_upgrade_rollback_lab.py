"""`toolkit upgrade glm5-tp8 --sglang-version 0.5.23` in the lab with 0.5.23's /health failing
(toolkit_lab_release_health): the new release's first run fails its deploy, and the old release is back at once,
without a pair decided. Apart from tests/upgrade/test_upgrade_lab.py so that CI runs it on another lab instance
(scripts/test-shard*.txt); the fixture provisions that lab's container, a no-change run where another module did.
"""

from __future__ import annotations

import pytest

from tests.upgrade.upgrade_lab_support import NEW, Lab, record_times

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def test_failing_health_is_rolled_back_at_once(lab_ct: Lab) -> None:
    inv = lab_ct.inventory_with(toolkit_lab_release_health={NEW: "fail"})
    rc, out, err, wall = lab_ct.upgrade(inv)
    times = {"health_s": wall, "health_rollback_s": float(out.get("rollback_s") or 0)}
    print(f"\nhealth failing: {out.get('decision')} in {wall:.0f} s, rollback {out.get('rollback_s')} s: "
          f"{out.get('text')}")
    assert rc == 1 and out["decision"] == "rolled-back", err[-4000:]
    assert [r["side"] for r in out["runs"]] == ["old", "new"] and out["runs"][1]["failure"]
    assert lab_ct.serving() == (200, "0.5.9")
    record_times(times)
