"""Shared code of the lab's stand-ins (pct, modprobe, nvidia-smi, nvidia-modprobe, the driver
installer). Runs on pve1 and in its containers with Debian 12's python3 standard library only;
the toolkit imports the pure parts for its tests. Everything here is a lab stand-in.
"""

from __future__ import annotations

import json
import os
import re
import sys

BANNER = "lab stand-in"
CONFIG_FILE = "/etc/lab-standin/lab.json"
RUN_DIR = "/run/lab-standin"
SYS_MODULE_DIR = RUN_DIR + "/sys/module"
PROC_DEVICES = RUN_DIR + "/proc-devices"
KERNEL_PROC_DEVICES = "/usr/lib/lab-standin/proc-devices.kernel"
# What the stand-in driver installer leaves on a host when it installs the kernel modules.
KERNEL_MODULE_STAMP = "/var/lib/lab-standin/kernel-module-version"
# Where `pct start` binds the host's /run/lab-standin/sys/module inside a container, so the
# container sees the host's live module parameters as on a real host (the module is shared).
CT_HOST_SYS_MODULE_DIR = "/var/lib/lab-standin/host-sys-module"
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
DEFAULT_CONFIG = {"nvidia_major": 195, "uvm_major": 508, "caps_major": 509}


def load_config() -> dict:
    try:
        with open(CONFIG_FILE) as fh:
            return dict(DEFAULT_CONFIG, **json.load(fh))
    except FileNotFoundError:
        return dict(DEFAULT_CONFIG)


def render_proc_devices(kernel_proc_devices: str, loaded: set[str], config: dict) -> str:
    """/proc/devices as it would read with the stand-in driver's modules `loaded`: this kernel's
    own file with the nvidia majors added in major order (the format the roles parse)."""
    extra = []
    if "nvidia" in loaded:
        extra.append((config["nvidia_major"], "nvidia-frontend"))
        extra.append((config["caps_major"], "nvidia-caps"))
    if "nvidia_uvm" in loaded:
        extra.append((config["uvm_major"], "nvidia-uvm"))
    pending = sorted(extra)
    out = []
    section = ""
    for line in kernel_proc_devices.splitlines():
        if line.endswith(":"):
            section = line[:-1]
            out.append(line)
            continue
        if section == "Character devices":
            if not line.strip():
                out += [f"{m:3d} {n}" for m, n in pending]
                pending = []
            else:
                major = int(line.split()[0])
                while pending and pending[0][0] < major:
                    out.append("{:3d} {}".format(*pending.pop(0)))
        out.append(line)
    out += [f"{m:3d} {n}" for m, n in pending]
    return "\n".join(out) + "\n"


def parse_modprobe_options(texts: list[str], module: str) -> dict[str, str]:
    """`options MODULE key=value ...` lines of /etc/modprobe.d/*.conf (later files win, as modprobe
    reads them in name order). Module names treat '-' and '_' alike, as modprobe does."""
    want = module.replace("-", "_")
    opts: dict[str, str] = {}
    for text in texts:
        for raw in text.replace("\\\n", " ").splitlines():
            line = raw.split("#", 1)[0].split()
            if len(line) >= 2 and line[0] == "options" and line[1].replace("-", "_") == want:
                for kv in line[2:]:
                    key, _, value = kv.partition("=")
                    opts[key] = value
    return opts


def bool_param(value: str) -> str:
    """Linux shows a `bool` module parameter as Y or N in sysfs whatever was written (1, y, on)."""
    return "Y" if value.strip().lower() in ("1", "y", "yes", "on", "true") else "N"


# uvm_disable_hmm is `module_param(uvm_disable_hmm, bool, 0444)` in open-gpu-kernel-modules'
# kernel-open/nvidia-uvm/uvm_hmm.c; default false (HMM on where the kernel supports it).
UVM_PARAMS = {"uvm_disable_hmm": ("bool", "N")}


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def loaded_modules() -> set[str]:
    try:
        return {m for m in os.listdir(SYS_MODULE_DIR) if m in NVIDIA_MODULES}
    except FileNotFoundError:
        return set()


def refresh_proc_devices() -> None:
    try:
        with open(KERNEL_PROC_DEVICES) as fh:
            kernel = fh.read()
    except FileNotFoundError:
        with open("/proc/devices") as fh:
            kernel = fh.read()
    write_atomic(PROC_DEVICES, render_proc_devices(kernel, loaded_modules(), load_config()))


