"""The lab's system work on the controller: network namespace, veth, cgroups, the pve1 process
tree, and taking all of it down again. Everything `up` makes is recorded in the state file as it
is made, so `down` removes exactly that (by pid, by name) even after a crash halfway through.

pve1 is one process tree: `unshare` (new mount, UTS, IPC, PID and cgroup namespaces, inside the
lab's network namespace) runs stage1.sh as PID 1 of the new PID namespace, which mounts pve1's
overlay root, /proc, /sys, the cgroup controllers, /dev, pivot_roots into it (LXC refuses to
start from a plain chroot: docs/lab.md) and execs systemd. All mounts live only in that
mount namespace, so they vanish with it; killing PID 1 kills every process in the namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from toolkit.adapters import cache_lock
from toolkit.adapters.files import write_atomic
from toolkit.core.errors import EXIT_FAILED, Problem, ToolkitError
from toolkit.lab import plan, rootfs, template
from toolkit.lab.plan import LabConfig, LabState

STATE_DIR = Path("/var/lib") / plan.STATE_DIR_NAME
STATE_FILE = STATE_DIR / "state.json"
SSH_DIR = STATE_DIR / "ssh"
PVE1_DIR = STATE_DIR / "pve1"
# A cluster's /etc/pve/nodes (pmxcfs, the same on every node): one directory bound into each host.
CLUSTER_DIR = STATE_DIR / "pve-cluster"


def host_dir(host: str) -> Path:
    """A host's files on the controller: its overlay, root disk, console (pve1's is PVE1_DIR)."""
    return STATE_DIR / host


def netns_path(name: str) -> Path:
    return Path("/run/netns") / name


def _dhcp_file(name: str, host: str) -> Path:
    """The DHCP server's files of `host`'s vmbr0 (pve1's keep the one-host lab's names)."""
    return STATE_DIR / (name if host == plan.HOSTNAME else f"{host}-{name}")


def _every_host() -> list[str]:
    """Every host name a lab of this instance can have: what `down` looks for when the state is lost."""
    return [f"pve{i}" for i in range(1, plan.MAX_HOSTS + 1)]


def _lab_netns_names() -> list[str]:
    config = plan.LabConfig(hosts=plan.MAX_HOSTS)
    return [h.netns for h in config.lab_hosts] + [plan.LAN_NETNS]

# Controller commands the lab runs, and the Debian package each comes from.
REQUIRED_COMMANDS = {
    "mmdebstrap": "mmdebstrap",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "gcc": "gcc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "zstd": "zstd",
    "tar": "tar",
    "dnsmasq": "dnsmasq-base",
    "openssl": "openssl",
    "mkfs.ext4": "e2fsprogs",
}

Progress = Callable[[str], None]

# Units pve1's systemd must not run: they would act on this machine's kernel and devices, which pve1
# shares (udev would replay the machine's uevents, systemd-sysctl and binfmt set global kernel
# state, fstrim would trim the machine's disk), or would make a network or containers of their
# own (Proxmox does not use Debian's lxc units either), or want a network the lab does not have.
PVE1_MASKED_UNITS = (
    "systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service", "systemd-udev-settle.service", "systemd-sysctl.service",
    "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount", "fstrim.timer", "lxc.service",
    "lxc-net.service", "lxc-monitord.service", "apt-daily.timer", "apt-daily-upgrade.timer",
    "getty@tty1.service", "console-getty.service",
)


def _quiet(_: str) -> None:
    return None


# ---------------------------------------------------------------- small helpers


def run(cmd: list[str], *, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, input=input_text, check=False)
    if check and proc.returncode != 0:
        raise ToolkitError.of(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}",
            fix="run `toolkit lab down` to remove what was made, then `toolkit lab up` again",
            exit_code=EXIT_FAILED,
        )
    return proc


def start_ticks(pid: int) -> int:
    """Field 22 of /proc/PID/stat (start time): a pid plus this names one process, not a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])


def alive(pid: int, ticks: int) -> bool:
    return pid > 0 and ticks > 0 and start_ticks(pid) == ticks


def load_state() -> LabState | None:
    try:
        text = STATE_FILE.read_text()
    except FileNotFoundError:
        return None
    except PermissionError as err:
        raise ToolkitError.of(f"cannot read the lab's state: {err}", file=str(STATE_FILE), field="user",
                              fix="run it as root: `sudo toolkit lab ...`") from err
    return LabState.from_json(text, str(STATE_FILE))


def save_state(state: LabState) -> None:
    write_atomic(STATE_FILE, state.to_json(), mode=0o600)


def default_inventory_path() -> Path:
    """inventory/lab.yml of the checkout when run from one (where the README's commands look),
    else under the lab's state directory (an installed wheel has no writable inventory/)."""
    env = os.environ.get("TOOLKIT_LAB_INVENTORY")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    if not plan.INSTANCE and (checkout / "pyproject.toml").is_file() and (checkout / "inventory").is_dir():
        return checkout / "inventory" / "lab.yml"
    return STATE_DIR / "lab.yml"


# ---------------------------------------------------------------- preflight


def require_root() -> None:
    if os.geteuid() != 0:
        raise ToolkitError.of(
            "the lab makes network namespaces, mounts and LXC containers, which needs root",
            field="user", fix="run it as root: `sudo toolkit lab up`")


def preflight(config: LabConfig) -> None:
    """Everything that can refuse `up` is checked here, before anything is made."""
    problems: list[Problem] = []
    require_root()
    missing = sorted({pkg for cmd, pkg in REQUIRED_COMMANDS.items() if shutil.which(cmd) is None})
    if missing:
        problems.append(Problem(
            f"Debian packages missing on this machine: {', '.join(missing)}", field="packages",
            fix=f"apt-get install {' '.join(missing)}  (or run scripts/setup, which installs "
                "scripts/debian-packages.txt)"))
    if not Path("/usr/include/stdio.h").exists():
        problems.append(Problem("C library headers missing (the libcuda stand-in is compiled here)",
                                field="packages", fix="apt-get install libc6-dev"))
    if not _cgroup_mounts():
        problems.append(Problem("no cgroup hierarchy mounted under /sys/fs/cgroup", field="cgroups",
                                fix="mount the cgroup controllers (a stock Debian 12 boot does)"))
    if shutil.which("ip"):
        routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]")
        addrs = json.loads(run(["ip", "-j", "-4", "addr"]).stdout or "[]")
        for link in addrs:
            for a in link.get("addr_info", []):
                routes.append({"dst": f"{a['local']}/32", "dev": link.get("ifname", "?")})
        # Another lab up here on the same networks is named, with a free pair; its veth's routes are then not
        # reported a second time as anonymous routes.
        others = {name: other.config for name, other in other_running_labs().items()}
        clashing = plan.other_lab_conflicts(config, others, routes)
        problems += clashing
        their_links = {f"tklab{name or '0'}" for name in others} if clashing else set()
        problems += plan.address_conflicts(config, routes, our_links={plan.HOST_VETH} | their_links)
    if problems:
        raise ToolkitError(problems)


# ---------------------------------------------------------------- cgroups


def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of each cgroup hierarchy the controller has."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fstype, _src, sopts = right.split(" ", 2)
        if fstype in ("cgroup", "cgroup2"):
            out.append((left.split()[4], fstype, sopts))
    return out


