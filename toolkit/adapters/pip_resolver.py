"""pip's resolver, the one place the toolkit asks it what an SGLang release needs (an engine lock).

`pip install --dry-run --report` resolves the whole engine for a container's CPython on Linux x86_64 without
installing anything, and downloads only what it must read the metadata of (PEP 658 metadata where the index
serves it). pip refuses --platform/--python-version without --target, so a throwaway target is named.

Isolated from this machine's pip configuration: a lock is what the package index alone offers. A site's pip.conf,
PIP_* variables, find-links directories or constraints would let a lock "resolve" from wheels that sit on one
controller's disk and nowhere else (seen: a local torch that the index does not have). The index is PyPI unless
the caller names another; only the CA bundle is kept, which says how to reach an index, not what it holds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.core.engine_lock import (
    PLATFORM_TAGS,
    PYPI_SIMPLE,
    EngineLock,
    LockEntry,
    LockRefusal,
    normalize_name,
    python_tag,
    redact_url,
)
from toolkit.core.errors import EXIT_FAILED, ToolkitError


@dataclass(frozen=True)
class Resolution:
    """What pip said: the lock, or the refusal, or (resolving under constraints) the conflict; and how long it
    took."""

    lock: EngineLock | None
    refusal: LockRefusal | None
    duration_s: float
    conflict: tuple[str, ...] = ()  # pip's ERROR lines where the constraints cannot all hold


def isolated_env() -> dict[str, str]:
    """The environment pip runs in: no PIP_* setting of this machine, no pip.conf (PIP_CONFIG_FILE=/dev/null
    also keeps out the site-wide /etc/pip.conf and /etc/xdg/pip, which --isolated alone still reads)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def ca_options() -> list[str]:
    """The CA bundle this machine's pip is told to trust, if any: a TLS-intercepting proxy needs it."""
    cert = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
    return ["--cert", cert] if cert and Path(cert).is_file() else []


def target_options(python: str) -> list[str]:
    """pip's options for wheels of the container, not of this machine."""
    opts = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--abi", python_tag(python), "--abi", "abi3", "--abi", "none"]
    for tag in PLATFORM_TAGS:
        opts += ["--platform", tag]
    return opts


def _pip_version() -> str:
    proc = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True,
                          env=isolated_env())
    m = re.match(r"pip (\S+)", proc.stdout)
    return m.group(1) if m else ""


# An index without PEP 658 metadata files (seen here for PyPI's GPU wheels: pip downloaded torch's 900 MB wheel,
# sgl-kernel's 536 MB, each nvidia-* whole) makes a dry run download the whole engine to read its dependencies.
# fast-deps reads a wheel's METADATA with HTTP range requests instead: the same 169 packages and hashes for 0.5.9
# (compared), 123 s against 187 s side by side on a loaded 2-core machine, and no GB of downloads. A pip without
# the feature gets the plain command.
FAST_DEPS = ["--use-feature=fast-deps"]


def resolve_command(sglang_version: str, python: str, index_url: str, report: Path, target: Path, *,
                    fast_deps: bool = True, constraints: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "pip", "--isolated", *ca_options(), "install", *(FAST_DEPS if fast_deps else []),
            "--dry-run", "--ignore-installed", "--report", str(report), "--target", str(target),
            "--index-url", index_url, "--progress-bar", "off", *target_options(python),
            *(["--constraint", str(constraints)] if constraints is not None else []), f"sglang=={sglang_version}"]