def modprobe_d_texts() -> list[str]:
    texts = []
    for d in ("/lib/modprobe.d", "/usr/lib/modprobe.d", "/etc/modprobe.d", "/run/modprobe.d"):
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".conf"))
        except FileNotFoundError:
            continue
        for n in names:
            with open(os.path.join(d, n)) as fh:
                texts.append(fh.read())
    return texts


def installed_kernel_module_version() -> str | None:
    try:
        with open(KERNEL_MODULE_STAMP) as fh:
            return fh.read().strip() or None
    except FileNotFoundError:
        return None


def load_module(module: str, cli_options: dict[str, str]) -> None:
    """What `modprobe MODULE` does with the stand-in driver: the module's sysfs directory, its
    parameters (modprobe.d options, then command-line ones), and /proc/devices."""
    module = module.replace("-", "_")
    version = installed_kernel_module_version()
    if version is None:
        raise LookupError(f"Module {module} not found in directory /lib/modules/{os.uname().release}")
    if module != "nvidia" and "nvidia" not in loaded_modules():
        load_module("nvidia", {})  # as modprobe does through the dependency
    mdir = os.path.join(SYS_MODULE_DIR, module)
    if os.path.isdir(mdir):
        return  # loaded already: modprobe does nothing, parameters stay as they were loaded
    opts = parse_modprobe_options(modprobe_d_texts(), module)
    opts.update(cli_options)
    write_atomic(os.path.join(mdir, "version"), version + "\n")
    if module == "nvidia_uvm":
        for name, (kind, default) in UVM_PARAMS.items():
            value = opts.get(name, default)
            shown = bool_param(value) if kind == "bool" else value
            write_atomic(os.path.join(mdir, "parameters", name), shown + "\n", 0o444)
    refresh_proc_devices()


def unload_module(module: str) -> None:
    module = module.replace("-", "_")
    mdir = os.path.join(SYS_MODULE_DIR, module)
    if not os.path.isdir(mdir):
        return
    if module == "nvidia" and any(m != "nvidia" for m in loaded_modules()):
        raise RuntimeError("Module nvidia is in use by: " + " ".join(sorted(loaded_modules() - {"nvidia"})))
    for dirpath, _dirs, files in sorted(os.walk(mdir), reverse=True):
        for f in files:
            os.unlink(os.path.join(dirpath, f))
        os.rmdir(dirpath)
    refresh_proc_devices()


def gpu_nodes(dev: str = "/dev") -> list[int]:
    """Indices of /dev/nvidiaN nodes present (in a container: the passed-through ones)."""
    found: list[int] = []
    try:
        names = os.listdir(dev)
    except FileNotFoundError:
        return found
    for n in names:
        m = re.fullmatch(r"nvidia(\d+)", n)
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def kernel_module_version_seen() -> str | None:
    """The loaded nvidia module's version as this caller sees it (host: the stand-in sysfs; in a
    container: the host's, bound in by pct)."""
    for base in (SYS_MODULE_DIR, CT_HOST_SYS_MODULE_DIR):
        try:
            with open(os.path.join(base, "nvidia", "version")) as fh:
                return fh.read().strip()
        except OSError:
            continue
    return None


def die(prog: str, message: str, code: int) -> None:
    sys.stderr.write(f"{prog} ({BANNER}): {message}\n")
    sys.exit(code)


PVE_DIR = "/etc/pve"


def cluster_vmids(pve_dir: str = PVE_DIR) -> dict[str, tuple[str, str]]:
    """vmid -> ("CT" or "VM", node) over the whole cluster, as pmxcfs's .vmlist has it: this node's
    /etc/pve/lxc plus every node's lxc/ and qemu-server/ under /etc/pve/nodes (the lab's second
    node is a directory of configs there)."""
    node = os.uname().nodename
    found: dict[str, tuple[str, str]] = {}
    dirs = [(os.path.join(pve_dir, "lxc"), "CT", node)]
    nodes_dir = os.path.join(pve_dir, "nodes")
    if os.path.isdir(nodes_dir):
        for n in sorted(os.listdir(nodes_dir)):
            dirs += [(os.path.join(nodes_dir, n, "lxc"), "CT", n), (os.path.join(nodes_dir, n, "qemu-server"), "VM", n)]
    for d, kind, n in dirs:
        if os.path.isdir(d):
            for f in os.listdir(d):
                if re.fullmatch(r"\d+\.conf", f):
                    found.setdefault(f[:-5], (kind, n))
    return found
