"""The cached Debian 12 userland (system work: debootstrap, tar, zstd).

One debootstrap run makes the userland both pve1 and the CT template are made of, so a cold
`lab up` downloads Debian packages once (docs/lab.md: minbase bookworm took 38 s here).
The cache directory is named by a hash of what went into it, so changing the package list
builds a new one instead of silently reusing a stale one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
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


def build(cache_dir: Path = CACHE_DIR, mirror: str = plan.DEBIAN_MIRROR, debs: Path | None = None) -> Path:
    """Build the userland if it is not cached; return its directory. Safe to interrupt: the
    directory only gets its final name once it is complete. `debs`: .debs fetched ahead (prefetch_debs)."""
    final = rootfs_dir(cache_dir)
    cache_lock.build_once(final, lambda: is_cached(cache_dir), lambda: _build_locked(final, cache_dir, mirror, debs))
    return final


def _build_locked(final: Path, cache_dir: Path, mirror: str, debs: Path | None) -> Path:
    tmp = final.with_name(final.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    log = cache_dir / "debootstrap.log"
    log.write_text("")
    with _debs_for(tmp, debs) as cache_opts:
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(plan.ROOTFS_PACKAGES), *cache_opts,
              plan.DEBIAN_SUITE, str(tmp), mirror], "debootstrap", log)
    _strip_for_the_lab(tmp, "packages come from the cached userland")
    (tmp / ".toolkit-lab-complete").write_text(cache_key() + "\n")
    os.replace(tmp, final)
    # Userlands of an older package list or revision are left alone: a running lab may still have
    # one as its overlay's lower layer. `toolkit lab down --purge-cache` removes them.
    return final


# ---------------------------------------------------------------- the CT template

# Bump when the way the template is made changes.
TEMPLATE_BUILD_REVISION = "1"
_DEBOOTSTRAP_EXTRAS = ("lsb-base", "usr-is-merged")


def template_dir(suite: str = template.DEFAULT_SUITE, cache_dir: Path = CACHE_DIR) -> Path:
    a = template.APPLIANCES[suite]
    key = hashlib.sha256("\n".join([suite, a.version, TEMPLATE_BUILD_REVISION]).encode()).hexdigest()[:12]
    return cache_dir / f"template-{suite}-{key}"


def template_path(suite: str = template.DEFAULT_SUITE, cache_dir: Path = CACHE_DIR) -> Path:
    return template_dir(suite, cache_dir) / template.APPLIANCES[suite].file_name


def build_template(suite: str = template.DEFAULT_SUITE, cache_dir: Path = CACHE_DIR,
                   mirror: str = plan.DEBIAN_MIRROR, debs: Path | None = None, index: bytes | None = None) -> Path:
    """Proxmox's standard template for `suite`, made the way dab makes it: the package selection
    computed from the archive's own Packages file (toolkit.lab.template.dab_selection), installed
    by debootstrap. Its own debootstrap, not pve1's userland: the template must lack what Proxmox's
    lacks (python3-venv, patch, a compiler). Kept beside it: the Packages index it was chosen from
    and the dpkg status it ended with, so a test can compare the two. Safe to interrupt."""
    final = template_dir(suite, cache_dir)
    cache_lock.build_once(final, lambda: _template_done(final),
                          lambda: _build_template_locked(suite, final, cache_dir, mirror, debs, index))
    return final / template.APPLIANCES[suite].file_name


def build_all(cache_dir: Path = CACHE_DIR, mirror: str = plan.DEBIAN_MIRROR,
              side_by_side: bool = True, suites: tuple[str, ...] = tuple(template.APPLIANCES)
              ) -> tuple[Path, dict[str, Path]]:
    """pve1's userland and every CT template, built where not cached. Side by side: each is its own
    debootstrap that waits mostly on the mirror and on dpkg, so on a cold machine (every CI run) the three at
    once take little more than the longest alone (benchmarks/bench_cold_caches.py). An error in one is
    raised once the others are done, so what they built is kept for the next `up`."""
    if not side_by_side:
        return build(cache_dir, mirror), {s: build_template(s, cache_dir, mirror) for s in suites}
    from concurrent.futures import ThreadPoolExecutor

    # debootstrap fetches its .debs one wget at a time: on a cold cache that wait was about a third of each
    # build. Fetched ahead, many at once, both builds of a suite find them in their --cache-dir.
    cold = [s for s in suites if not _template_done(template_dir(s, cache_dir))]
    userland_cold = not is_cached(cache_dir)
    pools: dict[str, Path | None] = {}
    indexes: dict[str, bytes] = {}
    for suite in dict.fromkeys([*([plan.DEBIAN_SUITE] if userland_cold else []), *cold]):
        indexes[suite] = _packages_index(mirror, suite)
        pools[suite] = prefetch_debs(cache_dir, suite, mirror, indexes[suite],
                                     userland=userland_cold and suite == plan.DEBIAN_SUITE,
                                     template_of_suite=suite in cold)
    with ThreadPoolExecutor(max_workers=len(suites), thread_name_prefix="template") as pool:
        futures = {s: pool.submit(build_template, s, cache_dir, mirror, pools.get(s), indexes.get(s)) for s in suites}
        lower = build(cache_dir, mirror, pools.get(plan.DEBIAN_SUITE))
        return lower, {s: f.result() for s, f in futures.items()}


def _template_done(final: Path) -> bool:
    return (final / ".toolkit-lab-complete").is_file()


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


def deb_file_name(package: str, version: str, arch: str) -> str:
    """The name debootstrap gives a .deb in its --cache-dir (functions, download_debs: the epoch's colon as %3a)."""
    return f"{package}_{version}_{arch}.deb".replace(":", "%3a", 1)


def prefetch_debs(cache_dir: Path, suite: str, mirror: str, index: bytes, *, userland: bool, template_of_suite: bool,
                  workers: int = 8) -> Path | None:
    """The .debs a cold build of pve1's userland and/or the suite's CT template will install, fetched from the
    mirror `workers` at a time into `cache_dir/debs-SUITE/` (each checked against the index's sha256, renamed into
    place once whole). What debootstrap picks beyond them (another alternative of a dependency) it fetches itself,
    as before; so a failure here only costs the time: it is logged and the builds fetch everything themselves."""
    import hashlib
    import lzma
    import tempfile
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    log = cache_dir / f"prefetch-{suite}.log"
    cache_dir.mkdir(parents=True, exist_ok=True)
    try:
        pkginfo = template.parse_packages(lzma.decompress(index).decode())
        # minbase: Priority required and apt; debootstrap adds usr-is-merged itself (bookworm and later).
        roots = [n for n, f in pkginfo.items() if f.get("priority") == "required"] + ["apt", "usr-is-merged"]
        roots += list(plan.ROOTFS_PACKAGES) if userland else []
        roots += template.dab_selection(pkginfo) if template_of_suite else []
        names = template.dependency_closure(pkginfo, roots)
    except lzma.LZMAError as err:
        log.write_text(f"no prefetch: {err}\n")
        return None
    pool = cache_dir / f"debs-{suite}"
    pool.mkdir(exist_ok=True)

    def fetch(name: str) -> None:
        info = pkginfo[name]
        out = pool / deb_file_name(name, info["version"], info.get("architecture", "amd64"))
        if out.exists() and out.stat().st_size == int(info.get("size", -1)):
            return
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=pool)
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            with urllib.request.urlopen(f"{mirror}/{info['filename']}", timeout=120) as resp, os.fdopen(fd, "wb") as fh:
                for chunk in iter(lambda: resp.read(1 << 16), b""):
                    h.update(chunk)
                    fh.write(chunk)
            if h.hexdigest() != info.get("sha256"):
                raise OSError(f"{info['filename']}: sha256 {h.hexdigest()}, the index says {info.get('sha256')}")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prefetch") as ex:
        failed = [f"{n}: {e}" for n, e in zip(names, ex.map(_caught(fetch), names), strict=True) if e is not None]
    log.write_text(f"{len(names) - len(failed)} of {len(names)} .debs fetched ahead\n" + "\n".join(failed) + "\n")
    return pool


