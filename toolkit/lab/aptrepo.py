"""The stock flavours' package mirror (system work: apt-get, dpkg-deb, dpkg-scanpackages, gpg).

pve1 has no route out, yet the role installs build-essential, dkms and Proxmox's kernel headers
with apt as on a real host. So `lab up --flavour stock-pve8` gives pve1 a mirror of its own,
served on pve1 at the real hosts' names (deb.debian.org, download.proxmox.com, ... resolve to
127.0.0.2 there), with the real sources.list lines of a Proxmox VE host:

- Debian's own .debs, unchanged: the closure of build-essential against pve1's userland, fetched
  once on the controller with apt-get (it reaches Debian's archive) and cached.
- Stand-in .debs built here with dpkg-deb, each saying so in its Description: the Proxmox kernel
  headers (proxmox-headers-<kver>, proxmox-default-headers), a newer stand-in Proxmox kernel (for
  the kernel-update test), dkms, and NVIDIA's nvidia-fabricmanager.
- The NVIDIA driver's .run file, where us.download.nvidia.com keeps it.

The indexes are the lab's, signed by a key made here (pve1 trusts it in /etc/apt/trusted.gpg.d):
the real archives' keys cannot sign an index that lists only some of their packages.
"""

from __future__ import annotations

import email.utils
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from toolkit.adapters import cache_lock
from toolkit.core.errors import EXIT_FAILED, ToolkitError
from toolkit.lab import plan

# What the role installs from Debian on a stock host (Recommends off, as the role asks apt).
DEBIAN_TOOLCHAIN = ("build-essential",)
# Bump when the stand-in packages' contents change.
MIRROR_REVISION = "9"


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise ToolkitError.of(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}",
                              fix="check that deb.debian.org is reachable from this machine, then "
                                  "`toolkit lab up` again", exit_code=EXIT_FAILED)
    return proc.stdout


def debian_debs(cache_dir: Path, rootfs: Path) -> Path:
    """Debian's .debs of DEBIAN_TOOLCHAIN and everything they pull into pve1's userland: resolved by
    apt-get against the userland's own dpkg status, so it is exactly what `apt-get install` on pve1
    will ask for. Cached by (userland, package list)."""
    key = hashlib.sha256("\n".join([rootfs.name, *DEBIAN_TOOLCHAIN]).encode()).hexdigest()[:12]
    out = cache_dir / f"debian-debs-{key}"
    cache_lock.build_once(out, (out / ".complete").is_file, lambda: _debian_debs_locked(cache_dir, rootfs, out))
    return out


def _debian_debs_locked(cache_dir: Path, rootfs: Path, out: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="toolkit-lab-apt-", dir=cache_dir))
    try:
        archives = work / "archives"
        for d in (archives / "partial", work / "lists" / "partial", work / "cache"):
            d.mkdir(parents=True)
        sources = work / "sources.list"
        sources.write_text(f"deb {plan.DEBIAN_MIRROR} {plan.DEBIAN_SUITE} main\n"
                           f"deb {plan.DEBIAN_MIRROR} {plan.DEBIAN_SUITE}-updates main\n"
                           f"deb http://security.debian.org/debian-security {plan.DEBIAN_SUITE}-security main\n")
        opts = ["-o", f"Dir::State::status={rootfs}/var/lib/dpkg/status", "-o", f"Dir::Etc::SourceList={sources}",
                "-o", "Dir::Etc::SourceParts=/nonexistent", "-o", f"Dir::State::Lists={work}/lists",
                "-o", f"Dir::Cache={work}/cache", "-o", f"Dir::Cache::Archives={archives}",
                "-o", "Debug::NoLocking=1", "-o", "APT::Install-Recommends=0", "-o", "APT::Get::List-Cleanup=0",
                "-o", f"Dir::Etc::Trusted={rootfs}/etc/apt/trusted.gpg",
                "-o", f"Dir::Etc::TrustedParts={rootfs}/etc/apt/trusted.gpg.d"]
        _run(["apt-get", *opts, "update"], "apt-get update (for the stock flavour's Debian packages)")
        _run(["apt-get", *opts, "install", "-y", "--download-only", *DEBIAN_TOOLCHAIN],
             "apt-get --download-only " + " ".join(DEBIAN_TOOLCHAIN))
        debs = out.with_name(out.name + ".building")
        shutil.rmtree(debs, ignore_errors=True)
        debs.mkdir()
        for deb in archives.glob("*.deb"):
            shutil.move(str(deb), debs / deb.name)
        (debs / ".complete").write_text("\n".join(sorted(p.name for p in debs.glob("*.deb"))) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(debs, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _standin_deb(out_dir: Path, name: str, version: str, description: str,
                 files: Mapping[str, tuple[str | bytes, int]], depends: str = "", provides: str = "",
                 postinst: str = "", links: dict[str, str] | None = None, arch: str = "amd64") -> None:
    """One stand-in .deb (dpkg-deb --build), announcing itself as a lab stand-in."""
    root = out_dir / f".build-{name}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
               "Maintainer: toolkit lab <lab@invalid>",
               "Priority: optional", "Section: kernel"]
    if depends:
        control.append(f"Depends: {depends}")
    if provides:
        control.append(f"Provides: {provides}")
    control.append(f"Description: {description} (lab stand-in)\n This package is a stand-in made by the toolkit's lab;"
                   " it installs no real software.")
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    if postinst:
        (root / "DEBIAN/postinst").write_text("#!/bin/sh\nset -e\n" + postinst)
        os.chmod(root / "DEBIAN/postinst", 0o755)
    for rel, (content, mode) in files.items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        os.chmod(path, mode)
    for rel, target in (links or {}).items():
        path = root / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    for d in root.rglob("*"):
        if d.is_dir():
            os.chmod(d, 0o755)
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root),
          str(out_dir / f"{name}_{version}_{arch}.deb")],
         f"dpkg-deb --build {name}")
    shutil.rmtree(root)