def _own_cgroup_paths() -> dict[str, str]:
    """controller name (or 'name=systemd', or '' for v2) -> this process's path in it."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    return paths


def lab_cgroup_dirs(name: str = plan.CGROUP_NAME) -> list[Path]:
    """A host's cgroup directory (pve1's by default) in every hierarchy: under this process's own cgroup,
    so the lab stays inside whatever limits the controller runs under. Each host has its own, beside
    pve1's: LXC names a container's group by its vmid under its host's."""
    own = _own_cgroup_paths()
    dirs = []
    for mnt, fstype, sopts in _cgroup_mounts():
        if fstype == "cgroup2":
            key = ""
        else:
            opts = sopts.split(",")
            key = next((o for o in opts if o.startswith("name=")), "")
            if not key:
                key = next((o for o in opts if o in own), "")
        base = own.get(key, "/")
        dirs.append(Path(mnt) / base.lstrip("/") / name)
    return dirs


def _every_cgroup_dir() -> list[Path]:
    names = [h.cgroup_name for h in plan.LabConfig(hosts=plan.MAX_HOSTS).lab_hosts]
    return [d for name in names for d in lab_cgroup_dirs(name)]


def make_cgroups(name: str = plan.CGROUP_NAME) -> list[Path]:
    made = []
    for d in lab_cgroup_dirs(name):
        d.mkdir(exist_ok=True)
        # cgroup v1 cpuset: a new group starts with no CPUs and no memory nodes, and refuses tasks.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (d / knob).exists() and not (d / knob).read_text().strip():
                (d / knob).write_text((d.parent / knob).read_text())
        if (d / "cgroup.clone_children").exists():
            (d / "cgroup.clone_children").write_text("1")
        made.append(d)
    return made


def _walk_down(d: Path) -> Iterator[Path]:
    for child in sorted((p for p in d.iterdir() if p.is_dir()), reverse=True):
        yield from _walk_down(child)
    yield d


def cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for d in _every_cgroup_dir():
        if d.is_dir():
            for sub in _walk_down(d):
                procs = sub / "cgroup.procs"
                if procs.exists():
                    pids |= {int(p) for p in procs.read_text().split()}
    return pids


def remove_cgroups() -> None:
    for d in _every_cgroup_dir():
        if d.is_dir():
            for sub in _walk_down(d):
                try:
                    sub.rmdir()
                except OSError as err:
                    raise ToolkitError.of(f"cannot remove cgroup {sub}: {err}", exit_code=EXIT_FAILED,
                                          fix="a lab process is still running: `toolkit lab down` again") from err


# ---------------------------------------------------------------- files for pve1


def standin_text(name: str) -> str:
    return resources.files("toolkit.lab.standins").joinpath(name).read_text()


def standin_bytes(name: str) -> bytes:
    return resources.files("toolkit.lab.standins").joinpath(name).read_bytes()


def _standin_build_dir() -> Path:
    import hashlib

    h = hashlib.sha256()
    for name in ("libcuda.c", "nvidia-installer.sh", "nvidia-smi", "nvidia-modprobe", "nvidia-persistenced",
                 "labstandin.py", "kernel-Makefile", "kernel-conftest.c"):
        h.update(standin_bytes(name))
    return rootfs.CACHE_DIR / f"standins-{h.hexdigest()[:12]}"


def build_installer(driver_version: str) -> Path:
    """The stand-in NVIDIA-Linux-x86_64-<ver>.run: a shell header plus a tar payload, like the
    real makeself archive, so it runs unchanged on pve1 and inside the container."""
    out_dir = _standin_build_dir()
    run_file = out_dir / f"NVIDIA-Linux-x86_64-{driver_version}.run"
    cache_lock.build_once(out_dir, run_file.is_file, lambda: _build_installer_locked(driver_version, out_dir, run_file))
    return run_file


def _build_installer_locked(driver_version: str, out_dir: Path, run_file: Path) -> Path:
    work = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    payload = work / "payload"
    payload.mkdir(parents=True)
    run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f'-DLAB_DRIVER_VERSION="{driver_version}"',
         "-Wl,-soname,libcuda.so.1", "-o", str(payload / f"libcuda.so.{driver_version}"),
         str(resources.files("toolkit.lab.standins").joinpath("libcuda.c"))])
    for name in ("nvidia-smi", "nvidia-modprobe", "nvidia-persistenced", "labstandin.py"):
        write_atomic(payload / name, standin_bytes(name), mode=0o755)
    write_atomic(payload / "VERSION", driver_version + "\n")
    # The kernel module's "source": built on the host with its own toolchain (and by dkms).
    write_atomic(payload / "kernel/Makefile", standin_bytes("kernel-Makefile"))
    write_atomic(payload / "kernel/conftest.c", standin_bytes("kernel-conftest.c"))
    write_atomic(payload / "kernel/dkms.conf", f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{driver_version}"\n'
                 'BUILT_MODULE_NAME[0]="nvidia"\nDEST_MODULE_LOCATION[0]="/kernel/drivers/video"\nAUTOINSTALL="yes"\n')
    tarball = work / "payload.tar.gz"
    run(["tar", "--numeric-owner", "--owner=0", "--group=0", "-C", str(payload), "-czf", str(tarball), "."])
    header = standin_text("nvidia-installer.sh").replace("@DRIVER_VERSION@", driver_version)
    write_atomic(work / run_file.name, header.encode() + tarball.read_bytes(), mode=0o755)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.replace(work / run_file.name, run_file)
    shutil.rmtree(work, ignore_errors=True)
    return run_file


def ensure_ssh_key() -> Path:
    SSH_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(SSH_DIR, 0o700)
    key = SSH_DIR / "id_ed25519"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "toolkit-lab", "-f", str(key)])
    return key


