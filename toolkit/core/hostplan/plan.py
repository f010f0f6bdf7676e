"""The plan: host facts + the profile's needs + the inventory's variables -> one stack, the changes in order, and
the refusals that stop a run before it changes anything.

Every choice carries its reason (and the matrix row's source where one decided); every refusal its reason, its
fix and its source. `extravars()` is what provision/reproduce pass to the roles. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from toolkit.core.hostplan.facts import Gpu, HostFacts, Storage, version_key
from toolkit.core.hostplan.matrix import Matrix, branch_of

PLAN_SCHEMA = 1
# Room left free on a storage after the model cache: ZFS slows badly near full, LVM-thin stops every guest on
# a full pool (the larger of the two).
FREE_MARGIN_FRACTION = 0.10
FREE_MARGIN_GIB = 20.0
# The model cache volume is made this much larger than the checkpoint (lxc_gpu_container's own sizing).
CACHE_OVER_MODEL = 1.1
LOCAL_TYPES = ("zfspool", "lvmthin", "lvm", "btrfs", "dir")
VM_DRIVER_FIX = ("bind it to vfio-pci at boot: `options vfio-pci ids={pci_id}` in /etc/modprobe.d/vfio.conf "
                 "and `softdep nvidia pre: vfio-pci` (when no host GPU shares {pci_id}; else a driver_override "
                 "for {bus}), update-initramfs -u, reboot; or remove the hostpci entry from VM {vms}")
VM_DRIVER_SOURCE = ("pve-docs qm-pci-passthrough.adoc; qemu-server src/PVE/QemuServer/PCI.pm "
                    "(binds to vfio-pci only when the VM starts)")


@dataclass(frozen=True)
class ProfileNeeds:
    """What the plan reads of a resolved profile (None: provision without a profile)."""

    name: str
    sglang_version: str | None
    gpu_count: int  # GPUs per node the server uses (tp x pp x dp, or target.gpu_count)
    tp_size: int
    p2p: bool | None
    nnodes: int
    model_size_gib: float | None
    power_limit_w: float | None


@dataclass(frozen=True)
class Choice:
    what: str
    value: Any
    reason: str
    source: str = ""


@dataclass(frozen=True)
class Refusal:
    finding: str  # a short stable id: driver-kernel, apt-driver, vm-gpu-bound ...
    reason: str
    fix: str
    source: str = ""


@dataclass(frozen=True)
class Change:
    what: str
    why: str


@dataclass
class Plan:
    host: str
    profile: str | None
    choices: list[Choice] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[Refusal] = field(default_factory=list)
    variables: dict[str, Any] = field(default_factory=dict)  # what the roles are given
    unknown: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        return not self.refusals

    def choice(self, what: str) -> Choice | None:
        return next((c for c in self.choices if c.what == what), None)

    def extravars(self) -> dict[str, Any]:
        digest = hashlib.sha256(json.dumps(self.variables, sort_keys=True).encode()).hexdigest()[:16]
        return {**self.variables, "toolkit_plan_digest": digest}

    def to_json(self) -> dict[str, Any]:
        return {"schema": PLAN_SCHEMA, "host": self.host, "profile": self.profile, "resolved": self.resolved,
                "stack": {c.what: c.value for c in self.choices},
                "choices": [asdict(c) for c in self.choices], "changes": [asdict(c) for c in self.changes],
                "refusals": [asdict(r) for r in self.refusals], "warnings": [asdict(w) for w in self.warnings],
                "extravars": self.extravars(), "unknown": list(self.unknown)}


def make_plan(facts: HostFacts, matrix: Matrix, needs: ProfileNeeds | None, variables: Mapping[str, Any],
              origins: Mapping[str, str] | None = None) -> Plan:
    """`variables`: the host's inventory variables with the run's -e on top; `origins`: where each came from
    ("-e", "inventory"), said in the reasons."""
    plan = Plan(facts.host, needs.name if needs else None, unknown=facts.unknown)
    where = dict(origins or {})
    _platform(plan, facts, matrix)
    gpus = _gpus(plan, facts, matrix, needs, variables, where)
    module_type = _module_type(plan, facts, matrix, gpus, variables, where)
    cuda = _cuda(plan, matrix, needs)
    driver = _driver(plan, facts, matrix, gpus, cuda, variables, where)
    _existing_driver(plan, facts, driver, variables)
    _p2p(plan, facts, needs, gpus)
    _fabricmanager(plan, facts, matrix, driver)
    storage = _storage(plan, facts, needs, variables, where)
    _proxies(plan, facts, driver, variables)
    if needs and needs.nnodes > 1:
        plan.warnings.append(Refusal(
            "multi-node-tcp", f"{needs.name} spans {needs.nnodes} nodes: the container gets no /dev/infiniband "
            "nodes and no LimitMEMLOCK, so NCCL runs over TCP on the container's veth, at a fraction of the fabric",
            "measure the NCCL transport (NCCL_DEBUG=INFO shows NET/Socket) before trusting multi-node figures",
            "roles-review-3 finding 13; NCCL user guide, environment variables"))
    _changes(plan, facts, needs, gpus, driver, module_type, cuda, storage)
    return plan


# ------------------------------------------------------------------ pieces


def _platform(plan: Plan, facts: HostFacts, matrix: Matrix) -> None:
    deb = matrix.debian_of(facts.pve_version)
    if deb is not None:
        plan.choices.append(Choice("debian_suite", deb.debian_suite,
                                   f"Proxmox VE {facts.pve_version} is built on Debian {deb.debian_suite}; NVIDIA's "
                                   f"repository for it is {deb.cuda_repo}", deb.source))
        if facts.debian_suite and facts.debian_suite != deb.debian_suite:
            plan.warnings.append(Refusal("pve-debian", f"/etc/os-release says {facts.debian_suite}, Proxmox VE "
                                         f"{facts.pve_version} is built on {deb.debian_suite}",
                                         "finish the major upgrade (pve8to9) before provisioning", deb.source))
    k = facts.kernels
    plan.choices.append(Choice("kernels", list(k.series_to_build()),
                               f"running {k.running or 'unknown'}, next boot {k.default or 'unknown'}"
                               + (" (pinned)" if k.pinned else "")
                               + f", installed {[x.release for x in k.installed] or 'unknown'}"
                               + (f", proxmox-default-kernel pulls in {k.pending_series}" if k.pending_series else "")
                               + ": the driver must build on each series"))
    if facts.secure_boot is not None:
        read = "mokutil --sb-state" if "mokutil" not in facts.unknown else "the EFI SecureBoot variable"
        plan.choices.append(Choice("secure_boot", facts.secure_boot, read))


def _gpus(plan: Plan, facts: HostFacts, matrix: Matrix, needs: ProfileNeeds | None, variables: Mapping[str, Any],
          where: Mapping[str, str]) -> tuple[Gpu, ...]:
    """The GPUs this run may touch, by PCI bus id. VM GPUs are not the host's; one a VM names but the NVIDIA
    driver holds is refused (qemu-server unbinds it only when the VM starts)."""
    for g in facts.gpus:
        if g.vms and g.driver != "vfio-pci" and not g.is_nvswitch:
            vms = ", ".join(str(v) for v in g.vms)
            bound = f"bound to {g.driver}" if g.driver else "bound to no driver"
            plan.refusals.append(Refusal(
                "vm-gpu-bound", f"GPU {g.bus_id} ({g.name}) is in VM {vms}'s hostpci but {bound}: the NVIDIA "
                "driver would take and open it, and the VM's start would unbind it under a running container",
                VM_DRIVER_FIX.format(pci_id=g.pci_id, bus=g.bus_id, vms=vms), VM_DRIVER_SOURCE))
    vm_gpus = sorted(g.bus_id for g in facts.gpus if g.vms or g.driver == "vfio-pci")
    if vm_gpus:
        plan.variables["proxmox_gpu_host_vm_gpus"] = vm_gpus
    own = facts.host_gpus()
    named = variables.get("lxc_gpu_container_gpus")
    chosen: tuple[Gpu, ...] = own
    reason = "every GPU of the host's own (no NVSwitch, none bound to vfio-pci, none a VM's hostpci names)"
    if isinstance(named, list) and named and all(isinstance(x, str) and ":" in x for x in named):
        picked = []
        for bus in named:
            found = facts.gpu(bus)
            if found is None or found not in own:
                plan.refusals.append(Refusal(
                    "gpu-identity", f"lxc_gpu_container_gpus names {bus}, which is not one of the host's own GPUs "
                    f"({', '.join(x.bus_id for x in own) or 'none'})",
                    "name GPUs by their PCI bus id as `lspci -D -d 10de:` prints them", "roles-review-3 finding 7"))
            else:
                picked.append(found)
        chosen = tuple(picked)
        reason = f"lxc_gpu_container_gpus ({where.get('lxc_gpu_container_gpus', 'inventory')})"
    if needs is not None and len(chosen) < needs.gpu_count:
        plan.refusals.append(Refusal(
            "gpu-count", f"{needs.name} needs {needs.gpu_count} GPUs per node; this host has {len(chosen)} of its "
            f"own ({', '.join(g.bus_id for g in chosen) or 'none'})"
            + (f"; VM GPUs not counted: {', '.join(vm_gpus)}" if vm_gpus else ""),
            "pick a profile for this GPU count, or free GPUs from VMs", "roles-review-3 finding 5"))
    if needs is not None and len(chosen) > needs.gpu_count:
        chosen = chosen[:needs.gpu_count]
        reason += f"; the first {needs.gpu_count} by bus id (nvidia-smi's and CUDA_DEVICE_ORDER=PCI_BUS_ID's order)"
    minors = {g.bus_id: g.minor for g in chosen if g.minor is not None}
    plan.choices.append(Choice("gpus", [g.bus_id for g in chosen],
                               reason + (f"; device minors {minors}" if minors else
                                         "; device minors known once the driver is loaded "
                                         "(/proc/driver/nvidia/gpus/BUS/information)")))
    for g in chosen:
        if matrix.arch_of(g.chip) is None:
            plan.warnings.append(Refusal("gpu-arch", f"GPU {g.bus_id} ({g.name}): no architecture row for chip "
                                         f"{g.chip or 'unknown'}", "add its chip prefix to gpu_arch.yaml"))
    plan.variables["proxmox_gpu_host_power_limit_gpus"] = [g.bus_id for g in chosen]
    return chosen


def _module_type(plan: Plan, facts: HostFacts, matrix: Matrix, gpus: tuple[Gpu, ...], variables: Mapping[str, Any],
                 where: Mapping[str, str]) -> str | None:
    own = facts.host_gpus()
    archs = {g.bus_id: matrix.arch_of(g.chip) for g in own}
    legacy = [b for b, a in archs.items() if a is not None and not a.gsp]
    open_only = [b for b, a in archs.items() if a is not None and a.modules == ("open",)]
    vm_legacy = [g.bus_id for g in facts.gpus if g not in own and not g.is_nvswitch
                 and (a := matrix.arch_of(g.chip)) is not None and not a.gsp]
    forced = str(variables.get("proxmox_gpu_host_driver_kernel_module_type") or "auto")
    if legacy and open_only:
        plan.refusals.append(Refusal(
            "module-type", f"the host's own GPUs need both module types: {open_only} are open-only (Blackwell), "
            f"{legacy} have no GSP (pre-Turing, proprietary only); one driver loads one type",
            "pass the pre-Turing GPUs to a VM (bind them to vfio-pci), or move them to another host",
            _arch_source(matrix, "blackwell")))
        return None
    if forced not in ("auto", ""):
        if forced == "open" and legacy:
            plan.refusals.append(Refusal("module-type", f"open modules forced, but {legacy} have no GSP",
                                         "set proxmox_gpu_host_driver_kernel_module_type: auto",
                                         _arch_source(matrix, "pascal")))
        if forced == "proprietary" and open_only:
            plan.refusals.append(Refusal("module-type", f"proprietary modules forced, but {open_only} are "
                                         "open-only (Blackwell)",
                                         "set proxmox_gpu_host_driver_kernel_module_type: auto",
                                         _arch_source(matrix, "blackwell")))
        plan.choices.append(Choice("module_type", forced, "proxmox_gpu_host_driver_kernel_module_type "
                                   f"({where.get('proxmox_gpu_host_driver_kernel_module_type', 'inventory')})"))
        plan.variables["proxmox_gpu_host_driver_kernel_module_type"] = forced
        return forced
    if legacy:
        value, reason, src = "proprietary", f"{legacy} have no GSP: the open modules cannot drive them", \
            _arch_source(matrix, "pascal")
    elif not own:
        value, reason, src = "open", "no GPU of the host's own seen; open is the default from Turing on", ""
    else:
        value = "open"
        reason = "every GPU of the host's own has a GSP (Turing or later)"
        src = _arch_source(matrix, "turing")
        if open_only:
            reason += f"; {open_only} are Blackwell, open only"
            src = _arch_source(matrix, "blackwell")
        if vm_legacy:
            # nvidia-installer counts every NVIDIA function, bound or not: left to choose, it would take
            # proprietary for the VM's pre-Turing card and leave the host's GPUs undriven.
            reason += (f"; passed explicitly, as the installer would count the VM's pre-Turing {vm_legacy} "
                       "and choose proprietary (misc.c pci_device_scan)")
    plan.choices.append(Choice("module_type", value, reason, src))
    plan.variables["proxmox_gpu_host_driver_kernel_module_type"] = value
    return value


def _arch_source(matrix: Matrix, arch: str) -> str:
    return next((a.source for a in matrix.gpu_arch if a.arch == arch), "")


def _cuda(plan: Plan, matrix: Matrix, needs: ProfileNeeds | None) -> str | None:
    if needs is None:
        return None
    row = matrix.cuda_of_sglang(needs.sglang_version)
    if row is None:
        plan.warnings.append(Refusal(
            "cuda", f"no row says which CUDA SGLang {needs.sglang_version or '(unpinned)'} is built for; the "
                    "container keeps the role's default toolkit",
            "pin engine.sglang_version, or add a row to toolkit/data/compat/sglang_cuda.yaml"))
        return None
    plan.choices.append(Choice("container_cuda", row.cuda,
                               f"SGLang {needs.sglang_version}'s wheels are built for CUDA {row.cuda.split('.')[0]}: "
                               f"the container's toolkit (cuda-toolkit-{row.cuda.replace('.', '-')}) must match for "
                               "JIT builds", row.source))
    plan.variables["container_nvidia_userspace_cuda_version"] = row.cuda
    return row.cuda


def _driver(plan: Plan, facts: HostFacts, matrix: Matrix, gpus: tuple[Gpu, ...], cuda: str | None,
            variables: Mapping[str, Any], where: Mapping[str, str]) -> str | None:
    series = facts.kernels.series_to_build()
    pin = variables.get("proxmox_gpu_host_driver_version")
    legacy = [g.bus_id for g in facts.host_gpus() if (a := matrix.arch_of(g.chip)) is not None and not a.gsp]
    min_driver = matrix.min_driver(cuda) if cuda else None

    def problems(release: str) -> list[Refusal]:
        out = []
        for s in series:
            status, row = matrix.kernel_build(release, s)
            kernels = _kernels_of(facts, s)
            if status == "too-old" and row is not None:
                first = matrix.first_building(s, branch_of(release))
                out.append(Refusal(
                    "driver-kernel", f"{release} does not build on {kernels}; "
                    f"{first.first_release if first else row.first_release} is the first {branch_of(release)} "
                    f"release that does", _kernel_fix(facts, s, first.first_release if first else row.first_release),
                    row.source))
            elif status == "unknown":
                out.append(Refusal(
                    "driver-kernel", f"no matrix row says {release} builds on {kernels} "
                    f"(the newest known for branch {branch_of(release)}: "
                    f"{row.kernel_series + ' needs ' + row.first_release if row else 'none'})",
                    _kernel_fix(facts, s, None) + "; or add the row (with its source) to "
                    "toolkit/data/compat/driver_kernel.yaml", row.source if row else ""))
        if legacy and version_key(branch_of(release)) > (580,):
            out.append(Refusal(
                "legacy-gpu-branch", f"{release} is of branch {branch_of(release)}: 590 and later drop Maxwell, "
                f"Pascal and Volta, and the host's {legacy} are among them; 580 is their last branch",
                "pin a 580 release (proxmox_gpu_host_driver_version), or pass those GPUs to a VM",
                _arch_source(matrix, "pascal")))
        if min_driver is not None and version_key(release) < version_key(min_driver.min_driver):
            out.append(Refusal(
                "driver-cuda", f"{release} is older than {min_driver.min_driver}, the first driver that runs CUDA "
                f"{min_driver.cuda_major} (the profile's SGLang needs CUDA {cuda})",
                f"raise proxmox_gpu_host_driver_version to {min_driver.min_driver} or later", min_driver.source))
        return out

    if pin and not re.fullmatch(r"\d+\.\d+(\.\d+)?", str(pin)):
        plan.refusals.append(Refusal(
            "driver-pin", f"proxmox_gpu_host_driver_version is {pin!r} "
            f"({where.get('proxmox_gpu_host_driver_version', 'inventory')}), not a release the matrix can check",
            "give a literal release (580.142), or leave it unset for the matrix's pick"))
        return None
    if pin:
        release = str(pin)
        found = problems(release)
        plan.refusals.extend(found)
        plan.choices.append(Choice("driver", release, f"pinned: proxmox_gpu_host_driver_version "
                                   f"({where.get('proxmox_gpu_host_driver_version', 'inventory')})"
                                   + ("" if found else f"; builds on {', '.join(series) or 'the running kernel'}")))
        plan.variables["proxmox_gpu_host_driver_version"] = release
        return release
    for row in matrix.driver_pick:
        if not problems(row.release):
            plan.choices.append(Choice(
                "driver", row.release, f"unpinned: the newest tested release that builds on "
                f"{', '.join(series) or 'the running kernel'}"
                + (f" and runs CUDA {cuda}" if cuda else "")
                + (f" and still drives {legacy}" if legacy else ""), row.source))
            plan.variables["proxmox_gpu_host_driver_version"] = row.release
            return row.release
    first = matrix.driver_pick[0].release if matrix.driver_pick else "?"
    plan.refusals.extend(problems(first))
    if not plan.refusals:
        plan.refusals.append(Refusal("driver-kernel", "no release in driver_pick.yaml fits this host",
                                     "pin proxmox_gpu_host_driver_version", ""))
    return None


def _kernels_of(facts: HostFacts, series: str) -> str:
    k = facts.kernels
    named = sorted({r for r in (k.running, k.default, *(x.release for x in k.installed))
                    if r and r.startswith(series + ".")}, key=version_key)
    parts = []
    for r in named:
        roles = [w for w, v in (("running", k.running), ("next boot", k.default)) if v == r]
        parts.append(r + (f" ({', '.join(roles)})" if roles else " (installed)"))
    if not named and k.pending_series == series:
        parts.append(f"{series} (proxmox-default-kernel pulls in proxmox-kernel-{series} on the next full-upgrade)")
    return ", ".join(parts) or series


def _kernel_fix(facts: HostFacts, series: str, first: str | None) -> str:
    k = facts.kernels
    raise_it = (f"raise proxmox_gpu_host_driver_version to {first} or later" if first
                else "pin a driver the matrix knows builds there")
    if k.running and k.running.startswith(series + "."):
        return raise_it + " (the running kernel itself needs it)"
    if k.running:
        return (f"{raise_it}; or keep booting the running kernel: `proxmox-boot-tool kernel pin {k.running}`"
                + (" and `apt-mark hold proxmox-default-kernel`" if k.pending_series == series else ""))
    return raise_it


def _existing_driver(plan: Plan, facts: HostFacts, release: str | None, variables: Mapping[str, Any]) -> None:
    method = str(variables.get("proxmox_gpu_host_driver_install_method") or "runfile")
    d = facts.driver
    if method == "runfile" and (d.apt_installed or d.alternate_install_marker):
        what = (f"apt packages {list(d.apt_installed)}" if d.apt_installed else "") + \
            (" and " if d.apt_installed and d.alternate_install_marker else "") + \
            ("/usr/lib/nvidia/alternate-install-present" if d.alternate_install_marker else "")
        plan.refusals.append(Refusal(
            "apt-driver", f"a driver is installed from apt ({what}): NVIDIA's .run installer aborts on it "
            "(\"an alternate driver installation\"), after the containers were stopped",
            "either purge it (`apt purge " + (" ".join(d.apt_installed) or "nvidia-driver cuda-drivers nvidia-open")
            + "`, then reboot), or keep apt's driver: proxmox_gpu_host_driver_install_method: package "
            "(or skip to leave the driver alone)",
            "nvidia-installer misc.c check_for_alternate_install"))
    if d.loaded_version:
        same = release is not None and d.loaded_version == release
        plan.choices.append(Choice("driver_present", d.loaded_version,
                                   ("already loaded: no driver change" if same else
                                    f"loaded now; replaced by {release}") +
                                   (" (installed with the .run installer)" if d.runfile else "")))


def _p2p(plan: Plan, facts: HostFacts, needs: ProfileNeeds | None, gpus: tuple[Gpu, ...]) -> None:
    if needs is None or needs.gpu_count < 2:
        return
    ids = {g.bus_id for g in gpus}
    pairs = [(a, b, s) for a, b, s in facts.p2p if a in ids and b in ids]
    if not pairs:
        plan.choices.append(Choice("p2p", needs.p2p, "the profile's target.p2p (the host's topology is read once "
                                   "the driver is loaded: nvidia-smi topo -p2p r)"))
        return
    bad = [(a, b, s) for a, b, s in pairs if s != "OK"]
    host_p2p = not bad
    plan.choices.append(Choice("p2p", host_p2p, "nvidia-smi topo -p2p r between the profile's GPUs"
                               + (f": {bad[0][0]} - {bad[0][1]} {bad[0][2]}" if bad else ": every pair OK")))
    if needs.p2p and not host_p2p:
        plan.refusals.append(Refusal(
            "p2p", f"{needs.name} says target.p2p: true, but the host reads {bad[0][2]} between {bad[0][0]} and "
            f"{bad[0][1]}: SGLang's custom allreduce would be built on P2P that is not there",
            "set target.p2p: false in the profile (the launch then carries --disable-custom-all-reduce)",
            "sglang srt/utils.py monkey_patch_p2p_access_check; sgl-project/sglang#4814"))


def _fabricmanager(plan: Plan, facts: HostFacts, matrix: Matrix, release: str | None) -> None:
    if release is None:
        return
    fm = matrix.fabricmanager_of(release)
    if fm is None:
        return
    switches = [g.bus_id for g in facts.gpus if g.is_nvswitch]
    plan.variables["proxmox_gpu_host_fabricmanager_package"] = fm.package
    if switches:
        plan.choices.append(Choice("fabricmanager", fm.package,
                                   f"{len(switches)} NVSwitches; branch {branch_of(release)} ships Fabric Manager "
                                   f"as {fm.package}" + (f" ({fm.virtual} is only a virtual name)" if fm.virtual
                                                          else ""), fm.source))


def _storage(plan: Plan, facts: HostFacts, needs: ProfileNeeds | None, variables: Mapping[str, Any],
             where: Mapping[str, str]) -> Storage | None:
    if "pvesm" in facts.unknown:
        plan.warnings.append(Refusal("storage", "pvesm status could not be read: the storage is left to the role",
                                     "run the plan on the Proxmox host itself"))
        return None
    named = variables.get("lxc_gpu_container_rootfs_storage") or ""
    cache_named = variables.get("lxc_gpu_container_model_cache_storage") or ""
    by_name = {s.name: s for s in facts.storages}
    chosen: Storage | None = None
    if named:
        chosen = by_name.get(str(named))
        if chosen is None:
            plan.refusals.append(Refusal("storage", f"lxc_gpu_container_rootfs_storage: {named} is no storage of "
                                         f"this host ({sorted(by_name)})", "name one `pvesm status` lists"))
            return None
        reason = f"lxc_gpu_container_rootfs_storage ({where.get('lxc_gpu_container_rootfs_storage', 'inventory')})"
        if chosen.shared:
            plan.warnings.append(Refusal("network-storage", f"{chosen.name} is a network share ({chosen.type}): "
                                         "model loads at network speed, the container's start depends on it",
                                         "name a local storage unless this is meant"))
    else:
        candidates = [s for s in facts.storages if s.active and "rootdir" in s.content and not s.shared
                      and s.type in LOCAL_TYPES]
        network = [s.name for s in facts.storages if s.active and "rootdir" in s.content and s.shared]
        apart = [s for s in candidates if s.shares_root is False]
        pool = apart or candidates
        if not pool:
            plan.refusals.append(Refusal(
                "storage", "no active local storage takes container root disks (content rootdir)"
                + (f"; network shares {network} are not taken by default" if network else ""),
                "name one: -e lxc_gpu_container_rootfs_storage=NAME", "roles-review-3 finding 9"))
            return None
        chosen = max(pool, key=lambda s: s.avail_kib or 0)
        if not apart:
            plan.refusals.append(Refusal(
                "storage-root-pool", f"every local storage for containers shares the host root's pool or "
                f"filesystem ({[s.name for s in candidates]}; / is {facts.root_source} {facts.root_fstype}): a "
                "model cache there can fill the pool that holds the host's root",
                f"name it to accept that (-e lxc_gpu_container_rootfs_storage={chosen.name}), or add a storage "
                "on another disk", "pve-docs local-zfs.adoc, local-btrfs.adoc; roles-review-2 finding 2"))
        reason = ("the local storage with the most room" + (" apart from the root's pool" if apart else "")
                  + (f"; network shares {network} never by default" if network else ""))
    plan.choices.append(Choice("rootfs_storage", chosen.name, reason))
    plan.variables["lxc_gpu_container_rootfs_storage"] = chosen.name
    cache = by_name.get(str(cache_named)) if cache_named else chosen
    if cache is None:
        plan.refusals.append(Refusal("storage", f"lxc_gpu_container_model_cache_storage: {cache_named} is no storage "
                                     "of this host", "name one `pvesm status` lists"))
        return chosen
    # A cache in a host directory (lxc_gpu_container_model_cache_host_dir) is no volume of a storage: the
    # container role checks that directory's filesystem itself.
    if needs is not None and needs.model_size_gib and cache.avail_kib is not None \
            and not variables.get("lxc_gpu_container_model_cache_host_dir"):
        want = needs.model_size_gib * CACHE_OVER_MODEL
        total_gib = (cache.total_kib or 0) / 1024 ** 2
        margin = max(FREE_MARGIN_FRACTION * total_gib, FREE_MARGIN_GIB)
        avail = cache.avail_kib / 1024 ** 2
        if want + margin > avail:
            plan.refusals.append(Refusal(
                "storage-room", f"the model cache ({want:.0f} GiB for {needs.model_size_gib:g} GiB of weights) and "
                f"{margin:.0f} GiB left free do not fit {cache.name}'s {avail:.0f} GiB",
                "free room, or name another storage (lxc_gpu_container_model_cache_storage)",
                "roles-review-2 finding 2 (a full ZFS pool or thin pool stops the host or its guests)"))
        plan.choices.append(Choice("model_cache_storage", cache.name,
                                   f"{want:.0f} GiB + {margin:.0f} GiB free of {avail:.0f} GiB available"))
    return chosen


def _proxies(plan: Plan, facts: HostFacts, release: str | None, variables: Mapping[str, Any]) -> None:
    method = str(variables.get("proxmox_gpu_host_driver_install_method") or "runfile")
    urls = []
    if release and method == "runfile":
        # Fetched only when proxmox_gpu_host_driver_installer is not on the host yet.
        urls.append(str(variables.get("proxmox_gpu_host_driver_url") or
                        f"https://us.download.nvidia.com/XFree86/Linux-x86_64/{release}/"
                        f"NVIDIA-Linux-x86_64-{release}.run"))
    env = [(k, v) for k, v in facts.proxies if not k.startswith("Acquire::")]
    apt = [(k, v) for k, v in facts.proxies if k.startswith("Acquire::")]
    https_env = next((v for k, v in env if k.lower() == "https_proxy"), None)
    proxy = https_env or "none (direct)"
    plan.choices.append(Choice("downloads", urls, f"fetched by Ansible's own HTTP, through the proxy: {proxy}"
                               + (f"; apt uses {apt[0][1]}" if apt else "")))
    if apt and not https_env:
        plan.warnings.append(Refusal(
            "proxy", f"apt goes through {apt[0][1]} ({apt[0][0]}), but no https_proxy is set for the downloads "
            "Ansible makes itself (the driver .run, the Fabric Manager archive, cuda-keyring)",
            "set https_proxy in the host's environment (or the play's environment:) if direct HTTPS is blocked",
            "roles-review-3 finding 10"))


def _changes(plan: Plan, facts: HostFacts, needs: ProfileNeeds | None, gpus: tuple[Gpu, ...], driver: str | None,
             module_type: str | None, cuda: str | None, storage: Storage | None) -> None:
    if plan.refusals:
        return
    add = plan.changes.append
    missing_headers = [k.release for k in facts.kernels.installed if not k.headers]
    if missing_headers:
        add(Change(f"install headers for {', '.join(missing_headers)}", "DKMS builds the driver for every installed "
                   "kernel, so a kernel booted later has its module"))
    present = facts.driver.loaded_version
    if driver and present != driver:
        if present:
            add(Change("stop the GPU containers, persistenced and Fabric Manager; unload the modules",
                       f"driver {present} is replaced"))
        series = ", ".join(facts.kernels.series_to_build())
        add(Change(f"install driver {driver} ({module_type} modules) with DKMS for {series}",
                   (plan.choice("driver") or Choice("", "", "")).reason))
    nouveau = [g.bus_id for g in gpus if g.driver == "nouveau"]
    if nouveau:
        add(Change("blacklist nouveau, update the initramfs", f"nouveau holds {nouveau}"))
    if needs is not None and needs.power_limit_w:
        add(Change(f"power limit {needs.power_limit_w:g} W on {[g.bus_id for g in gpus]}",
                   "the profile's GPUs only, by bus id; other containers' GPUs keep theirs"))
    if storage is not None:
        add(Change(f"the GPU container's root disk on {storage.name}", (plan.choice("rootfs_storage") or
                                                                        Choice("", "", "")).reason))
    if cuda:
        add(Change(f"CUDA toolkit {cuda} in the container (cuda-toolkit-{cuda.replace('.', '-')})",
                   (plan.choice("container_cuda") or Choice("", "", "")).reason))
    if needs is not None:
        add(Change(f"deploy {needs.name}", "the profile, on the GPUs above"))

