"""`up` and `down` themselves (root): bad input refused with nothing made, `down` leaves no
namespace, mount, link, cgroup or process, and a warm `up` reuses the cache. The session's
shared `lab` fixture is not used here: tests/conftest.py runs this module first, on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import toolkit.lab
from toolkit.lab import plan, rootfs, system

pytestmark = [pytest.mark.lab, pytest.mark.slow]
VENV_PYTHON = sys.executable


@pytest.fixture(scope="module", autouse=True)
def lab_is_ours() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    state = toolkit.lab.status()
    if state and state.running:
        pytest.skip("a lab is already up on this machine; not taking someone's lab down")
    toolkit.lab.down()
    assert system.leftovers() == []


def toolkit_cli(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> \
        subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, VENV_PYTHON, "-m", "toolkit", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def assert_nothing_made() -> None:
    assert system.leftovers() == []
    assert not system.STATE_FILE.exists()


def test_up_as_non_root_is_refused_and_makes_nothing() -> None:
    env = {**os.environ, "HOME": "/tmp"}
    proc = toolkit_cli("lab", "up", prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "needs root" in proc.stderr and "fix: run it as root" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_nothing_made()


def test_up_without_the_debian_packages_names_them_and_makes_nothing(tmp_path: Path) -> None:
    # A PATH with everything the CLI itself needs but none of the lab's tools.
    (tmp_path / "bin").mkdir()
    proc = toolkit_cli("lab", "up", env={**os.environ, "PATH": str(tmp_path / "bin")})
    assert proc.returncode == 2, proc.stderr
    for pkg in ("mmdebstrap", "iproute2", "openssh-client", "util-linux"):
        assert pkg in proc.stderr
    assert "apt-get install" in proc.stderr
    assert_nothing_made()


def test_up_refuses_a_network_already_in_use_and_makes_nothing() -> None:
    subprocess.run(["ip", "link", "add", "tktaken0", "type", "veth", "peer", "name", "tktaken1"], check=True)
    try:
        taken = plan.LabConfig().subnet
        subprocess.run(["ip", "addr", "add", taken.replace(".0/24", ".77/24"), "dev", "tktaken0"], check=True)
        subprocess.run(["ip", "link", "set", "tktaken0", "up"], check=True)
        proc = toolkit_cli("lab", "up")
        assert proc.returncode == 2, proc.stderr
        assert f"{taken} is already in use" in proc.stderr and "tktaken0" in proc.stderr
        assert "--subnet" in proc.stderr
        assert_nothing_made()
    finally:
        subprocess.run(["ip", "link", "del", "tktaken0"], check=True)


def test_up_refuses_the_networks_of_another_lab_up_here_naming_it_and_makes_nothing() -> None:
    # Another instance up on this machine (its state file and a live holder process, as `up` leaves them) whose
    # networks are the ones asked: refused before anything is made, naming that lab, a free pair and its down.
    other_dir = Path("/var/lib/toolkit-lab-zq9")
    assert not other_dir.exists(), f"{other_dir} is someone's lab"
    holder = subprocess.Popen(["sleep", "300"])
    subnet, ct_subnet = "10.251.40.0/24", "10.251.41.0/24"
    try:
        other_dir.mkdir()
        other = plan.LabState(config=plan.LabConfig(subnet=subnet, ct_subnet=ct_subnet),
                              inventory_path=str(other_dir / "lab.yml"), ssh_key_path="", known_hosts_path="",
                              holder_pid=holder.pid, holder_start_ticks=system.start_ticks(holder.pid),
                              running=True)
        (other_dir / "state.json").write_text(other.to_json())
        proc = toolkit_cli("lab", "up", "--subnet", subnet, "--ct-subnet", ct_subnet)
        assert proc.returncode == 2, proc.stderr
        assert "lab instance zq9 (TOOLKIT_LAB_INSTANCE=zq9), which is up on this machine" in proc.stderr
        assert "TOOLKIT_LAB_INSTANCE=zq9 toolkit lab down" in proc.stderr and "--subnet 10." in proc.stderr
        assert "Traceback" not in proc.stderr
        assert_nothing_made()
    finally:
        holder.kill()
        holder.wait()
        (other_dir / "state.json").unlink(missing_ok=True)
        other_dir.rmdir()


def test_down_removes_everything_up_made_and_a_warm_up_is_fast() -> None:
    t0 = time.monotonic()
    state = toolkit.lab.up(gpus=2)
    first_up_s = time.monotonic() - t0
    assert rootfs.is_cached()
    try:
        pid = state.holder_pid
        assert toolkit.lab.up(gpus=2).holder_pid == pid, "a second up must reuse the running lab"
        # Give down real work: a running LXC container with its own veth, cgroups and processes.
        tmpl = f"local:vztmpl/{plan.TEMPLATE_NAME}"
        state.ssh("pve1", f"pveam download local {plan.TEMPLATE_NAME}")
        ct_ip = state.config.ct_subnet.replace(".0/24", ".150/24")
        proc = state.ssh("pve1", f"pct create 150 {tmpl} --storage local-lvm --hostname t "
                                 f"--net0 name=eth0,bridge=vmbr0,ip={ct_ip} --dev0 /dev/nvidia1 "
                                 "&& pct start 150 && pct status 150")
        assert proc.stdout.endswith("status: running\n"), proc.stderr
        lab_pids = system.cgroup_pids()
        assert len(lab_pids) > 3
    finally:
        toolkit.lab.down()
    assert system.leftovers() == []
    assert [p for p in lab_pids if Path(f"/proc/{p}").exists()] == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    # Exact names: another lab instance's namespace (toolkit-pve1-b) may exist beside this one.
    assert plan.NETNS not in [line.split()[0] for line in netns.splitlines() if line.strip()]
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert state.config.subnet not in routes and state.config.ct_subnet not in routes
    assert str(system.STATE_DIR) + "/" not in Path("/proc/self/mountinfo").read_text()
    assert not Path(state.inventory_path).exists()
    assert rootfs.is_cached(), "down keeps the cache unless asked"

    t1 = time.monotonic()
    again = toolkit.lab.up(gpus=2)
    warm_up_s = time.monotonic() - t1
    try:
        assert again.ssh("pve1", "hostname").stdout == "pve1\n"
        assert warm_up_s < 30, f"warm up took {warm_up_s:.1f} s"
        print(f"lab up: first {first_up_s:.1f} s, warm {warm_up_s:.1f} s")
    finally:
        toolkit.lab.down()
    assert system.leftovers() == []
