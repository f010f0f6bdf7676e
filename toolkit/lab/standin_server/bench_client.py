"""Lab only: another SGLang release's bench_serving, for a container whose pinned release's client cannot start.

From 0.5.10 on, `python -m sglang.bench_serving` imports torch (sglang/__init__.py, and sglang.srt modules the
client takes a constant from), and the lab's containers have no torch: PyPI's is the CUDA build, 4.4 GB with its
NVIDIA libraries, and it does not import without them. Tried for every release in a torch-less venv holding the
wheelhouse's packages, only 0.5.9's client imports. It speaks the same OpenAI HTTP API and takes every flag the
toolkit renders (tests/profile/test_profile_catalogue.py checks them against 0.5.9's and 0.5.23's), so the lab's
deploy overlay ships 0.5.9's `sglang/` package inside a wheel of its own (`toolkit_lab_bench_client`, installed
into the engine's venv beside the pinned SGLang without touching it) and runs the profile's bench argv through
`python -m toolkit.lab.standin_server.bench_client ARGS`, which puts that package first on sys.path and runs
`sglang.bench_serving` with ARGS. Real hosts always run their own release's client.

The runner is standard library only (it runs in the engine's venv); `build_wheel` runs on the controller.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import zipfile
from pathlib import Path

RELEASE = "0.5.9"
PACKAGE = "toolkit_lab_bench_client"
MODULE = "toolkit.lab.standin_server.bench_client"
_INIT = (
    '"""Lab only (toolkit): SGLang {release}\'s sglang package, for its bench_serving in a lab container whose own\n'
    "SGLang client imports torch. Not importable as `sglang` unless this directory is first on sys.path:\n"
    f'`python -m {MODULE}` does that."""\n'
)


def wheel_name(release: str = RELEASE) -> str:
    return f"{PACKAGE}-{release}-py3-none-any.whl"


def build_wheel(sglang_wheel: Path, dest: Path, release: str = RELEASE) -> Path:
    """The wheel of `toolkit_lab_bench_client`: SGLang `release`'s `sglang/` tree (from its own wheel) under
    toolkit_lab_bench_client/, with its dist-info; deterministic (sorted members, fixed times)."""
    files: dict[str, bytes] = {f"{PACKAGE}/__init__.py": _INIT.format(release=release).encode()}
    with zipfile.ZipFile(sglang_wheel) as zf:
        for name in sorted(zf.namelist()):
            if name.startswith("sglang/") and not name.endswith("/"):
                files[f"{PACKAGE}/{name}"] = zf.read(name)
    from toolkit.lab.engine_standins import write_wheel

    return write_wheel(dest, PACKAGE, release, files,
                       f"Lab only: SGLang {release}'s bench_serving for the toolkit's lab containers")


def main(argv: list[str]) -> int:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        print(f"[lab] {PACKAGE} is not installed in this venv: the lab's deploy installs it", file=sys.stderr)
        return 2
    sys.path.insert(0, next(iter(spec.submodule_search_locations)))
    # The venv's torch is the lab lock's stand-in (the engine check imports it). transformers 5.x (0.5.23's lock
    # pins 5.19.0) no longer reads USE_TORCH=0 and takes any importable torch for the real one, so 0.5.9's client
    # failed importing AutoProcessor; it needs no torch, so it runs as in a venv without one (find_spec: None).
    sys.modules["torch"] = None  # type: ignore[assignment]
    sys.argv = ["bench_serving", *argv]
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