def _standin(name: str) -> str:
    return resources.files("toolkit.lab.standins").joinpath(name).read_text()


def _kernel_files(kver: str) -> dict[str, tuple[str, int]]:
    return {f"/boot/vmlinuz-{kver}": (f"lab stand-in kernel {kver}: pve1 runs the controller's kernel\n", 0o644),
            f"/lib/modules/{kver}/modules.order": ("", 0o644)}


def headers_files(kver: str) -> dict[str, tuple[str, int]]:
    """A stand-in proxmox-headers-<kver>: a Makefile (Kbuild's entry point, which the stand-in module build
    looks for) and scripts/sign-file (dkms signs modules only where the kernel's sign-file exists)."""
    base = f"/usr/src/linux-headers-{kver}"
    return {f"{base}/Makefile": (f"# lab stand-in: Proxmox kernel headers for {kver}\nKERNELRELEASE = {kver}\n", 0o644),
            f"{base}/include/generated/utsrelease.h": (f'#define UTS_RELEASE "{kver}"\n', 0o644),
            f"{base}/scripts/sign-file": ("#!/bin/sh\n# lab stand-in: the kernel's sign-file (dkms records the "
                                           "signer in the stand-in module itself)\nexit 0\n", 0o755)}


# Real Proxmox kernel packages run the /etc/kernel/postinst.d hooks (dkms, initramfs-tools, ...).
_KERNEL_POSTINST = 'if [ "$1" = configure ] && [ -d /etc/kernel/postinst.d ]; then\n' \
                   '  run-parts --verbose --exit-on-error --arg={kver} --arg=/boot/vmlinuz-{kver} ' \
                   '/etc/kernel/postinst.d\nfi\n'
_HEADERS_POSTINST = 'if [ "$1" = configure ] && [ -d /etc/kernel/header_postinst.d ]; then\n' \
                    '  run-parts --verbose --exit-on-error --arg={kver} /etc/kernel/header_postinst.d\nfi\n'


def kernel_series(kver: str) -> str:
    return ".".join(kver.split(".")[:2])


def _newest(kernels: list[str]) -> str:
    return max(kernels, key=lambda k: [int(p) if p.isdigit() else p for p in k.replace("-", ".").split(".")])


