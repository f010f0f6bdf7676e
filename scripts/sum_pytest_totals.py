"""One closing line for several pytest runs (scripts/test's shards): each log's own closing line summed.

Usage: python scripts/sum_pytest_totals.py LOG [LOG ...]
Prints `total: N passed, N failed, N skipped` (errors counted as failed); a log with no closing line
(pytest never got to the end) counts as one failure, so the sum can never read greener than the runs.
"""

from __future__ import annotations

import re
import sys

CLOSING = re.compile(r"\b\d+ (passed|failed|errors?)\b")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?)\b")


def totals(texts: list[str]) -> dict[str, int]:
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for text in texts:
        closing = [line for line in text.splitlines() if CLOSING.search(line) and " in " in line]
        if not closing:
            total["failed"] += 1
            continue
        for n, word in COUNT.findall(closing[-1]):
            total["failed" if word.startswith("error") else word] += int(n)
    return total


def main(paths: list[str]) -> int:
    texts = []
    for path in paths:
        with open(path, errors="replace") as f:
            texts.append(f.read())
    t = totals(texts)
    print(f"total: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
