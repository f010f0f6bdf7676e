"""What the playbook summary makes of a run's events, pure: a changed task's diff for `--diff`, and the fix an
unknown SSH host key gets."""

from __future__ import annotations

from toolkit.core.ansible_summary import diff_text, event_from_runner, host_key_fix


def test_a_file_change_is_a_unified_diff_with_its_headers() -> None:
    result = {"changed": True, "diff": [{"before": "", "after": "blacklist nouveau\noptions nouveau modeset=0\n",
                                         "before_header": "/etc/modprobe.d/blacklist-nouveau.conf",
                                         "after_header": "/etc/modprobe.d/blacklist-nouveau.conf"}]}
    assert diff_text(result).splitlines() == [
        "--- /etc/modprobe.d/blacklist-nouveau.conf", "+++ /etc/modprobe.d/blacklist-nouveau.conf", "@@ -0,0 +1,2 @@",
        "+blacklist nouveau", "+options nouveau modeset=0"]


def test_prepared_text_a_state_change_and_a_loops_items_are_shown_and_a_hidden_one_is_not() -> None:
    assert diff_text({"diff": {"prepared": "The following NEW packages will be installed:\n  dkms\n"}}) == (
        "The following NEW packages will be installed:\n  dkms")
    assert diff_text({"diff": {"before": {"state": "absent"}, "after": {"state": "directory"}}}) == (
        "- {'state': 'absent'}\n+ {'state': 'directory'}")
    loop = {"results": [{"diff": [{"before": "a\n", "after": "b\n"}]}, {"diff": []}, {"diff": [{"before": "c\n",
                                                                                              "after": "d\n"}]}]}
    assert [line for line in diff_text(loop).splitlines() if line[:1] in "+-" and line[:3] not in ("---", "+++")] == [
        "-a", "+b", "-c", "+d"]
    assert diff_text({"censored": "the output has been hidden", "diff": [{"before": "k", "after": "s"}]}) == ""
    assert diff_text({"changed": True}) == ""


def test_an_unknown_host_key_gets_the_fix_naming_its_address() -> None:
    raw = {"event": "runner_on_unreachable", "counter": 3, "event_data": {
        "host": "pve1", "task": "Gathering Facts", "res": {"unreachable": True, "msg": (
            'Task failed: Data could not be sent to remote host "192.0.2.10". Make sure this host can be reached '
            "over ssh: Host key verification failed.")}}}
    message = event_from_runner(raw).message
    assert message.startswith("Task failed: Data could not be sent")
    assert "ssh-keyscan -H 192.0.2.10 >> ~/.ssh/known_hosts" in message and "ssh-keygen -R 192.0.2.10" in message
    assert "StrictHostKeyChecking=accept-new" in message
    assert host_key_fix("Connection timed out during banner exchange") == "Connection timed out during banner exchange"


def test_mitogens_refusal_of_a_host_key_gets_the_fix_with_the_address_from_the_inventory() -> None:
    # Mitogen's SSH (the toolkit's strategy) names no address: the adapter passes the inventory's.
    raw = {"event": "runner_on_unreachable", "counter": 4, "event_data": {
        "host": "pve1", "task": "ping", "res": {"unreachable": True, "msg": (
            "Host key checking is enabled, and SSH reported an unrecognized or mismatching host key.")}}}
    message = event_from_runner(raw, {"pve1": "192.0.2.11"}).message
    assert message.startswith("Host key checking is enabled")
    assert "ssh-keyscan -H 192.0.2.11 >> ~/.ssh/known_hosts" in message
    assert "ssh-keyscan -H ADDRESS" in event_from_runner(raw).message
