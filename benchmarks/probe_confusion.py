"""The verdict against every labelled probe recording: a confusion table for docs/probe.md.

    python3 benchmarks/probe_confusion.py            # markdown: per-run rows, then the confusion matrix
    python3 benchmarks/probe_confusion.py --json

Replays each directory named in tests/fixtures/probe/labels.json through the same summary and verdict code as
`toolkit probe replay` (GPU trace, and the server and host timelines where the run recorded them) and compares
the class with its label. tests/probe/test_confusion.py checks that docs/probe.md holds exactly this output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.adapters.probe_store import load_run  # noqa: E402
from toolkit.core.probe.judge import judge_run  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "probe"


def rows() -> list[dict[str, Any]]:
    labels = json.loads((FIXTURES / "labels.json").read_text())["labels"]
    out = []
    for name, expected in sorted(labels.items()):
        run = load_run(FIXTURES / name)
        _, v = judge_run(run)
        out.append({"run": name, "expected": expected, "verdict": v.cls, "confidence": round(v.confidence, 2),
                    "signals": "+".join(v.signals), "window_mean": (v.window_mean or {}).get("class", v.cls),
                    "ok": v.cls == expected})
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| run | expected | verdict | confidence | signals | window mean alone |", "|---|---|---|---|---|---|"]
    for r in table:
        mark = "" if r["ok"] else " **(wrong)**"
        lines.append(f"| {r['run']} | {r['expected']} | {r['verdict']}{mark} | {r['confidence']:.2f} | "
                     f"{r['signals']} | {r['window_mean']} |")
    classes = sorted({r["expected"] for r in table} | {r["verdict"] for r in table})
    counts = Counter((r["expected"], r["verdict"]) for r in table)
    lines += ["", "| expected \\ verdict | " + " | ".join(classes) + " |", "|---|" + "---|" * len(classes)]
    for e in classes:
        if any(r["expected"] == e for r in table):
            lines.append(f"| {e} | " + " | ".join(str(counts.get((e, c), "")) for c in classes) + " |")
    right = sum(r["ok"] for r in table)
    lines += ["", f"{right} of {len(table)} labelled runs get their class."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = rows()
    print(json.dumps(table, indent=2) if args.json else markdown(table), end="" if not args.json else "\n")
    return 0 if all(r["ok"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
