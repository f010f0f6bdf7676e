#!/usr/bin/env bash
# The last H200 call: the fleet cost with drains set by the power ring's depth (1.5 s on the H200) and
# GPM at 2.5 Hz (loads/sampler_breakdown.py: a drain ~0.55 ms whatever it brings, a GPM pair ~0.14 ms, the
# counter ~3.5 ms; results in benchmarks/results/h200-sampler-breakdown.json); the earlier fixtures' loads
# re-recorded with this sampler (h200j-*, committed as tests/fixtures/probe/h200j-*, their classes checked by
# benchmarks/probe_confusion.py); and the replay benchmark on this machine's CPU.
source "$(dirname "$0")/device_env.sh" h200j
{ date -u; nvidia-smi -L; nproc; uptime; python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } \
  > "$R/env.txt" 2>&1
python3 benchmarks/bench_probe.py --fleet --phase compute --seconds 15 --rounds 3 > "$R/fleet_compute.json" 2> "$R/fleet_compute.err"
echo "== fleet compute rc=$?"; head -c 900 "$R/fleet_compute.json"; tail -3 "$R/fleet_compute.err"
probe() { name=$1; shift; python3 -m toolkit probe run --live off --idle-s 3 --hz 10 --host-hz 4 \
  --out "$R/h200j-$name" -- python3 loads/gpu_phases.py "$@" > "$R/h200j-$name.log" 2>&1
  echo "== $name rc=$?"; grep -a "verdict:" "$R/h200j-$name.log"; }
for phase in compute memory spin launch; do probe "$phase" "$phase" --duration-s 12; done
probe host host --duration-s 14
probe alternate-2s alternate --on-s 2 --off-s 2 --duration-s 16
probe idle idle --duration-s 6
for d in "$R"/h200j-*/; do python3 -c "import json,sys; d=sys.argv[1]; v=json.load(open(d+'verdict.json')); r=json.load(open(d+'run.json'))
print(d.rstrip('/').rsplit('/',1)[-1], v['class'], v['confidence'], r.get('sampler_cost'))" "$d"; done
python3 benchmarks/bench_probe.py --repeats 5 > "$R/replay_bench.json" 2>&1; echo "== replay bench rc=$?"
head -c 900 "$R/replay_bench.json"
cp "$R/fleet_compute.json" "$R/replay_bench.json" "$OUT/"
tar czf "$OUT/h200j.tgz" -C "$OUT" h200j && rm -rf "$R"
ls -la "$OUT"