def populate_upper(config: LabConfig, upper: Path, key: Path, installer: Path, host: str = plan.HOSTNAME) -> str:
    """Write a host's own files into its overlay's upper layer; return the known_hosts line."""
    me = config.lab_host(host)
    def put(rel: str, content: str | bytes, mode: int = 0o644) -> None:
        write_atomic(upper / rel.lstrip("/"), content, mode=mode)

    root_ssh = upper / "root/.ssh"
    root_ssh.mkdir(parents=True, exist_ok=True)
    os.chmod(root_ssh, 0o700)
    put("/root/.ssh/authorized_keys", Path(str(key) + ".pub").read_text(), 0o600)
    # A fresh host key per `up` (a new host each time), pinned in the lab's known_hosts.
    hk = upper / "etc/ssh/ssh_host_ed25519_key"
    hk.parent.mkdir(parents=True, exist_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", str(hk)])
    put("/etc/ssh/sshd_config.d/lab.conf", standin_text("sshd-lab.conf"))
    put("/etc/hostname", host + "\n")
    # Every host and container of the lab by name, as a LAN's DNS would have them.
    put("/etc/hosts", "127.0.0.1 localhost\n" + "".join(
        f"{h.address} {h.name}.lab {h.name}\n{h.ct_address} {h.ct_name}\n" for h in config.lab_hosts))
    if me.clock_skew_ms:
        _skew_clock(upper, me.clock_skew_ms)

    put("/etc/lab-standin/lab.json", plan.standin_config(config))
    put("/usr/lib/lab-standin/labstandin.py", standin_bytes("labstandin.py"))
    put("/usr/lib/lab-standin/proc-devices.kernel", Path("/proc/devices").read_text())
    put("/usr/local/sbin/lab-init", standin_bytes("lab-init"), 0o755)
    put("/etc/systemd/system/lab-standin-boot.service", standin_bytes("lab-standin-boot.service"))
    wants = upper / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "lab-standin-boot.service").symlink_to("/etc/systemd/system/lab-standin-boot.service")
    for unit in PVE1_MASKED_UNITS:
        (upper / "etc/systemd/system" / unit).symlink_to("/dev/null")
    put("/usr/sbin/pct", standin_bytes("pct"), 0o755)
    put("/usr/bin/pveversion", standin_bytes("pveversion"), 0o755)
    put("/usr/sbin/modprobe", standin_bytes("modprobe"), 0o755)
    put("/usr/local/bin/lspci-lab-standin", standin_bytes("lspci-lab-standin"), 0o755)
    if not config.flavour_spec.stock:
        put(f"/opt/lab-standin/{installer.name}", installer.read_bytes(), 0o755)
    (upper / "etc/pve/lxc").mkdir(parents=True, exist_ok=True)  # the link to nodes/ in a cluster
    put("/etc/pve/storage.cfg", plan.STORAGE_CFG[config.flavour_spec.storage])
    (upper / "etc/pve/qemu-server").mkdir(parents=True, exist_ok=True)
    if config.vm_gpus:
        put(f"/etc/pve/qemu-server/{plan.VM_VMID}.conf", plan.vm_config(config))
    # The HA stack (pve-ha-manager): its CLI and the rounds of its CRM and LRM.
    (upper / "etc/pve/ha").mkdir(parents=True, exist_ok=True)
    put("/usr/sbin/ha-manager", standin_bytes("ha-manager"), 0o755)
    put("/usr/share/lab-standin/pve-ha-lrm", standin_bytes("pve-ha-lrm"), 0o755)
    put("/etc/systemd/system/pve-ha-lrm.service", standin_bytes("pve-ha-lrm.service"))
    (upper / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (upper / "etc/systemd/system/multi-user.target.wants/pve-ha-lrm.service").symlink_to(
        "/etc/systemd/system/pve-ha-lrm.service")
    (upper / "etc/modprobe.d").mkdir(parents=True, exist_ok=True)
    put("/usr/share/lab-standin/pve-startall", standin_bytes("pve-startall"), 0o755)
    put("/etc/systemd/system/pve-guests.service", standin_bytes("pve-guests.service"))
    (upper / "etc/systemd/system/multi-user.target.wants/pve-guests.service").symlink_to(
        "/etc/systemd/system/pve-guests.service")
    if config.cluster:
        _join_cluster(upper, host)
    pub = (hk.parent / "ssh_host_ed25519_key.pub").read_text().split()
    return f"{me.address} {pub[0]} {pub[1]}\n"


def _join_cluster(upper: Path, host: str) -> None:
    """pmxcfs's layout: a node's own guests under /etc/pve/nodes/<node>/, which is the same directory on every
    node (stage1.sh binds the lab's one), and /etc/pve/lxc and qemu-server links to the node's own."""
    (upper / "etc/pve/nodes").mkdir(parents=True, exist_ok=True)
    for sub in ("lxc", "qemu-server"):
        shared = CLUSTER_DIR / host / sub
        shared.mkdir(parents=True, exist_ok=True)
        local = upper / "etc/pve" / sub
        for conf in sorted(local.iterdir()):
            shutil.move(conf, shared / conf.name)
        local.rmdir()
        local.symlink_to(f"nodes/{host}/{sub}")


def _skew_clock(upper: Path, skew_ms: int) -> None:
    """A host whose wall clock is `skew_ms` apart from the controller's. The hosts share this machine's kernel
    and its CLOCK_REALTIME (a time namespace offsets only the monotonic and boot clocks), so a shim preloaded into
    every process of the host (its /etc/ld.so.preload) adds the offset to the wall-clock calls; the monotonic
    clock, sleeps and timed waits stay the kernel's (standins/clockskew.c says why not libfaketime). Compiled
    here, as the libcuda stand-in is."""
    library = upper / plan.CLOCK_SKEW_LIBRARY.lstrip("/")
    library.parent.mkdir(parents=True, exist_ok=True)
    run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library),
         str(resources.files("toolkit.lab.standins").joinpath("clockskew.c")), "-ldl"])
    for rel, text in plan.clock_skew_files(skew_ms).items():
        write_atomic(upper / rel.lstrip("/"), text)


# A host's appliance index (aplinfo.dat and the CT templates it lists), where pveam's stand-in downloads from: a
# directory on the controller, bound into the host (stage1.sh, LAB_APLINFO), so that a template built after the
# host started appears there whole. While APLINFO_PENDING is in it the templates are still being built and
# pveam's stand-in waits; APLINFO_FAILED says why their build failed, and pveam's stand-in fails with it.
APLINFO_MOUNT = "var/lib/lab-standin/aplinfo"
APLINFO_PENDING = ".building"
APLINFO_FAILED = ".failed"


def aplinfo_dir(host: str) -> Path:
    return host_dir(host) / "aplinfo"


def place_templates(upper: Path, lower: Path) -> None:
    """pveam's, pvesm's and pvesh's stand-ins, and the mount point of the appliance index; none in
    /var/lib/vz/template/cache (a fresh Proxmox host has none), and the toolkit's old template, still inside
    cached userlands, hidden by an overlay whiteout."""
    import stat

    (upper / APLINFO_MOUNT).mkdir(parents=True, exist_ok=True)
    for name in ("pveam", "pvesm", "pvesh"):
        write_atomic(upper / "usr/bin" / name, standin_bytes(name), mode=0o755)
    cache = plan.TEMPLATE_DIR.lstrip("/")
    (upper / cache).mkdir(parents=True, exist_ok=True)
    for old in template.RETIRED_FILE_NAMES:
        if (lower / cache / old).exists():
            os.mknod(upper / cache / old, stat.S_IFCHR, os.makedev(0, 0))


