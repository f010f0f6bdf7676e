#!/usr/bin/env bash
# The second (last) H200 call: the fleet cost after the first call's figures (loads/h200_fleet.sh:
# process 2.2 % of a core against the idle baseline, the sampler thread 1.64 %) with the trace writer's
# carried-value cache, buffer decoding in one pass and no idle-start energy read; and the replay benchmark
# on this machine's CPU with the numpy-column path (and the list path, same run).
source "$(dirname "$0")/device_env.sh" h200f
{ date -u; nproc; uptime; python3 -c "import numpy; print('numpy', numpy.__version__)"; } > "$R/env.txt" 2>&1
python3 benchmarks/bench_probe.py --fleet --phase compute --seconds 15 --rounds 3 > "$R/fleet_compute.json" 2> "$R/fleet_compute.err"
echo "== fleet compute rc=$?"; head -c 900 "$R/fleet_compute.json"; tail -3 "$R/fleet_compute.err"
python3 benchmarks/bench_probe.py --repeats 3 > "$R/replay_bench.json" 2>&1; echo "== replay bench rc=$?"
head -c 700 "$R/replay_bench.json"
cp "$R"/*.json "$R/env.txt" "$OUT/" ; ls -la "$OUT"
