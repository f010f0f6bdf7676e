#!/usr/bin/env bash
# the fleet cost again, twice under the compute load (is 1.81 % reproducible?) and once under the
# host load (pure-Python work between kernels: the load's process holds a core), same sampler as h200_fleet_j.sh.
source "$(dirname "$0")/device_env.sh" h200k
{ date -u; nproc; uptime; } > "$R/env.txt" 2>&1
for run in compute-a compute-b host; do
  phase=${run%-*}
  python3 benchmarks/bench_probe.py --fleet --phase "$phase" --seconds 15 --rounds 3 > "$R/fleet_$run.json" 2> "$R/fleet_$run.err"
  echo "== fleet $run rc=$?"; head -c 700 "$R/fleet_$run.json"; tail -3 "$R/fleet_$run.err"
done
cp "$R"/*.json "$R/env.txt" "$OUT/"; ls -la "$OUT"
