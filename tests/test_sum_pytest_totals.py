"""scripts/sum_pytest_totals.py: the one closing line of scripts/test's two shards."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sum_pytest_totals.py"
spec = importlib.util.spec_from_file_location("sum_pytest_totals", SCRIPT)
assert spec and spec.loader
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


def test_sums_each_shards_closing_line_and_counts_errors_as_failed() -> None:
    quiet = "....F\n1 failed, 377 passed, 3 skipped in 1102.18s (0:18:22)\n"
    verbose = "==== 1 passed, 1 error in 410.10s (0:06:50) ====\n"
    assert mod.totals([quiet, verbose]) == {"passed": 378, "failed": 2, "skipped": 3}


def test_a_shard_that_never_closed_counts_as_a_failure() -> None:
    # A crashed pytest prints no closing line: the sum must not read greener than the runs.
    assert mod.totals(["2 passed in 1.0s\n", "Traceback (most recent call last):\n"])["failed"] == 1
