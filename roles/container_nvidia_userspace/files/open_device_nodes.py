#!/usr/bin/env python3
"""Open each NVIDIA device node in /dev and report how: one JSON line {node: result}.

"ok" (a driver answered), "ENXIO" (the cgroup allows the node, but no driver owns its major),
"EPERM" (the container's device cgroup does not allow the node's major:minor: a wrong or stale
major in its rules), or another errno name.
"""
import errno
import glob
import json
import os

result = {}
for node in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")):
    if os.path.isdir(node):
        continue
    st = os.stat(node)
    entry = {"major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)}
    try:
        fd = os.open(node, os.O_RDWR)
        os.close(fd)
        entry["open"] = "ok"
    except OSError as err:
        entry["open"] = errno.errorcode.get(err.errno, str(err.errno))
    result[node] = entry
print(json.dumps(result, sort_keys=True))
