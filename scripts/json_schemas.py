"""Write the JSON Schema of every `--json` kind into docs/schemas/ (toolkit/cli/schemas.py says from what), or with
--check exit 1 when a committed schema is not what it would write (a stale file, a missing or a left-over one)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.adapters.files import write_atomic
from toolkit.cli.schemas import DATA_TYPES, text

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"
SUFFIX = ".schema.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when docs/schemas/ is not current")
    args = ap.parse_args(argv)
    stale = [kind for kind in sorted(DATA_TYPES)
             if not (SCHEMAS / f"{kind}{SUFFIX}").is_file() or (SCHEMAS / f"{kind}{SUFFIX}").read_text() != text(kind)]
    extra = sorted(p for p in SCHEMAS.glob(f"*{SUFFIX}") if p.name.removesuffix(SUFFIX) not in DATA_TYPES)
    if args.check:
        if stale or extra:
            print(f"docs/schemas is not current: run .venv/bin/python scripts/json_schemas.py (stale: "
                  f"{', '.join(stale) or 'none'}; left over: {', '.join(p.name for p in extra) or 'none'})",
                  file=sys.stderr)
            return 1
        return 0
    for kind in stale:
        write_atomic(SCHEMAS / f"{kind}{SUFFIX}", text(kind))
        print(f"wrote docs/schemas/{kind}{SUFFIX}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(SCHEMAS.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