def standin_debs(out_dir: Path, flavour: plan.Flavour) -> None:
    """The Proxmox packages: every stand-in kernel's headers and image (the running one's image is installed
    already), each series' meta packages (proxmox-kernel-6.8 and proxmox-headers-6.8 pull the newest of the
    series, as `apt dist-upgrade` brings it), proxmox-default-headers (the default series only: an opt-in
    series' next kernel gets no headers from it), and dkms."""
    out_dir.mkdir(parents=True, exist_ok=True)
    default = [flavour.kernel, flavour.next_kernel, flavour.latest_kernel]
    kernels = default + list(flavour.opt_in_kernels)
    for kver in kernels:
        _standin_deb(out_dir, f"proxmox-headers-{kver}", "1", f"Proxmox kernel headers for {kver}",
                     headers_files(kver), postinst=_HEADERS_POSTINST.format(kver=kver),
                     links={f"/lib/modules/{kver}/build": f"/usr/src/linux-headers-{kver}"})
        if kver != flavour.kernel:
            _standin_deb(out_dir, f"proxmox-kernel-{kver}-signed", "1", f"Proxmox kernel image {kver}",
                         _kernel_files(kver), provides=f"proxmox-kernel-{kver}",
                         postinst=_KERNEL_POSTINST.format(kver=kver))
    for series in sorted({kernel_series(k) for k in kernels}):
        newest = _newest([k for k in kernels if kernel_series(k) == series])
        kernel_dep = (f"proxmox-kernel-{newest}-signed" if newest != flavour.kernel else "")
        _standin_deb(out_dir, f"proxmox-kernel-{series}", "2", f"Proxmox kernel {series} (latest)", {},
                     depends=kernel_dep)
        # The meta package pulls the headers of every future kernel of the series (review finding 2).
        _standin_deb(out_dir, f"proxmox-headers-{series}", "2", f"Proxmox kernel headers {series} (latest)", {},
                     depends=f"proxmox-headers-{newest}")
    _standin_deb(out_dir, "proxmox-default-headers", "1.1.0", "Default Proxmox kernel headers", {},
                 depends=f"proxmox-headers-{kernel_series(flavour.kernel)}")
    _standin_deb(out_dir, "dkms", "3.0.10-8+labstandin1", "Dynamic Kernel Module System (DKMS)",
                 {"/usr/sbin/dkms": (_standin("dkms"), 0o755),
                  "/etc/kernel/postinst.d/dkms": (_DKMS_HOOK, 0o755),
                  "/etc/kernel/header_postinst.d/dkms": (_DKMS_HOOK, 0o755)},
                 depends="gcc, make, kmod, openssl")


# dell/dkms kernel_postinst.d_dkms: autoinstall for the kernel being installed; a kernel without headers only
# gets the warning (the kernel package still configures).
_DKMS_HOOK = """#!/bin/sh
# lab stand-in: as Debian dkms's /etc/kernel/postinst.d/dkms
inst_kern=$1
if [ ! -e "/lib/modules/$inst_kern/build/include" ]; then
    echo "dkms: WARNING: Linux headers are missing, which may explain the above failures." >&2
    echo "      please install the linux-headers-$inst_kern package to fix this." >&2
    exit 0
fi
exec /usr/sbin/dkms kernel_postinst -k "$inst_kern"
"""

# The 580-era unit (a user's `systemctl status` of it, siderolabs/extensions#717): a precheck, then the start script,
# which starts nv-fabricmanager (and NVLSM on NVLink5 boards).
_FM_UNIT = ("[Unit]\nDescription=NVIDIA fabric manager service (lab stand-in)\n"
            "After=network-online.target\n\n[Service]\nType=forking\n"
            "ExecStartPre=/usr/bin/nvidia-fabricmanager-start.sh --mode precheck\n"
            "ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start\n"
            "PIDFile=/run/nvidia-fabricmanager/nv-fabricmanager.pid\n\n"
            "[Install]\nWantedBy=multi-user.target\n")
_FM_START = """#!/bin/sh
# nvidia-fabricmanager-start.sh (lab stand-in): precheck: the configuration and the NVSwitch topology files it needs;
# start: nv-fabricmanager with that configuration.
set -eu
cfg=/usr/share/nvidia/nvswitch/fabricmanager.cfg
case "${2:-}" in
  precheck)
    [ -f "$cfg" ] || { echo "fabric manager configuration $cfg not found (lab stand-in)" >&2; exit 1; }
    ls /usr/share/nvidia/nvswitch/*_topology >/dev/null 2>&1 || {
      echo "fabric manager topology file not found in /usr/share/nvidia/nvswitch (lab stand-in)" >&2; exit 1; } ;;
  start) exec /usr/bin/nv-fabricmanager -c "$cfg" ;;
  *) echo "usage: $0 --mode precheck|start" >&2; exit 2 ;;
esac
"""


_FM_SHARE = "/usr/share/nvidia/nvswitch"


