"""SGLang's router (the SGLang Model Gateway, PyPI `smg`): its per-release pins, and the pinned router itself.

`load_pins` reads toolkit/data/sglang_router/pins.json (keyed by SGLang release, like the flag catalogues) for the
pure core (toolkit/core/router.py). `router_venv` makes a venv with a pinned router installed, built once per
version under the wheelhouse cache (`TOOLKIT_WHEELHOUSE_DIR`, /var/cache/toolkit/wheelhouse): its wheels are
downloaded once and kept beside it, so CI downloads the router once per cache.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from toolkit.adapters import cache_lock, wheelhouse
from toolkit.adapters.files import read_capped
from toolkit.core.errors import EXIT_FAILED, ToolkitError
from toolkit.core.router import PINS_FILE, RouterPin, RouterPins, pins_from_json

PINS_PATH = Path(__file__).resolve().parent.parent / "data" / "sglang_router" / "pins.json"
MAX_PINS_BYTES = 1024 * 1024
STAMP = ".complete"


@functools.lru_cache(maxsize=4)
def load_pins(path: Path = PINS_PATH) -> RouterPins:
    raw = read_capped(path, MAX_PINS_BYTES, what="router pins")
    if len(raw) > MAX_PINS_BYTES:
        raise ToolkitError.of(f"more than {MAX_PINS_BYTES:,} bytes", file=PINS_FILE,
                              fix=f"restore the file (git checkout -- {PINS_FILE})")
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as err:
        raise ToolkitError.of(f"not JSON: {err}", file=PINS_FILE,
                              fix=f"restore the file (git checkout -- {PINS_FILE})") from None
    return pins_from_json(data)


def venv_directory(pin: RouterPin, root: Path | None = None) -> Path:
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return (root or wheelhouse.cache_root()) / "router" / f"{pin.package}-{pin.version}-{py}"


def _pip(args: list[str], what: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if "is ignored" not in line][-3:]
        raise ToolkitError.of(f"{what} failed: {' / '.join(tail) or proc.stdout.strip()[-300:]}",
                              fix="check that PyPI is reachable (pip download works here)", exit_code=EXIT_FAILED)


def router_venv(pin: RouterPin, root: Path | None = None) -> Path:
    """A venv (for this Python) with `pin`'s router installed; its console script is bin/<pin.command[0]>.
    The wheels (the router's and its dependencies') are downloaded once into wheels/ beside it and installed from
    there with no index, so rebuilding the venv needs no network."""
    dest = venv_directory(pin, root)
    stamp = dest / STAMP

    def build() -> None:
        wheels = dest / "wheels"
        if not any(wheels.glob(f"{pin.package}-{pin.version}-*.whl")):
            tmp = dest / ".wheels.download"
            shutil.rmtree(tmp, ignore_errors=True)
            _pip([sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "-q",
                  "--disable-pip-version-check", "-d", str(tmp), pin.requirement], f"pip download {pin.requirement}")
            shutil.rmtree(wheels, ignore_errors=True)
            tmp.rename(wheels)
        env_dir = dest / "venv"
        shutil.rmtree(env_dir, ignore_errors=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        _pip([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--no-index", "--find-links", str(wheels), pin.requirement], f"pip install {pin.requirement}")
        stamp.write_text(pin.requirement + "\n")

    cache_lock.build_once(dest, lambda: stamp.is_file() and stamp.read_text().strip() == pin.requirement, build)
    return dest / "venv"
