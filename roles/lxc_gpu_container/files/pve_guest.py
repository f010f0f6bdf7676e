#!/usr/bin/python3
"""Start or stop a Proxmox container the way that works for it, and wait until it has.

    pve_guest.py start|stop VMID [TIMEOUT_S] [CHECK(0|1)]

For a container the HA stack manages (`ha-manager config` lists ct:VMID, state not `ignored`), `pct start`
and `pct shutdown` only file a request with the HA stack and return at once (pve-container
API2/LXC/Status.pm: "Requesting HA start for CT 100"); the LRM acts a round later, and a `pct start` before
that dies with "CT 100 already running". So the HA resource's state is set (`ha-manager set ct:VMID
--state started|stopped`, which the HA stack then enforces) and this waits, up to TIMEOUT_S, until
`pct status` shows it. Other containers: `pct start`, or `pct shutdown --timeout 60 --forceStop 1`.
Prints one JSON line: {"changed", "ha", "ha_state", "status"}. Used by the proxmox_gpu_host and
lxc_gpu_container roles."""
import json
import subprocess
import sys
import time


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True)


def ha_state(vmid: str) -> str:
    """The HA resource's configured state for ct:VMID ('' when it is not HA-managed): `ha-manager config`
    prints `ct:100` and its `\tkey value` lines (pve-ha-manager CLI/ha_manager.pm)."""
    proc = run("ha-manager", "config")
    if proc.returncode != 0:
        return ""
    blocks: dict[str, dict[str, str]] = {}
    current = ""
    for line in proc.stdout.splitlines():
        if line and not line[0].isspace():
            current = line.strip()
            blocks[current] = {}
        elif current and line.strip():
            key, _, value = line.strip().partition(" ")
            blocks[current][key] = value.strip()
    resource = blocks.get(f"ct:{vmid}")
    return "" if resource is None else resource.get("state", "started")


def status(vmid: str) -> str:
    out = run("pct", "status", vmid).stdout
    return "running" if "status: running" in out else "stopped"


def fail(message: str) -> None:
    print(json.dumps({"failed": True, "msg": message}))
    sys.exit(1)


def main() -> None:
    action, vmid = sys.argv[1], sys.argv[2]
    timeout_s = float(sys.argv[3]) if len(sys.argv) > 3 else 180.0
    check = len(sys.argv) > 4 and sys.argv[4] == "1"
    want = "running" if action == "start" else "stopped"
    state = ha_state(vmid)
    ha = state not in ("", "ignored")
    before = status(vmid)
    if before == want and (not ha or state == ("started" if action == "start" else "stopped")):
        print(json.dumps({"changed": False, "ha": ha, "ha_state": state, "status": before}))
        return
    if check:
        print(json.dumps({"changed": True, "ha": ha, "ha_state": state, "status": before}))
        return
    if ha:
        proc = run("ha-manager", "set", f"ct:{vmid}", "--state", "started" if action == "start" else "stopped")
    elif before != want:
        proc = run("pct", "start", vmid) if action == "start" else run("pct", "shutdown", vmid, "--timeout", "60",
                                                                      "--forceStop", "1")
    else:
        proc = run("true")
    if proc.returncode != 0:
        fail(f"{' '.join(proc.args)}: {(proc.stderr or proc.stdout).strip()}")
    deadline = time.monotonic() + timeout_s
    while status(vmid) != want:
        if time.monotonic() > deadline:
            fail(f"CT {vmid} is not {want} {timeout_s:.0f} s after "
                 f"{'the HA request (ha-manager status shows why)' if ha else ' '.join(proc.args)}")
        time.sleep(1)
    print(json.dumps({"changed": True, "ha": ha, "ha_state": "started" if ha and action == "start" else
                      ("stopped" if ha else state), "status": want}))


main()