def _fm_files(version: str) -> dict[str, tuple[str, int]]:
    """Fabric Manager's files as NVIDIA's packages install them (NVIDIA/yum-packaging-fabric-manager
    fabricmanager.spec), by their path on the host."""
    return {"/usr/bin/nv-fabricmanager": (_standin("nv-fabricmanager").replace("@VERSION@", version), 0o755),
            "/usr/bin/nvidia-fabricmanager-start.sh": (_FM_START, 0o755),
            f"{_FM_SHARE}/fabricmanager.cfg": ("# lab stand-in: Fabric Manager configuration\nLOG_LEVEL=4\n", 0o644),
            f"{_FM_SHARE}/dgxh100_hgxh100_topology": ("lab stand-in: HGX H100 topology\n", 0o644),
            "/usr/lib/x86_64-linux-gnu/libnvfm.so.1": ("lab stand-in: no NVIDIA library here\n", 0o755),
            "/lib/systemd/system/nvidia-fabricmanager.service": (_FM_UNIT, 0o644)}


def _payload(installer: Path, into: Path) -> Path:
    """The stand-in installer's payload (the tar after its marker line, as a makeself archive carries it)."""
    data = installer.read_bytes()
    marker = b"__LAB_PAYLOAD_BELOW__\n"
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data[data.index(marker) + len(marker):]), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    return into


# Debian's dh_dkms postinst (dkms_common.postinst): the module is built for the running kernel when its headers
# are there; without them the build is skipped with its message, and the package still configures.
_DKMS_PACKAGE_POSTINST = """if [ "$1" = configure ]; then
  kernel=$(uname -r)
  dkms add -m nvidia -v {version} || true
  if [ -e "/lib/modules/$kernel/build/include" ]; then
    dkms install -m nvidia -v {version} -k "$kernel"
  else
    echo "Module build for kernel $kernel was skipped since the kernel headers for this kernel" \\
         "does not seem to be installed."
  fi
fi
"""


def driver_debs(out_dir: Path, installers: list[Path]) -> None:
    """NVIDIA's driver packages in the CUDA repository (the role's `package` install method): for each driver
    version nvidia-kernel-open-dkms (the module's source for DKMS, built at configure time for the running kernel
    if its headers are there) and nvidia-driver (the userspace: nvidia-smi, nvidia-modprobe, nvidia-persistenced,
    libcuda), from the stand-in installer's own payload."""
    for installer in installers:
        version = installer.name.split("-")[-1].removesuffix(".run")
        with tempfile.TemporaryDirectory() as tmp:
            payload = _payload(installer, Path(tmp))
            src = f"/usr/src/nvidia-{version}"
            kernel = {f"{src}/{name}": ((payload / "kernel" / name).read_text(), 0o644)
                      for name in ("Makefile", "conftest.c", "dkms.conf")}
            kernel[f"{src}/module-type"] = ("open\n", 0o644)
            _standin_deb(out_dir, "nvidia-kernel-open-dkms", f"{version}-1", f"NVIDIA open kernel module {version}",
                         kernel, depends="dkms", postinst=_DKMS_PACKAGE_POSTINST.format(version=version))
            lib = "/usr/lib/x86_64-linux-gnu"
            files: dict[str, tuple[str | bytes, int]] = {
                f"/usr/bin/{name}": ((payload / name).read_bytes(), 0o755)
                for name in ("nvidia-smi", "nvidia-modprobe", "nvidia-persistenced")}
            files["/usr/lib/lab-standin/labstandin.py"] = ((payload / "labstandin.py").read_bytes(), 0o644)
            files[f"{lib}/libcuda.so.{version}"] = ((payload / f"libcuda.so.{version}").read_bytes(), 0o755)
            files["/usr/share/lab-standin/driver-version"] = (version + "\n", 0o644)
            _standin_deb(out_dir, "nvidia-driver", f"{version}-1", f"NVIDIA driver userspace {version}", files,
                         depends=f"nvidia-kernel-open-dkms (= {version}-1)",
                         links={f"{lib}/libcuda.so.1": f"libcuda.so.{version}", f"{lib}/libcuda.so": "libcuda.so.1"})


