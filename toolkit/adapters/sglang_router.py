"""SGLang's router (the SGLang Model Gateway, PyPI `smg`): its per-release pins, and the pinned router itself.

`load_pins` reads toolkit/data/sglang_router/pins.json (keyed by SGLang release, like the flag catalogues) for the
pure core (toolkit/core/router.py). `router_venv` makes a venv with a pinned router installed, built once per
version under the wheelhouse cache (`TOOLKIT_WHEELHOUSE_DIR`, /var/cache/toolkit/wheelhouse) from the wheelhouse's
router wheels (`wheelhouse.router_wheels`, downloaded once per version), so CI downloads the router once per cache.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from toolkit.adapters import cache_lock, wheelhouse
from toolkit.adapters.files import read_capped, write_atomic
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
    """Where `router_venv` keeps the pinned router for this Python: venv/ and the wheels/ it was installed from."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return (root or wheelhouse.cache_root()) / "router" / f"{pin.package}-{pin.version}-{py}"


def router_venv(pin: RouterPin, root: Path | None = None) -> Path:
    """A venv (for this Python) with `pin`'s router installed; its console script is bin/<pin.command[0]>. Its
    wheels are the wheelhouse's router wheels for this Python (downloaded once per version), linked into wheels/
    beside it and installed from there with no index, so a rebuilt venv needs no network. A host whose CPython
    differs takes `wheelhouse.router_wheels(pin.requirement, its_python)` instead."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    dest = venv_directory(pin, root)
    stamp = dest / STAMP

    def build() -> None:
        stamp.unlink(missing_ok=True)
        wheels = dest / "wheels"
        shutil.rmtree(wheels, ignore_errors=True)
        wheels.mkdir(parents=True)
        for wheel in wheelhouse.router_wheels(pin.requirement, python, root):
            try:
                os.link(wheel, wheels / wheel.name)
            except OSError:
                shutil.copy2(wheel, wheels / wheel.name)
        env_dir = dest / "venv"
        shutil.rmtree(env_dir, ignore_errors=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        proc = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", "--no-index", "--find-links", str(wheels),
                               pin.requirement], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = " / ".join(proc.stderr.strip().splitlines()[-3:])
            raise ToolkitError.of(f"installing {pin.requirement} from the wheelhouse failed: {tail}",
                                  fix=f"remove {dest} and the wheelhouse's router wheels to download them again",
                                  exit_code=EXIT_FAILED)
        write_atomic(stamp, pin.requirement + "\n")

    cache_lock.build_once(dest, lambda: stamp.is_file() and stamp.read_text().strip() == pin.requirement, build)
    return dest / "venv"
