#!/usr/bin/python3
"""One look at the SGLang unit while the role waits for it: /health's status and whether the server's process has
exited. The role's wait repeats it (`until:`), so a server that dies while starting (a module missing from the
venv, a flag the release refuses) fails the deploy within one poll, not after the health timeout: under
Restart=on-failure systemd would otherwise restart it every RestartSec for the whole wait. Read-only.

Usage: sglang_service_health.py URL UNIT RESTARTS_BEFORE. Prints one JSON line:
{"status": /health's HTTP status (0: nothing answered), "healthy", "exited", "reason" (why it counts as exited,
"" while it runs or starts), "unit": the unit's systemctl show properties}."""
import json
import subprocess
import sys
import urllib.error
import urllib.request

PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ExecMainStatus")


def exit_reason(props, restarts_before):
    """Why the unit's server counts as exited, from its `systemctl show` properties; "" while it runs or starts.
    The main PID alone cannot tell: it is 0 while ExecStartPre runs too."""
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    status = props.get("ExecMainStatus", "")
    how = f"exit status {status}" if status not in ("", "0") else f"result {props.get('Result', '') or 'unknown'}"
    restarts = int(props.get("NRestarts", "0") or 0)
    if active == "failed":
        return f"the unit failed ({how})"
    if sub == "auto-restart":
        return f"its process exited ({how}); systemd will restart it (Restart=on-failure)"
    if restarts > restarts_before:
        return f"systemd restarted it {restarts - restarts_before} time(s) since the wait began ({how})"
    if active in ("inactive", "deactivating"):
        return f"the unit stopped ({how})"
    return ""


def health_status(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError):
        return 0


def main(argv):
    url, unit, restarts_before = argv[0], argv[1], int(argv[2] or 0)
    status = health_status(url)
    shown = subprocess.run(["systemctl", "show", *(f"--property={k}" for k in PROPERTIES), unit],
                           capture_output=True, text=True, check=True)
    props = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    # A healthy answer wins: the process that answered is alive, whatever a racing read of the unit says.
    reason = "" if status == 200 else exit_reason(props, restarts_before)
    print(json.dumps({"status": status, "healthy": status == 200, "exited": bool(reason), "reason": reason,
                      "unit": props}, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