def nvidia_debs(out_dir: Path, cuda_repo: str, driver_versions: tuple[str, ...], nvidia_key: bytes) -> None:
    """NVIDIA's CUDA repository: cuda-keyring (its key, and the repository's source line with signed-by, as
    NVIDIA's package writes them) and, for debian12, nvidia-fabricmanager-580 at each driver version. The
    debian13 repository offers no 580-branch Fabric Manager (NVIDIA/cuda-repo-management#30): there, only the
    redist archive has it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    url = f"https://developer.download.nvidia.com/compute/cuda/repos/{cuda_repo}/x86_64/"
    _standin_deb(out_dir, "cuda-keyring", "1.1-1", "GPG keyring for the CUDA repository",
                 {"/usr/share/keyrings/cuda-archive-keyring.gpg": (nvidia_key, 0o644),
                  f"/etc/apt/sources.list.d/cuda-{cuda_repo}-x86_64.list":
                      (f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {url} /\n", 0o644)},
                 arch="all")
    if cuda_repo != "debian12":
        return
    for version in driver_versions:
        branch = version.split(".")[0]
        # From R580 the package is nvidia-fabricmanager, providing the branch's name only as a virtual package
        # (NVIDIA/gpu-driver-container#451: apt then finds no version of nvidia-fabricmanager-580 to install).
        name, provides = (("nvidia-fabricmanager", f"nvidia-fabricmanager-{branch}") if int(branch) >= 580
                          else (f"nvidia-fabricmanager-{branch}", "nvidia-fabricmanager"))
        _standin_deb(out_dir, name, f"{version}-1", f"NVIDIA Fabric Manager {version}", _fm_files(version),
                     provides=provides)


def fabricmanager_archive(out_dir: Path, version: str) -> Path:
    """NVIDIA's redist archive of Fabric Manager (fabricmanager-linux-x86_64-VER-archive.tar.xz: bin/ with the start
    script, etc/fabricmanager.cfg, share/nvidia/nvswitch/ topologies, lib/libnvfm.so.1,
    systemd/nvidia-fabricmanager.service, as NVIDIA lays it out), stand-in contents."""
    name = f"fabricmanager-linux-x86_64-{version}-archive"
    root = out_dir / f".build-{name}" / name
    shutil.rmtree(root.parent, ignore_errors=True)
    fm = _fm_files(version)
    files = {"bin/nv-fabricmanager": fm["/usr/bin/nv-fabricmanager"],
             "bin/nvidia-fabricmanager-start.sh": fm["/usr/bin/nvidia-fabricmanager-start.sh"],
             "etc/fabricmanager.cfg": fm[f"{_FM_SHARE}/fabricmanager.cfg"],
             "share/nvidia/nvswitch/dgxh100_hgxh100_topology": fm[f"{_FM_SHARE}/dgxh100_hgxh100_topology"],
             "lib/libnvfm.so.1": fm["/usr/lib/x86_64-linux-gnu/libnvfm.so.1"],
             "systemd/nvidia-fabricmanager.service": (_FM_UNIT, 0o644),
             "LICENSE": ("lab stand-in: no NVIDIA software in this archive\n", 0o644)}
    for rel, (text, mode) in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        os.chmod(root / rel, mode)
    out = out_dir / f"{name}.tar.xz"
    _run(["tar", "--numeric-owner", "--owner=0", "--group=0", "-C", str(root.parent), "-cJf", str(out), name],
         f"tar {name}")
    shutil.rmtree(root.parent)
    return out


def _sign_key(cache_dir: Path, name: str = "apt-signing-key",
              uid: str = "toolkit lab stand-in archive") -> tuple[Path, bytes]:
    """A lab archive key (made once, cached): GNUPGHOME and the exported public key. The Debian and Proxmox
    indexes share one (pve1 trusts it in trusted.gpg.d); NVIDIA's has its own, known only to cuda-keyring."""
    home = cache_dir / name
    pub = home / "lab-standin-archive.gpg"
    cache_lock.build_once(home, pub.is_file, lambda: _make_sign_key(home, uid))
    return home, pub.read_bytes()


def _make_sign_key(home: Path, uid: str) -> None:
    tmp = home.with_name(home.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    env = {"GNUPGHOME": str(tmp)}
    _run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key",
          f"{uid} <lab@invalid>", "ed25519", "sign", "never"], "gpg --quick-gen-key", env)
    data = subprocess.run(["gpg", "--batch", "--export"], capture_output=True, env={**os.environ, **env},
                          check=True).stdout
    (tmp / "lab-standin-archive.gpg").write_bytes(data)
    # The agent knows its home by path: stop it before the rename (a new one starts on use).
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={**os.environ, **env}, check=False)
    shutil.rmtree(home, ignore_errors=True)
    os.replace(tmp, home)


