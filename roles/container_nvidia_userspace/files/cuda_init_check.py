#!/usr/bin/env python3
"""cuInit(0) through ctypes, as the CUDA runtime does at a server's start; prints one JSON line.

Exit 0 when CUDA initialises and sees at least one device, 1 otherwise. rc 3 is
CUDA_ERROR_NOT_INITIALIZED: inside an LXC container with nvidia-smi working, the nvidia_uvm HMM
symptom (NVIDIA/open-gpu-kernel-modules#797, #901, #947).
"""
import ctypes
import json
import sys


def main() -> int:
    out = {"library": "libcuda.so.1"}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        out.update(ok=False, rc=None, error="cannot load libcuda.so.1: %s" % err)
        print(json.dumps(out))
        return 1
    rc = lib.cuInit(0)
    out["rc"] = rc
    name = ctypes.c_char_p()
    if rc != 0 and hasattr(lib, "cuGetErrorName") and lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
        out["error"] = name.value.decode()
    count = ctypes.c_int(0)
    if rc == 0:
        lib.cuDeviceGetCount(ctypes.byref(count))
        version = ctypes.c_int(0)
        lib.cuDriverGetVersion(ctypes.byref(version))
        out["cuda_driver_version"] = version.value
    out["device_count"] = count.value
    out["ok"] = rc == 0 and count.value > 0
    print(json.dumps(out))
    return 0 if out["ok"] else 1


sys.exit(main())
