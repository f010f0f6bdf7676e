#!/usr/bin/env bash
# Second (last) H200 call: the sampling cost after PCIe throughput was taken off the hot path
# (nvml.py PCIE_MIN_INTERVAL_S), with each NVML call's own cost, plus two probe runs to confirm the fix.
source "$(dirname "$0")/device_env.sh" h200b
python3 benchmarks/bench_probe.py --nvml --seconds 10 > "$R/nvml_cost.json" 2> "$R/nvml_cost.err"; echo "== nvml cost rc=$?"
cat "$R/nvml_cost.json" "$R/nvml_cost.err"
for spec in "compute 50 15" "spin 10 15" "memory 20 15"; do
  set -- $spec
  python3 -m toolkit probe run --live off --idle-s 3 --hz "$2" --out "$R/h200-$1-$2hz" -- \
    python3 loads/gpu_phases.py "$1" --duration-s "$3" > "$R/h200-$1-$2hz.log" 2>&1
  echo "== $1 $2 Hz rc=$?"; grep -a "verdict:" "$R/h200-$1-$2hz.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=json.load(open(sys.argv[2])); g=s['steady']['gpus']['0'];
print(r['sampler_cost']); print('E', g['energy_j'], 'Eint', g['energy_integrated_j'], 'Einst', g['energy_integrated_instant_j'], 'window', s['steady']['duration_s'])" \
    "$R/h200-$1-$2hz/run.json" "$R/h200-$1-$2hz/summary.json"
done
tar czf "$OUT/h200b.tgz" -C "$OUT" h200b && rm -rf "$R"
