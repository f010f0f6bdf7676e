"""Fleet preflight on node 0: bind the init port (free?) and accept the other nodes' connections for a few
seconds (reachable?), then close it before SGLang needs it. Prints {"bound": bool, "error": str, "accepted": n}.
argv: BIND PORT SECONDS. Reads nothing and writes nothing on the host."""

import json
import socket
import sys
import time

bind, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    sock.bind((bind, port))
    sock.listen(64)
except OSError as err:
    print(json.dumps({"bound": False, "error": str(err), "accepted": 0}))
    sys.exit(0)
sock.settimeout(0.5)
accepted = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        conn, _ = sock.accept()
    except OSError:
        continue
    accepted += 1
    conn.close()
sock.close()
print(json.dumps({"bound": True, "error": "", "accepted": accepted}))
