#!/usr/bin/env bash
# replay + judge of the 288,000-row synthetic trace on the H200 host's CPU, the numpy path with the
# empty-column cut against the same path without it (loads/_baseline_columnar.py, the previous parse_body,
# carried only for this call: `git show 3ad33d2~1:toolkit/core/probe/columnar.py > loads/_baseline_columnar.py`)
# and the bare csv.reader floor, interleaved in one process; then the
# benchmark's own command (bench_probe.py --repeats 5) as the closing note quotes it.
source "$(dirname "$0")/device_env.sh" h200r
{ date -u; nproc; uptime; python3 -c "import numpy; print('numpy', numpy.__version__)"; } > "$R/env.txt" 2>&1
python3 - > "$R/replay_ab.json" 2> "$R/replay_ab.err" <<'PY'
import csv, importlib.util, io, json, statistics, sys, time
sys.path.insert(0, "benchmarks")
import bench_probe as b
from toolkit.core.probe import columnar
spec = importlib.util.spec_from_file_location("old_columnar", "loads/_baseline_columnar.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
old.ColumnValues = columnar.ColumnValues  # the statistics take the numpy path only for this module's class
text = b.synthetic_trace_text()
run = {"idle_start_s": 0.0, "idle_end_s": 10.0, "bench_start_s": 10.0, "bench_end_s": 3599.9, "exit_code": 0}
new_parse = columnar.parse_body
t = {"floor": [], "new": [], "old": []}; v = {}
for _ in range(7):
    t0 = time.perf_counter()
    for _r in csv.reader(io.StringIO(text)): pass
    t["floor"].append(time.perf_counter() - t0)
    for name, fn in (("new", new_parse), ("old", old.parse_body)):
        columnar.parse_body = fn
        dt, v[name] = b._replay_once(text, run, stdlib=False)
        t[name].append(dt)
columnar.parse_body = new_parse
med = {k: statistics.median(x) for k, x in t.items()}
print(json.dumps({"median_s": {k: round(x, 3) for k, x in med.items()},
                  "ratio_new_to_floor": round(med["new"] / med["floor"], 2),
                  "ratio_old_to_floor": round(med["old"] / med["floor"], 2),
                  "new_over_old": round(med["new"] / med["old"], 3),
                  "verdicts_identical": v["new"] == v["old"], "verdict": v["new"]["class"],
                  "times_s": {k: [round(y, 3) for y in x] for k, x in t.items()}}, indent=1))
PY
echo "== a/b rc=$?"; cat "$R/replay_ab.json"; tail -3 "$R/replay_ab.err"
python3 benchmarks/bench_probe.py --repeats 5 > "$R/replay_bench.json" 2>&1; echo "== replay bench rc=$?"
python3 -c "import json; d=json.load(open('$R/replay_bench.json')); print({k: d[k] for k in ('median_s', 'baseline_csv_reader_median_s', 'ratio_to_baseline', 'stdlib_median_s', 'verdicts_identical')})"