def place_index(mirror: Path, template_files: dict[str, Path]) -> None:
    """The appliance index and the templates (suite -> file) in a host's aplinfo directory, as Proxmox's index
    lists them (debian-12-standard and debian-13-standard); then the pending mark goes. Each file lands whole
    (a link or copy under a temporary name, then a rename), so `up` and the template build may both place it."""
    import hashlib

    sums: dict[str, str] = {}
    for template_file in template_files.values():
        dst = mirror / template_file.name
        tmp = mirror / f".{template_file.name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            os.link(template_file, tmp)  # same filesystem: no 140 MB copy per up
        except OSError:
            shutil.copyfile(template_file, tmp)
        os.replace(tmp, dst)
        sums_file = template_file.with_name(template_file.name + ".sha512")
        if not sums_file.is_file():
            h = hashlib.sha512()
            with open(template_file, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            write_atomic(sums_file, h.hexdigest() + "\n")
        sums[template_file.name] = sums_file.read_text().strip()
    write_atomic(mirror / "aplinfo.dat", template.render_aplinfo(
        [template.APPLIANCES[suite] for suite in template_files], sums, "http://download.proxmox.com/images/system"))
    (mirror / APLINFO_PENDING).unlink(missing_ok=True)


def start_template_builder(suites: tuple[str, ...], mirrors: list[Path]) -> subprocess.Popen[bytes]:
    """The CT templates built beside the rest of `up` and the hosts' provisioning, then placed into each mirror
    still pending (toolkit.lab.template_job): nothing needs a template before a container is created. Its own
    process group, so that `down` stops it with its mmdebstrap."""
    rootfs.CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (rootfs.CACHE_DIR / "template-job.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "toolkit.lab.template_job", *suites, "--into", *map(str, mirrors)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _index_if_built(builder: subprocess.Popen[bytes], suites: tuple[str, ...], mirrors: list[Path]) -> None:
    """Once the hosts' mirrors are marked pending: if the build has already ended, place its templates here
    (it placed into no mirror marked after it looked), or raise its failure while `up` can still say so."""
    if builder.poll() is None:
        return
    if all(rootfs.template_cached(s) for s in suites):
        for mirror in mirrors:
            place_index(mirror, {s: rootfs.template_file(s) for s in suites})
        return
    log = rootfs.CACHE_DIR / "template-job.log"
    tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
    raise ToolkitError.of(f"building the CT template failed (exit {builder.returncode}):\n{tail}",
                          exit_code=EXIT_FAILED, file=str(log),
                          fix="fix what the log says, then `toolkit lab up` again")


def stop_template_builder(state: LabState, progress: Progress) -> None:
    pid, ticks = ([*state.template_builder, 0, 0])[:2]
    if not alive(pid, ticks):
        return
    progress(f"stopping the CT template's build (pid {pid}; its cache directory is rebuilt by the next up)")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(pid, ticks):
            time.sleep(0.05)


# ---------------------------------------------------------------- stock flavours (issue 13)


def build_installers(config: LabConfig) -> list[Path]:
    """The installers: the asked version and every other one the flavour's mirror serves."""
    return [build_installer(v) for v in config.mirror_driver_versions]


def build_flavour(config: LabConfig, lower: Path, installers: list[Path] | None = None) -> tuple[list[Path], Any]:
    """The installers (built here unless given) and, for a stock flavour, its mirror."""
    installers = installers if installers is not None else build_installers(config)
    if not config.flavour_spec.stock:
        return installers, None
    from toolkit.lab import aptrepo

    return installers, aptrepo.build(rootfs.CACHE_DIR, lower, config.flavour_spec, installers)


def populate_flavour(config: LabConfig, upper: Path, lower: Path, mirror: Any) -> None:
    """A stock flavour's pve1: the stand-in Proxmox kernel it boots (and, homelab, a newer one installed but
    not booted), apt sources as a Proxmox VE host has them after its installer (Debian's, and the
    enterprise repositories, answered by the mirror on pve1 over http and https), the subscription key when
    the flavour has one, the firmware's enrolled Machine Owner Key, initramfs-tools' command, the stand-in
    uname and mokutil."""
    from toolkit.lab import aptrepo

    f = config.flavour_spec

    def put(rel: str, content: str | bytes, mode: int = 0o644) -> None:
        write_atomic(upper / rel.lstrip("/"), content, mode=mode)

    for kver in (f.kernel, f.pending_kernel):
        if not kver:
            continue
        put(f"/boot/vmlinuz-{kver}", f"lab stand-in kernel {kver}: pve1 runs the controller's kernel\n")
        # The kernel package's initramfs: nothing blacklisted in it, so nouveau is loaded from it at boot.
        put(f"/boot/initrd.img-{kver}", json.dumps({"kernel": kver, "modprobe.d": {}}) + "\n")
        # usr/lib, not lib: /lib is the lower layer's symlink to usr/lib (merged /usr), which a real
        # directory in the upper layer would hide.
        (upper / f"usr/lib/modules/{kver}").mkdir(parents=True, exist_ok=True)
    if f.pending_kernel:
        # Installed after the last boot: this boot is still the older kernel's (lab-init's one-time choice).
        put("/var/lib/lab-standin/boot-once", f.kernel + "\n")
        # Its headers came with it (an `apt dist-upgrade` with proxmox-default-headers installed), before any
        # NVIDIA module was registered with DKMS: nothing is built for it.
        for rel, (text, mode) in aptrepo.headers_files(f.pending_kernel).items():
            put(rel, text, mode)
        (upper / f"usr/lib/modules/{f.pending_kernel}/build").symlink_to(f"/usr/src/linux-headers-{f.pending_kernel}")
    put("/usr/local/bin/uname", standin_bytes("uname"), 0o755)
    put("/usr/sbin/update-initramfs", standin_bytes("update-initramfs"), 0o755)
    put("/usr/bin/mokutil", standin_bytes("mokutil"), 0o755)
    put("/usr/lib/lab-standin/mirror.py", standin_bytes("mirror.py"), 0o755)
    put("/etc/systemd/system/lab-standin-mirror.service", standin_bytes("lab-standin-mirror.service"))
    (upper / "etc/systemd/system/multi-user.target.wants/lab-standin-mirror.service").symlink_to(
        "/etc/systemd/system/lab-standin-mirror.service")
    # The mirror is bound in read-only by stage1.sh (LAB_MIRROR), so the cached tree is not copied.
    (upper / "srv/lab-standin-mirror").mkdir(parents=True, exist_ok=True)
    hosts = (upper / "etc/hosts").read_text()
    put("/etc/hosts", hosts + f"{plan.MIRROR_ADDRESS} {' '.join(plan.MIRROR_HOSTS)}  # lab stand-in mirror\n")
    # TLS: the mirror's certificate, and the lab CA among the ones pve1 trusts (apt's https method, curl and
    # Python read /etc/ssl/certs/ca-certificates.crt, which update-ca-certificates would write).
    ca = (mirror.tls_dir / "ca.crt").read_text()
    put("/etc/lab-standin/mirror-tls/server.crt", (mirror.tls_dir / "server.crt").read_bytes())
    put("/etc/lab-standin/mirror-tls/server.key", (mirror.tls_dir / "server.key").read_bytes(), 0o600)
    put("/usr/local/share/ca-certificates/lab-standin-ca.crt", ca)
    put("/etc/ssl/certs/ca-certificates.crt", (lower / "etc/ssl/certs/ca-certificates.crt").read_text() + ca)
    put("/etc/apt/trusted.gpg.d/lab-standin-archive.gpg", mirror.archive_key)
    put("/usr/share/keyrings/proxmox-archive-keyring.gpg", mirror.archive_key)
    suite, ceph = f.debian_suite, f"ceph-{f.ceph_release}"
    if f.pve_major < 9:
        # pve-docs pve-package-repos.adoc (PVE 8): the installer's sources.list, pve-enterprise.list, ceph.list.
        put("/etc/apt/sources.list", f"deb http://deb.debian.org/debian {suite} main contrib\n"
                                     f"deb http://deb.debian.org/debian {suite}-updates main contrib\n\n"
                                     "# security updates\n"
                                     f"deb http://security.debian.org/debian-security {suite}-security main contrib\n")
        put("/etc/apt/sources.list.d/pve-enterprise.list",
            f"deb https://enterprise.proxmox.com/debian/pve {suite} pve-enterprise\n")
        put("/etc/apt/sources.list.d/ceph.list",
            f"deb https://enterprise.proxmox.com/debian/{ceph} {suite} enterprise\n")
    else:
        # PVE 9: deb822 .sources files (pve-docs, "Repository Formats").
        put("/etc/apt/sources.list", "")
        put("/etc/apt/sources.list.d/debian.sources",
            f"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite} {suite}-updates\n"
            f"Components: main contrib\n\nTypes: deb\nURIs: http://security.debian.org/debian-security\n"
            f"Suites: {suite}-security\nComponents: main contrib\n")
        put("/etc/apt/sources.list.d/pve-enterprise.sources",
            f"Types: deb\nURIs: https://enterprise.proxmox.com/debian/pve\nSuites: {suite}\n"
            "Components: pve-enterprise\nSigned-By: /usr/share/keyrings/proxmox-archive-keyring.gpg\n")
        put("/etc/apt/sources.list.d/ceph.sources",
            f"Types: deb\nURIs: https://enterprise.proxmox.com/debian/{ceph}\nSuites: {suite}\n"
            "Components: enterprise\nSigned-By: /usr/share/keyrings/proxmox-archive-keyring.gpg\n")
    if f.subscription:
        # What `pvesubscription set KEY` leaves for apt (pve-manager): the key for the enterprise repositories.
        put("/etc/apt/auth.conf.d/pve.conf",
            "".join(f"machine enterprise.proxmox.com/debian/{repo}\n login {plan.SUBSCRIPTION_SERVER_ID}\n"
                    f" password {plan.SUBSCRIPTION_KEY}\n" for repo in ("pve", ceph)), 0o600)
    if config.apt_driver:
        put("/var/lib/dpkg/status", (lower / "var/lib/dpkg/status").read_text() + plan.apt_driver_status())
        put(plan.ALTERNATE_INSTALL_MARKER, "")
        for name in plan.APT_DRIVER_PACKAGES:
            put(f"/var/lib/dpkg/info/{name}.list",
                f"/usr/lib/nvidia\n{plan.ALTERNATE_INSTALL_MARKER}\n" if name == "nvidia-support" else "")
    # The owner's module-signing key, enrolled in the firmware's MOK list (as one does once with
    # `mokutil --import` and MokManager): what a Secure Boot host's NVIDIA module must be signed with.
    key_dir = upper / "root/secure-boot"
    key_dir.mkdir(parents=True, exist_ok=True)
    run(["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "36500", "-outform", "DER",
         "-subj", "/CN=pve1 module signing (lab stand-in)/", "-keyout", str(key_dir / "MOK.priv"),
         "-out", str(key_dir / "MOK.der")])
    os.chmod(key_dir / "MOK.priv", 0o600)
    der = (key_dir / "MOK.der").read_bytes()
    put(f"/var/lib/lab-standin/firmware/mok/{hashlib.sha256(der).hexdigest()[:16]}.der", der)


# ---------------------------------------------------------------- network


def make_network(config: LabConfig, state: LabState) -> None:
    """One host: a veth from the controller straight into pve1's namespace. Several: the LAN is a bridge in a
    namespace of its own (a switch) that the controller and every host plug a veth into; each host routes the
    others' container networks, so containers reach each other (a multi-node server's ranks) through their
    hosts, as on a routed LAN."""
    def step(record: str, cmd: list[str]) -> None:
        run(cmd)
        if record and record not in state.made:
            state.made.append(record)
            save_state(state)

    hosts = config.lab_hosts
    if len(hosts) == 1:
        step(f"netns:{plan.NETNS}", ["ip", "netns", "add", plan.NETNS])
        step(f"link:{plan.HOST_VETH}", ["ip", "link", "add", plan.HOST_VETH, "type", "veth", "peer", "name",
                                        plan.PEER_VETH, "netns", plan.NETNS])
        run(["ip", "-n", plan.NETNS, "link", "set", plan.PEER_VETH, "name", "eth0"])
    else:
        lan = ["ip", "-n", plan.LAN_NETNS]
        step(f"netns:{plan.LAN_NETNS}", ["ip", "netns", "add", plan.LAN_NETNS])
        run([*lan, "link", "add", plan.LAN_BRIDGE, "type", "bridge"])
        run([*lan, "link", "set", plan.LAN_BRIDGE, "up"])
        step(f"link:{plan.HOST_VETH}", ["ip", "link", "add", plan.HOST_VETH, "type", "veth", "peer", "name",
                                        plan.PEER_VETH, "netns", plan.LAN_NETNS])
        run([*lan, "link", "set", plan.PEER_VETH, "master", plan.LAN_BRIDGE, "up"])
        for h in hosts:
            step(f"netns:{h.netns}", ["ip", "netns", "add", h.netns])
            # The switch's port is named after the host; its peer is the host's eth0.
            run([*lan, "link", "add", h.name, "type", "veth", "peer", "name", "eth0", "netns", h.netns])
            run([*lan, "link", "set", h.name, "master", plan.LAN_BRIDGE, "up"])
    for h in hosts:
        ns = ["ip", "-n", h.netns]
        run([*ns, "addr", "add", f"{h.address}/{config.prefixlen}", "dev", "eth0"])
        run([*ns, "link", "set", "lo", "up"])
        run([*ns, "link", "set", "eth0", "up"])
        # vmbr0 as on a Proxmox host; containers' veths join it. No default route in a host: nothing
        # in the lab can reach beyond the controller.
        run([*ns, "link", "add", plan.BRIDGE, "type", "bridge"])
        run([*ns, "addr", "add", f"{h.bridge_address}/{h.ct_prefixlen}", "dev", plan.BRIDGE])
        run([*ns, "link", "set", plan.BRIDGE, "up"])
        run(["ip", "netns", "exec", h.netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        for other in hosts:
            if other != h:
                run([*ns, "route", "add", other.ct_subnet, "via", other.address, "dev", "eth0"])
    run(["ip", "addr", "add", f"{config.controller_address}/{config.prefixlen}", "dev", plan.HOST_VETH])
    run(["ip", "link", "set", plan.HOST_VETH, "up"])
    # The container networks are routed through their hosts, so Ansible reaches each container directly; the
    # routes go away with the veth.
    for h in hosts:
        run(["ip", "route", "add", h.ct_subnet, "via", h.address, "dev", plan.HOST_VETH])


def start_dhcp(config: LabConfig, host: str = plan.HOSTNAME) -> None:
    """The LAN's DHCP server on a host's vmbr0, for containers whose netN says ip=dhcp (the role's default):
    dnsmasq in the host's network namespace, not in the host (a Proxmox host is no DHCP server; its LAN has
    one). DHCP only (--port=0), as root (dnsmasq-base makes no user of its own). An address is reserved
    by the hostname the container's DHCP client sends (reserve_dhcp_address); others get one from the
    subnet's top 50. It runs in the namespace, so `down` stops it with the host's leftovers."""
    import ipaddress

    me = config.lab_host(host)
    net = ipaddress.IPv4Network(me.ct_subnet)
    hosts = list(net.hosts())
    pool = hosts[-50:] if len(hosts) > 100 else hosts[len(hosts) // 2:]
    dhcp_hosts, dhcp_pid = _dhcp_file("dhcp-hosts", host), _dhcp_file("dnsmasq.pid", host)
    write_atomic(dhcp_hosts, "")  # a new lab: no reservations yet
    dhcp_pid.unlink(missing_ok=True)
    run(["ip", "netns", "exec", me.netns, "dnsmasq", "--conf-file=/dev/null", "--port=0", "--user=root",
         f"--interface={plan.BRIDGE}", "--bind-interfaces", "--dhcp-authoritative",
         f"--dhcp-range={pool[0]},{pool[-1]},{net.netmask},1h", f"--dhcp-option=option:router,{me.bridge_address}",
         f"--dhcp-hostsfile={dhcp_hosts}", f"--dhcp-leasefile={_dhcp_file('dhcp.leases', host)}",
         f"--pid-file={dhcp_pid}", "--log-dhcp", f"--log-facility={_dhcp_file('dnsmasq.log', host)}"])


def reserve_dhcp_address(hostname: str, address: str, host: str = plan.HOSTNAME) -> None:
    """The DHCP server of `host`'s vmbr0 gives `address` to the container that asks as `hostname` (a
    reservation, as a LAN's DHCP server keeps one per host); dnsmasq rereads its hosts file on SIGHUP."""
    dhcp_hosts, dhcp_pid = _dhcp_file("dhcp-hosts", host), _dhcp_file("dnsmasq.pid", host)
    kept = [line for line in (dhcp_hosts.read_text().splitlines() if dhcp_hosts.exists() else [])
            if line.split(",")[0] != hostname]
    write_atomic(dhcp_hosts, "".join(f"{line}\n" for line in [*kept, f"{hostname},{address}"]))
    if dhcp_pid.exists():
        os.kill(int(dhcp_pid.read_text().split()[0]), signal.SIGHUP)


def netns_inode(name: str = plan.NETNS) -> int:
    try:
        return netns_path(name).stat().st_ino
    except OSError:
        return 0


def netns_pids() -> set[int]:
    """Processes in the lab's network namespaces (every host's and the LAN's): found by the namespaces' names,
    for a `down` after a crash that lost the state file."""
    inodes = {netns_inode(name) for name in _lab_netns_names()} - {0}
    pids: set[int] = set()
    if not inodes:
        return pids
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.stat(p / "ns/net").st_ino in inodes:
                    pids.add(int(p.name))
            except OSError:
                continue
    return pids


# ---------------------------------------------------------------- pve1 process tree


def make_root_disk(config: LabConfig, state: LabState, host: str = plan.HOSTNAME) -> None:
    """A host's root filesystem as an LVM install has it: ext4 of the installer's root size (at most 96 GiB: too
    small for a model's weights), so what pve1 writes and what statvfs (df, pvesm's `local`) reports are a real
    filesystem's. A sparse image, loop-mounted here: its blocks cost the controller only what pve1 writes. The
    overlay's upper and work directories live on it (overlayfs reports the upper filesystem's space)."""
    size_gib = plan.storage_layout(config)["root_gib"]
    hdir = host_dir(host)
    disk = hdir / "disk"
    image = hdir / "root.img"
    with open(image, "wb") as fh:
        fh.truncate(int(size_gib * 1024 ** 3))
    run(["mkfs.ext4", "-q", "-F", "-L", "pve-root", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image)])
    disk.mkdir()
    run(["mount", "-o", "loop", str(image), str(disk)])
    state.made.append(f"mount:{disk}")
    save_state(state)
    for name in ("upper", "work"):
        (disk / name).mkdir()
        (hdir / name).symlink_to(disk / name)


def unmount_root_disk(host: str = plan.HOSTNAME) -> None:
    """The root disk's loop mount (down): unmounted, and the loop device with it (`mount -o loop` set autoclear)."""
    disk = str(host_dir(host) / "disk")
    mounted = any(line.split()[4] == disk for line in Path("/proc/self/mountinfo").read_text().splitlines())
    if mounted and run(["umount", disk], check=False).returncode != 0:
        run(["umount", "-l", disk])


def start_pve1(config: LabConfig, state: LabState, lower: Path, host: str = plan.HOSTNAME) -> None:
    """Start a host's process tree (pve1's by default); returns once its init runs."""
    me = config.lab_host(host)
    hdir = host_dir(host)
    upper, work, root = hdir / "upper", hdir / "work", hdir / "root"
    for d in (work, root):
        d.mkdir(parents=True, exist_ok=True)
    stage1 = hdir / "stage1.sh"
    write_atomic(stage1, standin_text("stage1.sh"), mode=0o755)
    cgroups = make_cgroups(me.cgroup_name)
    state.made.append(f"cgroup:{me.cgroup_name}")
    save_state(state)
    join = " ".join(f"echo $$ > {d}/cgroup.procs;" for d in cgroups)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LAB_ROOT": str(root), "LAB_LOWER": str(lower), "LAB_UPPER": str(upper), "LAB_WORK": str(work),
        "LAB_GPUS": str(config.gpus), "LAB_HOSTNAME": host,
        "LAB_PREMADE_NODES": "0" if config.flavour_spec.stock else "1",
        "LAB_MIRROR": state.mirror_dir,
        "LAB_APLINFO": str(aplinfo_dir(host)),
        "LAB_CLUSTER_NODES": str(CLUSTER_DIR) if config.cluster else "",
    }
    console = (hdir / "console.log").open("ab")
    # --kill-child: if the launcher dies, PID 1 of pve1 is killed, and with it everything in it.
    # The loop is pve1's power button: a reboot inside pve1 (systemd's reboot(2) in a PID namespace
    # ends its init with SIGHUP, which unshare passes on: status 129) boots it again, as a real
    # host's firmware would; a halt (SIGINT) or a kill ends the loop.
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"{join} while :; do nsenter --net={netns_path(me.netns)} unshare --mount --uts --ipc --pid "
                          f"--cgroup --fork --kill-child --propagation private {stage1}; rc=$?; "
                          f"[ $rc -eq 129 ] || exit $rc; echo '{host}: rebooting (lab)'; done"],
        stdin=subprocess.DEVNULL, stdout=console, stderr=console, env=env, start_new_session=True)
    console.close()
    state.made.append(f"process:{proc.pid}")
    # The init's own host pid: the child of `unshare --fork`.
    deadline = time.monotonic() + 10
    init_pid = 0
    while time.monotonic() < deadline and not init_pid:
        if proc.poll() is not None:
            break
        init_pid = pve1_init_pid(proc.pid)
        time.sleep(0.02)
    if host == plan.HOSTNAME:
        state.holder_pid = proc.pid
        state.holder_start_ticks = start_ticks(proc.pid)
        state.sshd_pid = 0
    else:
        state.holders[host] = [proc.pid, start_ticks(proc.pid)]
    save_state(state)
    if not init_pid:
        tail = (hdir / "console.log").read_text(errors="replace")[-2000:]
        raise ToolkitError.of(f"{host} did not start; its console says:\n{tail}", exit_code=EXIT_FAILED,
                              fix="`toolkit lab down`, then look at the console above")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def pve1_init_pid(holder_pid: int) -> int:
    """pve1's init as this machine sees it: the child of the `unshare --fork` the launcher loop runs."""
    for child in _children(holder_pid):
        try:
            if Path(f"/proc/{child}/exe").resolve().name == "unshare":
                kids = _children(child)
                return kids[0] if kids else 0
        except OSError:
            continue
    return 0


def wait_for_ssh(state: LabState, timeout_s: float = 30, boot: bool = True, allow_failed_units: bool = False,
                 host: str = plan.HOSTNAME) -> str:
    """Until a host (pve1 by default) answers over SSH and (`boot`) its systemd has finished booting with no failed
    unit. An already running lab is only asked to answer: a unit a role broke is the role's.
    `allow_failed_units` (a reboot, where the roles' units run): return the failed ones instead."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if not alive(*state.holder(host)):
            break
        if not boot:
            if state.ssh(host, "true", timeout_s=10).returncode == 0:
                return ""
            time.sleep(0.2)
            continue
        proc = state.ssh(host, "systemctl is-system-running --wait", timeout_s=max(timeout_s, 30))
        if proc.stdout.strip() in ("running", "degraded"):
            if proc.stdout.strip() == "degraded":
                failed = state.ssh(host, "systemctl --failed --no-legend --plain", timeout_s=10).stdout
                if allow_failed_units:
                    return failed
                raise ToolkitError.of(f"{host} booted with failed units:\n{failed}", exit_code=EXIT_FAILED,
                                      fix=f"`toolkit lab ssh {host} journalctl -b` shows why; then `toolkit lab down`")
            return ""
        last = proc.stderr.strip()
        time.sleep(0.1)
    tail = (host_dir(host) / "console.log").read_text(errors="replace")[-2000:]
    raise ToolkitError.of(f"{host} did not answer over SSH within {timeout_s:.0f} s ({last}); its console:\n{tail}",
                          exit_code=EXIT_FAILED, fix="`toolkit lab down`, then look at the console above")


# ---------------------------------------------------------------- up / down / status


def up(config: LabConfig, progress: Progress = _quiet) -> LabState:
    plan.validate(config)
    require_root()
    preflight_existing = load_state()
    if preflight_existing and preflight_existing.running and all(
            alive(*preflight_existing.holder(h)) for h in plan.host_names(preflight_existing.config)):
        if preflight_existing.config != config:
            raise ToolkitError.of(
                f"the lab is up with {preflight_existing.config}, not {config}", field="options",
                fix="`toolkit lab down` first, or run `up` with the options it was made with")
        progress("lab already up: checking " + " and ".join(plan.host_names(config)) + " answer")
        for name in plan.host_names(config):
            wait_for_ssh(preflight_existing, timeout_s=10, boot=False, host=name)
        # The inventory follows this toolkit's roles: a lab made by an older checkout gets today's variables.
        write_atomic(Path(preflight_existing.inventory_path), plan.render_inventory(preflight_existing))
        return preflight_existing
    if preflight_existing or any(netns_inode(name) for name in _lab_netns_names()):
        progress("removing what an earlier, unfinished up left")
        down(progress=progress)
    preflight(config)

    suites = template.suites_wanted(os.environ.get(template.TEMPLATES_ENV))
    templates = "the CT template" + ("s" if len(suites) > 1 else "") + " with the package sets of Proxmox's " + \
        " and ".join(template.APPLIANCES[s].name for s in suites)
    mirrors = [aplinfo_dir(h.name) for h in config.lab_hosts]
    # Not cached: built beside the userland, then beside the hosts' start and provisioning (pveam's stand-in
    # waits for them when the container role downloads one): they were the longer build, 87 s against the
    # userland's 57 s in a cold demo.
    builder = None
    if not all(rootfs.template_cached(s) for s in suites):
        progress(f"{templates}: built in the background, beside the userland and then the hosts' provisioning "
                 f"(pveam on the hosts waits for them; {template.TEMPLATES_ENV}=all adds the others)")
        builder = start_template_builder(suites, mirrors)
    progress("Debian 12 userland (cached after the first up)")
    from concurrent.futures import ThreadPoolExecutor

    # Until the state names the template's build (then `down` stops it), a failure here stops it.
    try:
        # The stand-in installers need no userland: they are built (gcc, tar) while mmdebstrap waits on the mirror
        # and dpkg.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="installers") as pool:
            built = pool.submit(build_installers, config)
            lower = rootfs.build()
            progress("stand-ins: compiling libcuda, packing the driver installer (beside the userland)" +
                     (f"; {config.flavour}'s package mirror" if config.flavour_spec.stock else ""))
            installers, mirror = build_flavour(config, lower, built.result())
        installer = installers[0]
        key = ensure_ssh_key()
        state = LabState(config=config, inventory_path=str(default_inventory_path()), ssh_key_path=str(key),
                         known_hosts_path=str(SSH_DIR / "known_hosts"),
                         template_builder=[builder.pid, start_ticks(builder.pid)] if builder else [])
        save_state(state)
    except BaseException:
        if builder is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(builder.pid, signal.SIGTERM)
        raise
    try:
        known = ""
        if config.cluster:
            shutil.rmtree(CLUSTER_DIR, ignore_errors=True)
            state.made.append(f"dir:{CLUSTER_DIR}")
        for h in config.lab_hosts:
            hdir = host_dir(h.name)
            progress(f"{h.name} files")
            if hdir.exists():
                shutil.rmtree(hdir)
            state.made.append(f"dir:{hdir}")
            save_state(state)
            hdir.mkdir(parents=True)
            if plan.storage_layout(config)["kind"] == "lvm":
                progress(f"{h.name}'s root filesystem: {plan.storage_layout(config)['root_gib']} GiB of ext4, as the "
                         "installer makes it on an LVM install")
                make_root_disk(config, state, h.name)
            upper = hdir / "upper"
            upper.mkdir(parents=True, exist_ok=True)
            known += populate_upper(config, upper, key, installer, h.name)
            place_templates(upper, lower)
            mirror_dir = aplinfo_dir(h.name)
            mirror_dir.mkdir()
            if builder is None:
                place_index(mirror_dir, {s: rootfs.template_file(s) for s in suites})
            else:
                write_atomic(mirror_dir / APLINFO_PENDING, f"{templates}: being built (log: "
                             f"{rootfs.CACHE_DIR}/template-job.log)\n")
            if mirror is not None:
                populate_flavour(config, upper, lower, mirror)
        # The inventory gives the roles each installer's sha256, so the lab's installer passes the check a
        # real host's does (staged on pve1 in the flavour lab, downloaded from the mirror in the stock ones).
        state.installer_sha256 = {p.name.split("-")[-1].removesuffix(".run"):
                                  hashlib.sha256(p.read_bytes()).hexdigest() for p in installers}
        if mirror is not None:
            state.mirror_dir = str(mirror.path)
            state.fm_archive_sha256 = {v: hashlib.sha256(p.read_bytes()).hexdigest()
                                       for v, p in mirror.fabricmanager_archives().items()}
        if builder is not None:
            _index_if_built(builder, suites, mirrors)
        write_atomic(Path(state.known_hosts_path), known, mode=0o600)
        netns = plan.NETNS if config.hosts == 1 else f"{plan.LAN_NETNS} and one a host"
        progress(f"network: netns {netns}, veth {plan.HOST_VETH}, {config.subnet} and {config.ct_subnet}")
        make_network(config, state)
        for h in config.lab_hosts:
            start_dhcp(config, h.name)
        for h in config.lab_hosts:
            progress(f"{h.name}: namespaces, pivot_root, sshd")
            start_pve1(config, state, lower, h.name)
        for h in config.lab_hosts:
            wait_for_ssh(state, host=h.name)
        state.running = True
        write_atomic(Path(state.inventory_path), plan.render_inventory(state))
        state.made.append(f"file:{state.inventory_path}")
        save_state(state)
    except BaseException:
        progress("up failed: removing what it made")
        with contextlib.suppress(ToolkitError):
            down(progress=progress)
        raise
    return state


def _kill_tree(pids: set[int], ticks: dict[int, int], timeout_s: float, first: int = signal.SIGTERM) -> None:
    for sig in (first, signal.SIGKILL):
        for pid in pids:
            if alive(pid, ticks.get(pid, 0)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(alive(p, ticks.get(p, 0)) for p in pids):
            time.sleep(0.05)


def _stop_host(state: LabState, name: str, progress: Progress) -> None:
    holder_pid, holder_ticks = state.holder(name)
    if not holder_pid:
        return
    progress(f"stopping {name} (pid {holder_pid}): containers, sshd, init")
    init_pids = set()
    if alive(holder_pid, holder_ticks):
        init_pids = {pve1_init_pid(holder_pid)} - {0}
    # A host's systemd halts on SIGRTMIN+3 (what lxc-stop sends a systemd container): units stop,
    # the PID namespace ends. Then SIGKILL, and the launcher by pid.
    ticks = {p: start_ticks(p) for p in init_pids}
    _kill_tree(init_pids, ticks, timeout_s=15, first=signal.SIGRTMIN + 3)
    _kill_tree({holder_pid}, {holder_pid: holder_ticks}, timeout_s=5)


def power_off(host: str, progress: Progress = _quiet) -> None:
    """`toolkit lab down pve2`: one host halted as its power button would (its units stop, its containers with
    them); its network and files stay until the lab's `down`, and an `up` builds the whole lab again."""
    require_root()
    state = load_state()
    if state is None:
        raise ToolkitError.of("the lab is not up", field="host", fix="`toolkit lab up`")
    state.config.lab_host(host)
    _stop_host(state, host, progress)


def down(purge_cache: bool = False, progress: Progress = _quiet) -> None:
    """Remove what `up` made: its processes (by pid, then anything left in its namespace or its
    cgroup), cgroups, veth (and the route with it), network namespace, pve1's files, the
    inventory. The cache stays unless `purge_cache`."""
    if os.geteuid() != 0:
        raise ToolkitError.of("taking the lab down needs root", field="user", fix="`sudo toolkit lab down`")
    state = load_state()
    if state is not None:
        stop_template_builder(state, progress)
        for name in plan.host_names(state.config):
            _stop_host(state, name, progress)
    # By name: whatever is still in the lab's network namespaces or cgroups is the lab's.
    leftover = (netns_pids() | cgroup_pids()) - {os.getpid()}
    if leftover:
        progress(f"killing {len(leftover)} leftover lab processes")
        _kill_tree(leftover, {p: start_ticks(p) for p in leftover}, timeout_s=5)
    remove_cgroups()
    if run(["ip", "link", "show", plan.HOST_VETH], check=False).returncode == 0:
        run(["ip", "link", "del", plan.HOST_VETH])
    for name in _lab_netns_names():
        if netns_inode(name):
            run(["ip", "netns", "del", name])
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    for name in _every_host():
        root = str(host_dir(name) / "root")
        if any(root in line for line in mountinfo):
            raise ToolkitError.of(f"{root} is still mounted here; not removing {name}'s files", exit_code=EXIT_FAILED,
                                  fix=f"umount {root}, then `toolkit lab down`")
        unmount_root_disk(name)
        if host_dir(name).exists():
            shutil.rmtree(host_dir(name))
        for dhcp in ("dhcp-hosts", "dhcp.leases", "dnsmasq.pid", "dnsmasq.log"):
            _dhcp_file(dhcp, name).unlink(missing_ok=True)
    shutil.rmtree(CLUSTER_DIR, ignore_errors=True)
    inventory = Path(state.inventory_path) if state else default_inventory_path()
    if inventory.exists() and inventory.read_text().startswith("# Generated by `toolkit lab up`"):
        inventory.unlink()
    STATE_FILE.unlink(missing_ok=True)
    if purge_cache:
        others = other_running_labs()
        if others:
            raise ToolkitError.of(
                f"this lab is down, but the cache stays: {', '.join(map(plan.instance_label, others))} still "
                "run on it",
                field="--purge-cache", fix="take those labs down first (TOOLKIT_LAB_INSTANCE=... toolkit lab down)")
        progress("removing the cache and the lab's SSH key")
        rootfs.purge()
        shutil.rmtree(SSH_DIR, ignore_errors=True)


def reboot(progress: Progress = _quiet, timeout_s: float = 90,
           host: str = plan.HOSTNAME) -> tuple[LabState, float, str]:
    """Reboot a host (pve1 by default) as a real host reboots (`toolkit lab reboot pve1`): `systemctl reboot` in it,
    so its
    systemd stops the units (pve-guests.service shuts the containers down), the PID namespace ends,
    and with it everything volatile (/run, /dev, the stand-in modules and their parameters, every
    process); the disk (the overlay's upper layer) stays. Then it boots again: lab-init's coldplug loads modules with
    their modprobe.d options, units start in order, pve-guests.service starts the onboot
    containers. Returns the state, the seconds it took, and the failed units ('' when none)."""
    require_root()
    state = load_state()
    if state is None or not state.running or not alive(*state.holder(plan.HOSTNAME)):
        raise ToolkitError.of("the lab is not up", field=host, fix="`toolkit lab up`")
    state.config.lab_host(host)
    holder_pid, holder_ticks = state.holder(host)
    console = host_dir(host) / "console.log"
    t0 = time.monotonic()
    old_init = pve1_init_pid(holder_pid)
    progress(f"{host}: systemctl reboot (init pid {old_init})")
    state.ssh(host, "systemctl reboot", timeout_s=30)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new_init = pve1_init_pid(holder_pid)
        if new_init and new_init != old_init:
            break
        if not alive(holder_pid, holder_ticks):
            raise ToolkitError.of(f"{host} did not come back from the reboot", exit_code=EXIT_FAILED,
                                  fix=f"see {console}, then `toolkit lab down` and `up`")
        time.sleep(0.05)
    else:
        raise ToolkitError.of(f"{host} did not reboot within {timeout_s:.0f} s", exit_code=EXIT_FAILED,
                              fix=f"see {console}")
    progress(f"{host}: booting")
    failed = wait_for_ssh(state, timeout_s=timeout_s, allow_failed_units=True, host=host)
    state.running = True
    save_state(state)
    return state, time.monotonic() - t0, failed


def other_running_labs() -> dict[str, LabState]:
    """Other lab instances on this machine whose pve1 still runs (they share the cache), by instance name
    ('' the default lab)."""
    found = {}
    for state_file in sorted(Path("/var/lib").glob("toolkit-lab*/state.json")):
        if state_file == STATE_FILE:
            continue
        try:
            other = LabState.from_json(state_file.read_text(), str(state_file), tolerant=True)
        except (OSError, ToolkitError):
            continue
        if alive(other.holder_pid, other.holder_start_ticks):
            found[state_file.parent.name.removeprefix("toolkit-lab").removeprefix("-")] = other
    return found


def status() -> LabState | None:
    state = load_state()
    if state is None:
        return None
    # The lab is up while pve1 runs; another host may be powered off on purpose (`toolkit lab down pve2`).
    state.running = state.running and alive(*state.holder(plan.HOSTNAME))
    return state


def leftovers() -> list[str]:
    """What of the lab is still on this machine (for tests and `status`): empty after `down`."""
    found = [f"network namespace {name}" for name in _lab_netns_names() if netns_inode(name)]
    if run(["ip", "link", "show", plan.HOST_VETH], check=False).returncode == 0:
        found.append(f"link {plan.HOST_VETH}")
    found += [f"cgroup {d}" for d in _every_cgroup_dir() if d.exists()]
    found += [f"process {p}" for p in sorted(netns_pids() | cgroup_pids())]
    netns_mounts = {str(netns_path(name)) for name in _lab_netns_names()}
    found += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(STATE_DIR) + "/" in line or line.split()[4] in netns_mounts]
    found += [f"directory {d}" for d in [*map(host_dir, _every_host()), CLUSTER_DIR] if d.exists()]
    return found
