"""The cached Debian 12 userland (system work: debootstrap, tar, zstd).

One debootstrap run makes the userland both pve1 and the CT template are made of, so a cold
`lab up` downloads Debian packages once (DOMAIN.md section 5: minbase bookworm took 38 s here).
The cache directory is named by a hash of what went into it, so changing the package list
builds a new one instead of silently reusing a stale one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from toolkit.core.errors import EXIT_FAILED, ToolkitError
from toolkit.lab import plan

CACHE_DIR = Path("/var/cache/toolkit-lab")


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


def build(cache_dir: Path = CACHE_DIR, mirror: str = plan.DEBIAN_MIRROR) -> Path:
    """Build the userland if it is not cached; return its directory. Safe to interrupt: the
    directory only gets its final name once it is complete."""
    final = rootfs_dir(cache_dir)
    if is_cached(cache_dir):
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Two labs coming up at once on a cold machine (CI runs two test shards, each with its own lab
    # instance) would otherwise both debootstrap into the same `.building` directory: one waits here,
    # then finds the other's finished cache.
    with open(cache_dir / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_cached(cache_dir):
            return final
        return _build_locked(final, cache_dir, mirror)


def _build_locked(final: Path, cache_dir: Path, mirror: str) -> Path:
    tmp = final.with_name(final.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    log = cache_dir / "debootstrap.log"
    log.write_text("")
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=" + ",".join(plan.ROOTFS_PACKAGES),
            plan.DEBIAN_SUITE,
            str(tmp),
            mirror,
        ],
        "debootstrap",
        log,
    )
    # Nothing in the lab may reach the network: no apt sources that would make an `apt-get update`
    # inside the lab try deb.debian.org (there is no route out anyway; this makes it fail fast).
    (tmp / "etc/apt/sources.list").write_text("# lab: no network; packages come from the cached userland\n")
    # Host keys made by openssh-server's postinst would be shared by every host and container made
    # from this cache; each boot of pve1 and each `pct create` makes its own instead.
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # Apt's package lists are the biggest part of the userland nobody in the lab can use.
    for lists in (tmp / "var/lib/apt/lists").glob("*_Packages"):
        lists.unlink()
    for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    _make_template(tmp, log)
    (tmp / ".toolkit-lab-complete").write_text(cache_key() + "\n")
    os.replace(tmp, final)
    # Userlands of an older package list or revision are left alone: a running lab may still have
    # one as its overlay's lower layer. `toolkit lab down --purge-cache` removes them.
    return final


def _make_template(root: Path, log: Path) -> None:
    """The CT template, where Proxmox keeps templates, inside the userland itself (so pve1 has it
    with no copy at `up`). It is the same userland minus the template directory."""
    tdir = root / plan.TEMPLATE_DIR.lstrip("/")
    tdir.mkdir(parents=True, exist_ok=True)
    tmp = tdir / (plan.TEMPLATE_NAME + ".tmp")
    # The container does not run containers of its own: lxc's units are masked in the template
    # (seen: lxc.service held the container's boot in "starting").
    overlay = root.with_name(root.name + ".template-overlay")
    shutil.rmtree(overlay, ignore_errors=True)
    units = overlay / "etc/systemd/system"
    units.mkdir(parents=True)
    for d in (overlay, overlay / "etc", overlay / "etc/systemd", units):
        os.chmod(d, 0o755)
    for unit in plan.TEMPLATE_MASKED_UNITS:
        (units / unit).symlink_to("/dev/null")
    _run(
        [
            "tar",
            "--numeric-owner",
            "--xattrs",
            "-C",
            str(root),
            "--exclude=./var/lib/vz",
            "--exclude=./.toolkit-lab-complete",
            "-I",
            "zstd -T0 -3",
            "-cf",
            str(tmp),
            ".",
            "-C",
            str(overlay),
            ".",
        ],
        "making the CT template",
        log,
    )
    shutil.rmtree(overlay)
    os.replace(tmp, tdir / plan.TEMPLATE_NAME)


def purge(cache_dir: Path = CACHE_DIR) -> None:
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
