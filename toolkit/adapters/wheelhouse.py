"""The wheelhouse: wheels the controller downloads from PyPI for a container that has no internet.

The lab container (and many real GPU containers) cannot reach PyPI, so `toolkit apply` fills a
directory here once per SGLang release, copies it in, and the roles install from it with
`pip install --no-index --find-links`. Built for the container's interpreter (CPython 3.11,
manylinux x86_64: Debian 12), not the controller's.

What goes in: the pinned `sglang` wheel itself (without its dependencies), SGLang's serving-side
Python imports that install without a GPU (toolkit.core.deploy.SERVING_REQUIREMENTS, with SGLang's
own pins), and the toolkit's probe (its wheel, plus rich, nvidia-ml-py, pyyaml and prometheus-client).
What SGLang requires and is left out (torch, flashinfer, sgl-kernel, ...) is written to LEFT_OUT.txt, so the
closing note can say exactly which.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.deploy import SERVING_REQUIREMENTS
from toolkit.core.errors import EXIT_FAILED, ToolkitError

TARGET_PYTHON = "3.11"
# Debian 12 has glibc 2.36: every manylinux tag up to 2_36 installs there.
PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "linux_x86_64")
# prometheus-client: the probe's server timeline parses SGLang's /metrics with it (adapters/sglang_metrics.py).
PROBE_REQUIREMENTS = ("rich", "nvidia-ml-py", "pyyaml", "prometheus-client")
STAMP = ".complete"


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    sglang_version: str
    left_out: list[str]  # SGLang requirements not in the wheelhouse (GPU-only or not needed to serve the lab)
    built: bool  # False when a complete cached one was reused
    tarball: Path  # the same wheels in one tar, what the hosts get
    toolkit_wheel: Path  # the toolkit's own wheel, for the probe's venv (kept apart from the wheelhouse)


def cache_root() -> Path:
    return Path(os.environ.get("TOOLKIT_WHEELHOUSE_DIR", "/var/cache/toolkit/wheelhouse"))


def _pip_download(dest: Path, reqs: list[str], *, no_deps: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(dest),
           "--only-binary=:all:", "--python-version", TARGET_PYTHON, "--implementation", "cp", "--abi", "cp311",
           "--abi", "abi3", "--abi", "none"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    if no_deps:
        cmd.append("--no-deps")
    cmd += reqs
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise ToolkitError.of(
            f"pip download failed for {' '.join(reqs)}:\n{tail}",
            field="wheelhouse",
            fix="check that PyPI is reachable from this machine and that the pinned release exists",
            exit_code=EXIT_FAILED,
        )


def _requires(wheel: Path) -> list[str]:
    """Requires-Dist lines without extras or markers that exclude Linux x86_64."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        out.append(req)
    return out


def _name(req: str) -> str:
    m = re.match(r"[A-Za-z0-9_.-]+", req)
    return (m.group(0) if m else req).lower().replace("_", "-")


def _pins(reqs: list[str]) -> dict[str, str]:
    pins = {}
    for r in reqs:
        spec = r.split(";", 1)[0].strip()
        name = _name(spec)
        rest = spec[len(name):].strip() if spec.lower().replace("_", "-").startswith(name) else ""
        if rest:
            pins[name] = rest
    return pins


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


def _tarball(dest: Path) -> Path:
    """The wheelhouse as one uncompressed tar (wheels are zips already): the host gets one file to
    checksum and copy instead of sixty, which is most of a no-change apply's time otherwise.
    Members are sorted and their metadata fixed, so the same wheels give the same bytes."""
    import tarfile

    out = dest.with_suffix(".tar")
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


def ensure(sglang_version: str, *, repo_root: Path, root: Path | None = None) -> Wheelhouse:
    """A complete wheelhouse for this SGLang release (built once, then reused), and the toolkit's wheel."""
    base = root or cache_root()
    dest = base / f"sglang-{sglang_version}-cp311"
    dest.mkdir(parents=True, exist_ok=True)
    # The toolkit's own wheel follows the checkout: rebuilt when its sources changed. It lives apart
    # from the wheelhouse, so a toolkit change never makes the SGLang venv's wheelhouse look changed.
    tk_dir = base / "toolkit"
    tk_dir.mkdir(parents=True, exist_ok=True)
    source = _source_digest(repo_root)
    marker = tk_dir / ".toolkit-source-sha256"
    wheels = list(tk_dir.glob("gpu_serving_toolkit-*.whl"))
    if not wheels or not marker.exists() or marker.read_text().strip() != source:
        for old in wheels:
            old.unlink()
        _build_toolkit_wheel(tk_dir, repo_root)
        marker.write_text(source + "\n")
    toolkit_wheel = next(tk_dir.glob("gpu_serving_toolkit-*.whl"))
    # The stamp names what was downloaded: a new requirement list fills the gaps (pip skips what is there).
    wanted = json.dumps([sglang_version, list(SERVING_REQUIREMENTS), list(PROBE_REQUIREMENTS)])
    tar = dest.with_suffix(".tar")
    if (dest / STAMP).exists() and (dest / STAMP).read_text().strip() == wanted and tar.exists():
        left = (dest / "LEFT_OUT.txt").read_text().split()
        return Wheelhouse(dest, sglang_version, left, built=False, tarball=tar, toolkit_wheel=toolkit_wheel)
    for stale in dest.glob("gpu_serving_toolkit-*.whl"):  # from before the toolkit wheel moved out
        stale.unlink()
    _pip_download(dest, [f"sglang=={sglang_version}"], no_deps=True)
    wheel = next(dest.glob(f"sglang-{sglang_version}-*.whl"))
    sglang_reqs = _requires(wheel)
    pins = _pins(sglang_reqs)
    serving = [f"{r}{pins.get(_name(r), '')}" for r in SERVING_REQUIREMENTS]
    _pip_download(dest, [*serving, *PROBE_REQUIREMENTS], no_deps=False)
    have = {_name(p.name.split("-")[0]) for p in dest.glob("*.whl")}
    left_out = sorted({_name(r) for r in sglang_reqs} - have)
    tmp = dest / "LEFT_OUT.txt.tmp"
    tmp.write_text("\n".join(left_out) + "\n")
    os.replace(tmp, dest / "LEFT_OUT.txt")
    (dest / STAMP).write_text(wanted + "\n")
    tar = _tarball(dest)
    return Wheelhouse(dest, sglang_version, left_out, built=True, tarball=tar, toolkit_wheel=toolkit_wheel)
