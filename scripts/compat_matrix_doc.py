#!/usr/bin/env python3
"""Write the compatibility matrix's table (every row with its source) into docs/provision.md.

    .venv/bin/python scripts/compat_matrix_doc.py            # rewrite the section
    .venv/bin/python scripts/compat_matrix_doc.py --check    # exit 1 when the section is not what it would write

The section between the markers is this script's: edit toolkit/data/compat/*.yaml (or the requirements files the
SGLang rows are generated from), not the section.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit.adapters.compat_store import read_matrix  # noqa: E402
from toolkit.core.hostplan.matrix import matrix_table  # noqa: E402

DOC = REPO / "docs" / "provision.md"
BEGIN = "<!-- BEGIN compat-matrix: written by scripts/compat_matrix_doc.py, do not edit by hand -->"
END = "<!-- END compat-matrix -->"


def rewrite(text: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _old, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing")
    return head + BEGIN + "\n" + "\n".join(matrix_table(read_matrix())) + "\n" + END + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/provision.md is not current")
    args = ap.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = rewrite(text)
    if args.check:
        if new != text:
            print(f"{DOC} is not current: run .venv/bin/python scripts/compat_matrix_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