def _caught(fn: Callable[[str], None]) -> Callable[[str], Exception | None]:
    def call(arg: str) -> Exception | None:
        try:
            fn(arg)
        except OSError as err:
            return err
        return None

    return call


@contextlib.contextmanager
def _debs_for(target: Path, debs: Path | None) -> Iterator[list[str]]:
    """debootstrap's --cache-dir options for a build into `target`: a directory of its own holding hard links to
    the .debs fetched ahead (debootstrap writes what it fetches itself there: two builds never write one file)."""
    if debs is None:
        yield []
        return
    own = target.with_name(target.name + ".debs")
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir(parents=True)
    try:
        for deb in debs.glob("*.deb"):
            try:
                os.link(deb, own / deb.name)
            except OSError:
                shutil.copyfile(deb, own / deb.name)
        yield [f"--cache-dir={own.resolve()}"]
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _build_template_locked(suite: str, final: Path, cache_dir: Path, mirror: str, debs: Path | None,
                           index_xz: bytes | None) -> Path:
    import lzma

    work = final.with_name(final.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    log = cache_dir / f"debootstrap-template-{suite}.log"
    log.write_text("")
    index = work / "Packages.xz"
    index.write_bytes(index_xz or _packages_index(mirror, suite))
    selection = template.dab_selection(template.parse_packages(lzma.decompress(index.read_bytes()).decode()))
    (work / "selection.txt").write_text("\n".join(selection) + "\n")
    root = work / "rootfs"
    with _debs_for(root, debs) as cache_opts:
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(selection), *cache_opts, suite, str(root),
              mirror], f"debootstrap of the {suite} CT template", log)
    # debootstrap adds two packages dab does not (dab merges /usr itself and installs no lsb-base);
    # nothing in the selection needs them (usrmerge satisfies init-system-helpers).
    _run(["chroot", str(root), "dpkg", "--purge", *_DEBOOTSTRAP_EXTRAS], "removing debootstrap's extras", log)
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
