#!/usr/bin/env bash
# Fourth H200 call: the sampler's cost while the GPU computes (NVML calls cost more on a busy
# GPU: 1.2 ms per GPU-sample in the compute phase against 0.46 ms spinning, h200c fixtures), the same configs
# as benchmarks/bench_probe.py --nvml at idle; then a 20 Hz probe of the compute phase with the defaults.
source "$(dirname "$0")/device_env.sh" h200d
python3 loads/gpu_phases.py compute --duration-s 170 > "$R/load.log" 2>&1 &
LOAD=$!
sleep 10
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv > "$R/load_check.txt" 2>&1
python3 benchmarks/bench_probe.py --nvml --seconds 5 --rounds 2 > "$R/nvml_cost_under_load.json" 2> "$R/nvml_cost.err"
echo "== nvml cost under load rc=$?"; cat "$R/load_check.txt" "$R/nvml_cost_under_load.json" "$R/nvml_cost.err"
nvidia-smi --query-gpu=power.draw,utilization.gpu --format=csv >> "$R/load_check.txt" 2>&1
kill $LOAD 2>/dev/null; wait $LOAD 2>/dev/null
python3 -m toolkit probe run --live off --idle-s 3 --hz 20 --out "$R/h200d-compute-20hz" -- \
  python3 loads/gpu_phases.py compute --duration-s 20 > "$R/h200d-compute-20hz.log" 2>&1
echo "== compute 20 Hz rc=$?"; grep -a "verdict:" "$R/h200d-compute-20hz.log"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=json.load(open(sys.argv[2])); g=s['steady']['gpus']['0'];
print(r['sampler_cost'], r['energy_interval_s']); print('P', g['power_w']['mean'], 'E', g['energy_j'], g['energy_source'], 'Eint', g['energy_integrated_j'], 'Einst', g['energy_integrated_instant_j'], 'window', s['steady']['duration_s'])" \
  "$R/h200d-compute-20hz/run.json" "$R/h200d-compute-20hz/summary.json"
tar czf "$OUT/h200d.tgz" -C "$OUT" h200d && rm -rf "$R"
