"""Does the container have what SGLang's JIT paths need? Prints one JSON line {"ok", "checks", "error"}.

Triton builds a small C launcher for every kernel at first use (triton/runtime/build.py `_build`):
$CC, else gcc, else clang ("Failed to find C compiler. Please specify via CC environment
variable."), with the interpreter's Python.h, `-shared -fPIC`. That exact build is done here with a
tiny extension module, which is then imported. Where triton and a GPU are present, a real Triton
kernel is compiled and run as well. FlashInfer's JIT needs g++ (checked) and nvcc (the CUDA
toolkit, container_nvidia_userspace_cuda_install_method).
Runs with the SGLang venv's python.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

SRC = r"""
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "toolkit_jit_check", NULL, -1, methods};
PyMODINIT_FUNC PyInit_toolkit_jit_check(void) { return PyModule_Create(&module); }
"""


def launcher_build(checks):
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return "Failed to find C compiler. Please specify via CC environment variable. (Triton's launcher build)"
    include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        return "Python.h is not in %s (python3-dev missing): Triton cannot build its launcher" % include
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "main.c")
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        so = os.path.join(tmp, "toolkit_jit_check" + suffix)
        with open(src, "w") as fh:
            fh.write(SRC)
        proc = subprocess.run([cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, "-I" + include],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            return "%s could not build a Python extension: %s" % (cc, proc.stderr.strip()[-400:])
        spec = importlib.util.spec_from_file_location("toolkit_jit_check", so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if mod.answer() != 42:
            return "the compiled extension returned the wrong value"
    checks.append("launcher build: %s + %s/Python.h" % (cc, include))
    if shutil.which("g++") is None:
        return "no g++: FlashInfer's JIT cannot compile"
    checks.append("g++: %s" % shutil.which("g++"))
    return None


def triton_kernel(checks):
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        checks.append("triton kernel: skipped (triton or torch not installed in this venv)")
        return None
    # Whether torch imports is the engine check's finding (engine_check.py, with the lock line that brings it);
    # here a torch that cannot say whether CUDA is there only means no kernel can run.
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception as err:
        checks.append("triton kernel: skipped (torch cannot tell whether CUDA is there: %s: %s)"
                      % (type(err).__name__, err))
        return None
    if not cuda:
        checks.append("triton kernel: skipped (no CUDA device)")
        return None
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    x = torch.arange(64, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    add[(1,)](x, x, out, 64, BLOCK=64)
    if not torch.equal(out, x * 2):
        return "the Triton kernel computed a wrong result"
    checks.append("triton kernel: compiled and ran (triton %s)" % triton.__version__)
    return None


def main():
    checks = []
    try:
        error = launcher_build(checks) or triton_kernel(checks)
    except Exception as err:  # a JIT failure of any kind fails the check with its message
        error = "%s: %s" % (type(err).__name__, err)
    print(json.dumps({"ok": error is None, "checks": checks, "error": error}))


main()
sys.exit(0)
