"""Lab only: stand-in wheels for the engine lock's GPU-only lines, and the lab's lock that names them.

A real engine lock (profiles/requirements/sglang-VERSION-cpNN.lock) holds the CUDA build of torch, triton,
FlashInfer, sgl-kernel and NVIDIA's CUDA libraries: several GB, useless without a GPU, too much to download on
every CI run. The lab installs the lock the way a real host does (sglang_venv: pip --require-hashes --no-deps),
from a lab lock that is the real one with those lines' files replaced:
- a line is a stand-in when its distribution is of a GPU-only family (`GPU_ONLY_FAMILIES`: torch and its
  torch* companions, triton, flashinfer*, sgl-kernel (sglang-kernel from 0.5.23), nvidia-*, cuda-*), unless its
  wheel is pure Python (`py3-none-any`) outside the import-bearing names (nvidia-ml-py, cuda-pathfinder: small,
  and real);
- its stand-in is a wheel of the same distribution name and version, built here, whose module announces itself
  as a lab stand-in when imported and has nothing else (any attribute is refused with that message). The module
  has the real import name only for the distributions the engine check imports (torch, triton, sgl_kernel,
  flashinfer); the others' is `lab_standin_<name>`, so a library that looks for an optional package by its
  module (transformers imports torchvision.transforms when it finds torchvision) finds it absent, as the lab's
  venv had it before the lock, instead of taking a stand-in for the real thing;
- the lab lock keeps every other line (its real wheels come from the lock's wheelhouse, hash-checked) and marks
  each stand-in line with a `# LAB STAND-IN` comment; the toolkit's lock parser reads it as any lock.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from toolkit.adapters.files import write_atomic
from toolkit.core.engine_lock import EngineLock, LockEntry, format_lock, parse_lock

GPU_ONLY_FAMILIES = re.compile(r"^(torch|torch-.+|torchaudio|torchvision|torchao|torchcodec|triton|flashinfer-.+|"
                               r"sgl-kernel|sglang-kernel|nvidia-.+|cuda-.+)$")
# Distributions whose import name is not their own name with '-' as '_' (what SGLang imports them as).
IMPORT_NAMES = {"flashinfer-python": "flashinfer", "flashinfer-cubin": "flashinfer_cubin",
                "sglang-kernel": "sgl_kernel"}
# Families whose pure-Python wheels are still stand-ins: their modules import torch or CUDA at import time.
ALWAYS_STANDIN = re.compile(r"^(torch.*|triton|flashinfer-.+|sgl-kernel|sglang-kernel)$")
MARK = "# LAB STAND-IN (toolkit lab): not the real wheel; a module that says so when imported (no GPU here)"


def is_standin(entry: LockEntry) -> bool:
    """Is this lock line replaced by a stand-in in the lab (the rule in the module's docstring)?"""
    if not GPU_ONLY_FAMILIES.match(entry.name):
        return False
    pure = (entry.wheel or "").endswith("-none-any.whl")
    return not pure or bool(ALWAYS_STANDIN.match(entry.name))


def import_name(distribution: str) -> str:
    return IMPORT_NAMES.get(distribution, distribution.replace("-", "_"))


def _module_text(entry: LockEntry, module: str) -> str:
    return (
        f'"""LAB STAND-IN (toolkit lab): not {entry.name} {entry.version}. The lab has no GPU, so its lock installs\n'
        "this module in the real wheel's place (toolkit/lab/engine_standins.py): it imports, says so, and has\n"
        'nothing else."""\n\n'
        "import sys\n\n"
        "LAB_STANDIN = True\n"
        f"__version__ = {entry.version!r}\n"
        f"print('[lab] {module} is a lab stand-in for {entry.name} {entry.version}: no GPU here',\n"
        "      file=sys.stderr)\n\n\n"
        "def __getattr__(name):\n"
        f"    raise AttributeError('{module}.' + name + ': {module} is a lab stand-in for {entry.name} "
        f"{entry.version} and has nothing of it')\n"
    )


def write_wheel(dest: Path, distribution: str, version: str, files: Mapping[str, bytes], summary: str) -> Path:
    """A py3-none-any wheel of these files with its dist-info; deterministic (sorted members, fixed times), written
    under a temporary name and renamed into place."""
    stem = f"{distribution.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
                                   f"Summary: {summary}\n").encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: toolkit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    # RECORD is CSV (PEP 376): a name with a comma must stay in one field.
    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")
    for name, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.writerow([name, f"sha256={digest}", len(data)])
    rows.writerow([f"{info}/RECORD", "", ""])
    members[f"{info}/RECORD"] = record.getvalue().encode()
    import zipfile

    out = dest / f"{stem}-py3-none-any.whl"
    # Built in memory and written by the one atomic writer: applies of several test shards build the same
    # stand-in at once on a cold cache, and a fixed `.tmp` name let one's rename take the other's file away.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), members[name])
    write_atomic(out, buf.getvalue())
    return out


def build_standin(entry: LockEntry, dest: Path, *, importable: bool) -> Path:
    """The stand-in wheel of one lock line: same distribution name and version; its module under the real import
    name when `importable` (the engine check imports it), else under `lab_standin_<name>`."""
    module = import_name(entry.name) if importable else "lab_standin_" + entry.name.replace("-", "_")
    return write_wheel(dest, entry.name, entry.version, {f"{module}/__init__.py": _module_text(entry, module).encode()},
                       f"Lab stand-in for {entry.name} {entry.version} (toolkit lab; no GPU)")


@dataclass(frozen=True)
class LabLock:
    lock: EngineLock  # the lab lock, as parsed back from its text
    text: str
    standins: dict[str, Path]  # distribution -> its stand-in wheel
    real: tuple[LockEntry, ...]  # the lines whose real wheels the lab installs


def lab_lock(real: EngineLock, source: str, standin_dir: Path, importable: Collection[str] = ()) -> LabLock:
    """The lab's lock of `real` (named `source`): the GPU-only lines' files replaced by stand-ins built into
    `standin_dir` (importable under their real module name: the distributions `importable` names), each marked,
    the rest unchanged."""
    standin_dir.mkdir(parents=True, exist_ok=True)
    wheels: dict[str, Path] = {}
    entries = []
    for e in real.entries:
        if is_standin(e):
            # A stand-in's two builds (its module under the real name or not) have one file name: each in a
            # directory of its own, so a path's bytes never change. In one directory, a shard's apply of a profile
            # whose engine check imports flashinfer rewrote the wheel another shard had just hashed into its lab
            # lock, and that lock's install met the other build (a hash mismatch; seen in a cold CI run).
            importable_here = e.name in importable
            wheel = build_standin(e, standin_dir / ("real-module" if importable_here else "lab-module"),
                                  importable=importable_here)
            wheels[e.name] = wheel
            e = replace(e, sha256s=(hashlib.sha256(wheel.read_bytes()).hexdigest(),), wheel=wheel.name)
        entries.append(e)
    lock = EngineLock(real.sglang_version, real.python, tuple(entries), index_url=real.index_url,
                      pip_version=real.pip_version)
    text = format_lock(lock)
    for name, wheel in wheels.items():
        text = text.replace(f"# wheel: {wheel.name}\n", f"{MARK}: {name}\n# wheel: {wheel.name}\n", 1)
    header = (f"# LAB LOCK (toolkit lab): {source} with {len(wheels)} GPU-only line(s) replaced by lab stand-ins,\n"
              "# each marked below. Never for a real host.\n")
    text = header + text
    return LabLock(parse_lock(text, f"lab lock of {source}"), text, wheels,
                   tuple(e for e in real.entries if e.name not in wheels))
