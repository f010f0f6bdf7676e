"""The lab with several hosts: `lab up --hosts 2 --cluster --clock-skew-ms pve2=250` makes pve1 and pve2 on one LAN,
each with its own network namespace, stand-in GPUs and vmbr0; containers on both reach each other through their
hosts; a vmid is unique across the cluster (pve-container's refusal); pve2's clock, as a process reached over SSH
reads it, is 250 ms ahead of the controller's; and `down` leaves nothing of either host.

One lab for the module: it takes the session's lab down and brings it back, bare, after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def fleet_work(lab2: LabState, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both hosts and their containers provisioned once for the module's applies (`toolkit host provision all
    --containers`), and the shipped profiles copied where those applies record."""
    import shutil

    from tests.apply.apply_lab_support import REPO

    for h in lab2.config.lab_hosts:  # the bare containers an earlier test made give way to provisioned ones
        lab2.ssh(h.name, f"pct stop {h.ct_vmid} >/dev/null 2>&1; pct destroy {h.ct_vmid} >/dev/null 2>&1; true")
    t0 = time.monotonic()
    prov = subprocess.run([sys.executable, "-m", "toolkit", "host", "provision", "all", "--containers", "-i",
                           str(lab2.inventory_path)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert prov.returncode == 0, prov.stderr[-4000:]
    print(f"\nhost provision all --containers: {time.monotonic() - t0:.1f} s")
    work = tmp_path_factory.mktemp("fleet")
    shutil.copytree(REPO / "profiles", work / "profiles")
    return work


def apply_profile(lab: LabState, work: Path, profile: str, *extra: str,
                  inventory: Path | None = None) -> tuple[int, dict[str, Any], str]:
    from tests.apply.apply_lab_support import REPO, toolkit

    t0 = time.monotonic()
    out = toolkit("apply", "profile", profile, "-i", str(inventory or lab.inventory_path), "--profiles-dir",
                  str(work / "profiles"), "--runs-dir", str(work / "runs"), *extra, cwd=REPO)
    print(f"\napply {profile} {' '.join(extra)}: {time.monotonic() - t0:.1f} s, rc {out[0]}, "
          f"changed {out[1].get('changed')}")
    return out


def print_fleet(verdict: dict[str, Any]) -> None:
    print(verdict["headline"])
    for host, fig in verdict["per_host"].items():
        print(host, {k: fig.get(k) for k in ("power_w", "energy_j", "tokens_per_j", "net_gb_s")},
              verdict["evidence"]["clocks"].get(host), (fig.get("verdict") or {}).get("class"))


def test_apply_over_both_hosts_probes_every_host_on_one_clock_and_records_once(lab2: LabState,
                                                                                fleet_work: Path) -> None:
    """`toolkit apply profile glm5-2node --probe --record` after `host provision all --containers`: the fleet probe
    samples ct (pve1) and ct2 (pve2) from here, the run holds both hosts' GPU traces and each host's clock offset
    with its bound, the verdict has per-node figures, one typed entry is recorded (the lab's simulated GPUs: a
    stand-in's); a second apply changes nothing on either host."""
    from toolkit.app.record import load_results

    rc, summary, err = apply_profile(lab2, fleet_work, "glm5-2node", "--probe", "--record")
    assert rc == 0, err[-4000:]
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
    print_fleet(verdict)
    entry = load_results("glm5-2node", fleet_work / "profiles").block.entries[-1]
    assert entry.run_id == run_dir.name and entry.fleet is not None
    assert [n.host for n in entry.fleet.nodes] == ["ct", "ct2"] and entry.provenance().kind == "stand-in"
    rc, again, err = apply_profile(lab2, fleet_work, "glm5-2node")
    assert rc == 0 and again["changed"] == 0, (again.get("hosts"), err[-2000:])


def test_replicas_behind_the_router_probe_through_it_with_its_per_backend_load(lab2: LabState,
                                                                                fleet_work: Path) -> None:
    """`toolkit apply profile glm5-tp8-x2 --probe --record` over the node ranks the test before left: the change
    rolls over ct and ct2, SGLang's router (the pinned smg) starts last on ct, the benchmark goes through it, and
    the router's own per-backend load (its Prometheus exporter, scraped here) is in the run's router_trace.csv and
    the verdict's evidence, beside each replica's figures; one entry is recorded."""
    from toolkit.app.record import load_results

    rc, summary, err = apply_profile(lab2, fleet_work, "glm5-tp8-x2", "--probe", "--record")
    assert rc == 0, err[-4000:]
    run_dir = Path(summary["fleet_probe"]["run_dir"])
    verdict = summary["fleet_probe"]["verdict"]
    print_fleet(verdict)
    urls = {f"http://{h.ct_address}:8000" for h in lab2.config.lab_hosts}
    router = (run_dir / "router_trace.csv").read_text()
    scraped = {line.split(",")[1] for line in router.splitlines() if line[:1].isdigit()}
    assert urls <= scraped, router[:2000]
    load = verdict["evidence"]["backend_load"]
    print("router's load:", load, verdict["evidence"]["backend_load_is"], verdict["class"])
    assert set(load) == urls and sum(load.values()) > 0, verdict["evidence"]
    # The two stand-in replicas run alike: judged while the router had work (the lab's 160 prompts are about 7 s
    # of it in a 13 s benchmark), neither is a slow node for idling through bench_serving's start-up.
    assert verdict["class"] not in ("slow-node", "slow-rank"), verdict["headline"]
    for host in ("ct", "ct2"):
        assert verdict["per_host"][host]["gpu_count"] == 8 and verdict["per_host"][host]["energy_j"] > 0
    assert summary["record"]["recorded"]["fleet"].startswith("added")
    entry = load_results("glm5-tp8-x2", fleet_work / "profiles").block.entries[-1]
    assert entry.run_id == run_dir.name and entry.fleet is not None
    assert [n.host for n in entry.fleet.nodes] == ["ct", "ct2"] and entry.provenance().kind == "stand-in"


def test_a_rolling_change_stops_at_a_replica_that_fails_and_puts_it_back_on_its_old_unit(
        lab2: LabState, fleet_work: Path, tmp_path: Path) -> None:
    """A child of glm5-tp8-x2 with another max_running_requests over the replicas that serve, ct2's health made
    to fail (the lab's inventory switch): ct takes the new unit, ct2 fails its health wait, is put back on its
    previous unit and serves again; the run stops there with exit 1."""
    import yaml

    (fleet_work / "profiles" / "glm5-tp8-x2-mrr.yaml").write_text(
        "schema_version: 1\nname: glm5-tp8-x2-mrr\nextends: glm5-tp8-x2\n"
        "description: glm5-tp8-x2 with fewer requests at once per replica.\n"
        "server:\n  max_running_requests: 768\n")
    inv = yaml.safe_load(Path(lab2.inventory_path).read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct2"]["toolkit_lab_standin_fail_health"] = True
    failing = tmp_path / "ct2-fails-health.yml"
    failing.write_text(yaml.safe_dump(inv))
    rc, summary, err = apply_profile(lab2, fleet_work, "glm5-tp8-x2-mrr", inventory=failing)
    assert rc == 1, err[-4000:]
    failures = summary["failures"]
    assert {f["host"] for f in failures} == {"ct2"}, failures
    message = "\n".join(f["message"] for f in failures)
    assert "did not answer" in message and "back on its previous unit, serving again" in message, message
    unit = {h: ok(lab2, h, "systemctl cat sglang") for h in ("ct", "ct2")}
    assert "--max-running-requests 768" in unit["ct"], unit["ct"]
    assert "--max-running-requests 1024" in unit["ct2"] and "768" not in unit["ct2"], unit["ct2"]
    health = ok(lab2, "ct2", "python3 -c 'import urllib.request as u; "
                             "print(u.urlopen(\"http://127.0.0.1:8000/health\", timeout=10).status)'")
    assert health.strip() == "200", health


def test_down_leaves_nothing_of_either_host(lab2: LabState) -> None:
    toolkit.lab.down()
    assert system.leftovers() == []
