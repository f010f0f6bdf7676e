#!/usr/bin/env bash
# The H200 call: the verdict over time. Each load of loads/gpu_phases.py under `toolkit probe run` at 10 Hz
# with the host timeline (/proc, 4 Hz: host_trace.csv): Python work between kernels (host-bound),
# alternating compute/idle phases of 0.5 s, 2 s and 5 s (intermittent-load), then the earlier phases again
# (compute, memory, spin, launch, idle). The run directories come back in $OUT/h200i.tgz and are committed as
# tests/fixtures/probe/h200i-*; tests/probe/test_h200_intervals.py replays them. Needs python3 with torch, pynvml.
source "$(dirname "$0")/device_env.sh" h200i
{ date -u; nvidia-smi -L; nproc; uptime; python3 -c "import torch; print('torch', torch.__version__)"; } \
  > "$R/env.txt" 2>&1
probe() { name=$1; shift; python3 -m toolkit probe run --live off --idle-s 3 --hz 10 --host-hz 4 \
  --out "$R/h200i-$name" -- python3 loads/gpu_phases.py "$@" > "$R/h200i-$name.log" 2>&1
  echo "== $name rc=$?"; grep -a "verdict:" "$R/h200i-$name.log"; }
probe host host --duration-s 16
probe alternate-0.5s alternate --on-s 0.5 --off-s 0.5 --duration-s 16
probe alternate-2s alternate --on-s 2 --off-s 2 --duration-s 18
probe alternate-5s alternate --on-s 5 --off-s 5 --duration-s 25
for phase in compute memory spin launch; do probe "$phase" "$phase" --duration-s 12; done
probe idle idle --duration-s 8
for d in "$R"/h200i-*/; do python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
v = json.load(open(d + "verdict.json"))
r = json.load(open(d + "run.json"))
ot = v["evidence"].get("over_time") or {}
print(d.rstrip("/").rsplit("/", 1)[-1], v["class"], v["confidence"], "| mix:", ot.get("mix"), "| window mean:",
      (v.get("window_mean") or {}).get("class"), "| thread:", (ot.get("busiest_thread") or {}).get("name"),
      (ot.get("busiest_thread") or {}).get("cpu_pct"), "| host rows:", (r.get("host") or {}).get("rows"))
PY
done
tar czf "$OUT/h200i.tgz" -C "$OUT" h200i && rm -rf "$R"
