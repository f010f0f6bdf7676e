#!/usr/bin/env bash
# The README's first command (scripts/demo) at two revisions, interleaved, each from a fresh worktree with its own
# venv and a lab brought up and taken down around it (the lab's caches stay warm, as on a developer's second run):
#   benchmarks/bench_demo.sh OLD_REV NEW_REV [REPEATS]
# Prints each run's total and per-stage seconds (from the demo's own "== stage (Ns so far)" lines), then the medians
# and NEW/OLD. Runs as root on the default lab instance: take your own lab down first. On a shared machine both
# revisions see the same load, so quote the ratio, not the seconds.
set -euo pipefail
old=${1:?usage: bench_demo.sh OLD_REV NEW_REV [REPEATS]}
new=${2:?usage: bench_demo.sh OLD_REV NEW_REV [REPEATS]}
repeats=${3:-2}
repo=$(git rev-parse --show-toplevel)
results=$(mktemp /tmp/bench-demo.XXXXXX)
for i in $(seq "$repeats"); do
  for rev in "$old" "$new"; do
    dir=$(mktemp -d /tmp/bench-demo-wt.XXXXXX)
    git -C "$repo" worktree add -q --detach "$dir" "$rev"
    log="$dir.log"
    start=$(date +%s.%N)
    (cd "$dir" && scripts/demo) >"$log" 2>&1 || { echo "demo at $rev failed: $log" >&2; exit 1; }
    total=$(echo "$(date +%s.%N) - $start" | bc)
    stages=$(grep -E '^== ' "$log" | sed -E 's/^== ([^(]*) \(([0-9]+)s so far\)/\2:\1/' | tr '\n' '|')
    echo "$rev $i $total $stages" | tee -a "$results"
    (cd "$dir" && .venv/bin/toolkit lab down >/dev/null 2>&1) || true
    git -C "$repo" worktree remove --force "$dir"
  done
done
python3 - "$results" "$old" "$new" <<'PY'
import statistics, sys
rows = [line.split(" ", 3) for line in open(sys.argv[1])]
med = {rev: statistics.median(float(r[2]) for r in rows if r[0] == rev) for rev in sys.argv[2:4]}
for rev, m in med.items():
    print(f"median {rev}: {m:.1f} s")
print(f"new/old: {med[sys.argv[3]] / med[sys.argv[2]]:.3f}")
PY
