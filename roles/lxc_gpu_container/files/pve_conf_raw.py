"""The role's raw `lxc.*` lines in /etc/pve/lxc/VMID.conf, edited under Proxmox's own config lock.

`pct set` cannot write raw keys, so the file is edited, but as Proxmox edits it: holding
/run/lock/lxc/pve-config-VMID.lock (pve-container Config.pm config_file_lock, the flock every
`pct set` takes), read, change, write a temp file beside it without chmod/chown (pmxcfs allows
neither but 0640/0600 and root:www-data; Ansible's lineinfile chmods its temp file and fails there,
ansible/ansible#70535) and rename it over the config (PVE::Tools::file_set_contents does the same).

Only lines the toolkit wrote are ever removed: they are recorded in a state file on the host
(a `#` comment cannot mark them: Proxmox turns every comment line into the description). The
user's own lines, the pending section and snapshots stay byte for byte. Lines of a device major
no driver registers that are not the toolkit's are reported, not removed.

argv: VMID CONF RECORD PROC_DEVICES DESIRED_JSON CHECK(0|1). Prints one JSON line.
Runs with the Proxmox host's python3 standard library only.
"""

import fcntl
import json
import os
import re
import signal
import sys

LOCK_DIR = "/run/lock/lxc"
RAW = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$")
ALLOW = re.compile(r"^c (\d+):(\*|\d+) [rwm]+$")


def lock(vmid):
    """Proxmox's lock_file_full: a non-blocking try, then a blocking flock under a 10 s alarm (so the lock
    is taken the moment its holder lets go, not at the next poll), with Proxmox's messages."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    fh = open(os.path.join(LOCK_DIR, "pve-config-%s.lock" % vmid), "a")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fh
    except BlockingIOError:
        sys.stderr.write("trying to acquire lock...")
        sys.stderr.flush()

    def rang(signum, frame):
        raise TimeoutError

    signal.signal(signal.SIGALRM, rang)
    signal.alarm(10)  # AbstractConfig.pm lock_config: 10 s
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
    except TimeoutError:
        sys.exit("\ncan't lock file '%s' - got timeout" % fh.name)
    finally:
        signal.alarm(0)
    sys.stderr.write(" OK\n")
    return fh


def registered_majors(path):
    majors, section = set(), ""
    try:
        text = open(path).read()
    except OSError:
        return majors
    for line in text.splitlines():
        if line.endswith(":"):
            section = line
        elif section.startswith("Character") and line.split() and line.split()[0].isdigit():
            majors.add(int(line.split()[0]))
    return majors


def edit(text, owned, desired):
    """(new text, added, removed): owned-but-not-desired lines out, missing desired lines appended
    to the main section; nothing else moves."""
    lines = text.split("\n")
    end = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    while end > 0 and not lines[end - 1].strip():
        end -= 1
    main, rest = lines[:end], lines[end:]
    want = {"%s: %s" % (k, v) for k, v in desired}
    mine = {"%s: %s" % (k, v) for k, v in owned}
    removed = [line for line in main if line in mine and line not in want]
    kept = [line for line in main if not (line in mine and line not in want)]
    present = set(kept)
    added = ["%s: %s" % (k, v) for k, v in desired if "%s: %s" % (k, v) not in present]
    return "\n".join(kept + added + rest), added, removed


def main():
    vmid, conf, record, proc_devices, desired_json, check = sys.argv[1:7]
    desired = [list(x) for x in json.loads(desired_json)]
    fh = lock(vmid)
    try:
        try:
            owned = json.load(open(record)).get("lines", [])
        except (OSError, ValueError):
            owned = []
        text = open(conf).read()
        new, added, removed = edit(text, owned, desired)
        majors = registered_majors(proc_devices)
        foreign = []
        for line in new.split("\n"):
            if line.startswith("["):
                break
            m = RAW.match(line)
            if m and m.group(1).endswith("devices.allow") and [m.group(1), m.group(3)] not in desired:
                a = ALLOW.match(m.group(3))
                if a and majors and int(a.group(1)) not in majors:
                    foreign.append(line)
        changed = new != text
        if check != "1":
            os.makedirs(os.path.dirname(record), exist_ok=True)
        if changed and check != "1":
            tmp = "%s.tmp.%d" % (conf, os.getpid())
            with open(tmp, "w") as out:
                out.write(new)
            os.rename(tmp, conf)
            # The running container sees raw lines only at its next start; the role restarts it
            # when this file exists, so a run killed before the restart still restarts next time.
            open(os.path.join(os.path.dirname(record), "%s.restart" % vmid), "w").close()
        if check != "1":
            tmp = record + ".tmp"
            with open(tmp, "w") as out:
                json.dump({"schema": 1, "vmid": int(vmid), "lines": desired}, out, indent=1)
            os.rename(tmp, record)
    finally:
        fh.close()
    print(json.dumps({"changed": changed, "added": added, "removed": removed, "foreign_stale": foreign}))


if __name__ == "__main__":
    main()
