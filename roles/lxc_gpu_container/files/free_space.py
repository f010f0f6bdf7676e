#!/usr/bin/python3
"""The free space where a directory is (or would be made): statvfs of its nearest existing ancestor, and
what the directory already holds. Read-only. Prints one JSON line: {"mount", "avail_gib", "used_here_gib"}."""
import json
import os
import sys

path = os.path.abspath(sys.argv[1])
probe = path
while not os.path.exists(probe):
    probe = os.path.dirname(probe)
st = os.statvfs(probe)
used = 0
for dirpath, _dirs, files in os.walk(path):
    for name in files:
        try:
            used += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        except OSError:
            continue
mount = probe
while not os.path.ismount(mount):
    mount = os.path.dirname(mount)
gib = 1024 ** 3
print(json.dumps({"mount": mount, "avail_gib": round(st.f_bavail * st.f_frsize / gib, 1),
                  "used_here_gib": round(used / gib, 1)}))
