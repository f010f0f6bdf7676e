"""Cost of a no-change `toolkit apply` against the lab, next to plain ansible-playbook in the same run.

    python3 benchmarks/bench_apply.py [--repeats 5] [-i inventory/lab.yml] [--profile glm5-tp8]

Needs the lab up and the container provisioned (scripts/demo does both). One warm-up apply makes
sure the profile is deployed, then each repeat runs, interleaved so drift hits all alike:
  toolkit           `toolkit apply profile NAME -i INV` (process start, profile resolve and validate,
                    wheelhouse check, ansible-runner, summary)
  plain             `ansible-playbook -i INV playbooks/deploy.yml -e @extravars.json`, the same extravars
                    the toolkit computes, the same environment the adapter sets (pipelining on)
  plain, no reuse   the same with SSH pipelining off and ControlPersist off (a new SSH connection per task)
  toolkit, linear   the toolkit with ansible-core's own strategy (ANSIBLE_STRATEGY=linear) in place of
                    Mitogen's, which its Ansible config names
  toolkit, no gc.freeze  the toolkit with its Ansible config less the gc.freeze callback
                    (adapters/ansible_callbacks/toolkit_gc_freeze.py)
Every run must report changed=0 (it is a no-change apply); a run that changed something is reported.
Besides wall time, the whole machine's CPU over each run (/proc/stat: the controller, SSH, and the lab host's and
container's side, which run on this machine): on a quiet machine that is the run's own.
Prints one JSON object: medians in seconds, and ratios to `plain`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _plan(profile: str, inventory: str) -> dict[str, object]:
    from toolkit.app.apply import ApplyRequest, plan, target
    from toolkit.app.profiles import resolve_checked

    req = ApplyRequest(profile=profile, inventory=inventory, runs_dir=str(REPO / "runs"))
    inv, hosts = target(req)
    deploy_plan = plan(req, resolve_checked(profile), inv, hosts)  # what `toolkit apply` runs, overlay included
    if deploy_plan.secrets:
        raise SystemExit("bench_apply: this profile needs secrets; benchmark one without an API key")
    return deploy_plan.extravars


def _machine_cpu_s() -> float:
    """This machine's busy CPU seconds since boot (user, nice, system, irq, softirq of /proc/stat's first line)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str, int, float]:
    start, cpu0 = time.perf_counter(), _machine_cpu_s()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc.stdout + proc.stderr, proc.returncode, _machine_cpu_s() - cpu0


def _changed(output: str, *, json_summary: bool) -> int:
    if json_summary:
        try:
            return int(json.loads(output[: output.rindex("}") + 1])["data"]["changed"])
        except (ValueError, KeyError):
            return -1
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-i", "--inventory", default=str(REPO / "inventory" / "lab.yml"))
    parser.add_argument("--profile", default="glm5-tp8")
    args = parser.parse_args()

    bindir = Path(sys.executable).parent
    base_env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    extravars = _plan(args.profile, args.inventory)
    with tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        ev_file = Path(tmp) / "extravars.json"
        ev_file.write_text(json.dumps(extravars))
        ansible_env = {**base_env, "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_RETRY_FILES_ENABLED": "False",
                       "ANSIBLE_TIMEOUT": "20", "ANSIBLE_PIPELINING": "True"}
        no_reuse_env = {**ansible_env, "ANSIBLE_PIPELINING": "False",
                        "ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ControlPersist=no"}
        plain = [str(bindir / "ansible-playbook"), "-i", args.inventory, str(REPO / "playbooks" / "deploy.yml"),
                 "-e", f"@{ev_file}"]
        toolkit = [sys.executable, "-m", "toolkit", "apply", "profile", args.profile, "-i", args.inventory, "--json"]
        # The toolkit's own Ansible config less its gc.freeze callback, named as a user's config is.
        from toolkit.adapters.ansible import GC_FREEZE_CALLBACK, toolkit_ansible_cfg

        no_freeze_cfg = Path(tmp) / "no-gc-freeze.cfg"
        no_freeze_cfg.write_text("".join(line for line in toolkit_ansible_cfg().splitlines(keepends=True)
                                         if GC_FREEZE_CALLBACK not in line))
        variants: dict[str, tuple[list[str], dict[str, str], bool]] = {
            "toolkit": (toolkit, base_env, True),
            "plain": (plain, ansible_env, False),
            "plain, no pipelining, no ControlPersist": (plain, no_reuse_env, False),
            "toolkit, linear": (toolkit, {**base_env, "ANSIBLE_STRATEGY": "linear"}, True),
            "toolkit, no gc.freeze": (toolkit, {**base_env, "ANSIBLE_CONFIG": str(no_freeze_cfg)}, True),
        }
        warm_s, out, rc, _ = _timed(toolkit, base_env)
        if rc != 0:
            print(out[-3000:], file=sys.stderr)
            raise SystemExit("bench_apply: the warm-up apply failed; is the lab up and provisioned?")
        times: dict[str, list[float]] = {k: [] for k in variants}
        cpus: dict[str, list[float]] = {k: [] for k in variants}
        changed: dict[str, list[int]] = {k: [] for k in variants}
        for i in range(args.repeats):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for name in order:
                cmd, env, is_json = variants[name]
                elapsed, out, rc, cpu_s = _timed(cmd, env)
                if rc != 0:
                    print(out[-3000:], file=sys.stderr)
                    raise SystemExit(f"bench_apply: {name} failed (rc {rc})")
                times[name].append(elapsed)
                cpus[name].append(cpu_s)
                changed[name].append(_changed(out, json_summary=is_json))
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpus.items()}
    print(json.dumps({
        "profile": args.profile,
        "repeats": args.repeats,
        "warmup_apply_s": round(warm_s, 2),
        "median_s": {k: round(v, 2) for k, v in med.items()},
        "ratio_to_plain": {k: round(v / med["plain"], 3) for k, v in med.items()},
        "median_machine_cpu_s": {k: round(v, 2) for k, v in med_cpu.items()},
        "cpu_ratio_to_plain": {k: round(v / med_cpu["plain"], 3) for k, v in med_cpu.items()},
        "changed_per_run": changed,
        "all_runs_s": {k: [round(t, 2) for t in v] for k, v in times.items()},
        "all_runs_machine_cpu_s": {k: [round(t, 2) for t in v] for k, v in cpus.items()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