def resolve(sglang_version: str, python: str, *, index_url: str = PYPI_SIMPLE, pins: Sequence[str] = (),
            on_line: Callable[[str], None] | None = None) -> Resolution:
    """Resolve sglang==RELEASE for CPython `python` on Linux x86_64 from `index_url` alone.

    `pins` (`name==version` lines, a committed lock's) constrain the resolution: pip then answers whether those
    versions, as they stand on the index, are a whole engine (what it adds, drops or cannot reconcile), not what
    it would pick today. `on_line` gets pip's lines as they come (what it is collecting), for a progress
    display. Raises when pip fails for another reason than a requirement the index lacks or pins that conflict
    (no network, a bad index URL)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="toolkit-lock-") as tmp:
        report = Path(tmp) / "report.json"
        constraints = None
        if pins:
            constraints = Path(tmp) / "pins.txt"
            constraints.write_text("".join(f"{pin}\n" for pin in pins))

        def run(fast_deps: bool) -> list[str]:
            return list(_run(resolve_command(sglang_version, python, index_url, report, Path(tmp) / "target",
                                             fast_deps=fast_deps, constraints=constraints), on_line))

        lines = run(fast_deps=True)
        if not report.is_file() and any("fast-deps" in line and "invalid choice" in line for line in lines):
            lines = run(fast_deps=False)
        duration = time.monotonic() - started
        pip_version = _pip_version()
        if report.is_file():
            data = json.loads(report.read_text())
            lock = lock_from_report(data, sglang_version, python, index_url=index_url,
                                    pip_version=str(data.get("pip_version") or pip_version))
            return Resolution(lock, None, duration)
    refusal = refusal_from_output(lines, sglang_version, python, index_url=index_url, pip_version=pip_version)
    conflict = conflict_from_output(lines) if pins else ()
    if conflict and refusal is None:
        return Resolution(None, None, duration, conflict)
    if refusal is None:
        tail = "\n".join(lines[-12:])
        raise ToolkitError.of(
            f"pip could not resolve sglang=={sglang_version} for CPython {python} "
            f"from {redact_url(index_url)}:\n{tail}",
            field="index_url",
            fix="check that this machine reaches the index (behind a proxy: set HTTPS_PROXY), "
            "or name another with --index-url",
            exit_code=EXIT_FAILED,
        )
    return Resolution(None, refusal, duration)


def _run(cmd: list[str], on_line: Callable[[str], None] | None) -> Iterator[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=isolated_env())
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = raw.rstrip()
            if on_line is not None and line:
                on_line(line)
            yield line
    finally:
        proc.wait()


def lock_from_report(report: dict[str, Any], sglang_version: str, python: str, *, index_url: str,
                     pip_version: str) -> EngineLock:
    """pip's installation report (https://pip.pypa.io/en/stable/reference/installation-report/) as a lock."""
    entries = []
    for item in report.get("install", []):
        meta, info = item.get("metadata", {}), item.get("download_info", {})
        digest = (info.get("archive_info") or {}).get("hashes", {}).get("sha256") \
            or (info.get("archive_info") or {}).get("hash", "").removeprefix("sha256=")
        url = str(info.get("url", ""))
        if not digest or not url.endswith(".whl"):
            raise ToolkitError.of(f"pip chose {meta.get('name')} {meta.get('version')} from {redact_url(url)}, "
                                  "which is not a wheel with a sha256", field="index_url", exit_code=EXIT_FAILED,
                                  fix="use an index that serves wheels with hashes (PyPI does)")
        entries.append(LockEntry(normalize_name(str(meta["name"])), str(meta["version"]), (digest,),
                                 wheel=url.rsplit("/", 1)[-1].split("#", 1)[0]))
    return EngineLock(sglang_version, python, tuple(entries), index_url=index_url, pip_version=pip_version)


def conflict_from_output(lines: list[str]) -> tuple[str, ...]:
    """pip's account of requirements that cannot all hold ("conflicting dependencies", ResolutionImpossible):
    its lines from the first ERROR to its advice ("To fix this you could try"), which is about loosening a
    requirement and not about a lock; empty when it says no such thing."""
    if not any("ResolutionImpossible" in line or "conflicting dependencies" in line for line in lines):
        return ()
    start = next((i for i, line in enumerate(lines) if line.startswith("ERROR:")), 0)
    out = []
    for line in lines[start:]:
        if line.startswith("To fix this"):
            break
        if line.strip():
            out.append(line.rstrip())
    return tuple(out)


# pip 23-25: "ERROR: Could not find a version that satisfies the requirement X==Y (from torch) (from versions: ...)"
_NOT_FOUND = re.compile(r"Could not find a version that satisfies the requirement (\S+?)"
                        r"(?: \(from (?!versions:)([^)]*)\))?(?: \(from versions:|$)")
_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_CHOSE = re.compile(r"(?:Downloading|Using cached|Obtaining|Processing) (?:\S+/)?([A-Za-z0-9_.]+)-([^-\s]+)-"
                    r"[^\s]*\.whl")


def refusal_from_output(lines: list[str], sglang_version: str, python: str, *, index_url: str,
                        pip_version: str) -> LockRefusal | None:
    """The requirement the index lacks and what pins it, from pip's output; None when pip failed otherwise."""
    missing, parent, detail = "", "", ""
    for line in lines:
        m = _NOT_FOUND.search(line)
        if m:
            missing, parent, detail = m.group(1), (m.group(2) or "").strip(), line.strip()
        m = _NO_MATCH.search(line)
        if m and not missing:
            missing, detail = m.group(1), line.strip()
    if not missing:
        return None
    # pip >= 23.1: "Collecting outlines_core==0.1.26 (from outlines==0.1.11->sglang==0.5.23)" names the version.
    for line in lines:
        m = re.match(rf"Collecting {re.escape(missing)} \(from ([^)\s]+?)(?:->|\))", line.strip())
        if m and "==" in m.group(1) and normalize_name(m.group(1).split("==")[0].split("[")[0]) == normalize_name(
                parent.split("[")[0]):
            parent = m.group(1)
    return LockRefusal(sglang_version, python, missing, _with_version(parent, lines), index_url=index_url,
                       pip_version=pip_version, detail=detail)


def _with_version(parent: str, lines: list[str]) -> str:
    """`torch` as `torch==2.14.1`: pip names the package that requires the missing one, not its version, so the
    version is the last file of it pip fetched."""
    if not parent or "==" in parent:
        return parent
    name = normalize_name(parent.split("[")[0])
    version = ""
    for line in lines:
        m = _CHOSE.search(line)
        if m and normalize_name(m.group(1)) == name:
            version = m.group(2)
    return f"{name}=={version}" if version else name
