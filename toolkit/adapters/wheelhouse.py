"""The wheelhouse: wheels the controller downloads from PyPI for a container that has no internet.

The lab container (and many real GPU containers) cannot reach PyPI, so `toolkit apply` fills a directory
here, copies it in, and the roles install from it with `pip install --no-index --find-links`.

What a host's SGLang venv installs is the engine lock (toolkit/core/engine_lock.py), and only the lock: `fill_from_lock`
puts every wheel it names in a content-addressed cache (`files/sha256/<2 hex>/<sha256>/<wheel>`) shared by every
release and Python, so a torch that two releases lock is downloaded once. Only what the cache lacks is downloaded,
by `pip download --require-hashes --no-deps -r` on the missing lines (pip checks each file against its hash, and so
does this module before a file enters the cache); `stage_lock_files` lays out exactly a lock's files for a host. A
caller may pass a subset of a lock's entries (the lab leaves out the GPU-only wheels, several GB).

Beside the lock's wheels a host gets the probe's (`probe_wheels`): the toolkit's own wheel, built from the checkout,
and its runtime packages for the lock's CPython (PROBE_REQUIREMENTS with their dependencies; the toolkit's venv on
the host is apart from the engine's, so these need no lock line).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolkit.adapters import cache_lock, pip_resolver
from toolkit.adapters.files import write_atomic
from toolkit.core import installer
from toolkit.core.engine_lock import PLATFORM_TAGS, PYPI_SIMPLE, EngineLock, LockEntry, redact_url
from toolkit.core.errors import EXIT_FAILED, ToolkitError

# pip matches platform tags exactly: every glibc tag up to Debian 12's 2.36 is named (core/engine_lock.py says
# why; with only 2_36/2_34/2_28/2_17, NVIDIA's manylinux_2_27 and nccl's manylinux_2_18 wheels were never found).
PLATFORMS = PLATFORM_TAGS
# prometheus-client: the probe's server timeline parses SGLang's /metrics with it (adapters/sglang_metrics.py).
# The bench_probe role installs these names (bench_probe_requirements) from the host's wheelhouse.
PROBE_REQUIREMENTS = ("rich", "nvidia-ml-py", "pyyaml", "prometheus-client")
STAMP = ".complete"


@dataclass(frozen=True)
class ProbeWheels:
    """What the probe's venv on a host installs: the toolkit's own wheel and its runtime packages' wheels."""

    toolkit_wheel: Path  # built from the controller's checkout (kept apart from the runtime wheels)
    runtime: tuple[Path, ...]  # PROBE_REQUIREMENTS and their dependencies, for `python`
    python: str  # the CPython version ("3.11") the runtime wheels are for
    built: bool  # False when complete cached ones were reused


def cache_root() -> Path:
    return Path(os.environ.get("TOOLKIT_WHEELHOUSE_DIR", "/var/cache/toolkit/wheelhouse"))


def _abi(python: str) -> str:
    return "cp" + python.replace(".", "")


