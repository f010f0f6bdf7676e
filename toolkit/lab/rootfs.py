"""The cached Debian 12 userland and the CT templates (system work: mmdebstrap, tar, zstd).

pve1's userland and each CT template are an mmdebstrap run of their own, side by side: apt fetches the .debs
many at a time and dpkg installs them in one go, where debootstrap fetched one wget at a time and ran dpkg
package group by package group (docs/lab.md, "The demo's time": the two builds took 53 s and 75 s on an idle
machine after 58 s of fetching ahead). Each cache directory is named by a hash of what went into it, so
changing the package list builds a new one instead of silently reusing a stale one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from toolkit.adapters import cache_lock
from toolkit.core.errors import EXIT_FAILED, ToolkitError
from toolkit.lab import plan, template

# What every lab on this machine shares (the userland, templates, stand-ins, mirrors); TOOLKIT_LAB_CACHE_DIR gives
# one lab its own, e.g. to time a cold `lab up` while other labs keep using theirs (as TOOLKIT_WHEELHOUSE_DIR does
# for the wheelhouse).
CACHE_DIR_ENV = "TOOLKIT_LAB_CACHE_DIR"
CACHE_DIR = Path(os.environ.get(CACHE_DIR_ENV) or "/var/cache/toolkit-lab")


def cache_key(packages: tuple[str, ...] = plan.ROOTFS_PACKAGES, suite: str = plan.DEBIAN_SUITE) -> str:
    text = "\n".join([suite, plan.ROOTFS_BUILD_REVISION, *sorted(packages)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def rootfs_dir(cache_dir: Path = CACHE_DIR) -> Path:
    return cache_dir / f"rootfs-{plan.DEBIAN_SUITE}-{cache_key()}"


def is_cached(cache_dir: Path = CACHE_DIR) -> bool:
    return (rootfs_dir(cache_dir) / ".toolkit-lab-complete").is_file()


def _run(cmd: list[str], what: str, log: Path) -> None:
    with log.open("ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise ToolkitError.of(
            f"{what} failed (exit {proc.returncode}); last lines of {log}:\n    " + "\n    ".join(tail),
            fix="check that deb.debian.org is reachable from this machine, then run `toolkit lab up` again",
            exit_code=EXIT_FAILED,
        )


def _strip_for_the_lab(root: Path, where: str) -> None:
    # Nothing in the lab may reach the network: no apt sources that would make an `apt-get update`
    # inside the lab try deb.debian.org (there is no route out anyway; this makes it fail fast).
    (root / "etc/apt/sources.list").write_text(f"# lab: no network; {where}\n")
    # Host keys made by openssh-server's postinst would be shared by every host and container made
    # from this cache; each boot of pve1 and each `pct create` makes its own instead.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # Apt's package lists are the biggest part of a userland nobody in the lab can use.
    for lists in (root / "var/lib/apt/lists").glob("*_Packages"):
        lists.unlink()
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def build(cache_dir: Path = CACHE_DIR, mirror: str = plan.DEBIAN_MIRROR) -> Path:
    """Build the userland if it is not cached; return its directory. Safe to interrupt: the
    directory only gets its final name once it is complete."""
    final = rootfs_dir(cache_dir)
    cache_lock.build_once(final, lambda: is_cached(cache_dir), lambda: _build_locked(final, cache_dir, mirror))
    return final


# mmdebstrap's hook that merges /usr as debootstrap does (the usr-is-merged package, no usrmerge and the perl it
# pulls in): pve1's userland keeps the package set its debootstrap had.
MERGED_USR_HOOK = Path("/usr/share/mmdebstrap/hooks/merged-usr")


def _mmdebstrap(suite: str, target: Path, mirror: str, packages: list[str] | tuple[str, ...],
                *extra: str) -> list[str]:
    """minbase (Priority required and apt) plus `packages`, their Depends and Pre-Depends (no Recommends) into
    `target`, as root. Debian's apt lists are kept as debootstrap left them (the lab mirror's Release follows
    them, aptrepo.py); the .debs are dropped (_strip_for_the_lab)."""
    return ["mmdebstrap", "--mode=root", "--variant=minbase", "--include=" + ",".join(packages),
            "--skip=cleanup/apt/lists", *UNSAFE_IO_HOOKS, *extra, suite, str(target), mirror]


# dpkg without its fsync of every file while the tree is built (as Docker's and debootstrap's builds of throwaway
# trees run it), one sync of the filesystem at the end, before the cache marks the tree complete; the setting is
# removed again, so a container made from the template runs dpkg as Proxmox's own does. mmdebstrap's --dpkgopt
# would leave it in the tree for good. Measured back to back on the 2-core machine, pve1's userland: 26.7 s
# against 35.7 s (load 2.3-2.6), 55.4 s against 68.7 s (load 2.5-5.1).
UNSAFE_IO_HOOKS = (
    '--setup-hook=mkdir -p "$1/etc/dpkg/dpkg.cfg.d" && echo force-unsafe-io > "$1/etc/dpkg/dpkg.cfg.d/99lab-build"',
    '--customize-hook=rm "$1/etc/dpkg/dpkg.cfg.d/99lab-build" && sync --file-system "$1"',
)


def _build_locked(final: Path, cache_dir: Path, mirror: str) -> Path:
    tmp = final.with_name(final.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    log = cache_dir / "userland.log"
    log.write_text("")
    _run(_mmdebstrap(plan.DEBIAN_SUITE, tmp, mirror, plan.ROOTFS_PACKAGES, f"--hook-dir={MERGED_USR_HOOK}"),
         "mmdebstrap of pve1's userland", log)
    _strip_for_the_lab(tmp, "packages come from the cached userland")
    (tmp / ".toolkit-lab-complete").write_text(cache_key() + "\n")
    os.replace(tmp, final)
    # Userlands of an older package list or revision are left alone: a running lab may still have
    # one as its overlay's lower layer. `toolkit lab down --purge-cache` removes them.
    return final


# ---------------------------------------------------------------- the CT template

# Bump when the way the template is made changes.
TEMPLATE_BUILD_REVISION = "2"


def template_dir(suite: str = template.DEFAULT_SUITE, cache_dir: Path = CACHE_DIR) -> Path:
    a = template.APPLIANCES[suite]
    key = hashlib.sha256("\n".join([suite, a.version, TEMPLATE_BUILD_REVISION]).encode()).hexdigest()[:12]
    return cache_dir / f"template-{suite}-{key}"


def build_template(suite: str = template.DEFAULT_SUITE, cache_dir: Path = CACHE_DIR,
                   mirror: str = plan.DEBIAN_MIRROR) -> Path:
    """Proxmox's standard template for `suite`, made the way dab makes it: the package selection
    computed from the archive's own Packages file (toolkit.lab.template.dab_selection), installed
    by mmdebstrap. Its own build, not pve1's userland: the template must lack what Proxmox's
    lacks (python3-venv, patch, a compiler). Kept beside it: the Packages index it was chosen from
    and the dpkg status it ended with, so a test can compare the two. Safe to interrupt."""
    final = template_dir(suite, cache_dir)
    cache_lock.build_once(final, lambda: _template_done(final),
                          lambda: _build_template_locked(suite, final, cache_dir, mirror))
    return template_file(suite, cache_dir)


def build_all(cache_dir: Path = CACHE_DIR, mirror: str = plan.DEBIAN_MIRROR,
              side_by_side: bool = True, suites: tuple[str, ...] = tuple(template.APPLIANCES)
              ) -> tuple[Path, dict[str, Path]]:
    """pve1's userland and every CT template in `suites`, built where not cached. Side by side: each waits
    partly on the mirror and on dpkg's fsyncs, so on a cold machine (every CI run) the builds at once take
    less than one after another (benchmarks/bench_cold_caches.py). An error in one is raised once the others
    are done, so what they built is kept for the next `up`."""
    if not side_by_side:
        return build(cache_dir, mirror), {s: build_template(s, cache_dir, mirror) for s in suites}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(suites), thread_name_prefix="template") as pool:
        futures = {s: pool.submit(build_template, s, cache_dir, mirror) for s in suites}
        lower = build(cache_dir, mirror)
        return lower, {s: f.result() for s, f in futures.items()}


def _template_done(final: Path) -> bool:
    return (final / ".toolkit-lab-complete").is_file()


def template_cached(suite: str, cache_dir: Path = CACHE_DIR) -> bool:
    """Whether `suite`'s CT template is built in the cache (what `build_template` would return at once)."""
    return _template_done(template_dir(suite, cache_dir))


