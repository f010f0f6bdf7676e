"""What the apply lab modules share: the target container, the toolkit run as a user runs it, and the waits of
the fault tests. The provisioned container and the profiles' copy are fixtures (tests/apply/conftest.py), one
per module: test_apply_lab.py (deploys, probes, records) and test_apply_faults_lab.py (failures and faults) each
provision their own lab instance's container, so CI runs them side by side (scripts/test-shard5.txt, 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PATCH_TARGET = "sglang/srt/model_executor/model_runner.py"
PATCH_SHA = "be071c1567de4b63e82d070623f95aa4bb5f537698659526c68b1c7d05074640"


def toolkit(*args: str, cwd: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "toolkit", *args, "--json"], capture_output=True, text=True,
                          cwd=cwd, timeout=1200)
    try:
        summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        summary = {}
    return proc.returncode, summary, proc.stderr


class Target:
    """The lab's GPU container the tests deploy to: `ct` of the lab's inventory (CI), or, with
    TOOLKIT_TEST_APPLY_INVENTORY, another container of the same lab (so a developer's run does not
    redeploy a container another engineer is testing)."""

    def __init__(self, lab: Any, inventory: Path) -> None:
        self.lab = lab
        self.inventory_path = inventory
        hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_containers"]["hosts"]
        self.name = next(iter(hosts))
        self.address = hosts[self.name]["ansible_host"]

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        argv = [*self.lab.ssh_args("ct")[:-1], f"root@{self.address}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def ssh_background(self, command: str) -> subprocess.Popen[str]:
        """`command` on the container, left running: a watcher that acts there without an SSH round trip's delay."""
        argv = [*self.lab.ssh_args("ct")[:-1], f"root@{self.address}", command]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ct(target: Target, command: str) -> subprocess.CompletedProcess[str]:
    return target.ssh(command)


def installed_of(target: Target, dist: str) -> str:
    """The version of `dist` in the engine's venv on the container."""
    return ct(target, "/opt/sglang/venv/bin/python -c 'import importlib.metadata as m, sys; "
                      f"print(m.version(sys.argv[1]))' {dist}").stdout.strip()


def entries(profiles: Path, name: str = "glm5-tp8") -> int:
    text = (profiles / f"{name}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    return len(((data.get("results") or {}).get("entries")) or [])


def apply(lab: Target, work: Path, *extra: str, inventory: Path | None = None,
          profile: str = "glm5-tp8") -> tuple[int, dict[str, Any], str]:
    return toolkit("apply", "profile", profile, "-i", str(inventory or lab.inventory_path),
                   "--profiles-dir", str(work / "profiles"), "--runs-dir", str(work / "runs"), *extra, cwd=REPO)


def with_host_vars(target: Target, tmp: Path, **host_vars: Any) -> Path:
    """The lab's inventory with variables added to the target container, as a user sets them: the lab
    overlay's test switches (toolkit_lab_standin_fail_health, toolkit_lab_standin_nan_log) travel this way."""
    inv = yaml.safe_load(Path(target.inventory_path).read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"][target.name].update(host_vars)
    path = tmp / "switched.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def wait_for(check: Any, timeout_s: float, what: str, step_s: float = 0.3,
              running: subprocess.Popen[str] | None = None) -> None:
    """Poll `check` until it holds; fail with `running`'s output if that process ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if running is not None and running.poll() is not None:
            out, err = running.communicate()
            raise AssertionError(f"exit {running.returncode} before {what}: {err[-3000:]}\n{out[-2000:]}")
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def start_apply(target: Target, work: Path, runs: Path, *extra: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "toolkit", "apply", "profile", "glm5-tp8", "-i", str(target.inventory_path),
            "--profiles-dir", str(work / "profiles"), "--runs-dir", str(runs), "--json", *extra]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def main_pid(target: Target) -> str:
    return ct(target, "systemctl show -p MainPID --value sglang").stdout.strip()
