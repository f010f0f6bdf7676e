"""The command line of the scripts that write a generated section of a doc: rewrite it, or with --check exit 1
when it is not what they would write."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def section_main(doc: Path, rewrite: Callable[[str], str], description: str, script: str) -> int:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help=f"exit 1 when {doc.name} is not current")
    args = ap.parse_args()
    text = doc.read_text(encoding="utf-8")
    new = rewrite(text)
    if args.check:
        if new != text:
            print(f"{doc} is not current: run .venv/bin/python {script}", file=sys.stderr)
            return 1
        return 0
    doc.write_text(new, encoding="utf-8")
    return 0
