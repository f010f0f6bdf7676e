#!/usr/bin/env bash
# The real-GPU experiment, in ONE device call (device time is scarce): every phase of
# loads/gpu_phases.py under `toolkit probe run` at 10 Hz, the compute phase again at 50 Hz, NVML sampling
# cost at 10 and 50 Hz (benchmarks/bench_probe.py --nvml), the replay benchmark on that machine's CPUs,
# a failing benchmark and a Ctrl-C'd run. Everything lands in $OUT/h200.tgz (the tool returns at most 8 files).
# Needs only python3 with torch, pynvml and rich (no pydantic there).
source "$(dirname "$0")/device_env.sh" h200
probe() { python3 -m toolkit probe run --live off "$@"; }
{
  date -u; nvidia-smi; nvidia-smi -q -d POWER,CLOCK,PERFORMANCE | head -120
  python3 -c "import sys, torch, pynvml, rich; print(sys.version); print('torch', torch.__version__); print(pynvml.__file__)"
  python3 -m pip show nvidia-ml-py 2>/dev/null | head -2; nproc; uptime
} > "$R/env.txt" 2>&1
for phase in idle compute memory spin launch; do
  probe --idle-s 5 --hz 10 --out "$R/h200-$phase" -- python3 loads/gpu_phases.py "$phase" --duration-s 20 \
    > "$R/h200-$phase.log" 2>&1
  echo "== $phase rc=$?"; grep -a "verdict:" "$R/h200-$phase.log"
done
probe --idle-s 3 --hz 50 --out "$R/h200-compute-50hz" -- python3 loads/gpu_phases.py compute --duration-s 15 \
  > "$R/h200-compute-50hz.log" 2>&1; echo "== compute-50hz rc=$?"; grep -a "verdict:" "$R/h200-compute-50hz.log"
probe --idle-s 2 --hz 10 --out "$R/h200-failing" -- python3 -c "import sys; sys.stderr.write('planted failure\n'); sys.exit(3)" \
  > "$R/h200-failing.log" 2>&1; echo "== failing rc=$? (expect 1)"
timeout -s INT 8 python3 -m toolkit probe run --live off --idle-s 2 --out "$R/h200-interrupted" -- python3 loads/gpu_phases.py spin --duration-s 60 \
  > "$R/h200-interrupted.log" 2>&1; echo "== interrupted rc=$? (expect 130)"; ls "$R/h200-interrupted"
python3 benchmarks/bench_probe.py --nvml --seconds 10 > "$R/nvml_cost.json" 2> "$R/nvml_cost.err"; echo "== nvml cost rc=$?"
cat "$R/nvml_cost.json"
python3 benchmarks/bench_probe.py --repeats 5 > "$R/replay_bench.json" 2>&1; echo "== replay bench rc=$?"
cat "$R/replay_bench.json"
for d in "$R"/h200-*/; do python3 -c "
import json, sys
s = json.load(open(sys.argv[1] + 'summary.json')); v = json.load(open(sys.argv[1] + 'verdict.json'))
g = s['steady']['gpus']['0']; f = s['full']['gpus']['0']
print(sys.argv[1].split('/')[-2], v['class'], v['power_capped'], v['confidence'], 'steady', s['steady_state']['found'],
      'P', g['power_w']['mean'], 'util', g['util_gpu_pct'], 'gpm', g['gpm'], 'sm', g['sm_clock_mhz'], 'reasons',
      g['clock_reasons_seen'], 'E', g['energy_j'], 'Eint', g['energy_integrated_j'], 'Einst', g['energy_integrated_instant_j'],
      'idle', g['idle_power_w'], 'cost', json.load(open(sys.argv[1] + 'run.json'))['sampler_cost'])
" "$d" 2>&1; done
tar czf "$OUT/h200.tgz" -C "$OUT" h200 && rm -rf "$R"
ls -la "$OUT"
