#!/usr/bin/env bash
# where the sampler's process CPU goes on the H200 (loads/sampler_breakdown.py) and the fleet cost
# with GPM at 2 Hz and with drains every 1.5 s instead of 1 s (benchmarks/bench_probe.py --fleet, 2 rounds each).
source "$(dirname "$0")/device_env.sh" h200g
{ date -u; nproc; uptime; python3 -c "import sys; print(sys.version)"; } > "$R/env.txt" 2>&1
python3 loads/sampler_breakdown.py --seconds 15 > "$R/breakdown.json" 2> "$R/breakdown.err"
echo "== breakdown rc=$?"; cat "$R/breakdown.json"; tail -5 "$R/breakdown.err"
fleet() {  # NAME GPM_INTERVAL_S DRAIN_S
  python3 -c "import sys, runpy; import toolkit.adapters.nvml as n; n.GPM_INTERVAL_S=$2; n.POWER_DRAIN_INTERVAL_S=$3
sys.argv=['bench_probe.py','--fleet','--phase','compute','--seconds','15','--rounds','2']
runpy.run_path('benchmarks/bench_probe.py', run_name='__main__')" > "$R/fleet_$1.json" 2> "$R/fleet_$1.err"
  echo "== fleet $1 rc=$?"; head -c 700 "$R/fleet_$1.json"; tail -3 "$R/fleet_$1.err"
}
fleet base 0.2 1.0
fleet gpm2hz 0.5 1.0
fleet drain1p5 0.2 1.5
cp "$R"/*.json "$R/env.txt" "$OUT/"; ls -la "$OUT"
