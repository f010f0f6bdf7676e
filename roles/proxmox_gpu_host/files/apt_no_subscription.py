#!/usr/bin/python3
"""Switch a Proxmox VE host without a subscription from the enterprise repositories its installer enables
(which answer 401 without a key) to the no-subscription ones, as pve-docs' "Package Repositories" says:
a `deb https://enterprise.proxmox.com/...` line is commented out (PVE 8's .list files), a deb822 stanza gets
`Enabled: no` (PVE 9's .sources files), and for each repository disabled its no-subscription twin is added
(pve-no-subscription for pve, no-subscription for a Ceph release) unless the host has it already.

    apt_no_subscription.py CHECK(0|1)

Writes each file atomically (temporary file beside it, rename), keeping its mode. Prints one JSON line:
{"changed", "disabled": [repository lines], "added": [files]}."""
import json
import os
import re
import sys

SOURCES_DIR = "/etc/apt/sources.list.d"
ENTERPRISE = re.compile(r"^(\s*)(deb\s+(?:\[[^]]*\]\s+)?https?://enterprise\.proxmox\.com/debian/(\S+)\s+(\S+)\s+.*)$")
KEYRING = "/usr/share/keyrings/proxmox-archive-keyring.gpg"


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def write(path: str, text: str, check: bool) -> None:
    if check:
        return
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
    tmp = f"{path}.toolkit-tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def one_line_files() -> list[str]:
    files = ["/etc/apt/sources.list"] if os.path.exists("/etc/apt/sources.list") else []
    if os.path.isdir(SOURCES_DIR):
        files += sorted(os.path.join(SOURCES_DIR, n) for n in os.listdir(SOURCES_DIR) if n.endswith(".list"))
    return files


def deb822_files() -> list[str]:
    if not os.path.isdir(SOURCES_DIR):
        return []
    return sorted(os.path.join(SOURCES_DIR, n) for n in os.listdir(SOURCES_DIR) if n.endswith(".sources"))


def enabled_repos() -> list[tuple[str, str, str, str]]:
    """(host, repo, suite, component) of every enabled Proxmox source, both formats."""
    found = []
    for path in one_line_files():
        for line in read(path).splitlines():
            m = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?https?://(\S+?)\.proxmox\.com/debian/(\S+)\s+(\S+)\s+(.*)$", line)
            if m:
                found += [(m.group(1), m.group(2).rstrip("/"), m.group(3), c) for c in m.group(4).split()]
    for path in deb822_files():
        for stanza in re.split(r"\n\s*\n", read(path)):
            fields = dict((k.strip().lower(), v.strip()) for k, _, v in
                          (ln.partition(":") for ln in stanza.splitlines() if ":" in ln and not ln.startswith("#")))
            if fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                m = re.match(r"https?://(\S+?)\.proxmox\.com/debian/(\S+)", uri)
                if m:
                    found += [(m.group(1), m.group(2).rstrip("/"), s, c) for s in fields.get("suites", "").split()
                              for c in fields.get("components", "").split()]
    return found


def main() -> None:
    check = sys.argv[1:] == ["1"]
    disabled, added, deb822_used = [], [], False
    for path in one_line_files():
        lines = read(path).splitlines()
        out, hit = [], False
        for line in lines:
            m = ENTERPRISE.match(line)
            if m:
                out.append(f"{m.group(1)}# disabled by the toolkit (no subscription: 401): {m.group(2)}")
                disabled.append((m.group(3).rstrip("/"), m.group(4), line.strip()))
                hit = True
            else:
                out.append(line)
        if hit:
            write(path, "\n".join(out) + "\n", check)
    for path in deb822_files():
        text = read(path)
        stanzas = re.split(r"(\n\s*\n)", text)
        hit = False
        for i, stanza in enumerate(stanzas):
            if "enterprise.proxmox.com" not in stanza or re.search(r"(?mi)^Enabled:\s*no\s*$", stanza):
                continue
            uris = re.search(r"(?mi)^URIs:\s*(.+)$", stanza)
            suites = re.search(r"(?mi)^Suites:\s*(.+)$", stanza)
            for uri in (uris.group(1).split() if uris else []):
                m = re.match(r"https?://enterprise\.proxmox\.com/debian/(\S+)", uri)
                if m:
                    for suite in (suites.group(1).split() if suites else []):
                        disabled.append((m.group(1).rstrip("/"), suite, f"{os.path.basename(path)}: {uri}"))
            stanzas[i] = re.sub(r"(?mi)^Enabled:.*\n?", "", stanza).rstrip("\n") + "\nEnabled: no"
            hit = deb822_used = True
        if hit:
            write(path, "".join(stanzas).rstrip("\n") + "\n", check)
    have = {(repo, suite) for host, repo, suite, comp in enabled_repos()
            if host == "download" and comp in ("pve-no-subscription", "no-subscription")}
    for repo, suite, _line in disabled:
        if (repo, suite) in have:
            continue
        have.add((repo, suite))
        component = "pve-no-subscription" if repo == "pve" else "no-subscription"
        name = "proxmox" if repo == "pve" else f"{repo}-no-subscription"
        if deb822_used:
            path = os.path.join(SOURCES_DIR, f"{name}.sources")
            text = (f"Types: deb\nURIs: http://download.proxmox.com/debian/{repo}\nSuites: {suite}\n"
                    f"Components: {component}\nSigned-By: {KEYRING}\n")
        else:
            path = os.path.join(SOURCES_DIR, f"{'pve-no-subscription' if repo == 'pve' else name}.list")
            text = f"deb http://download.proxmox.com/debian/{repo} {suite} {component}\n"
        header = "# Added by the toolkit (role proxmox_gpu_host): the host has no subscription.\n"
        existing = read(path) if os.path.exists(path) else ""
        separator = "\n" if deb822_used else ""  # deb822 stanzas are separated by a blank line
        write(path, (existing.rstrip("\n") + "\n" + separator if existing else header) + text, check)
        added.append(path)
    print(json.dumps({"changed": bool(disabled or added), "disabled": [d[2] for d in disabled], "added": added}))


main()
