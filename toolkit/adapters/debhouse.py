"""The debhouse: Debian packages the controller downloads for a container that has no internet.

Proxmox's debian-12-standard template lacks python3-venv, python3-dev, patch and a compiler
(Priority optional; docs/lab.md "The CT template"), and a GPU container usually cannot reach
Debian's archive. So the controller resolves the packages against the container's own dpkg status
(fetched from it) with apt-get in a private apt directory, downloads exactly what is missing, and
the role installs the .debs with dpkg inside the container. Like the wheelhouse, it is cached by
what went into it. Needs apt-get and debian-archive-keyring on the controller (a Debian controller
has both).

`python -m toolkit.adapters.debhouse --suite bookworm --status FILE --out DIR PKG...` prints one
JSON line {"path", "tarball", "debs"}: how the container role calls it on the controller.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.adapters import cache_lock
from toolkit.core.errors import EXIT_FAILED, ToolkitError

DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
STAMP = ".complete"


@dataclass(frozen=True)
class Debhouse:
    path: Path
    tarball: Path
    debs: list[str]  # file names, what dpkg installs
    built: bool


def cache_root() -> Path:
    return Path(os.environ.get("TOOLKIT_DEBHOUSE_DIR", "/var/cache/toolkit/debhouse"))


def sources(suite: str, mirror: str, security: bool) -> str:
    lines = [f"deb [signed-by={KEYRING}] {mirror} {suite} main",
             f"deb [signed-by={KEYRING}] {mirror} {suite}-updates main"]
    if security:
        lines.append(f"deb [signed-by={KEYRING}] http://security.debian.org/debian-security {suite}-security main")
    return "\n".join(lines) + "\n"


def _apt(work: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    opts = {
        "Dir::State::status": work / "status",
        "Dir::State::Lists": work / "lists",
        "Dir::Cache": work / "cache",
        "Dir::Cache::archives": work / "archives",
        "Dir::Etc::SourceList": work / "sources.list",
        "Dir::Etc::SourceParts": work / "sources.list.d",
        "Dir::Etc::Preferences": work / "preferences",
        "Dir::Etc::PreferencesParts": work / "preferences.d",
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        "APT::Install-Recommends": "false",
        "Debug::NoLocking": "true",
    }
    cmd = ["apt-get", "-q", "-y"] + [a for k, v in opts.items() for a in ("-o", f"{k}={v}")] + args
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def ensure(suite: str, status_text: str, packages: list[str], *, mirror: str = DEFAULT_MIRROR,
           security: bool = True, root: Path | None = None) -> Debhouse:
    """The .debs `packages` need on a system whose dpkg status is `status_text`."""
    if shutil.which("apt-get") is None:
        raise ToolkitError.of("apt-get is not on this controller: the debhouse is resolved with it",
                              field="controller", fix="run the toolkit from a Debian or Ubuntu machine with apt",
                              exit_code=EXIT_FAILED)
    key_text = "\n".join([suite, mirror, str(security), *sorted(packages), status_text])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:12]
    out = (root or cache_root()) / f"debhouse-{suite}-{key}"
    tarball = out.with_suffix(".tar")
    built = cache_lock.build_once(out, lambda: (out / STAMP).is_file() and tarball.is_file(),
                                  lambda: _build_locked(out, tarball, suite, status_text, packages, mirror, security))
    return Debhouse(out, tarball, sorted(p.name for p in out.glob("*.deb")), built=built)


def _build_locked(out: Path, tarball: Path, suite: str, status_text: str, packages: list[str], mirror: str,
                  security: bool) -> None:
    work = out.with_name(out.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    for d in ("lists/partial", "cache", "archives/partial", "sources.list.d", "preferences.d"):
        (work / d).mkdir(parents=True)
    (work / "status").write_text(status_text)
    (work / "preferences").write_text("")
    (work / "sources.list").write_text(sources(suite, mirror, security))
    for step in (["update"], ["install", "--download-only", *packages]):
        proc = _apt(work, step)
        if proc.returncode != 0:
            raise ToolkitError.of(
                f"apt-get {step[0]} for the debhouse ({suite}: {' '.join(packages)}) failed: "
                f"{(proc.stderr or proc.stdout).strip()[-800:]}",
                fix=f"check that {mirror} is reachable from the controller and the package names exist in {suite}",
                exit_code=EXIT_FAILED)
    # What an interrupted build left is no part of this one: the entry's .debs are exactly the tarball's.
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    debs = sorted((work / "archives").glob("*.deb"))
    for deb in debs:
        os.replace(deb, out / deb.name)
    tmp = tarball.with_name(tarball.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        for deb in debs:
            tar.add(out / deb.name, arcname=deb.name)
    os.replace(tmp, tarball)
    (out / STAMP).write_text(json.dumps({"suite": suite, "packages": sorted(packages)}) + "\n")
    shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.adapters.debhouse")
    parser.add_argument("--suite", required=True)
    parser.add_argument("--status", required=True, help="the container's /var/lib/dpkg/status, fetched")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR)
    parser.add_argument("--no-security", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("packages", nargs="+")
    args = parser.parse_args(argv)
    try:
        house = ensure(args.suite, Path(args.status).read_text(), args.packages, mirror=args.mirror,
                       security=not args.no_security, root=Path(args.out) if args.out else None)
    except ToolkitError as err:
        print(str(err), file=sys.stderr)
        return err.exit_code
    print(json.dumps({"path": str(house.path), "tarball": str(house.tarball), "debs": house.debs,
                      "built": house.built}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