def _pip_download(dest: Path, reqs: list[str], *, python: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(dest),
           "--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", _abi(python),
           "--abi", "abi3", "--abi", "none"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd += reqs
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise ToolkitError.of(
            f"pip download for CPython {python} failed for {' '.join(reqs)}:\n{tail}",
            field="wheelhouse",
            fix="check that PyPI is reachable from this machine",
            exit_code=EXIT_FAILED,
        )


def _source_digest(repo_root: Path) -> str:
    """sha256 over the toolkit's package and metadata: what the probe on the host runs. (Profiles, roles and
    playbooks ride in the wheel too but are not used there; recording into a profile must not force a rebuild.)"""
    import hashlib

    h = hashlib.sha256()
    paths = [repo_root / "pyproject.toml"]
    for part in ("toolkit",):
        paths += sorted(p for p in (repo_root / part).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for p in paths:
        if p.exists():
            h.update(str(p.relative_to(repo_root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _build_toolkit_wheel(dest: Path, repo_root: Path) -> None:
    """The toolkit itself, for the probe's small venv on the container."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                           "-w", str(dest), str(repo_root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolkitError.of(f"could not build the toolkit wheel: {proc.stderr.strip()[-400:]}", field="wheelhouse",
                              exit_code=EXIT_FAILED)


def probe_directory(base: Path, python: str) -> Path:
    """Where the probe's runtime wheels for one CPython live."""
    return base / f"probe-{_abi(python)}"


def tarball_path(dest: Path) -> Path:
    # Beside the directory, named after all of it: with_suffix would cut `sglang-0.5.9-...` to `sglang-0.5.tar`,
    # one tar for every 0.5.x release, so a second release's apply shipped the first one's wheels.
    return dest.with_name(dest.name + ".tar")


def _tarball(dest: Path) -> Path:
    """The wheelhouse as one uncompressed tar (wheels are zips already): the host gets one file to
    checksum and copy instead of sixty, which is most of a no-change apply's time otherwise.
    Members are sorted and their metadata fixed, so the same wheels give the same bytes."""
    import tarfile

    out = tarball_path(dest)
    tmp = out.with_name(out.name + ".tmp")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
        return info

    with tarfile.open(tmp, "w") as tar:
        for p in sorted(dest.iterdir()):
            if p.is_file() and not p.name.endswith(".tmp"):
                tar.add(p, arcname=p.name, filter=clean)
    os.replace(tmp, out)
    return out


def toolkit_wheel(repo_root: Path, root: Path | None = None) -> Path:
    """The toolkit's own wheel for this checkout's sources (built once per source digest)."""
    base = root or cache_root()
    # One directory per source digest: the cache is shared by every checkout on the controller, and with one
    # wheel for all, another checkout's apply rebuilt it under ours (seen: a host got another branch's probe).
    # Built in a temporary directory and renamed into place, so a reader never sees a half-written wheel.
    source = _source_digest(repo_root)
    tk_dir = base / "toolkit" / source[:16]
    if not list(tk_dir.glob("gpu_serving_toolkit-*.whl")):
        import tempfile

        (base / "toolkit").mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{source[:16]}.", dir=base / "toolkit"))
        _build_toolkit_wheel(building, repo_root)
        try:
            os.rename(building, tk_dir)
        except OSError:  # another apply of the same sources got there first: theirs is the same wheel
            shutil.rmtree(building, ignore_errors=True)
    return next(tk_dir.glob("gpu_serving_toolkit-*.whl"))


def probe_wheels(python: str, *, repo_root: Path, root: Path | None = None) -> ProbeWheels:
    """The probe's wheels for a host whose CPython is `python`: its runtime packages downloaded once per Python
    and requirement list (a few small wheels), and the toolkit's wheel of this checkout."""
    base = root or cache_root()
    dest = probe_directory(base, python)
    wanted = json.dumps([python, list(PROBE_REQUIREMENTS)])

    def complete() -> bool:
        return (dest / STAMP).exists() and (dest / STAMP).read_text().strip() == wanted

    def fill() -> None:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / STAMP).unlink(missing_ok=True)
        _pip_download(dest, list(PROBE_REQUIREMENTS), python=python)
        write_atomic(dest / STAMP, wanted + "\n")

    # Two applies filling one directory at once would share pip's partial downloads.
    built = cache_lock.build_once(dest, complete, fill)
    return ProbeWheels(toolkit_wheel(repo_root, base), tuple(sorted(dest.glob("*.whl"))), python, built)


def router_directory(requirement: str, python: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "router" / f"{requirement.replace('==', '-')}-py{python}"


def router_wheels(requirement: str, python: str, root: Path | None = None) -> tuple[Path, ...]:
    """SGLang's router (`smg==X`, toolkit/core/router.py's pin) and its dependencies as wheels for CPython
    `python`, downloaded once per version and Python: what a host without PyPI installs the router from."""
    dest = router_directory(requirement, python, root)
    wanted = json.dumps([python, requirement])

    def complete() -> bool:
        return (dest / STAMP).exists() and (dest / STAMP).read_text().strip() == wanted

    def fill() -> None:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / STAMP).unlink(missing_ok=True)
        _pip_download(dest, [requirement], python=python)
        write_atomic(dest / STAMP, wanted + "\n")

    cache_lock.build_once(dest, complete, fill)
    return tuple(sorted(dest.glob("*.whl")))


@dataclass(frozen=True)
class LockFiles:
    """The cached files of a lock's entries (or of the subset asked for)."""

    files: dict[str, Path]  # entry name -> the cached wheel (its name is the wheel's own file name)
    downloaded: tuple[str, ...]  # the entries this call downloaded; the rest were in the cache
    size_bytes: int  # of all the files


def files_root(root: Path | None = None) -> Path:
    return (root or cache_root()) / "files" / "sha256"


def _cached(entry: LockEntry, base: Path) -> Path | None:
    for digest in entry.sha256s:
        d = base / digest[:2] / digest
        found = sorted(d.glob("*.whl")) if d.is_dir() else []
        if found:
            return found[0]
    return None


def _sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fill_from_lock(entries: Sequence[LockEntry], python: str, *, index_url: str = PYPI_SIMPLE,
                   root: Path | None = None, on_progress: Callable[[int, int, str], None] | None = None) -> LockFiles:
    """Every file of these lock entries in the content-addressed cache, downloading only what is missing.

    on_progress(done, total, name): after each entry is in the cache (a cached one counts at once)."""
    base = files_root(root)
    base.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    missing: list[LockEntry] = []
    for e in entries:
        hit = _cached(e, base)
        if hit is not None:
            files[e.name] = hit
        else:
            missing.append(e)
    total = len(entries)
    if on_progress is not None and files:
        on_progress(len(files), total, "")
    if missing:
        # One fill at a time per cache: two applies would download the same files; the second finds them.
        with cache_lock.building(base):
            still = [e for e in missing if _cached(e, base) is None]
            files.update({e.name: hit for e in missing if (hit := _cached(e, base)) is not None})
            if still:
                files.update(_download(still, python, index_url, base, done=len(files), total=total,
                                       on_progress=on_progress))
    return LockFiles(files, tuple(e.name for e in missing),
                     sum(p.stat().st_size for p in files.values()))


def _download(entries: Sequence[LockEntry], python: str, index_url: str, base: Path, *, done: int, total: int,
              on_progress: Callable[[int, int, str], None] | None) -> dict[str, Path]:
    """One `pip download --require-hashes --no-deps` of these entries, each file checked and moved into the cache
    under its sha256 (pip checked the hashes; a cache keyed by them checks again before trusting a file)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".download-", dir=base) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("".join(f"{e.requirement()} " + " ".join(f"--hash=sha256:{h}" for h in e.sha256s) + "\n"
                               for e in entries))
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "pip", "--isolated", *pip_resolver.ca_options(), "download",
               "--require-hashes", "--no-deps", "--progress-bar", "off", "-d", str(out), "--index-url", index_url,
               *pip_resolver.target_options(python), "-r", str(req)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=pip_resolver.isolated_env())
        assert proc.stdout is not None
        tail: list[str] = []
        for raw in proc.stdout:
            line = raw.strip()
            tail = [*tail[-7:], line]
            if line.startswith("Saved ") and on_progress is not None:
                done += 1
                on_progress(min(done, total), total, line.rsplit("/", 1)[-1])
        if proc.wait() != 0:
            raise ToolkitError.of(
                f"pip download of {len(entries)} locked wheel(s) for CPython {python} from {redact_url(index_url)} "
                "failed:\n" + "\n".join(tail), field="wheelhouse", exit_code=EXIT_FAILED,
                fix="check that this machine reaches the index; a file the index changed (another sha256) needs "
                "the lock made again (`toolkit profile lock`)")
        by_hash = {_sha256_file(p): p for p in out.glob("*.whl")}
        placed: dict[str, Path] = {}
        for e in entries:
            digest = next((h for h in e.sha256s if h in by_hash), None)
            if digest is None:
                raise ToolkitError.of(f"pip downloaded no file with the lock's sha256 for {e.requirement()}",
                                      field="wheelhouse", exit_code=EXIT_FAILED,
                                      fix="make the lock again (`toolkit profile lock`)")
            final = base / digest[:2] / digest / by_hash[digest].name
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(by_hash[digest], final)  # the temporary directory is inside the cache: one filesystem
            placed[e.name] = final
        return placed


def stage_lock_files(files: LockFiles, dest: Path) -> Path:
    """`dest` holds exactly these files (hard links into the cache where the filesystem allows, else copies),
    and a SHA256SUMS of them: what a host gets for one lock, nothing left from another."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in files.files.values()}
    for stale in dest.iterdir():
        if stale.is_file() and stale.name not in wanted and stale.name != "SHA256SUMS":
            stale.unlink()
    for name, src in sorted(wanted.items()):
        target = dest / name
        if target.exists() and target.stat().st_ino == src.stat().st_ino:
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(src, target)
        except OSError:
            shutil.copyfile(src, target)
    sums = "".join(f"{p.parent.name}  {name}\n" for name, p in sorted(wanted.items()))
    write_atomic(dest / "SHA256SUMS", sums)
    return dest


def lock_directory(name: str) -> Path:
    """Where `lock_wheelhouse(lock, name, ...)` builds (its tar: tarball_path of it)."""
    return cache_root() / "locks" / name


def lock_wheelhouse(lock: EngineLock, name: str, also: Sequence[Path] = (),
                    standins: Mapping[str, Path] | None = None) -> Path:
    """The wheelhouse a host installs `lock` from, `$TOOLKIT_WHEELHOUSE_DIR/locks/NAME` and its tar beside it: the
    lock's wheels from the wheelhouse's content-addressed cache (only what it lacks downloaded, each file checked
    against its sha256), a stand-in's wheel in place of each line `standins` names (the lab's), and the wheels
    `also` names (the probe's). Built once per name and `also`."""
    replaced = dict(standins or {})
    dest = lock_directory(name)
    stamp = dest.with_name(dest.name + ".complete")
    wanted = "\n".join(sorted(p.name for p in also)) + "\n"
    tar = tarball_path(dest)

    def build() -> None:
        files = fill_from_lock([e for e in lock.entries if e.name not in replaced], lock.python,
                                          index_url=lock.index_url)
        # The lock's files come last, so a probe wheel of the same file name never stands in for one.
        staged = {f"also:{p.name}": p for p in also} | files.files | replaced
        stage_lock_files(LockFiles(staged, files.downloaded, files.size_bytes), dest)
        _tarball(dest)
        write_atomic(stamp, wanted)

    dest.parent.mkdir(parents=True, exist_ok=True)
    cache_lock.build_once(dest, lambda: tar.exists() and stamp.exists() and stamp.read_text() == wanted, build)
    return dest


def installer_binary(python: str, root: Path | None = None) -> Path:
    """The pinned uv executable on the controller (toolkit.core.installer), taken out of its wheel: the wheel
    downloaded once into the content-addressed cache and checked against its sha256 like a lock's line, the
    executable written beside it under `tools/` (mode 0755, atomically). The sglang_venv role copies it to a host
    and installs the engine lock with it."""
    wheel = fill_from_lock([installer.UV], python, root=root).files[installer.UV.name]
    dest = (root or cache_root()) / "tools" / f"uv-{installer.UV_VERSION}-{wheel.parent.name[:16]}" / "uv"

    def build() -> None:
        import zipfile

        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(installer.UV_WHEEL_MEMBER)
        write_atomic(dest, data, mode=0o755)

    cache_lock.build_once(dest, dest.is_file, build)
    return dest
