"""Can this venv start SGLang? Run with the venv's own python before the unit is (re)started, and by anything
that starts the server later (the lab's stand-in server runs it at start): `VENV/bin/python engine_check.py
INPUTS.json`. Prints one JSON line {"ok", "error", "missing", "other_version", "extra", "imports", "notes"};
exits 0 when the venv can start SGLang, 1 when it cannot, 2 on unreadable inputs.

Two checks, both whole before either fails:
- the venv's distributions equal its lock: each locked distribution installed at its locked version, nothing
  else installed (an extra wheel the deploy was given counts as locked at its own version; the venv's own pip
  and setuptools, which `python -m venv` seeds, count unless the lock names them at another version);
- it imports what `sglang.launch_server` imports for the profile (torch, sglang.srt.server_args, the backend
  packages the profile names). A failed import names the lock line that should have brought the module. A
  module that cannot load only because this container has no CUDA driver or GPU passes: the import itself is
  what a container without GPU access can prove.

The inputs are written by the toolkit (toolkit.core.deploy.engine_check_inputs), from the lock it parsed:
{"lock": the lock as the controller names it, "lock_digest", "distributions": {normalized name: version},
"imports": [{"module", "distribution"}], "extra_wheels": [wheel file names], "notes": [...]}. This file never
reads the lock itself: the toolkit's lock parser is the only one.

Standard library only: it runs in a venv that holds nothing of the toolkit.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import sys
import sysconfig
import traceback

SCHEMA = 1
# What `python -m venv` puts into every venv (ensurepip): not the lock's business unless the lock names them.
VENV_SEED = ("pip", "setuptools")
# An import that fails only for want of a CUDA driver or device (a container without GPU access): libcuda is
# loaded by torch's and the kernels' extension modules; the messages are CUDA's and the loader's own.
NO_CUDA = re.compile(r"libcuda\.so|libnvidia-ml\.so|CUDA driver|no CUDA-capable device|cuInit|"
                     r"Found no NVIDIA driver|NVIDIA driver on your system|CUDA_ERROR_NO_DEVICE")


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(name, version) of a wheel file name, NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl (PEP 427)."""
    parts = filename.rsplit("/", 1)[-1].split("-")
    return normalize(parts[0]), parts[1]


def installed(paths: list[str] | None = None) -> dict[str, str]:
    """{normalized name: version} of the distributions in this interpreter's site-packages only."""
    if paths is None:
        paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    out: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name:
            out[normalize(name)] = dist.version
    return out


def compare(expected: dict[str, str], have: dict[str, str]) -> dict[str, list[str]]:
    missing = [f"{n}=={v}" for n, v in sorted(expected.items()) if n not in have]
    other = [f"{n} {have[n]} (the lock: {n}=={v})" for n, v in sorted(expected.items())
             if n in have and have[n] != v]
    extra = [f"{n} {v}" for n, v in sorted(have.items()) if n not in expected and n not in VENV_SEED]
    return {"missing": missing, "other_version": other, "extra": extra}


def try_import(module: str) -> tuple[str, str]:
    """("ok" | "no-cuda" | "failed", detail)."""
    try:
        importlib.import_module(module)
    except BaseException as err:  # any failure to import is the finding, SystemExit included
        detail = f"{type(err).__name__}: {err}"
        if NO_CUDA.search(detail) or NO_CUDA.search("".join(traceback.format_exception_only(type(err), err))):
            return "no-cuda", detail
        return "failed", detail
    return "ok", ""


def missing_library(detail: str) -> str:
    """The shared library the dynamic loader could not find, from an import error's text ('' when it is not one)."""
    match = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", detail)
    return match.group(1) if match else ""


def check(inputs: dict, *, paths: list[str] | None = None) -> dict:
    """The check's result for these inputs, in this interpreter."""
    if inputs.get("schema", SCHEMA) > SCHEMA:
        raise ValueError(f"inputs schema {inputs.get('schema')} is newer than this check reads ({SCHEMA})")
    lock = inputs["lock"]
    locked = {normalize(n): str(v) for n, v in inputs["distributions"].items()}
    expected = dict(locked)
    overridden = []
    for wheel in inputs.get("extra_wheels", []):
        name, version = wheel_name_version(wheel)
        if name in locked and locked[name] != version:
            overridden.append(f"{name} {version} (an extra wheel, in place of the lock's {name}=={locked[name]})")
        expected[name] = version
    have = installed(paths)
    for seed in VENV_SEED:  # a seed the lock names must be the lock's version; otherwise any
        if seed not in expected:
            have.pop(seed, None)
    diff = compare(expected, have)
    imports = []
    failed = []
    for item in inputs.get("imports", []):
        module, dist = item["module"], normalize(item["distribution"])
        status, detail = try_import(module)
        line = f"{dist}=={expected[dist]}" if dist in expected else f"{dist} (not in the lock)"
        imports.append({"module": module, "status": status, "detail": detail, "lock_line": line})
        if status == "failed":
            library = missing_library(detail)
            if library:
                # The distribution is there; a system library its native code links is not (sgl-kernel and
                # libnuma.so.1 on Proxmox's debian-12-standard): the lock cannot bring it, a Debian package does.
                failed.append(f"import {module} failed: the system library {library} it links is missing from the "
                              f"container (the distribution itself is installed: {line}); install the Debian package "
                              f"that provides {library} (container_nvidia_userspace_packages), then deploy again")
            else:
                failed.append(f"import {module} failed ({detail}); the lock line that should bring it: {line} in "
                              f"{lock}")
    problems = []
    if diff["missing"]:
        problems.append("missing " + ", ".join(diff["missing"]))
    if diff["other_version"]:
        problems.append("other version " + ", ".join(diff["other_version"]))
    if diff["extra"]:
        problems.append("not in the lock " + ", ".join(diff["extra"]))
    error = None
    if problems or failed:
        parts = []
        if problems:
            parts.append(f"the venv {sys.prefix} differs from its lock {lock}: " + "; ".join(problems))
        parts.extend(failed)
        error = ". ".join(parts)
    notes = list(inputs.get("notes", [])) + overridden
    notes += [f"import {i['module']}: CUDA absent here ({i['detail']})" for i in imports if i["status"] == "no-cuda"]
    return {"ok": error is None, "error": error, **diff, "imports": imports, "notes": notes,
            "lock": lock, "lock_digest": inputs.get("lock_digest", ""), "prefix": sys.prefix}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(json.dumps({"ok": False, "error": "usage: python engine_check.py INPUTS.json"}))
        return 2
    try:
        with open(argv[0], encoding="utf-8") as fh:
            inputs = json.load(fh)
        result = check(inputs)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(json.dumps({"ok": False, "error": f"cannot read the check's inputs {argv[0]}: {err}"}))
        return 2
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
