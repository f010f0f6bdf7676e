"""SGLang's flag catalogue per release: load the stored one, or build it from the release's own wheel.

Building downloads that release's wheel from PyPI once (`pip download --no-deps sglang==X`, cached under
/var/cache/toolkit/sglang-wheels or $TOOLKIT_SGLANG_WHEELS_DIR, where `toolkit profile migrate` finds it
too), reads the files that declare server arguments (server_args.py and the arg_groups package) and hands
their text to the pure reader (toolkit.core.profile.catalogue). No install: SGLang's runtime needs CUDA
wheels. Where that SGLang is importable, `from_installed()` walks `ServerArgs.add_cli_args` instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from toolkit.adapters import cache_lock
from toolkit.adapters.files import read_capped, write_atomic
from toolkit.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, ToolkitError
from toolkit.core.profile.catalogue import (
    SERVER_ARGS,
    Catalogue,
    extract_from_parser,
    extract_from_sources,
    parser_prog,
    plausibility_problems,
    release_key,
)

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "sglang_flags"
WHEELS_ENV = "TOOLKIT_SGLANG_WHEELS_DIR"
_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")


# A release's catalogue is about 100 KiB; a file far larger is damaged (and not read whole).
MAX_CATALOGUE_BYTES = 8 * 1024 * 1024


def catalogue_path(version: str) -> Path:
    return DATA_DIR / f"{version}.json"


def available_versions(data_dir: Path = DATA_DIR) -> list[str]:
    return sorted((p.stem for p in data_dir.glob("*.json")), key=release_key)


@functools.lru_cache(maxsize=32)
def load_catalogue(version: str | None) -> Catalogue | None:
    """The stored catalogue of `version`, or None when there is none or no version (read once per process)."""
    if not version:
        return None
    path = catalogue_path(version)
    if not path.is_file():
        return None
    try:
        raw = read_capped(path, MAX_CATALOGUE_BYTES, what="flag catalogue")
        if len(raw) > MAX_CATALOGUE_BYTES:
            raise ValueError(f"{len(raw):,} bytes or more, more than a catalogue may be ({MAX_CATALOGUE_BYTES:,})")
        return Catalogue.from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, KeyError, TypeError) as err:
        raise ToolkitError.of(
            f"flag catalogue is damaged: {err}",
            file=str(path),
            fix=f"regenerate it: toolkit profile catalogue --sglang-version {version}",
        ) from None


def wheel_cache_dir() -> Path:
    return Path(os.environ.get(WHEELS_ENV) or "/var/cache/toolkit/sglang-wheels")


def cached_wheel(version: str, cache: Path | None = None) -> Path | None:
    found = sorted((cache or wheel_cache_dir()).glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def ensure_wheel(version: str, cache: Path | None = None) -> Path:
    """SGLang `version`'s wheel from the cache, downloaded once (no dependencies) when it is not there."""
    if not _VERSION.match(version):
        raise ToolkitError.of(
            f"{version!r} is not an SGLang release number",
            field="--sglang-version",
            fix="give a release as PyPI lists it, e.g. 0.5.23 or 0.5.15.post1 (pip index versions sglang)",
        )
    base = cache or wheel_cache_dir()
    entry = base / f"sglang-{version}"
    cache_lock.build_once(entry, lambda: cached_wheel(version, base) is not None,
                          lambda: _download(version, base))
    wheel = cached_wheel(version, base)
    assert wheel is not None
    return wheel


def _download(version: str, dest: Path) -> None:
    """`pip download --no-deps sglang==version` into a temporary directory, then moved into dest whole."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
               "--disable-pip-version-check", "-d", tmp, f"sglang=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = sorted(Path(tmp).glob(f"sglang-{version}-*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = [line for line in proc.stderr.strip().splitlines() if "is ignored" not in line][-1:]
            raise ToolkitError.of(
                f"could not download sglang=={version}: {tail[0] if tail else proc.stdout.strip()}",
                field="--sglang-version",
                fix="check the release exists (pip index versions sglang) and that PyPI is reachable",
                exit_code=EXIT_FAILED,
            )
        os.replace(wheels[0], dest / wheels[0].name)


class WheelSources(Mapping[str, str]):
    """The wheel's Python files by path, each read from the zip when the reader first asks for it (a release has
    thousands; the reader follows a few dozen: server_args.py, the arg_groups package, the modules its choice lists
    come from). `read` holds what was read, for the catalogue's record of its sources."""

    def __init__(self, zf: zipfile.ZipFile) -> None:
        self._zf = zf
        self._names = {n for n in zf.namelist() if n.endswith(".py")}
        self.read: dict[str, str] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._names

    def __getitem__(self, key: str) -> str:
        if key not in self._names:
            raise KeyError(key)
        if key not in self.read:
            self.read[key] = self._zf.read(key).decode("utf-8")
        return self.read[key]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)


