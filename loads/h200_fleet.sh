#!/usr/bin/env bash
# The H200 call: the sampler built on the driver's 20 ms power samples (adapters/nvml.py), 8 independent
# sampler states on the one GPU at 50 Hz under a real load, its CPU against an idle baseline and the load's
# throughput with and without it (benchmarks/bench_probe.py --fleet, interleaved windows in one process); the
# earlier fixtures' loads re-recorded with it (h200e-*); and the replay benchmark on this machine's CPU.
source "$(dirname "$0")/device_env.sh" h200e
{ date -u; nvidia-smi -L; nproc; uptime; python3 -c "import sys, numpy; print(sys.version, 'numpy', numpy.__version__)";
  python3 -m pip show nvidia-ml-py 2>/dev/null | head -2; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
python3 benchmarks/bench_probe.py --fleet --phase compute --seconds 15 --rounds 3 > "$R/fleet_compute.json" 2> "$R/fleet_compute.err"
echo "== fleet compute rc=$?"; head -c 1500 "$R/fleet_compute.json"; tail -5 "$R/fleet_compute.err"
python3 benchmarks/bench_probe.py --fleet --phase launch --seconds 10 --rounds 3 > "$R/fleet_launch.json" 2> "$R/fleet_launch.err"
echo "== fleet launch rc=$?"; head -c 1200 "$R/fleet_launch.json"; tail -5 "$R/fleet_launch.err"
for phase in compute memory spin launch; do
  python3 -m toolkit probe run --live off --idle-s 4 --hz 10 --out "$R/h200e-$phase" -- \
    python3 loads/gpu_phases.py "$phase" --duration-s 16 > "$R/h200e-$phase.log" 2>&1
  echo "== $phase rc=$?"; grep -a "verdict:" "$R/h200e-$phase.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=json.load(open(sys.argv[2])); g=s['steady']['gpus']['0'];
print(r['sampler_cost']); print('P', g['power_w']['mean'], g['power_sample_w'], 'E', g['energy_j'], g['energy_source'], 'Esamp', g['energy_integrated_sample_j'], 'window', s['steady']['duration_s'], 'rows', g['samples'])" \
    "$R/h200e-$phase/run.json" "$R/h200e-$phase/summary.json"
done
python3 benchmarks/bench_probe.py --repeats 5 > "$R/replay_bench.json" 2>&1; echo "== replay bench rc=$?"; cat "$R/replay_bench.json"
tar czf "$OUT/h200e.tgz" -C "$OUT" h200e && rm -rf "$R"
ls -la "$OUT"
