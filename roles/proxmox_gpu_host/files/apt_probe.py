#!/usr/bin/python3
"""Ask every repository apt reads whether it answers, the way `apt-get update` will ask: `apt-get update
--print-uris` lists each source's InRelease (from sources.list, *.list and deb822 *.sources alike, with
`Enabled: no` honoured), and /usr/lib/apt/apt-helper fetches each with apt's own methods, credentials
(/etc/apt/auth.conf.d) and CAs. Read-only: the files go to a temporary directory that is removed.
Prints one JSON line: {"sources": [{"uri", "ok", "error"}]}. Run by the proxmox_gpu_host role's preflight
only when a package must be installed: a host that needs nothing needs no network."""
import json
import re
import subprocess
import tempfile

OPTS = ["-o", "Acquire::Retries=0", "-o", "Acquire::http::Timeout=20", "-o", "Acquire::https::Timeout=20"]


def main() -> None:
    listing = subprocess.run(["apt-get", "update", "--print-uris", *OPTS], capture_output=True, text=True)
    uris = [m.group(1) for m in re.finditer(r"^'([^']+/InRelease)' ", listing.stdout, re.M)]
    results = []
    with tempfile.TemporaryDirectory(prefix="toolkit-apt-probe-") as tmp:
        for i, uri in enumerate(uris):
            proc = subprocess.run(["/usr/lib/apt/apt-helper", *OPTS, "download-file", uri, f"{tmp}/{i}"],
                                  capture_output=True, text=True)
            error = ""
            if proc.returncode != 0:
                lines = (proc.stdout + proc.stderr).splitlines()
                # apt's own words: the indented line under "Err:N URI" ("401  Unauthorized [IP: ...]").
                after = [lines[j + 1].strip() for j, line in enumerate(lines[:-1]) if line.startswith("Err:")]
                error = re.sub(r"\s+", " ", after[0] if after else (lines[-1] if lines else f"rc {proc.returncode}"))
            results.append({"uri": uri, "ok": proc.returncode == 0, "error": error})
    print(json.dumps({"sources": results, "listed": listing.returncode == 0,
                      "list_error": listing.stderr.strip()[-500:]}))


main()
