"""The installer a host's engine venv is filled with: uv, pinned by its version and its wheel's sha256.

The sglang_venv role installs the engine lock exactly (`--require-hashes --no-deps -r LOCK`, from the wheelhouse
or an index). pip does it in Python, a file at a time: on the lab's 169-wheel lock (`--no-compile`, what CI
does eleven times) Debian 12's pip 23.0.1 took 16.8 s of CPU, 9.8 of them in user space, and uv 10.9 s, 1.7 in
user space, in a third of pip's wall time (benchmarks/bench_lock_install.py, medians of 3; docs/apply.md).
SGLang's own install guide uses uv. What is installed is the same: the lock's files, each wheel
checked against its sha256, nothing outside the lock. The binary comes from uv's own wheel on PyPI, checked
against the sha256 below like a lock's line, and is copied to the host's tools/ directory beside the venvs when a
venv is to be installed (it needs no Python and no internet there).
"""

from __future__ import annotations

from toolkit.core.engine_lock import LockEntry

UV_VERSION = "0.13.9"
# The manylinux x86_64 wheel: the engine locks are for Linux x86_64 (engine_lock.PLATFORM_TAGS).
UV = LockEntry(name="uv", version=UV_VERSION,
               sha256s=("d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",),
               wheel=f"uv-{UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
# Where the executable sits in that wheel (a wheel's scripts go under NAME-VERSION.data/scripts/).
UV_WHEEL_MEMBER = f"uv-{UV_VERSION}.data/scripts/uv"
