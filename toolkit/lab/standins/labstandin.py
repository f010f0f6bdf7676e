"""Shared code of the lab's stand-ins (pct, modprobe, nvidia-smi, nvidia-modprobe, the driver
installer). Runs on pve1 and in its containers with Debian 12's python3 standard library only;
the toolkit imports the pure parts for its tests. Everything here is a lab stand-in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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
# The modules the modprobe stand-in handles itself (nouveau: the stand-in GPUs' in-kernel driver).
STANDIN_MODULES = (*NVIDIA_MODULES, "nouveau")
KERNEL_RELEASE_FILE = RUN_DIR + "/kernel-release"
# Where the stand-in GPUs' PCI functions are (each has a `driver` file naming what binds it).
PCI_DEVICES_DIR = RUN_DIR + "/sys/bus/pci/devices"
PROC_DRIVER_DIR = RUN_DIR + "/proc/driver/nvidia"
DEFAULT_CONFIG = {"nvidia_major": 195, "uvm_major": 508, "caps_major": 509}

# The stand-in GPUs, by model: lspci's vendor:device and name, nvidia-smi's figures. Each is of one
# architecture: the open kernel modules do not support GPUs before Turing (no GSP) and Blackwell requires
# them (nvidia-installer kernel.c valid_kernel_module_types; open-gpu-kernel-modules' supported list).
GPU_MODELS = {
    "rtx-pro-6000": {"device_id": "2bb5", "chip": "GB202GL", "gpu_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                     "arch": "blackwell", "memory_total_mib": 97887, "power_limit_w": 600.0, "idle_power_w": 87.0,
                     "compute_cap": "12.0"},
    "b200": {"device_id": "2901", "chip": "GB100", "gpu_name": "NVIDIA B200", "arch": "blackwell",
             "memory_total_mib": 183359, "power_limit_w": 1000.0, "idle_power_w": 140.0, "compute_cap": "10.0"},
    "h100": {"device_id": "2330", "chip": "GH100", "gpu_name": "NVIDIA H100 80GB HBM3", "arch": "hopper",
             "memory_total_mib": 81559, "power_limit_w": 700.0, "idle_power_w": 70.0, "compute_cap": "9.0"},
    "p40": {"device_id": "1b38", "chip": "GP102GL", "gpu_name": "Tesla P40", "arch": "pascal",
            "memory_total_mib": 24576, "power_limit_w": 250.0, "idle_power_w": 9.0, "compute_cap": "6.1"},
}
# Architectures the open modules cannot drive, and those only they can.
OPEN_UNSUPPORTED_ARCHS = ("maxwell", "pascal", "volta")
OPEN_REQUIRED_ARCHS = ("blackwell",)


def load_config() -> dict:
    """lab.json (the lab's hardware and firmware settings) over the defaults, the GPU model's figures filled
    in where the file does not give them."""
    try:
        with open(CONFIG_FILE) as fh:
            cfg = dict(DEFAULT_CONFIG, **json.load(fh))
    except FileNotFoundError:
        cfg = dict(DEFAULT_CONFIG)
    model = GPU_MODELS.get(cfg.get("gpu_model", "rtx-pro-6000"), GPU_MODELS["rtx-pro-6000"])
    return dict(model, **cfg)


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
        return {m for m in os.listdir(SYS_MODULE_DIR) if m in STANDIN_MODULES}
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


def running_kernel() -> str:
    """The stand-in kernel pve1 "booted" (the newest /boot/vmlinuz-*, picked at boot by lab-init), else
    the controller's own kernel, which pve1 shares (flavour `lab`)."""
    try:
        with open(KERNEL_RELEASE_FILE) as fh:
            return fh.read().strip() or os.uname().release
    except FileNotFoundError:
        return os.uname().release


def kernel_version_key(release: str) -> list:
    """Sort key for kernel releases (6.8.12-4-pve < 6.8.12-10-pve < 6.14.8-2-pve), as dpkg/boot tools do."""
    return [int(p) if p.isdigit() else p for p in re.split(r"[.-]", release)]


def module_files(kernel: str) -> list[str]:
    """Where the stand-in nvidia.ko is looked for, in modprobe's order: DKMS's updates/ dir wins."""
    base = "/lib/modules/" + kernel
    return [base + "/updates/dkms/nvidia.ko", base + "/kernel/drivers/video/nvidia.ko"]


def read_module_file(kernel: str) -> dict[str, str] | None:
    """The stand-in nvidia.ko for `kernel` (key: value lines: version, kernel, signed), or None."""
    for path in module_files(kernel):
        try:
            with open(path) as fh:
                return dict(line.split(": ", 1) for line in fh.read().splitlines() if ": " in line)
        except FileNotFoundError:
            continue
    return None


def installed_kernel_module_version() -> str | None:
    """The nvidia module version installed for the running kernel; the flavour `lab` (no stand-in
    kernel) also accepts the installer's stamp of older labs."""
    ko = read_module_file(running_kernel())
    if ko is not None:
        return ko.get("version") or None
    if os.path.exists(KERNEL_RELEASE_FILE):
        return None  # a stock flavour: only a module built for the running kernel loads
    try:
        with open(KERNEL_MODULE_STAMP) as fh:
            return fh.read().strip() or None
    except FileNotFoundError:
        return None


def secure_boot() -> bool:
    return bool(load_config().get("secure_boot", False))


# The firmware's Machine Owner Key list (shim's MokList, kept in NVRAM: it survives reboots): the DER
# certificates enrolled, and those `mokutil --import` queued for MokManager at the next boot.
MOK_DIR = "/var/lib/lab-standin/firmware/mok"
MOK_PENDING_DIR = "/var/lib/lab-standin/firmware/mok-pending"


def cert_fingerprint(path: str) -> str:
    """sha256 of a DER certificate file: what the stand-in module records as its signer."""
    import hashlib

    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def enrolled_fingerprints() -> set[str]:
    try:
        names = os.listdir(MOK_DIR)
    except FileNotFoundError:
        return set()
    return {cert_fingerprint(os.path.join(MOK_DIR, n)) for n in names}


def signer_enrolled(signer: str) -> bool:
    """The kernel takes a signed module under Secure Boot when its key is in the MOK list (or the kernel's
    own keyring, which no third-party module is signed with)."""
    return bool(signer) and signer in enrolled_fingerprints()


def pid_alive(pidfile: str) -> bool:
    try:
        with open(pidfile) as fh:
            pid = int(fh.read().split()[0])
        os.kill(pid, 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


def module_holders(module: str) -> list[str]:
    """Who keeps `module` in use, as the kernel's refcount would: a module that depends on it; in the
    stock flavours also nvidia-persistenced (the real one holds the GPUs open) and a running container
    that was given /dev/nvidia* nodes (its CUDA server would hold them open: on this kernel nothing can,
    they open with ENXIO). The flavour `lab` keeps the lab's old, looser rule (dependent modules only)."""
    holders = []
    if module == "nvidia":
        holders += sorted(m for m in loaded_modules() if m != "nvidia" and m in NVIDIA_MODULES)
    if load_config().get("flavour", "lab") == "lab":
        return holders
    if module == "nvidia" and pid_alive("/run/nvidia-persistenced/nvidia-persistenced.pid"):
        holders.append("nvidia-persistenced")
    if module in ("nvidia", "nvidia_uvm"):
        node = "/dev/nvidia-uvm" if module == "nvidia_uvm" else "/dev/nvidia"
        try:
            running = subprocess.run(["lxc-ls", "--running"], capture_output=True, text=True,
                                     timeout=10).stdout.split()
        except (OSError, subprocess.SubprocessError):
            running = []
        for name in running:
            try:
                with open(f"/var/lib/lxc/{name}/config") as fh:
                    if node in fh.read():
                        holders.append(f"container {name}")
            except OSError:
                continue
    return holders


def gpu_functions() -> list[str]:
    """PCI addresses of the stand-in GPUs (written at boot by lab-init)."""
    try:
        return sorted(os.listdir(PCI_DEVICES_DIR))
    except FileNotFoundError:
        return []


def bound_driver(bdf: str) -> str:
    try:
        with open(os.path.join(PCI_DEVICES_DIR, bdf, "driver")) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return ""


def bind_all(driver: str) -> None:
    for bdf in gpu_functions():
        if driver == "" or not bound_driver(bdf):
            write_atomic(os.path.join(PCI_DEVICES_DIR, bdf, "driver"), driver + "\n")


def probe_refusal(arch: str, module_type: str) -> str:
    """Why nvidia.ko of `module_type` does not take a GPU of `arch` ('' when it does), in the driver's
    words (NVRM lines of open-gpu-kernel-modules and the proprietary module)."""
    if module_type == "open" and arch in OPEN_UNSUPPORTED_ARCHS:
        return ("is not supported by open nvidia.ko because it does not include the required GPU System "
                "Processor (GSP)")
    if module_type == "proprietary" and arch in OPEN_REQUIRED_ARCHS:
        return "requires use of the NVIDIA open kernel modules"
    return ""


def bind_nvidia(module_type: str) -> list[str]:
    """What nvidia.ko's probe does at load: every GPU function no other driver holds (vfio-pci keeps those
    passed to VMs) and that this module type supports is bound, in bus order (minor 0, 1, ...); the others
    are refused with the driver's NVRM line (dmesg). Returns the bound functions."""
    cfg = load_config()
    bound, dmesg = [], []
    for bdf in gpu_functions():
        if bound_driver(bdf) not in ("", "nvidia"):
            continue
        why = probe_refusal(cfg.get("arch", ""), module_type)
        if why:
            dmesg.append(f"NVRM: The NVIDIA GPU {bdf} (PCI ID: 10de:{cfg.get('device_id', '0000')}) installed in "
                         f"this system {why}.")
            continue
        write_atomic(os.path.join(PCI_DEVICES_DIR, bdf, "driver"), "nvidia\n")
        bound.append(bdf)
    if dmesg:
        write_atomic(RUN_DIR + "/dmesg-nvidia", "\n".join(dmesg) + "\n")
    return bound


def gpu_minor_table() -> list[str]:
    """The loaded nvidia module's GPUs by device minor: line N is minor N's bus id, '' a minor freed when its GPU
    was unbound at run time (host: its stand-in sysfs; a container: the host's, bound in). [] when not loaded."""
    for base in (SYS_MODULE_DIR, CT_HOST_SYS_MODULE_DIR):
        try:
            with open(os.path.join(base, "nvidia", "gpus")) as fh:
                return fh.read().split("\n")[:-1]
        except OSError:
            continue
    return []


def unbind_from_nvidia(bdf: str, driver: str) -> None:
    """A GPU taken from nvidia at run time and bound to `driver` (what qemu-server does with a VM's hostpci device
    when the VM starts): the driver frees its minor and its /proc entry; the other GPUs keep theirs."""
    table = gpu_minor_table()
    if bdf in table:
        table[table.index(bdf)] = ""
        write_atomic(os.path.join(SYS_MODULE_DIR, "nvidia", "gpus"), "".join(b + "\n" for b in table))
    import shutil

    shutil.rmtree(os.path.join(PROC_DRIVER_DIR, "gpus", bdf), ignore_errors=True)
    write_atomic(os.path.join(PCI_DEVICES_DIR, bdf, "driver"), driver + "\n")


def nvidia_gpu_count() -> int | None:
    """GPUs the loaded nvidia module drives (host: its stand-in sysfs; a container: the host's, bound in);
    None when the module is not loaded."""
    for base in (SYS_MODULE_DIR, CT_HOST_SYS_MODULE_DIR):
        try:
            with open(os.path.join(base, "nvidia", "gpu_count")) as fh:
                return int(fh.read().strip() or 0)
        except (OSError, ValueError):
            continue
    return None


def load_module(module: str, cli_options: dict[str, str]) -> None:
    """What `modprobe MODULE` does with the stand-in driver: the module's sysfs directory, its
    parameters (modprobe.d options, then command-line ones), and /proc/devices. Refused as the
    kernel refuses: no module for the running kernel, an unsigned module under Secure Boot, the
    GPUs already claimed by nouveau (nvidia's probe finds no device)."""
    module = module.replace("-", "_")
    mdir = os.path.join(SYS_MODULE_DIR, module)
    if module == "nouveau":
        if not os.path.isdir(mdir):
            write_atomic(os.path.join(mdir, "version"), "in-kernel\n")
            bind_all("nouveau")
        return
    version = installed_kernel_module_version()
    if version is None:
        raise LookupError(f"Module {module} not found in directory /lib/modules/{running_kernel()}")
    if os.path.isdir(mdir):
        return  # loaded already: modprobe does nothing, parameters stay as they were loaded
    if module != "nvidia" and "nvidia" not in loaded_modules():
        load_module("nvidia", {})  # as modprobe does through the dependency
    bound: list[str] = []
    if module == "nvidia":
        ko = read_module_file(running_kernel()) or {}
        if secure_boot() and not signer_enrolled(ko.get("signer", "")):
            raise PermissionError("could not insert 'nvidia': Key was rejected by service")
        if gpu_functions() and all(bound_driver(b) == "nouveau" for b in gpu_functions()):
            raise PermissionError("could not insert 'nvidia': No such device")
        bound = bind_nvidia(ko.get("type", "open"))
        if gpu_functions() and not bound:
            # nvidia.ko's init fails when its probe took no GPU ("NVRM: No NVIDIA GPU found.").
            raise PermissionError("could not insert 'nvidia': No such device")
    opts = parse_modprobe_options(modprobe_d_texts(), module)
    opts.update(cli_options)
    write_atomic(os.path.join(mdir, "version"), version + "\n")
    if module == "nvidia":
        write_atomic(os.path.join(mdir, "gpu_count"), f"{len(bound)}\n")
        write_atomic(os.path.join(mdir, "gpus"), "".join(b + "\n" for b in bound))
        cfg = load_config()
        for minor, bdf in enumerate(bound):
            # /proc/driver/nvidia/gpus/BUS/information as nv-procfs.c prints it: the device minor is the slot
            # the probe gave it, which the GPUs that stay keep when another is unbound at run time.
            write_atomic(os.path.join(PROC_DRIVER_DIR, "gpus", bdf, "information"),
                         f"Model: \t\t {cfg.get('gpu_name', 'NVIDIA GPU')}\nIRQ:   \t\t {150 + minor}\n"
                         f"GPU UUID: \t GPU-1ab5ca1e-0000-4000-8000-{int(bdf.split(':')[1], 16):012d}\n"
                         f"Video BIOS: \t 98.02.2e.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                         f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bdf}\nDevice Minor: \t {minor}\n"
                         f"GPU Firmware: \t {version}\nGPU Excluded:\t No\n")
        nvswitches = int(load_config().get("nvswitches", 0))
        if nvswitches:
            # An NVSwitch fabric: CUDA waits for Fabric Manager to train it (fabric_state, libcuda).
            write_atomic(os.path.join(mdir, "nvswitches"), f"{nvswitches}\n")
        # /proc/driver/nvidia/capabilities: the files `nvidia-modprobe -f` reads (MIG config, monitor).
        for minor, name in ((1, "mig/config"), (2, "mig/monitor")):
            write_atomic(os.path.join(PROC_DRIVER_DIR, "capabilities", name),
                         f"DeviceFileMinor: {minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
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
    if module == "nouveau" and load_config().get("nouveau_in_use"):
        # The console (fbcon) on nouveau's framebuffer keeps it: only a reboot gets rid of it.
        raise RuntimeError("Module nouveau is in use.")
    if module in ("nvidia", "nvidia_uvm") and module_holders(module):
        raise RuntimeError(f"Module {module} is in use.")
    for dirpath, _dirs, files in sorted(os.walk(mdir), reverse=True):
        for f in files:
            os.unlink(os.path.join(dirpath, f))
        os.rmdir(dirpath)
    if module in ("nvidia", "nouveau"):
        for bdf in gpu_functions():
            if bound_driver(bdf) == module:
                os.unlink(os.path.join(PCI_DEVICES_DIR, bdf, "driver"))
    if module == "nvidia":
        import shutil

        shutil.rmtree(PROC_DRIVER_DIR, ignore_errors=True)
    refresh_proc_devices()


# The enforced power limit of each GPU (nvidia-smi -pl), kept where the driver keeps it: in the loaded module's
# state, so it is gone when nvidia is unloaded (or the host reboots), as on a real host. A container sees it
# through pct's bind of the host's module directory.
POWER_LIMITS_FILE = "nvidia/power_limits.json"


def power_limits_path() -> str:
    base = CT_HOST_SYS_MODULE_DIR if os.path.isdir(CT_HOST_SYS_MODULE_DIR) else SYS_MODULE_DIR
    return os.path.join(base, POWER_LIMITS_FILE)


def read_power_limits() -> dict[str, float]:
    """GPU index (as text) -> enforced limit in W, for the GPUs whose limit was set; the rest run at the default."""
    try:
        with open(power_limits_path()) as fh:
            return {str(k): float(v) for k, v in json.load(fh).items()}
    except (OSError, ValueError):
        return {}


def write_power_limits(limits: dict[str, float]) -> None:
    write_atomic(os.path.join(SYS_MODULE_DIR, POWER_LIMITS_FILE), json.dumps(limits, sort_keys=True) + "\n")


def in_container() -> bool:
    return os.path.isdir(CT_HOST_SYS_MODULE_DIR)


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


def make_gpu_nodes() -> None:
    """What the driver's userspace (NVML, persistenced) does on the host: nvidia-modprobe -c=N for
    each GPU the driver drives and -c=255 for the control node."""
    table = gpu_minor_table()
    if table:
        minors = [i for i, bdf in enumerate(table) if bdf]
    else:
        minors = list(range(len(gpu_functions()) or int(load_config().get("gpus", 0))))
    args = [f"-c={i}" for i in minors] + ["-c=255"]
    subprocess.run(["/usr/bin/nvidia-modprobe", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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


# ---------------------------------------------------------------- storage (pvesm, pct)

STORAGE_CFG_FILE = PVE_DIR + "/storage.cfg"
VOLUMES_FILE = "/var/lib/lab-standin/volumes.json"
# Where a stand-in block volume's files live (an LVM thin volume is a formatted block device on a real host;
# here a directory, as the rootfs of every stand-in container is).
BLOCK_VOLUMES_DIR = "/var/lib/lab-standin/block-volumes"
GIB = 1024 ** 3


def parse_storage_cfg(text: str) -> dict[str, dict]:
    """/etc/pve/storage.cfg (pve-storage's SectionConfig): `TYPE: ID` then tab-indented `key value` lines;
    content is a comma list; a bare key (sparse, disable) is a flag."""
    out: dict[str, dict] = {}
    current: dict | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            kind, _, sid = line.partition(":")
            current = {"type": kind.strip(), "content": set()}
            out[sid.strip()] = current
            continue
        if current is None:
            continue
        key, _, value = line.strip().partition(" ")
        if key == "content":
            current["content"] = {c for c in value.split(",") if c}
        else:
            current[key] = value.strip() or True
    return out


def read_storages() -> dict[str, dict]:
    try:
        with open(STORAGE_CFG_FILE) as fh:
            return parse_storage_cfg(fh.read())
    except FileNotFoundError:
        return {}


def storage_config(sid: str) -> dict:
    """PVE::Storage::storage_config: the storage's section, or Proxmox's error."""
    scfg = read_storages().get(sid)
    if scfg is None:
        raise LookupError(f"storage '{sid}' does not exist")
    return scfg


def read_volumes() -> dict[str, dict]:
    try:
        with open(VOLUMES_FILE) as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return {}


def write_volumes(volumes: dict[str, dict]) -> None:
    write_atomic(VOLUMES_FILE, json.dumps(volumes, indent=1, sort_keys=True) + "\n")


def volume_dir(volid: str) -> str:
    """Where a volume's files are: a ZFS subvol is mounted at /POOL/NAME (as on a real host), a dir
    storage's under PATH/images/VMID/, an LVM thin volume under the stand-in's block-volume directory."""
    sid, _, name = volid.partition(":")
    scfg = storage_config(sid)
    kind = scfg["type"]
    if kind == "zfspool":
        return f"/{scfg.get('pool', 'rpool/data')}/{name}"
    if kind in ("dir", "nfs", "cifs", "btrfs", "cephfs"):
        return os.path.join(scfg.get("path", "/var/lib/vz"), "images", name)
    return os.path.join(BLOCK_VOLUMES_DIR, scfg.get("vgname", sid), name)


def alloc_volume(sid: str, vmid: str, size_gib: float) -> str:
    """vdisk_alloc for a container volume (rootfs or mpN): the storage must exist and take container
    directories; the name is the storage type's (pve-storage find_free_diskname): zfspool subvol-VMID-disk-N,
    lvmthin vm-VMID-disk-N, dir VMID/vm-VMID-disk-N.raw. Returns the volid."""
    scfg = storage_config(sid)
    if scfg.get("disable"):
        raise LookupError(f"storage '{sid}' is disabled")
    if "rootdir" not in scfg["content"]:
        raise ValueError(f"storage '{sid}' does not support container directories")
    volumes = read_volumes()
    used = {v.split(":", 1)[1] for v in volumes if v.startswith(sid + ":")}
    n = 0
    while True:
        kind = scfg["type"]
        if kind == "zfspool":
            name = f"subvol-{vmid}-disk-{n}"
        elif kind in ("dir", "nfs", "cifs", "btrfs", "cephfs"):
            name = f"{vmid}/vm-{vmid}-disk-{n}.raw"
        else:
            name = f"vm-{vmid}-disk-{n}"
        if name not in used:
            break
        n += 1
    volid = f"{sid}:{name}"
    volumes[volid] = {"size_gib": size_gib, "vmid": vmid}
    write_volumes(volumes)
    os.makedirs(volume_dir(volid), exist_ok=True)
    return volid


def free_volume(volid: str) -> None:
    volumes = read_volumes()
    if volid in volumes:
        try:
            path = volume_dir(volid)
        except LookupError:
            path = ""
        import shutil

        if path:
            shutil.rmtree(path, ignore_errors=True)
        del volumes[volid]
        write_volumes(volumes)


def _tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def storage_status(sid: str) -> dict:
    """What pvesm status reports for a storage (bytes): the stand-in disk's sizes (lab.json "storage", as
    the installer carved it) less what is on it. Volumes count at their allocated size (thin provisioning is
    not modelled: a sparse volume counts as written), files under a dir storage at their size."""
    scfg = storage_config(sid)
    layout = load_config().get("storage", {"kind": "lvm", "root_gib": 96, "thin_gib": 1651.3, "root_used_gib": 2.9})
    allocated = sum(v["size_gib"] for k, v in read_volumes().items() if k.startswith(sid + ":")) * GIB
    files = _tree_bytes(scfg["path"]) if scfg["type"] == "dir" and os.path.isdir(scfg.get("path", "")) else 0
    root_used = layout.get("root_used_gib", 2.9) * GIB
    if layout.get("kind") == "zfs":
        everything = root_used + sum(v["size_gib"] for v in read_volumes().values()) * GIB + (
            _tree_bytes("/var/lib/vz") if os.path.isdir("/var/lib/vz") else 0)
        avail = max(layout["pool_gib"] * GIB - everything, 0)
        used = files + allocated + (root_used if scfg["type"] == "dir" else 0)
        return {"type": scfg["type"], "total": used + avail, "used": used, "avail": avail,
                "enabled": not scfg.get("disable"), "active": True, "content": scfg["content"]}
    if scfg["type"] == "lvmthin":
        total = layout["thin_gib"] * GIB
        used = allocated
    elif os.path.isdir(scfg.get("path", "")):
        # A dir storage on the root filesystem (a real one of the installer's size, `lab up` makes it): what
        # pve-storage's DirPlugin reports, df of its path.
        st = os.statvfs(scfg["path"])
        total = st.f_blocks * st.f_frsize
        return {"type": scfg["type"], "total": total, "used": (st.f_blocks - st.f_bfree) * st.f_frsize,
                "avail": st.f_bavail * st.f_frsize, "enabled": not scfg.get("disable"), "active": True,
                "content": scfg["content"]}
    else:
        total = layout["root_gib"] * GIB
        used = root_used + files + allocated
    return {"type": scfg["type"], "total": total, "used": used, "avail": max(total - used, 0),
            "enabled": not scfg.get("disable"), "active": True, "content": scfg["content"]}


# ---------------------------------------------------------------- HA (ha-manager, pct, pve-ha-lrm)

HA_RESOURCES_FILE = PVE_DIR + "/ha/resources.cfg"
HA_COMMANDS_FILE = PVE_DIR + "/ha/crm_commands"
# Set by the stand-in LRM when it starts or stops a guest itself (the real one acts through the API with
# its own environment, rpcenv type 'ha'), so that pct does the work instead of filing a request.
HA_ENV = "LAB_STANDIN_HA_LRM"


def read_ha_resources() -> dict[str, dict]:
    """/etc/pve/ha/resources.cfg (SectionConfig): `ct: 100` then tab-indented `key value` lines."""
    out: dict[str, dict] = {}
    current: dict | None = None
    try:
        with open(HA_RESOURCES_FILE) as fh:
            text = fh.read()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            kind, _, name = line.partition(":")
            current = {}
            out[f"{kind.strip()}:{name.strip()}"] = current
        elif current is not None:
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return out


def write_ha_resources(resources: dict[str, dict]) -> None:
    lines = []
    for sid in sorted(resources):
        kind, _, name = sid.partition(":")
        lines.append(f"{kind}: {name}")
        lines += [f"\t{k} {v}" for k, v in sorted(resources[sid].items())]
        lines.append("")
    write_atomic(HA_RESOURCES_FILE, "\n".join(lines), 0o640)


def ha_managed(vmid: str) -> bool:
    """PVE::HA::Config::vm_is_ha_managed: a resource ct:VMID or vm:VMID whose state is not `ignored`."""
    res = read_ha_resources()
    return any(sid in res and res[sid].get("state", "started") != "ignored" for sid in (f"ct:{vmid}", f"vm:{vmid}"))
