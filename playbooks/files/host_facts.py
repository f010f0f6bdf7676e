#!/usr/bin/python3
"""Read-only: every raw output toolkit.core.hostplan.facts parses, as {name: {"rc": N, "stdout": "..."}} on
stdout. Run by playbooks/facts.yml (ansible.builtin.script) with one JSON argument: the commands the inventory
overrides (lspci, mokutil, nvidia-smi), the /proc/driver/nvidia directory and the apt packages to ask about.
The commands run in parallel: one gathering answers within a couple of seconds. Nothing here writes."""
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

TIMEOUT_S = 20
ABSENT = 127


def run(argv, ok_rcs=(0,)):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**os.environ, "LC_ALL": "C"})
    except FileNotFoundError:
        return {"rc": ABSENT, "stdout": ""}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": ""}
    return {"rc": 0 if done.returncode in ok_rcs else done.returncode, "stdout": done.stdout}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return {"rc": 0, "stdout": f.read()}
    except FileNotFoundError:
        return {"rc": 1, "stdout": ""}
    except OSError:
        return {"rc": 2, "stdout": ""}


def heads(patterns):
    """What `head -v` prints for the files the patterns match: '==> path <==' before each; none is no error."""
    out = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            got = read(path)
            if got["rc"] == 0:
                out.append("==> %s <==\n%s" % (path, got["stdout"]))
    return {"rc": 0, "stdout": "\n".join(out)}


def exists(path):
    return {"rc": 0 if os.path.exists(path) else 1, "stdout": ""}


def efi_secure_boot():
    paths = glob.glob("/sys/firmware/efi/efivars/SecureBoot-*")
    if not paths:
        return {"rc": 1, "stdout": ""}
    try:
        with open(paths[0], "rb") as f:
            data = f.read()
    except OSError:
        return {"rc": 2, "stdout": ""}
    return {"rc": 0, "stdout": "%d\n" % (data[-1] if data else 0)}


def no_credentials(url):
    return re.sub(r"//[^/@]*@", "//", url)


def env_proxy():
    lines = []
    for key in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        if os.environ.get(key):
            lines.append("%s=%s" % (key, no_credentials(os.environ[key])))
    return {"rc": 0, "stdout": "".join(line + "\n" for line in lines)}


def apt_proxy():
    got = run(["apt-config", "dump"])
    got["stdout"] = "".join(no_credentials(line) + "\n" for line in got["stdout"].splitlines()
                            if re.match(r"^Acquire::\w+::Proxy", line))
    return got


def main():
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    proc_driver = args.get("proc_driver_dir", "/proc/driver/nvidia")
    smi = args.get("nvidia_smi", "nvidia-smi")
    dpkg = ["dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n"]
    jobs = {
        "pveversion": lambda: run(["pveversion", "-v"]),
        "uname": lambda: run(["uname", "-r"]),
        "os_release": lambda: read("/etc/os-release"),
        # dpkg-query exits 1 when one pattern matches nothing: that is an answer, not a failure.
        "kernel_packages": lambda: run(dpkg + ["proxmox-kernel-*", "pve-kernel-*", "proxmox-headers-*",
                                               "pve-headers-*", "proxmox-default-kernel", "proxmox-default-headers"],
                                       ok_rcs=(0, 1)),
        "boot_kernels": lambda: run(["proxmox-boot-tool", "kernel", "list"]),
        "default_kernel_depends": lambda: run(["apt-cache", "depends", "proxmox-default-kernel"]),
        "mokutil": lambda: run(shlex.split(args.get("mokutil", "mokutil --sb-state"))),
        "efi_secure_boot": efi_secure_boot,
        "lspci": lambda: run(shlex.split(args.get("lspci", "lspci -nnk -D -d 10de:"))),
        "nvidia_gpus": lambda: heads([proc_driver + "/gpus/*/information"]),
        "nvidia_version": lambda: read(proc_driver + "/version"),
        "nvidia_smi": lambda: run([smi, "--query-gpu=index,pci.bus_id,driver_version,name",
                                   "--format=csv,noheader"]),
        "topo_p2p": lambda: run([smi, "topo", "-p2p", "r"]),
        "qemu_configs": lambda: heads(["/etc/pve/qemu-server/*.conf"]),
        "pci_mapping": lambda: read("/etc/pve/mapping/pci.cfg"),
        "driver_packages": lambda: run(dpkg + ["nvidia-*", "cuda-drivers*", "libnvidia-*",
                                               "xserver-xorg-video-nvidia*"], ok_rcs=(0, 1)),
        "alternate_install": lambda: exists("/usr/lib/nvidia/alternate-install-present"),
        "runfile_uninstaller": lambda: exists("/usr/bin/nvidia-uninstall"),
        "pvesm": lambda: run(["pvesm", "status"]),
        "storage_cfg": lambda: read("/etc/pve/storage.cfg"),
        "root_mount": lambda: run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,TARGET", "/"]),
        "zfs": lambda: run(["zfs", "list", "-H", "-p", "-o", "name,used,avail,mountpoint"]),
        "ha": lambda: run(["ha-manager", "config"]),
        "members": lambda: read("/etc/pve/.members"),
        "apt_sources": lambda: heads(["/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list",
                                      "/etc/apt/sources.list.d/*.sources"]),
        "apt_policy": lambda: run(["apt-cache", "policy"] + list(args.get("apt_packages", []))),
        "apt_proxy": apt_proxy,
        "env_proxy": env_proxy,
        "cmdline": lambda: read("/proc/cmdline"),
    }
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        out = {name: f.result() for name, f in futures.items()}
    json.dump(out, sys.stdout, sort_keys=True)


main()
