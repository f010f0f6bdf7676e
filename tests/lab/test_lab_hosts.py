"""The lab with several hosts: `lab up --hosts 2 --cluster --clock-skew-ms pve2=250` makes pve1 and pve2 on one LAN,
each with its own network namespace, stand-in GPUs and vmbr0; containers on both reach each other through their
hosts; a vmid is unique across the cluster (pve-container's refusal); pve2's clock, as a process reached over SSH
reads it, is 250 ms ahead of the controller's; and `down` leaves nothing of either host.

One lab for the module: it takes the session's lab down and brings it back, bare, after it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import toolkit.lab
from tests.lab.own_lab import module_lab
from toolkit.lab import system
from toolkit.lab.plan import TEMPLATE_NAME, LabConfig, LabState

pytestmark = [pytest.mark.lab, pytest.mark.slow]
SKEW_MS = 250
CONFIG = LabConfig(hosts=2, cluster=True, clock_skew_ms=(("pve2", SKEW_MS),))
TEMPLATE = (f"test -f /var/lib/vz/template/cache/{TEMPLATE_NAME} || pveam download local {TEMPLATE_NAME} >/dev/null; "
            f"echo local:vztmpl/{TEMPLATE_NAME}")


@pytest.fixture(scope="module")
def lab2() -> Iterator[LabState]:
    yield from module_lab(CONFIG)


def ok(lab: LabState, host: str, command: str) -> str:
    proc = lab.ssh(host, command)
    assert proc.returncode == 0, f"{host}: {command}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return str(proc.stdout)


def toolkit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolkit", "lab", *args], capture_output=True, text=True, timeout=60)


def test_each_host_is_its_own_proxmox_host_and_the_commands_take_its_name(lab2: LabState) -> None:
    for host in ("pve1", "pve2"):
        me = lab2.config.lab_host(host)
        assert ok(lab2, host, "hostname; cat /etc/lab-standin/lab.json | python3 -c "
                              "'import json, sys; print(json.load(sys.stdin)[\"gpus\"])'") == f"{host}\n8\n"
        assert f"inet {me.bridge_address}/24" in ok(lab2, host, "ip -4 addr show vmbr0")
    cli = toolkit_cli("ssh", "pve2", "hostname")
    assert (cli.returncode, cli.stdout) == (0, "pve2\n"), cli.stderr
    status = toolkit_cli("status", "pve2")
    assert status.returncode == 0 and "pve2" in status.stdout and "+250 ms" in status.stdout, status.stdout
    assert "pve1" not in status.stdout.replace("toolkit-pve1", "")


def test_containers_on_both_hosts_reach_each_other_and_a_vmid_is_unique_across_the_cluster(lab2: LabState) -> None:
    hosts = lab2.config.lab_hosts
    for h in hosts:
        ok(lab2, h.name, f"cp /root/.ssh/authorized_keys /root/ct.pub && pct create {h.ct_vmid} "
                         f"$({TEMPLATE}) --hostname {h.ct_name} --memory 512 --swap 0 --rootfs local-lvm:4 "
                         f"--unprivileged 0 --ssh-public-keys /root/ct.pub "
                         f"--net0 name=eth0,bridge=vmbr0,ip={h.ct_address}/24,gw={h.bridge_address} "
                         f"&& pct start {h.ct_vmid}")
    # pve-container's create refuses a vmid that any node of the cluster has (PVE::Cluster::check_vmid_unused).
    taken = lab2.ssh("pve2", f"pct create {hosts[0].ct_vmid} $({TEMPLATE}) --rootfs local-lvm:4")
    assert taken.returncode != 0
    assert f"CT {hosts[0].ct_vmid} already exists on node 'pve1'" in taken.stderr, taken.stderr
    deadline = time.monotonic() + 60
    while lab2.ssh("ct2", "true").returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    # rank 0's dist-init address (ct on pve1) from pve2's container, across the LAN and both hosts' routes
    reached = ok(lab2, "ct2", f"ping -c1 -W3 {hosts[0].ct_address} >/dev/null && echo reached || "
                              f"(exec 3<>/dev/tcp/{hosts[0].ct_address}/22 && head -c 7 <&3)")
    assert reached.strip() in ("reached", "SSH-2.0"), reached


def test_pve2s_clock_is_set_apart_as_a_process_over_ssh_reads_it(lab2: LabState) -> None:
    def offset_s(host: str) -> tuple[float, float]:
        """(host's clock minus the controller's at the midpoint of the round trip, half the round trip)."""
        best = (0.0, float("inf"))
        for _ in range(3):
            t0 = time.time()
            remote = float(ok(lab2, host, "date +%s.%N"))
            t1 = time.time()
            if (t1 - t0) / 2 < best[1]:
                best = (remote - (t0 + t1) / 2, (t1 - t0) / 2)
        return best

    for host, expected_s in (("pve1", 0.0), ("pve2", SKEW_MS / 1000)):
        offset, bound = offset_s(host)
        assert abs(offset - expected_s) <= bound + 0.02, (host, offset, bound)
    # Sleeps, timed waits and subprocess timeouts stay the kernel's (libfaketime broke these: EINVAL, hangs).
    waited = ok(lab2, "pve2", "timeout 20 python3 -c 'import subprocess, threading, time; e = threading.Event(); "
                              "t0 = time.monotonic(); e.wait(0.2); subprocess.run([\"sleep\", \"0.1\"], timeout=5); "
                              "time.sleep(0.05); print(round(time.monotonic() - t0, 1))'")
    assert 0.3 <= float(waited) <= 5, waited


def test_a_fleet_probe_merges_pve2s_250_ms_onto_the_controllers_clock(lab2: LabState, tmp_path: Path) -> None:
    """`toolkit probe run --fleet` over pve1 and pve2 (tests/probe/test_fleet_probe.py): pve2 is found 250 ms ahead
    within its bound, and its samples merged onto the controller's clock land where pve1's do."""
    from tests.probe.test_fleet_probe import probe_lab_hosts

    probe_lab_hosts(lab2, ["pve1", "pve2"], tmp_path, skew_ms={"pve2": SKEW_MS})


def test_apply_over_both_hosts_probes_every_host_on_one_clock_and_records_once(lab2: LabState,
                                                                                tmp_path: Path) -> None:
    """`toolkit host provision all --containers`, then `toolkit apply profile glm5-2node --probe --record`: the
    fleet probe samples ct (pve1) and ct2 (pve2) from here, the run holds both hosts' GPU traces and each host's
    clock offset with its bound, the verdict has per-node figures, one typed entry is recorded (the lab's simulated
    GPUs: a stand-in's); a second apply changes nothing on either host."""
    import json
    import shutil

    from tests.apply.apply_lab_support import REPO, toolkit
    from toolkit.app.record import load_results

    for h in lab2.config.lab_hosts:  # the bare containers an earlier test made give way to provisioned ones
        lab2.ssh(h.name, f"pct stop {h.ct_vmid} >/dev/null 2>&1; pct destroy {h.ct_vmid} >/dev/null 2>&1; true")
    inv = str(lab2.inventory_path)
    prov = subprocess.run([sys.executable, "-m", "toolkit", "host", "provision", "all", "--containers", "-i", inv],
                          capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert prov.returncode == 0, prov.stderr[-4000:]
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    args = ["apply", "profile", "glm5-2node", "-i", inv, "--profiles-dir", str(tmp_path / "profiles"),
            "--runs-dir", str(tmp_path / "runs")]
    t0 = time.monotonic()
    rc, summary, err = toolkit(*args, "--probe", "--record", cwd=REPO)
    assert rc == 0, err[-4000:]
    print(f"\napply --probe --record: {time.monotonic() - t0:.1f} s")
    run_dir = Path(summary["fleet_probe"]["run_dir"])
    run = json.loads((run_dir / "run.json").read_text())
    verdict = summary["fleet_probe"]["verdict"]
    for host in ("ct", "ct2"):
        assert (run_dir / "hosts" / host / "trace.csv").is_file()
        clock = run["clocks"][host]
        assert 0 < clock["bound_s"] < 0.05 and clock["start"]["consistent"], clock
        assert verdict["per_host"][host]["gpu_count"] == 8 and verdict["per_host"][host]["energy_j"] > 0
    assert run["network_gb_s"] and verdict["fleet"]["gpu_count"] == 16
    assert summary["record"]["recorded"]["fleet"].startswith("added")
    print(verdict["headline"])
    for host, fig in verdict["per_host"].items():
        print(host, {k: fig.get(k) for k in ("power_w", "energy_j", "tokens_per_j", "net_gb_s")},
              verdict["evidence"]["clocks"].get(host), (fig.get("verdict") or {}).get("class"))
    entry = load_results("glm5-2node", tmp_path / "profiles").block.entries[-1]
    assert entry.run_id == run_dir.name and entry.fleet is not None
    assert [n.host for n in entry.fleet.nodes] == ["ct", "ct2"] and entry.provenance().kind == "stand-in"
    t0 = time.monotonic()
    rc, again, err = toolkit(*args, cwd=REPO)
    print(f"second apply: {time.monotonic() - t0:.1f} s, changed {again.get('changed')}")
    assert rc == 0 and again["changed"] == 0, (again.get("hosts"), err[-2000:])


def test_down_leaves_nothing_of_either_host(lab2: LabState) -> None:
    toolkit.lab.down()
    assert system.leftovers() == []
