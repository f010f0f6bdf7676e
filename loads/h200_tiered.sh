#!/usr/bin/env bash
# Third H200 call: the sampler with slow readings at SLOW_INTERVAL_S (nvml.py) against the
# every-reading-every-tick baseline, in the same run (benchmarks/bench_probe.py --nvml, interleaved rounds);
# the whole probe process's CPU at 20 Hz (loop, CSV, sampler; minus start-up, measured by a run of `true`);
# and the compute, memory, spin and launch phases under the tiered sampler, to check each keeps its class.
source "$(dirname "$0")/device_env.sh" h200c
{ date -u; nvidia-smi -L; nproc; uptime; } > "$R/env.txt" 2>&1
python3 benchmarks/bench_probe.py --nvml --seconds 5 --rounds 3 > "$R/nvml_cost.json" 2> "$R/nvml_cost.err"
echo "== nvml cost rc=$?"; cat "$R/nvml_cost.json" "$R/nvml_cost.err"
python3 - "$R" <<'PY' > "$R/process_cpu.json"; echo "== process cpu rc=$?"; cat "$R/process_cpu.json"
import json, os, resource, subprocess, sys, time
r = sys.argv[1]
def cpu_of(args):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "toolkit", "probe", "run", "--live", "off", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, time.monotonic() - t0
out = {}
for rnd in range(3):  # interleaved: a start-up-only run, then a 30 s sampling run, each round
    base_cpu, base_wall = cpu_of(["--idle-s", "0", "--hz", "20", "--out", f"{r}/pc-base-{rnd}", "--", "true"])
    run_cpu, run_wall = cpu_of(["--idle-s", "0", "--hz", "20", "--out", f"{r}/pc-run-{rnd}", "--", "sleep", "30"])
    out.setdefault("rounds", []).append({"startup_cpu_s": base_cpu, "startup_wall_s": base_wall,
                                         "run_cpu_s": run_cpu, "run_wall_s": run_wall,
                                         "loop_cpu_share": (run_cpu - base_cpu) / (run_wall - base_wall),
                                         "sampler_cost": json.load(open(f"{r}/pc-run-{rnd}/run.json"))["sampler_cost"]})
shares = sorted(x["loop_cpu_share"] for x in out["rounds"])
out["loop_cpu_share_median"] = shares[1]
out["gpus"] = json.load(open(f"{r}/pc-run-0/run.json"))["gpus"]
print(json.dumps(out, indent=2))
PY
rm -rf "$R"/pc-*
for spec in "compute 10 20" "memory 10 20" "spin 10 20" "launch 10 20"; do
  set -- $spec
  python3 -m toolkit probe run --live off --idle-s 5 --hz "$2" --out "$R/h200c-$1-$2hz" -- \
    python3 loads/gpu_phases.py "$1" --duration-s "$3" > "$R/h200c-$1-$2hz.log" 2>&1
  echo "== $1 $2 Hz rc=$?"; grep -a "verdict:" "$R/h200c-$1-$2hz.log"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=json.load(open(sys.argv[2])); g=s['steady']['gpus']['0'];
print(r['sampler_cost']); print('P', g['power_w']['mean'], 'util', g['util_gpu_pct'], 'gpm', g['gpm'], 'E', g['energy_j'], 'Eint', g['energy_integrated_j'], 'window', s['steady']['duration_s'])" \
    "$R/h200c-$1-$2hz/run.json" "$R/h200c-$1-$2hz/summary.json"
done
tar czf "$OUT/h200c.tgz" -C "$OUT" h200c && rm -rf "$R"