def wheel_file(wheel: Path, path: str) -> bytes | None:
    """One file of the wheel (a patch's target), or None when the release has no such file."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(path)
        except KeyError:
            return None


def wheel_requires(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines without extras."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode("utf-8")
    return [
        line.split(":", 1)[1].strip()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


def from_wheel(wheel: Path, version: str) -> Catalogue:
    """The catalogue of the release in `wheel`. An extraction that finds too little is refused (exit 2)
    with what it found: a layout this reader does not know must never become a catalogue."""
    with zipfile.ZipFile(wheel) as zf:
        files = WheelSources(zf)
        if SERVER_ARGS not in files:
            raise ToolkitError.of(
                f"{wheel.name} has no {SERVER_ARGS}: SGLang {version} declares its arguments somewhere this "
                "toolkit does not read",
                field="--sglang-version",
                fix="pin a release that has a stored catalogue (toolkit/data/sglang_flags/), or teach "
                "toolkit/core/profile/catalogue.py the new layout",
                exit_code=EXIT_BAD_INPUT,
            )
        flags = extract_from_sources(files)
        prog = parser_prog(files)
        read = dict(sorted(files.read.items()))
    problems = plausibility_problems(flags)
    if problems:
        shown = ", ".join(n for f in flags[:12] for n in f.names[:1]) or "none"
        raise ToolkitError.of(
            f"SGLang {version}'s wheel gave {len(flags)} flags from {len(read)} files "
            f"({', '.join(list(read)[:3])}{', ...' if len(read) > 3 else ''}): {'; '.join(problems)}. "
            f"Found: {shown}{', ...' if len(flags) > 12 else ''}. Nothing was written",
            field="--sglang-version",
            fix="this release declares its arguments in a way the reader does not follow; teach "
            "toolkit/core/profile/catalogue.py its layout, or pin a release with a stored catalogue",
            exit_code=EXIT_BAD_INPUT,
        )
    digest = hashlib.sha256()
    for path, text in read.items():
        digest.update(path.encode() + b"\0" + hashlib.sha256(text.encode("utf-8")).digest())
    source = {
        "method": "ast: add_argument calls, A[...] fields of ServerArgs and of the arg_groups namespaces",
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "file": SERVER_ARGS,
        "file_sha256": hashlib.sha256(read[SERVER_ARGS].encode("utf-8")).hexdigest(),
        "files_read": len(read),
        "files_sha256": digest.hexdigest(),
    }
    return Catalogue(sglang_version=version, flags=flags, source=source, prog=prog)


def from_installed() -> Catalogue:
    """The runtime walk, inside an environment where SGLang is installed."""
    import argparse

    try:
        import sglang  # type: ignore[import-not-found]
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    except ImportError as err:
        raise ToolkitError.of(f"SGLang is not importable here: {err}", fix="use --sglang-version") from None
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return Catalogue(
        sglang_version=str(sglang.__version__),
        flags=extract_from_parser(parser),
        source={"method": "runtime: ServerArgs.add_cli_args walk of parser._actions"},
    )


def regenerate(version: str, *, wheel: Path | None = None, out_dir: Path = DATA_DIR) -> tuple[Path, Catalogue]:
    """Build the catalogue of `version` and store it as <out_dir>/<version>.json (atomically)."""
    catalogue = from_wheel(wheel or ensure_wheel(version), version)
    return store(catalogue, out_dir)


def store(catalogue: Catalogue, out_dir: Path = DATA_DIR) -> tuple[Path, Catalogue]:
    """Write <out_dir>/<version>.json atomically; flags in registration order, keys sorted (a regenerated
    catalogue diffs cleanly)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{catalogue.sglang_version}.json"
    write_atomic(path, json.dumps(catalogue.to_json(), indent=1, sort_keys=True) + "\n")
    load_catalogue.cache_clear()
    return path, catalogue
