"""`toolkit doctor`'s judgement: raw readings from a Proxmox host and its containers in, checks out.

Pure. The readings are what playbooks/doctor.yml collects (nvidia-smi output, /proc/devices, the
live nvidia_uvm parameter, `pct config`, how each /dev/nvidia* node opens inside the container, a
cuInit result). Each failing check says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.core.hostplan.facts import normalize_bus_id

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
_ALLOW = re.compile(r"^lxc\.cgroup2?\.devices\.allow:\s*c\s+(\d+):(\*|\d+)\s+[rwm]+\s*$")


@dataclass(frozen=True)
class Check:
    subject: str  # host or container name
    name: str
    status: str  # pass, fail, warn, skip
    detail: str
    fix: str = ""


def char_majors(proc_devices: str) -> dict[str, int]:
    """/proc/devices -> {character device name: major}. The lxc_gpu_container role's filter plugin parses the
    same text with its own copy (a role runs where the toolkit may not be installed); a test feeds both the
    same texts, so the two cannot drift apart."""
    majors: dict[str, int] = {}
    section = ""
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            section = line[:-1].strip()
            continue
        parts = line.split()
        if section == "Character devices" and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def nvidia_majors(proc_devices: str) -> dict[str, int]:
    m = char_majors(proc_devices)
    out = {}
    nvidia = m.get("nvidia-frontend", m.get("nvidia"))
    if nvidia is not None:
        out["nvidia"] = nvidia
    if "nvidia-uvm" in m:
        out["uvm"] = m["nvidia-uvm"]
    if "nvidia-caps" in m:
        out["caps"] = m["nvidia-caps"]
    return out


def smi_versions(smi: str) -> list[str]:
    """Driver versions from `nvidia-smi --query-gpu=index,driver_version[,...] --format=csv,noheader`."""
    versions = []
    for line in smi.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit():
            versions.append(cells[1])
    return versions


def topology_links(topo: str) -> dict[str, int]:
    """Counts of GPU-GPU link kinds in `nvidia-smi topo -m` (NV#, PIX, PXB, PHB, NODE, SYS)."""
    counts: dict[str, int] = {}
    for line in topo.splitlines():
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        for cell in cells[1:]:
            if re.fullmatch(r"NV\d+", cell):
                counts["NVLink"] = counts.get("NVLink", 0) + 1
            elif cell in ("PIX", "PXB", "PHB", "NODE", "SYS"):
                counts[cell] = counts.get(cell, 0) + 1
    return counts


def _as_int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def judge_host(name: str, r: Mapping[str, Any]) -> list[Check]:
    checks: list[Check] = []
    versions = smi_versions(str(r.get("smi", "")))
    if _as_int(r.get("smi_rc")) == 0 and versions:
        checks.append(Check(name, "driver", PASS, f"{len(versions)} GPU(s), driver {', '.join(sorted(set(versions)))}"))
    else:
        checks.append(
            Check(
                name,
                "driver",
                FAIL,
                f"nvidia-smi fails (rc {r.get('smi_rc')}): {str(r.get('smi', '')).strip()[:160]}",
                f"toolkit host provision {name} (a version mismatch needs a reboot of the host)",
            )
        )

    hmm = str(r.get("hmm", "")).strip()
    conf = str(r.get("modprobe_conf", ""))
    persisted = re.search(r"^\s*options\s+nvidia[-_]uvm\s+.*\buvm_disable_hmm=(1|y|Y)\b", conf, re.M) is not None
    if hmm in ("Y", "1"):
        if persisted:
            checks.append(
                Check(name, "HMM disabled", PASS, "uvm_disable_hmm=Y live and in " + str(r.get("modprobe_conf_path")))
            )
        else:
            checks.append(
                Check(
                    name,
                    "HMM disabled",
                    WARN,
                    "live uvm_disable_hmm=Y but not in modprobe.d: lost at reboot",
                    f"toolkit host provision {name} (writes options nvidia_uvm uvm_disable_hmm=1)",
                )
            )
    else:
        checks.append(
            Check(
                name,
                "HMM disabled",
                FAIL,
                f"uvm_disable_hmm={hmm or 'unreadable (nvidia_uvm not loaded)'}: CUDA in containers fails "
                "with cuInit 3 (NVIDIA/open-gpu-kernel-modules#797)",
                f"toolkit host provision {name} (sets uvm_disable_hmm=1 and reloads nvidia_uvm)",
            )
        )

    majors = nvidia_majors(str(r.get("proc_devices", "")))
    nodes: Mapping[str, Any] = r.get("nodes") or {}
    missing = [n for n in ("/dev/nvidiactl", "/dev/nvidia-uvm") if n not in nodes]
    wrong = []
    for node, info in sorted(nodes.items()):
        want = (
            majors.get("uvm")
            if node.startswith("/dev/nvidia-uvm")
            else (majors.get("caps") if node.startswith("/dev/nvidia-caps/") else majors.get("nvidia"))
        )
        if want is not None and _as_int(info.get("major")) != want:
            wrong.append(f"{node} is major {info.get('major')}, the driver registered {want}")
    if missing or wrong or not nodes:
        checks.append(
            Check(
                name,
                "device nodes",
                FAIL,
                "; ".join([f"missing {', '.join(missing)}"] if missing else []) + "; ".join(wrong),
                "systemctl restart nvidia-uvm-nodes.service on the host (stale nodes after a driver reload: "
                "remove them first, jammsen/proxmox-setup-scripts#7)",
            )
        )
    else:
        checks.append(Check(name, "device nodes", PASS, f"{len(nodes)} nodes, majors {majors}"))
    if not r.get("unit_present"):
        checks.append(
            Check(
                name,
                "node unit",
                WARN,
                "no oneshot unit creates /dev/nvidia-uvm before the guests start",
                f"toolkit host provision {name}",
            )
        )

    if _as_int(r.get("topo_rc")) != 0:
        checks.append(Check(name, "topology / P2P", SKIP, "nvidia-smi topo -m not available here"))
    else:
        links = topology_links(str(r.get("topo", "")))
        if links.get("NVLink"):
            checks.append(Check(name, "topology / P2P", PASS, f"NVLink between GPUs ({links})"))
        elif links:
            checks.append(
                Check(
                    name,
                    "topology / P2P",
                    WARN,
                    f"no NVLink, GPU pairs over PCIe {links}: tensor-parallel allreduce crosses PCIe "
                    "(the story's ~250 W of 600 W at 100 % utilisation)",
                    "prefer expert parallelism or TP4+PP2 over TP8 on such a host",
                )
            )
        else:
            checks.append(Check(name, "topology / P2P", SKIP, "single GPU or no matrix in nvidia-smi topo -m"))
    return checks + judge_power_limit(name, r) + judge_kernel_module(name, r)


def power_limits(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=index,pci.bus_id,power.limit,power.default_limit,power.min_limit,power.max_limit
    --format=csv,noheader,nounits` -> one dict per GPU (a row that does not parse, e.g. `[N/A]`, is left out); rows
    without the bus id (an older doctor's query) parse too."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 5:
            cells.insert(1, "")
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        try:
            out.append({"index": float(cells[0]), "bus": normalize_bus_id(cells[1]) if cells[1] else "",
                        "limit": float(cells[2]), "default": float(cells[3]), "min": float(cells[4]),
                        "max": float(cells[5])})
        except ValueError:
            continue
    return out


def unit_power_limits(unit: str) -> dict[str, float]:
    """The W the power-limit unit sets at boot, by bus id (`ExecStart=... nvidia-smi -i BUS -pl W`, one per GPU);
    "*" for a line without -i (every GPU). Empty without a unit."""
    out = {}
    for m in re.finditer(r"^ExecStart=\S*nvidia-smi\b(?:.*\s-i\s+(\S+))?.*\s-pl\s+([0-9.]+)\s*$", unit, re.M):
        out[normalize_bus_id(m.group(1)) if m.group(1) else "*"] = float(m.group(2))
    return out


def judge_power_limit(name: str, r: Mapping[str, Any]) -> list[Check]:
    """Each GPU's enforced power limit read back, against what the host keeps at boot (roles/proxmox_gpu_host
    power_limit.yml's unit, one line per GPU whose limit is not its default): equal passes; a limit the unit does not
    explain is lost at the next reboot (set by hand) or the unit's was lost (a driver reload), and says so."""
    if "power" not in r:
        return []
    gpus = power_limits(str(r.get("power", "")))
    if _as_int(r.get("power_rc")) != 0 or not gpus:
        return [Check(name, "power limit", SKIP, "nvidia-smi reads no power limit here")]
    unit = unit_power_limits(str(r.get("power_unit", "")))
    limits = sorted({g["limit"] for g in gpus})
    shown = ", ".join(f"GPU {int(g['index'])} {g['limit']:g} W" for g in gpus)
    if unit:
        kept = {id(g): unit.get(g["bus"], unit.get("*", g["default"])) for g in gpus}
        off = [g for g in gpus if abs(g["limit"] - kept[id(g)]) > 0.5]
        if not off:
            held = sorted({kept[id(g)] for g in gpus if abs(kept[id(g)] - g["default"]) > 0.5})
            at_default = sum(1 for g in gpus if abs(kept[id(g)] - g["default"]) <= 0.5)
            rest = f", {at_default} at their default" if at_default else ""
            return [Check(name, "power limit", PASS,
                          f"{', '.join(f'{w:g}' for w in held) or 'the default'} W on {len(gpus) - at_default} GPU(s)"
                          f"{rest}, kept at boot by the unit (range {gpus[0]['min']:g}-{gpus[0]['max']:g} W, default "
                          f"{gpus[0]['default']:g} W)")]
        return [Check(name, "power limit", FAIL,
                      f"the unit sets {', '.join(f'{w:g}' for w in sorted(set(unit.values())))} W at boot, but "
                      + ", ".join(f"GPU {int(g['index'])} ({g['bus'] or '?'}) {g['limit']:g} W, "
                                  f"{kept[id(g)]:g} W kept" for g in off),
                      f"systemctl restart nvidia-power-limit.service (or toolkit host provision {name})")]
    if any(abs(g["limit"] - g["default"]) > 0.5 for g in gpus):
        return [Check(name, "power limit", WARN, f"{shown}: below the default without a unit to keep it, so lost "
                      "at the next reboot or driver reload",
                      "set gpu.power_limit_w in the profile and `toolkit apply` it (the host role keeps it)")]
    return [Check(name, "power limit", PASS, f"the default {', '.join(f'{x:g}' for x in limits)} W on "
                  f"{len(gpus)} GPU(s)")]


def judge_kernel_module(name: str, r: Mapping[str, Any]) -> list[Check]:
    """Is there an nvidia module for the kernel the host runs, and will the next kernel get one? The
    usual "GPU gone after a kernel update": the .run driver installed without dkms (or dkms without
    the new kernel's headers) is built for the old kernel only. Readings: `kernel` (uname -r),
    `module_kernels` (kernels with an nvidia.ko), `dkms_rc`/`dkms` (`dkms status`; 127: not installed),
    `nvswitches` and `fabricmanager` (systemctl is-active)."""
    kernel = str(r.get("kernel", "")).strip()
    if not kernel:
        return []
    built = sorted({str(k) for k in (r.get("module_kernels") or [])})
    dkms_rc = _as_int(r.get("dkms_rc"))
    dkms = str(r.get("dkms", ""))
    registered = re.findall(r"^nvidia/(\S+?),\s*(\S+?),\s*\S+?:\s*installed", dkms, re.M)
    checks = []
    if kernel in built:
        how = "DKMS" if any(k == kernel for _v, k in registered) else "the installer"
        checks.append(Check(name, "kernel module", PASS, f"nvidia.ko for the running kernel {kernel} (from {how})"))
    else:
        detail = f"no nvidia module for the running kernel {kernel} (built for: {', '.join(built) or 'none'})"
        if dkms_rc == 127:
            detail += "; dkms is not installed, so nothing rebuilt it when the kernel changed"
            fix = (f"apt install dkms proxmox-default-headers proxmox-headers-{kernel}, then "
                   f"`toolkit host provision {name}` (reinstalls the driver with --dkms)")
        elif not registered:
            detail += "; the driver is not registered with DKMS"
            fix = f"toolkit host provision {name} (reinstalls the driver with --dkms)"
        else:
            detail += f"; DKMS has nvidia {registered[0][0]} but did not build it for {kernel} (its headers?)"
            fix = f"apt install proxmox-headers-{kernel} && dkms autoinstall -k {kernel}, then reboot"
        checks.append(Check(name, "kernel module", FAIL, detail, fix))
    checks += _next_boot(name, r, kernel, built)
    if kernel in built and dkms_rc == 127:
        checks.append(Check(name, "DKMS", WARN, "dkms is not installed: the next kernel update loses the GPUs",
                            f"apt install dkms proxmox-default-headers, then `toolkit host provision {name}`"))
    elif kernel in built and not registered:
        checks.append(Check(name, "DKMS", WARN, "the nvidia module is not registered with DKMS: the next kernel "
                            "update loses the GPUs", f"toolkit host provision {name} (installs with --dkms)"))
    elif registered:
        kernels = ", ".join(k for _v, k in registered)
        checks.append(Check(name, "DKMS", PASS, f"nvidia registered, installed for {kernels}"))
    nvswitches = _as_int(r.get("nvswitches"), 0)
    if nvswitches > 0:
        active = str(r.get("fabricmanager", "")).strip() == "active"
        checks.append(Check(name, "Fabric Manager", PASS if active else FAIL,
                            f"{nvswitches} NVSwitch(es); nvidia-fabricmanager {'active' if active else 'not running'}"
                            + ("" if active else ": cuInit returns 802 until it has trained the fabric"),
                            "" if active else f"toolkit host provision {name} (installs Fabric Manager at the "
                                              "driver's version)"))
    return checks


def _kernel_key(release: str) -> list[tuple[int, int, str]]:
    """Kernel releases in the bootloader's order (6.8.12-9-pve < 6.8.12-11-pve < 6.14.8-2-bpo12-pve)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.-]", release)]


def _next_boot(name: str, r: Mapping[str, Any], kernel: str, built: list[str]) -> list[Check]:
    """The kernel the bootloader boots next (the newest installed, `installed_kernels` from /boot) must have the
    module too: one installed after the driver, with its headers, had nothing to build then, and Debian's dkms
    does not rebuild at boot. Nothing to say when the running kernel is the newest."""
    installed = sorted({str(k) for k in (r.get("installed_kernels") or [])} | {kernel}, key=_kernel_key)
    upcoming = installed[-1]
    if upcoming == kernel:
        return []
    if upcoming in built:
        return [Check(name, "next boot", PASS, f"nvidia.ko for {upcoming}, the kernel the next reboot boots")]
    return [Check(name, "next boot", FAIL,
                  f"{upcoming} (the newest installed kernel, which the next reboot boots) has no nvidia module: "
                  "the GPUs would be gone after the reboot",
                  f"apt install proxmox-headers-{upcoming}, then `dkms autoinstall -k {upcoming}` "
                  f"(or `toolkit host provision {name}`)")]


def judge_container(
    name: str, r: Mapping[str, Any], host_report: Mapping[str, Any] | None, pct_config: str = "", host_name: str = ""
) -> list[Check]:
    if r.get("unreachable"):
        return [
            Check(
                name,
                "reachable",
                FAIL,
                str(r.get("message", "does not answer over SSH")),
                f"toolkit host provision {host_name or 'HOST'} --containers (starts it), then check its net0",
            )
        ]
    checks: list[Check] = []
    host_versions = sorted(set(smi_versions(str((host_report or {}).get("smi", "")))))
    ct_versions = sorted(set(smi_versions(str(r.get("smi", "")))))
    if not ct_versions:
        checks.append(
            Check(
                name,
                "driver versions",
                FAIL,
                f"nvidia-smi fails in the container (rc {r.get('smi_rc')}): {str(r.get('smi', '')).strip()[:160]}",
                f"toolkit host provision {host_name} --containers",
            )
        )
    elif host_versions and ct_versions != host_versions:
        checks.append(
            Check(
                name,
                "driver versions",
                FAIL,
                f"container userspace {', '.join(ct_versions)}, host driver {', '.join(host_versions)}",
                f"toolkit host provision {host_name} --containers (installs the host's exact version)",
            )
        )
    else:
        checks.append(Check(name, "driver versions", PASS, f"{', '.join(ct_versions)} = host's"))

    majors = nvidia_majors(str((host_report or {}).get("proc_devices", "")))
    allowed = {int(m.group(1)) for m in (_ALLOW.match(line) for line in pct_config.splitlines()) if m}
    registered = set(char_majors(str((host_report or {}).get("proc_devices", ""))).values())
    stale = sorted(a for a in allowed if registered and a not in registered)
    nodes: Mapping[str, Any] = r.get("nodes") or {}
    eperm = {n: i for n, i in nodes.items() if i.get("open") == "EPERM"}
    if eperm:
        denied = sorted({_as_int(i.get("major")) for i in eperm.values()})
        detail = f"EPERM on {', '.join(sorted(eperm))} (major {', '.join(map(str, denied))} not allowed)"
        if stale:
            detail += f"; the config allows major {', '.join(map(str, stale))}, which no driver registered (stale)"
        checks.append(
            Check(
                name,
                "cgroup rules",
                FAIL,
                detail,
                f"toolkit host provision {host_name} --containers (rules from the live majors {majors}), "
                "or fix the lxc.cgroup2.devices.allow lines in /etc/pve/lxc/VMID.conf and restart it",
            )
        )
    elif not nodes:
        checks.append(
            Check(
                name,
                "cgroup rules",
                FAIL,
                "no /dev/nvidia* node in the container",
                f"toolkit host provision {host_name} --containers (passes the GPUs through)",
            )
        )
    else:
        how = sorted({str(i.get("open")) for i in nodes.values()})
        status = WARN if stale else PASS
        detail = f"{len(nodes)} nodes open ({', '.join(how)}; ENXIO = allowed, no driver behind the node)"
        if stale:
            detail += f"; stale allow rule for unregistered major {', '.join(map(str, stale))}"
        checks.append(Check(name, "cgroup rules", status, detail))
        missing = [n for n in ("/dev/nvidiactl", "/dev/nvidia-uvm") if n not in nodes]
        if missing:
            checks.append(
                Check(
                    name,
                    "device nodes",
                    FAIL,
                    f"missing in the container: {', '.join(missing)}",
                    f"toolkit host provision {host_name} --containers",
                )
            )

    cuda: Mapping[str, Any] = r.get("cuda") or {}
    if cuda.get("ok"):
        checks.append(Check(name, "CUDA init", PASS, f"cuInit 0, {cuda.get('device_count')} device(s)"))
    elif _as_int(cuda.get("rc")) == 3:
        hmm = str((host_report or {}).get("hmm", "")).strip() or "unknown"
        checks.append(
            Check(
                name,
                "CUDA init",
                FAIL,
                f"cuInit 3 (CUDA_ERROR_NOT_INITIALIZED) while nvidia-smi works; host uvm_disable_hmm={hmm}",
                "on the host: options nvidia_uvm uvm_disable_hmm=1, reload nvidia_uvm "
                f"(toolkit host provision {host_name})"
                if hmm not in ("Y", "1")
                else "check /dev/nvidia-uvm and its cgroup rule in the container",
            )
        )
    else:
        checks.append(
            Check(
                name,
                "CUDA init",
                FAIL,
                f"CUDA does not initialise: {dict(cuda) or 'no result'}",
                "see the cgroup rules and device nodes checks above",
            )
        )
    return checks


def judge(host: str, reports: Mapping[str, Mapping[str, Any]], unreachable: Mapping[str, str]) -> list[Check]:
    """All checks for `host` and its containers. `reports`: inventory host -> the doctor report."""
    if host in unreachable:
        return [Check(host, "reachable", FAIL, unreachable[host], "check the address and SSH key in the inventory")]
    host_report = reports.get(host)
    if host_report is None:
        return [Check(host, "reachable", FAIL, "no report from the host", "see the run's artifacts")]
    checks = judge_host(host, host_report)
    configs: Mapping[str, str] = host_report.get("containers") or {}
    for ct in sorted(set(configs) | {c for c in unreachable if c != host}):
        r: Mapping[str, Any] = (
            {"unreachable": True, "message": unreachable[ct]}
            if ct in unreachable
            else (reports.get(ct) or {"unreachable": True, "message": "no report (not run)"})
        )
        checks += judge_container(ct, r, host_report, str(configs.get(ct, "")), host)
    return checks
