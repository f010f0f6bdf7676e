"""A cold lab cache, built one after another and side by side, in the same run (the CI critical path).

    sudo python3 benchmarks/bench_cold_caches.py [--repeats 1] [--order seq-first|par-first]

Each repeat builds pve1's Debian 12 userland and the two CT templates (debian-12-standard and
debian-13-standard package sets) from the network into a fresh, empty cache directory: once with
`rootfs.build_all(side_by_side=False)` (what `toolkit lab up` did before) and once side by side (what it does
now). The order alternates between repeats so the mirror's own cache warming does not favour one. Prints one
JSON object: each build's seconds, the medians and the ratio side-by-side / one-after-another. The lab's own
cache (/var/cache/toolkit-lab) is not touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--order", choices=("seq-first", "par-first"), default="seq-first")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("mmdebstrap --mode=root needs root")
    sys.path.insert(0, str(REPO))
    from toolkit.lab import rootfs

    runs: dict[str, list[float]] = {"one_after_another_s": [], "side_by_side_s": []}
    for i in range(args.repeats):
        order = [False, True] if (args.order == "seq-first") == (i % 2 == 0) else [True, False]
        for side_by_side in order:
            cache = Path(tempfile.mkdtemp(prefix="toolkit-bench-cold-", dir="/var/tmp"))
            try:
                t0 = time.monotonic()
                rootfs.build_all(cache_dir=cache, side_by_side=side_by_side)
                took_s = round(time.monotonic() - t0, 1)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            key = "side_by_side_s" if side_by_side else "one_after_another_s"
            runs[key].append(took_s)
            print(f"repeat {i + 1}: {key.removesuffix('_s')} {took_s} s", file=sys.stderr, flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({
        "repeats": args.repeats,
        "runs_s": runs,
        "median_s": medians,
        "ratio_side_by_side": round(medians["side_by_side_s"] / medians["one_after_another_s"], 2),
        "cpus": os.cpu_count(),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
