#!/usr/bin/env python3
"""Write the compatibility matrix's table (every row with its source) into docs/provision.md.

    .venv/bin/python scripts/compat_matrix_doc.py            # rewrite the section
    .venv/bin/python scripts/compat_matrix_doc.py --check    # exit 1 when the section is not what it would write

The section between the markers is this script's: edit toolkit/data/compat/*.yaml (or the requirements files the
SGLang rows are generated from), not the section.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from doc_section import section_main  # noqa: E402

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
    return section_main(DOC, rewrite, __doc__.split("\n")[0], "scripts/compat_matrix_doc.py")


if __name__ == "__main__":
    sys.exit(main())
