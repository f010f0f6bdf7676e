"""The lab for real (root; marked `lab` through the fixture): pve1 over SSH, a container made
and started through the pct stand-in, device passthrough semantics, the driver stand-ins."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import yaml

from toolkit.lab import template as template_index
from toolkit.lab.plan import TEMPLATE_NAME, LabState

VMID = 100
ERRNO_PROBE = (
    "python3 -c 'import errno, os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    "        os.close(os.open(p, os.O_RDWR)); print(p, \"OPENED\")\n"
    "    except OSError as e:\n"
    "        print(p, errno.errorcode[e.errno])' "
)
CUINIT = (
    "python3 -c 'import ctypes; cuda = ctypes.CDLL(\"libcuda.so.1\"); rc = cuda.cuInit(0); "
    "n = ctypes.c_int(-1); cuda.cuDeviceGetCount(ctypes.byref(n)); print(rc, n.value)'"
)


# A fresh Proxmox host has no template: `pveam download` fetches it (the lab's stand-in from its cache).
TEMPLATE = (f"test -f /var/lib/vz/template/cache/{TEMPLATE_NAME} || pveam download local {TEMPLATE_NAME} >/dev/null; "
            f"echo local:vztmpl/{TEMPLATE_NAME}")


def template(state: LabState) -> str:
    return ok(state, "pve1", TEMPLATE).strip()


def ok(state: LabState, host: str, command: str) -> str:
    proc = state.ssh(host, command)
    assert proc.returncode == 0, f"{host}: {command}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc.stdout


def errnos(state: LabState, host: str, *paths: str) -> dict[str, str]:
    out = ok(state, host, ERRNO_PROBE + " ".join(paths))
    return dict(line.split() for line in out.splitlines())


def wait_for(predicate, timeout_s: float = 60, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_pve1_answers_as_a_debian_12_proxmox_stand_in(lab: LabState) -> None:
    out = ok(lab, "pve1", "hostname; cat /etc/debian_version; pveversion; pct --version; "
                          "pveam available --section system")
    lines = out.splitlines()
    assert lines[0] == "pve1"
    assert lines[1].startswith("12.")
    assert lines[2].startswith("pve-manager/8.") and "lab stand-in" in lines[2]
    assert "lab stand-in" in lines[3]
    # Proxmox's index lists a standard template per supported Debian release; the lab serves both.
    assert lines[4:] == [f"system          {a.file_name}" for a in template_index.APPLIANCES.values()]
    assert template_index.APPLIANCES["bookworm"].file_name == TEMPLATE_NAME
    with open(lab.inventory_path) as fh:
        inventory = yaml.safe_load(fh)
    assert inventory["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]["ansible_host"] == lab.host_address


def test_pve1_runs_systemd_and_a_unit_a_role_installs_really_runs(lab: LabState) -> None:
    assert ok(lab, "pve1", "cat /proc/1/comm; systemctl is-system-running") == "systemd\nrunning\n"
    unit = ("[Unit]\nDescription=lab test oneshot\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
            "ExecStart=/usr/bin/touch /run/lab-test-oneshot\n")
    try:
        ok(lab, "pve1", f"printf '{unit}' > /etc/systemd/system/lab-test.service && systemctl daemon-reload && "
                        "systemctl start lab-test.service")
        assert ok(lab, "pve1", "systemctl is-active lab-test.service; test -e /run/lab-test-oneshot && echo ran") \
            == "active\nran\n"
    finally:
        lab.ssh("pve1", "systemctl stop lab-test.service; rm -f /etc/systemd/system/lab-test.service "
                        "/run/lab-test-oneshot; systemctl daemon-reload")


def test_pve1_cannot_reach_beyond_the_lab(lab: LabState) -> None:
    proc = lab.ssh("pve1", "ip route get 1.1.1.1")
    assert proc.returncode != 0 and "unreachable" in proc.stderr.lower()
    assert "default" not in ok(lab, "pve1", "ip route")


@pytest.fixture(scope="module")
def ct(lab: LabState) -> Iterator[LabState]:
    c = lab.config
    lab.ssh("pve1", f"pct stop {VMID}; pct destroy {VMID}")
    ok(lab, "pve1", f"cp /root/.ssh/authorized_keys /root/ct.pub && pct create {VMID} "
                    f"{template(lab)} --hostname ct --cores 2 --memory 2048 --swap 0 "
                    f"--rootfs local-lvm:8 --features nesting=1 --unprivileged 0 --ssh-public-keys /root/ct.pub "
                    f"--net0 name=eth0,bridge=vmbr0,ip={c.ct_address}/24,gw={c.bridge_address}")
    # dev0 through Proxmox's own key; nvidiactl bound in by a raw mount entry with no cgroup rule.
    ok(lab, "pve1", f"pct set {VMID} --dev0 /dev/nvidia0,mode=0666 && printf '%s\\n' "
                    f"'lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file' "
                    f">> /etc/pve/lxc/{VMID}.conf && pct start {VMID}")
    wait_for(lambda: lab.ssh("ct", "true").returncode == 0, 30, "ct to answer over SSH")
    yield lab
    lab.ssh("pve1", f"pct stop {VMID}; pct destroy {VMID}")


def test_pct_keeps_proxmox_format_and_runs_a_real_container(ct: LabState) -> None:
    config = ok(ct, "pve1", f"pct config {VMID}")
    assert "dev0: /dev/nvidia0,mode=0666\n" in config
    assert config.splitlines()[-1].startswith("lxc.mount.entry: /dev/nvidiactl")
    keys = [line.split(":")[0] for line in config.splitlines() if not line.startswith("lxc.")]
    assert keys == sorted(keys)
    assert ok(ct, "pve1", f"pct status {VMID}") == "status: running\n"
    assert ok(ct, "pve1", f"pct exec {VMID} -- hostname") == "ct\n"
    assert ok(ct, "ct", "hostname; cat /etc/debian_version").splitlines()[0] == "ct"


def test_container_runs_systemd_as_init(ct: LabState) -> None:
    wait_for(lambda: ct.ssh("ct", "systemctl is-system-running").stdout.strip() in ("running", "degraded"), 60,
             "systemd in ct to finish booting")
    assert ok(ct, "ct", "systemctl is-system-running; systemctl --failed --no-legend") == "running\n"
    assert ok(ct, "ct", "cat /proc/1/comm") == "systemd\n"


def test_passthrough_allowed_major_gives_enxio_and_unallowed_gives_eperm(ct: LabState) -> None:
    seen = errnos(ct, "ct", "/dev/nvidia0", "/dev/nvidiactl")
    # 195:0 is allowed by dev0 (no driver behind it: ENXIO); 195:255 has no cgroup rule: EPERM.
    assert seen == {"/dev/nvidia0": "ENXIO", "/dev/nvidiactl": "EPERM"}
    # A Proxmox 8 (cgroup v2) key is translated for this cgroup v1 host at start, as pct does.
    ok(ct, "pve1", f"echo 'lxc.cgroup2.devices.allow: c 195:255 rwm' >> /etc/pve/lxc/{VMID}.conf && "
                   f"pct stop {VMID} && pct start {VMID}")
    assert "lxc.cgroup.devices.allow = c 195:255 rwm" in ok(ct, "pve1", f"cat /var/lib/lxc/{VMID}/config")
    wait_for(lambda: ct.ssh("ct", "true").returncode == 0, 30, "ct back after restart")
    assert errnos(ct, "ct", "/dev/nvidiactl") == {"/dev/nvidiactl": "ENXIO"}


def test_unprivileged_container_boots_and_gets_its_device_with_the_mapped_ids(lab: LabState) -> None:
    ip = lab.config.ct_subnet.replace(".0/24", ".120/24")
    lab.ssh("pve1", "pct stop 120; pct destroy 120")
    ok(lab, "pve1", f"pct create 120 {template(lab)} --storage local-lvm --hostname u --unprivileged 1 "
                    f"--net0 name=eth0,bridge=vmbr0,ip={ip} --dev0 /dev/nvidia0,mode=0666,uid=0,gid=44 && "
                    "pct start 120")
    try:
        assert ok(lab, "pve1", "pct exec 120 -- cat /proc/self/uid_map").split() == ["0", "100000", "65536"]
        assert ok(lab, "pve1", "pct exec 120 -- stat -c '%u %g %a' /dev/nvidia0") == "0 44 666\n"
        probe = ERRNO_PROBE.replace("python3 -c ", "pct exec 120 -- python3 -c ") + "/dev/nvidia0"
        assert ok(lab, "pve1", probe).split() == ["/dev/nvidia0", "ENXIO"]
        wait_for(lambda: lab.ssh("pve1", "pct exec 120 -- systemctl is-system-running").stdout.strip()
                 in ("running", "degraded"), 60, "systemd in the unprivileged container")
        assert ok(lab, "pve1", "pct exec 120 -- systemctl is-system-running") == "running\n"
    finally:
        lab.ssh("pve1", "pct stop 120; pct destroy 120")


@pytest.mark.parametrize(("suite", "vmid"), [("bookworm", 121), ("trixie", 122)])
def test_ip_dhcp_gets_the_reserved_address_from_the_lans_dhcp_server(lab: LabState, suite: str, vmid: int) -> None:
    # The role's default net0 is ip=dhcp. Each template's own client asks (debian-12-standard: isc-dhcp-client,
    # debian-13-standard: dhcpcd-base) from the stanza pve-container writes; the lab's dnsmasq on vmbr0 answers.
    from toolkit.lab import system

    name = template_index.APPLIANCES[suite].file_name
    reserved = lab.config.ct_subnet.replace(".0/24", f".{vmid}")
    system.reserve_dhcp_address(f"dhcp-{vmid}", reserved)
    lab.ssh("pve1", f"pct stop {vmid}; pct destroy {vmid}")
    ok(lab, "pve1", f"test -f /var/lib/vz/template/cache/{name} || pveam download local {name} >/dev/null; "
                    f"pct create {vmid} local:vztmpl/{name} --storage local-lvm --hostname dhcp-{vmid} "
                    f"--unprivileged 0 --net0 name=eth0,bridge=vmbr0,ip=dhcp,type=veth && pct start {vmid}")
    try:
        assert "iface eth0 inet dhcp" in ok(lab, "pve1", f"pct exec {vmid} -- cat /etc/network/interfaces")
        addr = f"pct exec {vmid} -- ip -4 -o addr show dev eth0"
        wait_for(lambda: f" {reserved}/24 " in lab.ssh("pve1", addr).stdout, 60, f"{reserved} by DHCP")
        assert "ipv4.address" not in ok(lab, "pve1", f"cat /var/lib/lxc/{vmid}/config")  # not LXC's, the client's
        ok(lab, "pve1", f"ping -c 1 -W 2 {reserved}")
    finally:
        lab.ssh("pve1", f"pct stop {vmid}; pct destroy {vmid}")


def test_start_fails_like_proxmox_when_a_device_node_is_missing_and_other_refusals(lab: LabState) -> None:
    ok(lab, "pve1", f"pct create 101 {template(lab)} --storage local-lvm --hostname missing-dev "
                    f"--dev0 /dev/nvidia-does-not-exist")
    try:
        proc = lab.ssh("pve1", "pct start 101")
        assert proc.returncode != 0
        assert "Device /dev/nvidia-does-not-exist does not exist" in proc.stderr
        assert ok(lab, "pve1", "pct status 101") == "status: stopped\n"
        again = lab.ssh("pve1", f"pct create 101 {template(lab)} --storage local-lvm")
        assert again.returncode != 0 and "already exists" in again.stderr
        bad = lab.ssh("pve1", "pct set 101 --no-such-key 1")
        assert bad.returncode != 0 and "Unknown option: no-such-key" in bad.stderr
        push = lab.ssh("pve1", "pct push 101 /etc/hostname /root/x")
        assert push.returncode != 0 and "can only push files to a running CT" in push.stderr
        # VMIDs are cluster-wide: a VM of another node holds 103, the cluster says so, pct create refuses it.
        ok(lab, "pve1", "mkdir -p /etc/pve/nodes/pve2/qemu-server && echo 'memory: 512' > "
                        "/etc/pve/nodes/pve2/qemu-server/103.conf")
        taken = lab.ssh("pve1", "pvesh get /cluster/nextid --vmid 103")
        assert taken.returncode != 0 and "vmid: VM 103 already exists" in taken.stderr
        assert ok(lab, "pve1", "pvesh get /cluster/nextid --vmid 104") == "104\n"
        create = lab.ssh("pve1", f"pct create 103 {template(lab)} --storage local-lvm")
        assert create.returncode != 0 and "VM 103 already exists on node 'pve2'" in create.stderr
        # A backup's lock holds the config.
        ok(lab, "pve1", "echo 'lock: backup' >> /etc/pve/lxc/101.conf")
        locked = lab.ssh("pve1", "pct set 101 --cores 2")
        assert locked.returncode != 0 and "CT is locked (backup)" in locked.stderr
        ok(lab, "pve1", "sed -i '/^lock:/d' /etc/pve/lxc/101.conf")
        # Another writer holds the config's flock: pct waits as lock_file_full does (blocking, so it goes on
        # the moment the holder lets go), and gives up after 10 s with Proxmox's message.
        lock = "/run/lock/lxc/pve-config-101.lock"
        t0 = time.monotonic()
        waited = lab.ssh("pve1", f"(flock {lock} sleep 1.5 &) ; sleep 0.3; pct set 101 --cores 2")
        waited_s = time.monotonic() - t0
        assert waited.returncode == 0 and "trying to acquire lock... OK" in waited.stderr, waited.stderr
        assert 1.4 < waited_s < 3, waited_s
        t0 = time.monotonic()
        timed_out = lab.ssh("pve1", f"(flock {lock} sleep 12 &) ; sleep 0.3; pct set 101 --cores 3")
        assert timed_out.returncode != 0 and time.monotonic() - t0 > 10
        assert f"can't lock file '{lock}' - got timeout" in timed_out.stderr, timed_out.stderr
        assert "cores: 2\n" in ok(lab, "pve1", "pct config 101")
    finally:
        lab.ssh("pve1", "sed -i '/^lock:/d' /etc/pve/lxc/101.conf; rm -rf /etc/pve/nodes/pve2")
        ok(lab, "pve1", "pct destroy 101")
    assert lab.ssh("pve1", "pct config 101").returncode != 0


def test_pct_set_on_a_running_container_is_pending_like_proxmox(ct: LabState) -> None:
    """pve-container: a running CT gets what can be hotplugged (a new devN, cores) at once and the rest
    in [pve:pending], which `pct config` reports as applied; `--current` and `pct pending` tell them apart."""
    before = ok(ct, "pve1", f"pct config {VMID} --current")
    ok(ct, "pve1", f"pct set {VMID} --dev9 /dev/zero,mode=0600 --cores 3 --features nesting=1,keyctl=1")
    merged, current = ok(ct, "pve1", f"pct config {VMID}"), ok(ct, "pve1", f"pct config {VMID} --current")
    assert "features: nesting=1,keyctl=1\n" in merged and "features: nesting=1\n" in current
    assert "cores: 3\n" in current and "dev9: /dev/zero,mode=0600\n" in current  # hotplugged
    assert ok(ct, "ct", "stat -c %a /dev/zero") == "600\n"
    ok(ct, "pve1", f"pct set {VMID} --dev9 /dev/zero,mode=0666")  # an existing devN: pending until restart
    pending = ok(ct, "pve1", f"pct pending {VMID}")
    assert "cur dev9: /dev/zero,mode=0600\nnew dev9: /dev/zero,mode=0666\n" in pending
    assert "new features: nesting=1,keyctl=1\n" in pending
    assert "[pve:pending]" in ok(ct, "pve1", f"cat /etc/pve/lxc/{VMID}.conf")
    # Refused as Proxmox refuses them, nothing written.
    for bad, message in (("--dev8 /dev/zero,mode=666", "dev8.mode: value does not match the regex pattern"),
                         ("--dev8 /dev/zero,gid=video", "dev8.gid: type check ('integer') failed - got 'video'"),
                         ("--dev8 /dev/nvidia99", "Device /dev/nvidia99 does not exist")):
        proc = ct.ssh("pve1", f"pct set {VMID} {bad}")
        assert proc.returncode != 0 and message in proc.stderr, (bad, proc.stderr)
    # The restart applies what was pending; then it is all current.
    ok(ct, "pve1", f"pct stop {VMID} && pct start {VMID}")
    assert ok(ct, "pve1", f"pct pending {VMID}").count("new ") == 0
    wait_for(lambda: ct.ssh("ct", "true").returncode == 0, 30, "ct back after restart")
    assert ok(ct, "ct", "stat -c %a /dev/zero") == "666\n"
    ok(ct, "pve1", f"pct set {VMID} --delete dev9 --cores 2 --features nesting=1")
    assert ok(ct, "pve1", f"pct stop {VMID} && pct start {VMID} && pct config {VMID} --current") == before
    wait_for(lambda: ct.ssh("ct", "true").returncode == 0, 30, "ct back after restart")


def test_driver_stand_ins_and_the_hmm_symptom(ct: LabState) -> None:
    ver = ct.config.driver_version
    gpus = ct.config.gpus
    before = ct.ssh("pve1", "nvidia-smi")
    assert before.returncode != 0  # no driver yet (command missing, as on a bare host)
    ok(ct, "pve1", f"/opt/lab-standin/NVIDIA-Linux-x86_64-{ver}.run --silent --dkms --kernel-module-type=open "
                   "--no-questions --ui=none")
    rows = ok(ct, "pve1", "nvidia-smi --query-gpu=index,driver_version,power.draw,power.limit "
                          "--format=csv,noheader").splitlines()
    assert len(rows) == gpus and rows[0].split(", ")[:2] == ["0", ver] and rows[0].endswith("600.00 W")
    assert "195 nvidia-frontend" in ok(ct, "pve1", "cat /run/lab-standin/proc-devices")
    # uvm nodes appear only once nvidia-modprobe has loaded nvidia_uvm, with its dynamic major.
    assert errnos(ct, "pve1", "/dev/nvidia-uvm") == {"/dev/nvidia-uvm": "ENOENT"}
    ok(ct, "pve1", "nvidia-modprobe -u -c=0")
    uvm_major = next(int(line.split()[0]) for line in ok(ct, "pve1", "cat /run/lab-standin/proc-devices").splitlines()
                     if line.endswith(" nvidia-uvm"))
    assert ok(ct, "pve1", "stat -c '%t %T' /dev/nvidia-uvm").split() == [f"{uvm_major:x}", "0"]
    param = "/run/lab-standin/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
    assert ok(ct, "pve1", f"cat {param}") == "N\n"
    # The container: userspace without kernel module, uvm passed through.
    ok(ct, "pve1", f"pct push {VMID} /opt/lab-standin/NVIDIA-Linux-x86_64-{ver}.run /root/driver.run && "
                   f"pct exec {VMID} -- sh /root/driver.run --silent --no-kernel-module && "
                   f"pct set {VMID} --dev1 /dev/nvidia-uvm,mode=0666 --dev2 /dev/nvidiactl,mode=0666 && "
                   f"pct stop {VMID} && pct start {VMID}")
    wait_for(lambda: ct.ssh("ct", "true").returncode == 0, 30, "ct back after restart")
    assert ok(ct, "ct", "nvidia-smi --query-gpu=index,driver_version --format=csv,noheader") == f"0, {ver}\n"
    # HMM on (the default): cuInit fails with 3, CUDA_ERROR_NOT_INITIALIZED, as on the story's host.
    assert ok(ct, "ct", CUINIT).split() == ["3", "-1"]
    ok(ct, "pve1", "echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm.conf && "
                   "modprobe -r nvidia_uvm && modprobe nvidia_uvm")
    assert ok(ct, "pve1", f"cat {param}") == "Y\n"
    assert ok(ct, "ct", CUINIT).split() == ["0", "1"]
