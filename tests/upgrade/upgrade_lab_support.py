"""What the upgrade lab modules share: the container they upgrade and how they ask it (tests/upgrade/conftest.py
provisions it, once per module: each module runs on its own lab instance in CI, scripts/test-shard*.txt)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
NEW = "0.5.23"


class Lab:
    def __init__(self, lab: Any, inventory: Path, work: Path) -> None:
        self.lab, self.inventory, self.work = lab, inventory, work
        hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_containers"]["hosts"]
        self.name = next(iter(hosts))
        self.address = hosts[self.name]["ansible_host"]

    def ct(self, command: str) -> str:
        argv = [*self.lab.ssh_args("ct")[:-1], f"root@{self.address}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout

    def inventory_with(self, **host_vars: Any) -> Path:
        """The lab's inventory with the lab overlay's release knobs on the container, as a user sets them."""
        inv = yaml.safe_load(self.inventory.read_text())
        inv["all"]["children"]["gpu_containers"]["hosts"][self.name].update(host_vars)
        path = self.work / f"inventory-{len(list(self.work.glob('inventory-*')))}.yml"
        path.write_text(yaml.safe_dump(inv))
        return path

    def upgrade(self, inventory: Path, *extra: str) -> tuple[int, dict[str, Any], str, float]:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "toolkit", "upgrade", "glm5-tp8", "--sglang-version", NEW,
                               "-i", str(inventory), "--profiles-dir", str(self.work / "profiles"),
                               "--runs-dir", str(self.work / "runs"), "--json", *extra],
                              capture_output=True, text=True, cwd=REPO, timeout=3000)
        wall = time.monotonic() - start
        printed = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        out = printed["data"] if printed.get("kind") == "upgrade" else {}  # a refusal's envelope has no decision
        return proc.returncode, out, proc.stderr, wall

    def serving(self) -> tuple[int, str]:
        """(/health's status, the release the running server reports), asked from inside the container."""
        script = ("import json, urllib.request as u\n"
                  "try:\n    code = u.urlopen('http://127.0.0.1:8000/health', timeout=5).status\n"
                  "except Exception as e:\n    code = getattr(e, 'code', 0)\n"
                  "info = json.load(u.urlopen('http://127.0.0.1:8000/get_server_info', timeout=5))\n"
                  "print(code, info.get('version'))")
        got = self.ct(f"python3 -c {shlex.quote(script)}").split()
        return (int(got[0]), got[1]) if len(got) == 2 else (0, "")

    def entries(self, profile: str) -> list[dict[str, Any]]:
        data = yaml.safe_load((self.work / "profiles" / f"{profile}.yaml").read_text()) or {}
        return list(((data.get("results") or {}).get("entries")) or [])


def record_times(times: dict[str, float]) -> None:
    """Each case's wall time and its rollback's, printed, and merged into $TOOLKIT_TEST_UPGRADE_TIMES when set (both
    modules write to it: docs/upgrade.md's table)."""
    print("\nTIMES " + json.dumps(times))
    target = os.environ.get("TOOLKIT_TEST_UPGRADE_TIMES")
    if target:
        path = Path(target)
        known = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**known, **times}, indent=2, sort_keys=True) + "\n")