def template_file(suite: str, cache_dir: Path = CACHE_DIR) -> Path:
    return template_dir(suite, cache_dir) / template.APPLIANCES[suite].file_name


def _packages_index(mirror: str, suite: str) -> bytes:
    """The suite's main/binary-amd64 Packages.xz from the mirror."""
    import urllib.request

    url = f"{mirror}/dists/{suite}/main/binary-amd64/Packages.xz"
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            data: bytes = resp.read()
    except OSError as err:
        raise ToolkitError.of(f"cannot fetch {url}: {err}", exit_code=EXIT_FAILED,
                              fix="check that deb.debian.org is reachable from this machine, "
                                  "then run `toolkit lab up` again") from err
    return data


def _build_template_locked(suite: str, final: Path, cache_dir: Path, mirror: str) -> Path:
    import lzma

    work = final.with_name(final.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    log = cache_dir / f"template-{suite}.log"
    log.write_text("")
    index = work / "Packages.xz"
    index.write_bytes(_packages_index(mirror, suite))
    selection = template.dab_selection(template.parse_packages(lzma.decompress(index.read_bytes()).decode()))
    (work / "selection.txt").write_text("\n".join(selection) + "\n")
    root = work / "rootfs"
    # No merged-/usr hook: the selection holds usrmerge, which merges /usr as it does in dab's build, so
    # the template gets neither of debootstrap's extras (usr-is-merged, lsb-base) and is dab's set exactly.
    _run(_mmdebstrap(suite, root, mirror, selection), f"mmdebstrap of the {suite} CT template", log)
    _strip_for_the_lab(root, "packages come from the controller")
    shutil.copyfile(root / "var/lib/dpkg/status", work / "dpkg-status")
    # An unprivileged lab container may not mount debugfs (seen: "degraded"); the mask is the only
    # file the lab adds, and it is no package.
    mask = root / "etc/systemd/system/sys-kernel-debug.mount"
    mask.unlink(missing_ok=True)
    mask.symlink_to("/dev/null")
    name = template.APPLIANCES[suite].file_name
    _run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-I", "zstd -T0 -3", "-cf",
          str(work / (name + ".tmp")), "."], "packing the CT template", log)
    os.replace(work / (name + ".tmp"), work / name)
    shutil.rmtree(root)
    (work / ".toolkit-lab-complete").write_text(name + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(work, final)
    return final / name


def purge(cache_dir: Path = CACHE_DIR) -> None:
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
