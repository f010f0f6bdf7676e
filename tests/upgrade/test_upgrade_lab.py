"""`toolkit upgrade glm5-tp8 --sglang-version 0.5.23` in the lab, for real: the lab's stand-in made 50 % faster, 25 %
slower or broken for 0.5.23 through the inventory (toolkit_lab_release_speed, toolkit_lab_release_health), the
0.5.23 venv installed beside 0.5.9's, old and new applied and probed in alternation, the decision, the rollback.

One module, one lab (TOOLKIT_LAB_INSTANCE), one provisioned container; the cases run in file order and each ends
with a known unit serving. Each case's wall time and its rollback's are printed (-s) for docs/upgrade.md.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.slow]

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


@pytest.fixture(scope="module")
def lab_ct(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    inventory = Path(lab.inventory_path)
    proc = subprocess.run([sys.executable, "-m", "toolkit", "host", "provision", "pve1", "--containers", "-i",
                           str(inventory)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    work = tmp_path_factory.mktemp("upgrade")
    shutil.copytree(REPO / "profiles", work / "profiles")
    return Lab(lab, inventory, work)


TIMES: dict[str, float] = {}


def test_half_again_as_fast_is_promoted_and_keeps_serving(lab_ct: Lab) -> None:
    # 50 %, not 10 %: the engine model runs on the CI machine's CPU, and beside seven shards its throughput drifted
    # by 5 % over the run; +10 % showed as +6.1 %, 99 % [-1.2 %, +13.8 %] after 6 pairs: refused, rightly. +25 %
    # was promoted, but only after 5 pairs at load 10-12 (2 more than the gate's least, about 4 min of this shard,
    # the CI run's longest); the gate's power for smaller effects is benchmarks/bench_upgrade_gate.py's to show.
    inv = lab_ct.inventory_with(toolkit_lab_release_speed={NEW: 1.5})
    rc, out, err, wall = lab_ct.upgrade(inv)
    TIMES["promoted_s"] = wall
    print(f"\n50 % faster: {out.get('decision')} in {wall:.0f} s, {out.get('pairs')} pairs: {out.get('text')}")
    assert rc == 0 and out["decision"] == "promoted", err[-4000:]
    assert out["change"]["low"] > 0 and out["rollback_s"] is None
    assert lab_ct.serving() == (200, NEW)
    new_entries = [e for e in lab_ct.entries(f"glm5-tp8-{NEW}") if e.get("gate")]
    assert new_entries and all(e["gate"]["decision"] == "promoted" and e["gate"]["side"] == "new"
                               for e in new_entries)
    assert Path(out["report"]).is_file() and "Decision: promoted" in Path(out["report"]).read_text()


def test_a_quarter_slower_is_refused_and_rolled_back_with_no_entry_claiming_it_better(lab_ct: Lab) -> None:
    before = len(lab_ct.entries(f"glm5-tp8-{NEW}"))
    inv = lab_ct.inventory_with(toolkit_lab_release_speed={NEW: 0.75})
    rc, out, err, wall = lab_ct.upgrade(inv)
    TIMES["refused_s"], TIMES["refused_rollback_s"] = wall, float(out.get("rollback_s") or 0)
    print(f"\n25 % slower: {out.get('decision')} in {wall:.0f} s, {out.get('pairs')} pairs, rollback "
          f"{out.get('rollback_s')} s: {out.get('text')}")
    assert rc == 1 and out["decision"] == "refused", err[-4000:]
    assert out["change"]["high"] < 0 and out["rollback_s"] is not None
    assert lab_ct.serving() == (200, "0.5.9")  # the old unit serves
    fresh = lab_ct.entries(f"glm5-tp8-{NEW}")[before:]
    assert fresh and all(e["gate"]["decision"] == "refused" and e["gate"]["change"]["high"] < 0 for e in fresh)
    # results check agrees: the new release against the old's runs is a regression.
    check = subprocess.run([sys.executable, "-m", "toolkit", "results", "check", f"glm5-tp8-{NEW}",
                            "--profiles-dir", str(lab_ct.work / "profiles")], capture_output=True, text=True,
                           cwd=REPO)
    print(check.stdout)


def test_failing_health_is_rolled_back_at_once(lab_ct: Lab) -> None:
    inv = lab_ct.inventory_with(toolkit_lab_release_health={NEW: "fail"})
    rc, out, err, wall = lab_ct.upgrade(inv)
    TIMES["health_s"], TIMES["health_rollback_s"] = wall, float(out.get("rollback_s") or 0)
    print(f"\nhealth failing: {out.get('decision')} in {wall:.0f} s, rollback {out.get('rollback_s')} s: "
          f"{out.get('text')}")
    assert rc == 1 and out["decision"] == "rolled-back", err[-4000:]
    assert [r["side"] for r in out["runs"]] == ["old", "new"] and out["runs"][1]["failure"]
    assert lab_ct.serving() == (200, "0.5.9")
    print("\nTIMES " + json.dumps(TIMES))
    if os.environ.get("TOOLKIT_TEST_UPGRADE_TIMES"):
        Path(os.environ["TOOLKIT_TEST_UPGRADE_TIMES"]).write_text(json.dumps(TIMES, indent=2) + "\n")
