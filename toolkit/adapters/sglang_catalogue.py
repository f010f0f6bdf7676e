"""SGLang's flag catalogue per version: load the stored one, or regenerate it from the release itself.

Regenerating downloads that release's wheel from PyPI (`pip download --no-deps sglang==X`), reads
`sglang/srt/server_args.py` out of it and extracts every flag with `ast` (no install: SGLang's
runtime needs CUDA wheels). Where that SGLang is importable, `from_installed()` walks
`ServerArgs.add_cli_args` instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from toolkit.adapters.files import write_atomic
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.catalogue import Catalogue, extract_from_parser, extract_from_source

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "sglang_flags"
SERVER_ARGS = "sglang/srt/server_args.py"


def catalogue_path(version: str) -> Path:
    return DATA_DIR / f"{version}.json"


def available_versions() -> list[str]:
    return sorted((p.stem for p in DATA_DIR.glob("*.json")), key=_version_key)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(part) for part in v.replace(".post", ".").split(".") if part.isdigit())


@functools.lru_cache(maxsize=8)
def load_catalogue(version: str | None) -> Catalogue | None:
    """The stored catalogue of `version`, or None when there is none or no version (read once per process)."""
    if not version:
        return None
    path = catalogue_path(version)
    if not path.is_file():
        return None
    try:
        return Catalogue.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as err:
        raise ToolkitError.of(
            f"flag catalogue is damaged: {err}",
            file=str(path),
            fix=f"regenerate it: toolkit profile catalogue --sglang-version {version}",
        ) from None


def download_wheel(version: str, dest: Path) -> Path:
    """`pip download --no-deps sglang==version` into dest; returns the wheel."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(dest)]
    proc = subprocess.run([*cmd, f"sglang=={version}"], capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ToolkitError.of(
            f"could not download sglang=={version}: {proc.stderr.strip().splitlines()[-1:] or proc.stdout}",
            field="--sglang-version",
            fix="check the version exists on PyPI (pip index versions sglang) and that PyPI is reachable",
            exit_code=1,
        )
    return wheels[0]


def from_wheel(wheel: Path, version: str) -> Catalogue:
    with zipfile.ZipFile(wheel) as zf:
        try:
            text = zf.read(SERVER_ARGS).decode("utf-8")
        except KeyError:
            raise ToolkitError.of(
                f"{wheel.name} has no {SERVER_ARGS}", fix="this SGLang release is laid out differently", exit_code=1
            ) from None
    flags = extract_from_source(text)
    source = {
        "method": "ast: add_argument calls and A[...] dataclass fields of server_args.py",
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "file": SERVER_ARGS,
        "file_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    return Catalogue(sglang_version=version, flags=flags, source=source)


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
    if wheel is None:
        with tempfile.TemporaryDirectory(prefix="toolkit-sglang-") as tmp:
            catalogue = from_wheel(download_wheel(version, Path(tmp)), version)
    else:
        catalogue = from_wheel(wheel, version)
    return store(catalogue, out_dir)


def store(catalogue: Catalogue, out_dir: Path = DATA_DIR) -> tuple[Path, Catalogue]:
    """Write <out_dir>/<version>.json atomically, keys sorted (a regenerated catalogue diffs cleanly)."""
    path = out_dir / f"{catalogue.sglang_version}.json"
    write_atomic(path, json.dumps(catalogue.to_json(), indent=1, sort_keys=True) + "\n")
    load_catalogue.cache_clear()
    return path, catalogue