def _index(repo_root: Path, dist_dir: Path, pool_rel: str, suite: str, components: tuple[str, ...],
           gnupg: Path, origin: str = "Debian") -> None:
    """Packages (all debs under repo_root/pool_rel in the first component, the others empty), empty
    Translation-en files, and a signed InRelease listing them; a flat repo when components is ()."""
    packages = _run(["dpkg-scanpackages", "--multiversion", pool_rel, "/dev/null"], "dpkg-scanpackages",
                    cwd=repo_root) if (repo_root / pool_rel).is_dir() else ""
    files: dict[str, str] = {}
    if not components:
        files["Packages"] = packages
    for i, component in enumerate(components):
        files[f"{component}/binary-amd64/Packages"] = packages if i == 0 else ""
        files[f"{component}/i18n/Translation-en"] = ""
    # Origin and Label as the real archive's (apt refuses a repository whose Origin changes, and the
    # userland's lists hold Debian's); the Description says whose index this is.
    release = [f"Origin: {origin}", f"Label: {origin}", f"Suite: {suite}",
               f"Codename: {suite}", "Architectures: amd64", f"Components: {' '.join(components)}".rstrip(),
               "Description: lab stand-in index (toolkit lab mirror)",
               # Now, not a fixed date: the userland's apt lists hold Debian's real Release files from
               # the userland's build, and apt keeps the newer of two Releases.
               f"Date: {email.utils.formatdate(usegmt=True)}", "SHA256:"]
    for rel, text in files.items():
        (dist_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (dist_dir / rel).write_text(text)
        release.append(f" {hashlib.sha256(text.encode()).hexdigest()} {len(text.encode())} {rel}")
    (dist_dir / "Release").write_text("\n".join(release) + "\n")
    _run(["gpg", "--batch", "--yes", "--clearsign", "-o", str(dist_dir / "InRelease"), str(dist_dir / "Release")],
         "gpg --clearsign", {"GNUPGHOME": str(gnupg)})


@dataclass(frozen=True)
class Mirror:
    """A built mirror: its tree (bound read-only into pve1), the key pve1 trusts for the Debian and Proxmox
    indexes, and the TLS directory (the lab CA's certificate, the server's certificate and key)."""

    path: Path
    archive_key: bytes
    tls_dir: Path

    def fabricmanager_archives(self) -> dict[str, Path]:
        """Fabric Manager redist archives by driver version."""
        d = self.path / FM_REDIST
        return {p.name.split("-")[3]: p for p in sorted(d.glob("fabricmanager-linux-x86_64-*-archive.tar.xz"))}


# Where NVIDIA keeps Fabric Manager's redist archives (on developer.download.nvidia.com).
FM_REDIST = "developer.download.nvidia.com/compute/nvidia-driver/redist/fabricmanager/linux-x86_64"


def tls(cache_dir: Path) -> Path:
    """The lab's CA and the mirror's server certificate for every name in plan.MIRROR_HOSTS (made once with
    openssl, cached): apt's https method, curl and Python check them as they check the real hosts'."""
    out = cache_dir / "mirror-tls"
    cache_lock.build_once(out, (out / "server.crt").is_file, lambda: _make_tls(out))
    return out


def _make_tls(out: Path) -> None:
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj",
          "/CN=toolkit lab stand-in CA", "-keyout", "ca.key", "-out", "ca.crt", "-addext",
          "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
         "openssl (the lab CA)", cwd=tmp)
    _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=lab stand-in mirror",
          "-keyout", "server.key", "-out", "server.csr"], "openssl (the mirror's key)", cwd=tmp)
    (tmp / "ext.cnf").write_text("subjectAltName=" + ",".join(f"DNS:{h}" for h in plan.MIRROR_HOSTS) + "\n"
                                 "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                                 "extendedKeyUsage=serverAuth\n")
    _run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
          "-days", "3650", "-out", "server.crt", "-extfile", "ext.cnf"], "openssl (the mirror's certificate)",
         cwd=tmp)
    (tmp / "ca.key").unlink()  # nothing else is ever signed with it
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def build(cache_dir: Path, rootfs: Path, flavour: plan.Flavour, installers: list[Path]) -> Mirror:
    """The mirror's tree (cached by everything that goes into it), the key pve1 must trust, its TLS."""
    gnupg, pubkey = _sign_key(cache_dir)
    nvidia_gnupg, nvidia_key = _sign_key(cache_dir, "apt-signing-key-nvidia", "toolkit lab stand-in NVIDIA archive")
    debian = debian_debs(cache_dir, rootfs)
    h = hashlib.sha256()
    for part in (MIRROR_REVISION, debian.name, repr(flavour), _standin("dkms"), _standin("nv-fabricmanager"),
                 nvidia_key.hex(), *(i.name for i in installers), *(str(i.stat().st_mtime_ns) for i in installers)):
        h.update(part.encode())
    out = cache_dir / f"mirror-{h.hexdigest()[:12]}"
    cache_lock.build_once(out, (out / ".complete").is_file,
                          lambda: _build_mirror_locked(out, h.hexdigest(), (gnupg, nvidia_gnupg, nvidia_key), debian,
                                                       flavour, installers))
    return Mirror(out, pubkey, tls(cache_dir))


def _build_mirror_locked(out: Path, digest: str, keys: tuple[Path, Path, bytes], debian: Path, flavour: plan.Flavour,
                         installers: list[Path]) -> None:
    gnupg, nvidia_gnupg, nvidia_key = keys
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    suite = flavour.debian_suite
    # deb.debian.org/debian: Debian's debs (bookworm main); -updates and security.debian.org: empty.
    pool = tmp / "deb.debian.org/debian/pool/main"
    pool.mkdir(parents=True)
    for deb in debian.glob("*.deb"):
        os.link(deb, pool / deb.name)
    root = tmp / "deb.debian.org/debian"
    _index(root, root / f"dists/{suite}", "pool", suite, ("main", "contrib"), gnupg)
    _index(root, root / f"dists/{suite}-updates", "pool-none", f"{suite}-updates", ("main", "contrib"), gnupg)
    sec = tmp / "security.debian.org/debian-security"
    sec.mkdir(parents=True)
    _index(sec, sec / f"dists/{suite}-security", "pool-none", f"{suite}-security", ("main", "contrib"), gnupg)
    # The Proxmox packages, in pve-no-subscription (download.proxmox.com) and pve-enterprise
    # (enterprise.proxmox.com, which answers only with a subscription key: mirror.py); the Ceph repositories
    # a fresh host lists, empty.
    pve = tmp / "download.proxmox.com/debian/pve"
    standin_debs(pve / "pool", flavour)
    _index(pve, pve / f"dists/{suite}", "pool", suite, ("pve-no-subscription",), gnupg, origin="Proxmox")
    ent = tmp / "enterprise.proxmox.com/debian/pve"
    (ent / "pool").mkdir(parents=True)
    for deb in (pve / "pool").glob("*.deb"):
        os.link(deb, ent / "pool" / deb.name)
    _index(ent, ent / f"dists/{suite}", "pool", suite, ("pve-enterprise",), gnupg, origin="Proxmox")
    ceph = f"ceph-{flavour.ceph_release}"
    for host, component in (("download.proxmox.com", "no-subscription"), ("enterprise.proxmox.com", "enterprise")):
        repo = tmp / host / "debian" / ceph
        repo.mkdir(parents=True)
        _index(repo, repo / f"dists/{suite}", "pool-none", suite, (component,), gnupg, origin="Proxmox")
    # NVIDIA's CUDA repository (flat, "/"), signed by NVIDIA's key (in cuda-keyring only).
    cuda = tmp / f"developer.download.nvidia.com/compute/cuda/repos/{flavour.cuda_repo}/x86_64"
    versions = tuple(i.name.split("-")[-1].removesuffix(".run") for i in installers)
    nvidia_debs(cuda, flavour.cuda_repo, versions, nvidia_key)
    if flavour.cuda_repo == "debian12":
        driver_debs(cuda, installers)
    _index(cuda, cuda, ".", "/", (), nvidia_gnupg, origin="NVIDIA")
    redist = tmp / FM_REDIST
    redist.mkdir(parents=True)
    for version in versions:
        fabricmanager_archive(redist, version)
    for inst in installers:
        version = inst.name.split("-")[-1].removesuffix(".run")
        dest = tmp / f"us.download.nvidia.com/XFree86/Linux-x86_64/{version}/{inst.name}"
        dest.parent.mkdir(parents=True)
        shutil.copy2(inst, dest)
    for home in (gnupg, nvidia_gnupg):
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={**os.environ, "GNUPGHOME": str(home)}, check=False)
    (tmp / ".complete").write_text(digest + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
