"""The ansible-runner adapter, for real: ansible-playbook on localhost (connection=local), writing only under tmp."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from toolkit.adapters.ansible import PlaybookEvent, run_playbook, secrets_from_environment, share_dir
from toolkit.core.errors import ToolkitError

PLAYBOOK = """\
- name: Tiny play
  hosts: all
  gather_facts: false
  tasks:
    - name: Write a file
      ansible.builtin.copy:
        dest: "{{ out }}/plain.txt"
        content: "plain\\n"
        mode: "0644"
    - name: Write the secret
      ansible.builtin.copy:
        dest: "{{ out }}/secret.txt"
        content: "{{ tiny_secret }}"
        mode: "0600"
      no_log: true
    - name: Fail when asked
      ansible.builtin.fail:
        msg: "asked to fail at {{ out }}"
      when: fail_now | default(false) | bool
"""


@pytest.fixture
def local(tmp_path: Path) -> tuple[Path, Path, Path]:
    book = tmp_path / "tiny.yml"
    book.write_text(PLAYBOOK)
    inv = tmp_path / "inventory.yml"
    inv.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    return book, inv, out


def test_run_counts_changes_then_none(local: tuple[Path, Path, Path], tmp_path: Path) -> None:
    book, inv, out = local
    seen: list[PlaybookEvent] = []
    kwargs = dict(inventory=inv, extravars={"out": str(out)}, private_data_dir=tmp_path / "runs",
                  secrets={"tiny_secret": "s3cr3t-value-41"})
    first = run_playbook(str(book), on_event=seen.append, **kwargs)  # type: ignore[arg-type]
    assert first.rc == 0 and first.status == "successful"
    assert first.hosts["localhost"].changed == 2
    assert first.hosts["localhost"].skipped == 1
    assert (out / "plain.txt").read_text() == "plain\n"
    assert (out / "secret.txt").read_text() == "s3cr3t-value-41"
    assert [e.task for e in seen if e.kind == "task_start"] == ["Write a file", "Write the secret", "Fail when asked"]
    assert first.artifacts_dir is not None and (first.artifacts_dir / "job_events").is_dir()

    second = run_playbook(str(book), **kwargs)  # type: ignore[arg-type]
    assert second.rc == 0 and second.hosts["localhost"].changed == 0


def test_failure_names_task_and_message(local: tuple[Path, Path, Path], tmp_path: Path) -> None:
    book, inv, out = local
    result = run_playbook(str(book), inventory=inv, extravars={"out": str(out), "fail_now": True},
                          private_data_dir=tmp_path / "runs", secrets={"tiny_secret": "x-unused-secret"})
    assert result.rc != 0 and result.status == "failed"
    assert result.hosts["localhost"].failed == 1
    assert [(f.host, f.task) for f in result.failures] == [("localhost", "Fail when asked")]
    assert f"asked to fail at {out}" in result.failures[0].message


def test_check_mode_changes_nothing(local: tuple[Path, Path, Path], tmp_path: Path) -> None:
    book, inv, out = local
    result = run_playbook(str(book), inventory=inv, extravars={"out": str(out)}, check=True, diff=True,
                          private_data_dir=tmp_path / "runs", secrets={"tiny_secret": "zz-check-secret"})
    assert result.rc == 0
    assert result.hosts["localhost"].changed == 2  # would change
    assert not (out / "plain.txt").exists()


def test_secrets_never_reach_artifacts(local: tuple[Path, Path, Path], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    book, inv, out = local
    env_secret = "env-borne-secret-8c1f"
    monkeypatch.setenv("TOOLKIT_SECRET_TINY_SECRET", env_secret)
    runs = tmp_path / "runs"
    result = run_playbook(str(book), inventory=inv, extravars={"out": str(out)}, private_data_dir=runs)
    assert result.rc == 0
    assert (out / "secret.txt").read_text() == env_secret  # it did reach the task
    files = [p for p in runs.rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files) and any(p.parent.name == "job_events" for p in files)
    leaks = [str(p) for p in files if env_secret.encode() in p.read_bytes()]
    assert leaks == []
    # And the variable is back in the environment afterwards.
    assert secrets_from_environment()["tiny_secret"] == env_secret


def test_a_run_scrubs_its_own_artifacts_and_leaves_other_runs_to_theirs(tmp_path: Path) -> None:
    # Several processes share the runs directory and rotate each other's runs: a run that walked all of them died
    # on one removed meanwhile (FileNotFoundError). Each run scrubs what it wrote: its artifacts, the runner's files.
    from toolkit.adapters.ansible import _scrub_artifacts

    secret = "scrub-me-5d1a"
    current, other = tmp_path / "artifacts" / "run-2", tmp_path / "artifacts" / "run-1"
    for d in (current / "job_events", other / "job_events", tmp_path / "env"):
        d.mkdir(parents=True)
        (d / "1.json").write_text(f'{{"stdout": "{secret}"}}')
    _scrub_artifacts(tmp_path, current, [secret])
    assert secret not in (current / "job_events" / "1.json").read_text()
    assert secret not in (tmp_path / "env" / "1.json").read_text()
    assert secret in (other / "job_events" / "1.json").read_text()  # not walked: that run scrubbed its own


def test_secret_also_given_as_extravar_is_refused(local: tuple[Path, Path, Path], tmp_path: Path) -> None:
    book, inv, out = local
    with pytest.raises(ToolkitError, match="both as a secret and as a plain extra var"):
        run_playbook(str(book), inventory=inv, extravars={"out": str(out), "tiny_secret": "a"},
                     secrets={"tiny_secret": "a"}, private_data_dir=tmp_path / "runs")


def test_bad_inventory_and_playbook_are_toolkit_errors(local: tuple[Path, Path, Path], tmp_path: Path) -> None:
    book, _inv, _out = local
    with pytest.raises(ToolkitError) as err:
        run_playbook(str(book), inventory=tmp_path / "nope.yml", private_data_dir=tmp_path / "runs")
    assert err.value.exit_code == 2 and "nope.yml" in str(err.value) and "fix:" in str(err.value)
    with pytest.raises(ToolkitError, match="playbook not found"):
        run_playbook("no-such-playbook", inventory=_inv, private_data_dir=tmp_path / "runs")


def test_unreachable_host_is_reported(tmp_path: Path, local: tuple[Path, Path, Path]) -> None:
    book, _inv, out = local
    inv = tmp_path / "dead.yml"
    # 127.0.0.1 port 1: refused at once (loopback only, no traffic leaves the machine).
    inv.write_text("all:\n  hosts:\n    deadhost:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n")
    result = run_playbook(str(book), inventory=inv, extravars={"out": str(out)}, private_data_dir=tmp_path / "runs",
                          secrets={"tiny_secret": "q"})
    assert result.rc != 0
    assert result.hosts["deadhost"].unreachable == 1
    assert result.failures and result.failures[0].unreachable and result.failures[0].host == "deadhost"


def test_share_dir_finds_roles_and_playbooks() -> None:
    share = share_dir()
    assert (share / "roles" / "proxmox_gpu_host" / "tasks" / "main.yml").is_file()
    assert (share / "playbooks").is_dir()


def test_vault_encrypted_secret_is_used_and_not_logged(local: tuple[Path, Path, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    book, inv, out = local
    secret = "vaulted-secret-3f9a"
    pw = tmp_path / "vault-pass"
    pw.write_text("vault-test-password\n")
    vault = Path(sys.executable).parent / "ansible-vault"
    enc = subprocess.run([str(vault), "encrypt_string", "--vault-password-file", str(pw), secret, "--name",
                          "tiny_secret"], capture_output=True, text=True, check=True).stdout
    group_vars = inv.parent / "group_vars"
    group_vars.mkdir()
    (group_vars / "all.yml").write_text(enc)
    monkeypatch.setenv("TOOLKIT_VAULT_PASSWORD_FILE", str(pw))
    runs = tmp_path / "runs"
    result = run_playbook(str(book), inventory=inv, extravars={"out": str(out)}, private_data_dir=runs)
    assert result.rc == 0, result.failures
    assert (out / "secret.txt").read_text() == secret
    assert [str(p) for p in runs.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()] == []


SLOW_PLAYBOOK = """\
- name: A task that takes a while
  hosts: all
  gather_facts: false
  tasks:
    - name: Sleep
      ansible.builtin.command:
        argv: [sleep, "{{ seconds }}"]
"""

INTERRUPTIBLE = """
import sys
from pathlib import Path
from toolkit.adapters.ansible import PlaybookInterrupted, run_playbook
book, inv, runs, seconds = sys.argv[1:]
try:
    run_playbook(book, inventory=inv, private_data_dir=Path(runs), extravars={"seconds": seconds},
                 on_event=lambda e: print(e.kind, flush=True) if e.kind == "task_start" else None)
except PlaybookInterrupted as err:
    print("interrupted", err.artifacts_dir, flush=True)
    sys.exit(130)
"""


def _slow_playbook(tmp_path: Path) -> tuple[Path, Path]:
    """SLOW_PLAYBOOK and an inventory of this machine (connection=local)."""
    book = tmp_path / "slow.yml"
    book.write_text(SLOW_PLAYBOOK)
    inv = tmp_path / "inventory.yml"
    inv.write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                   f"      ansible_python_interpreter: {sys.executable}\n")
    return book, inv


def test_ctrl_c_stops_ansible_playbook_and_its_workers(tmp_path: Path, reliability) -> None:
    """SIGINT to the toolkit while a task runs: ansible-playbook (its own session, so a terminal's Ctrl-C would
    not reach it) and its workers are stopped, nothing of the run is left, and the caller sees the interrupt."""
    import signal
    import subprocess
    import time

    book, inv = _slow_playbook(tmp_path)
    seconds = "123.4"  # an argv no other process here has
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, str(book), str(inv), str(tmp_path / "runs"),
                             seconds], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "task_start"
    deadline = time.monotonic() + 30
    while not _processes_with(seconds) and time.monotonic() < deadline:
        time.sleep(0.1)
    playbook_pids = _processes_with(str(book))
    assert _processes_with(seconds) and playbook_pids  # the sleep runs, under ansible-playbook
    interrupted_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    stopped_s = time.monotonic() - interrupted_at
    assert proc.returncode == 130 and "interrupted" in out, (out, err)
    assert "interrupted: stopping ansible-playbook" in err and "Traceback" not in err
    assert stopped_s < 5
    assert _processes_with(seconds) == [] and _processes_with(str(book)) == []
    reliability(
        fault="Ctrl-C (SIGINT) while ansible-playbook runs a task (local connection, a real ansible-playbook)",
        user_saw=f"'{err.strip().splitlines()[0]}', exit 130 after {stopped_s:.1f} s",
        recorded="ansible-runner's artifacts (status canceled); no ansible-playbook, worker or task process left "
        f"(before: ansible-playbook pid(s) {playbook_pids} and the task's `sleep`)",
        next_run="(nothing left to clean up on the controller; the lab test covers the remote probe)",
        area="apply",
    )


def test_a_run_past_its_timeout_is_stopped_like_ctrl_c(tmp_path: Path) -> None:
    """`timeout_s` (a sweep's --point-timeout-s, in process): the playbook and its task's process are stopped, and
    the caller gets PlaybookTimedOut, not a result."""
    import time

    from toolkit.adapters.ansible import PlaybookTimedOut

    book, inv = _slow_playbook(tmp_path)
    seconds = "124.6"  # an argv no other process here has
    started = time.monotonic()
    with pytest.raises(PlaybookTimedOut) as err:
        run_playbook(str(book), inventory=inv, private_data_dir=tmp_path / "runs", extravars={"seconds": seconds},
                     timeout_s=3)
    assert 3 <= time.monotonic() - started < 60
    assert "did not finish in 3 s" in str(err.value) and err.value.artifacts_dir.is_dir()
    assert _processes_with(seconds) == [] and _processes_with(str(book)) == []


def _processes_with(needle: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != __import__("os").getpid():
            try:
                if needle in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def test_rotation_keeps_a_run_another_process_is_still_making(local: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The runs directory is shared by every toolkit process of the user: a sweep's apply + probe (minutes) runs
    beside commands that start and rotate many runs. Rotation removes the oldest finished runs down to the newest
    20, never the directory of a run still going in a live process (it would lose its events and fail)."""
    import os
    import subprocess

    book, inv, out = local
    artifacts = tmp_path / "runs" / "artifacts"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has exited: its pid names runs that are over
    live = subprocess.Popen(["sleep", "120"])
    try:
        def run_dir(stamp: int, pid: int, *, finished: bool) -> Path:
            d = artifacts / f"20261205T{stamp:06d}-deploy-{pid}"
            (d / "job_events").mkdir(parents=True)
            if finished:
                (d / "rc").write_text("0")
            os.utime(d, (1_000_000 + stamp, 1_000_000 + stamp))
            return d

        running = run_dir(0, live.pid, finished=False)  # the oldest of all, still going
        crashed = run_dir(1, gone.pid, finished=False)  # its process died before it wrote rc
        finished = [run_dir(10 + i, gone.pid, finished=True) for i in range(22)]
        result = run_playbook(str(book), inventory=inv, extravars={"out": str(out)},
                              private_data_dir=tmp_path / "runs", secrets={"tiny_secret": "x"})
        assert result.rc == 0
        left = sorted(p.name for p in artifacts.iterdir())
        assert running.is_dir() and (running / "job_events").is_dir(), left
        assert not crashed.exists(), left
        # 20 kept: this run and the 19 newest finished ones; the 3 oldest finished ones went.
        assert [d.exists() for d in finished] == [False] * 3 + [True] * 19, left
        assert result.artifacts_dir is not None and result.artifacts_dir.is_dir()
        assert len(left) == 21
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize(("instance", "named"), [("", "it writes inventory/lab.yml)"),
                                                 ("h3", "it writes /var/lib/toolkit-lab-h3/lab.yml, then pass -i "
                                                        "/var/lib/toolkit-lab-h3/lab.yml)")])
def test_no_inventory_names_the_lab_inventory_of_this_instance(instance: str, named: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from toolkit.adapters import ansible

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOOLKIT_INVENTORY", raising=False)
    monkeypatch.setenv("TOOLKIT_LAB_INSTANCE", instance)
    monkeypatch.setattr(ansible, "share_dir", lambda: tmp_path)  # no inventory/lab.yml beside the roles either
    with pytest.raises(ToolkitError) as err:
        ansible.find_inventory(None)
    assert named in err.value.problems[0].fix


POLL_BOOK = """\
- name: Which poll interval
  hosts: all
  gather_facts: false
  tasks:
    - name: Say it
      ansible.builtin.debug:
        msg: "poll={{ lookup('ansible.builtin.config', 'DEFAULT_INTERNAL_POLL_INTERVAL') }}"
    - name: Which strategy
      ansible.builtin.debug:
        msg: "{{ lookup('ansible.builtin.config', 'DEFAULT_STRATEGY') }}"
    - name: Which callbacks
      ansible.builtin.debug:
        msg: "{{ lookup('ansible.builtin.config', 'CALLBACKS_ENABLED') | join(',') }}"
    # A module's shell is a child of the Python that runs the module: one per task under ansible-core's own
    # strategies, the host's one persistent interpreter under Mitogen's.
    - name: Whose child, first
      ansible.builtin.shell: echo $PPID
      changed_when: false
    - name: Whose child, second
      ansible.builtin.shell: echo $PPID
      changed_when: false
"""


@dataclass(frozen=True)
class _Seen:
    """What a playbook ran with: the poll interval, the strategy, the callbacks enabled; the parent pid of each of
    two tasks' shells; ansible-playbook's own output."""

    poll: str
    strategy: str
    parents: list[str]
    callbacks: str
    stdout: str


def _config_seen(local: tuple[Path, Path, Path], tmp_path: Path) -> _Seen:
    _, inv, _ = local
    book = tmp_path / "poll.yml"
    book.write_text(POLL_BOOK)
    seen: list[PlaybookEvent] = []
    result = run_playbook(str(book), inventory=inv, private_data_dir=tmp_path / "runs", on_event=seen.append)
    assert result.rc == 0, result.failures
    said = {e.task: e.result.get("msg") for e in seen
            if e.kind == "ok" and e.task in ("Say it", "Which strategy", "Which callbacks")}
    parents = [str(e.result.get("stdout")) for e in seen if e.kind == "ok" and e.task.startswith("Whose child")]
    assert len(said) == 3 and len(parents) == 2, (said, parents)
    return _Seen(str(said["Say it"]), str(said["Which strategy"]), parents, str(said["Which callbacks"]),
                 (Path(result.artifacts_dir) / "stdout").read_text())


def test_the_controller_polls_its_workers_every_10_ms_without_a_config_of_the_users(
        local: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if Path("/etc/ansible/ansible.cfg").is_file():
        pytest.skip("this machine has /etc/ansible/ansible.cfg, which the toolkit leaves in force")
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = _config_seen(local, tmp_path)
    assert seen.poll == "poll=0.01"
    # The toolkit's gc.freeze callback is enabled and found (Ansible warns of an enabled one it cannot load).
    assert "toolkit_gc_freeze" in seen.callbacks.split(",")
    assert "Skipping callback plugin 'toolkit_gc_freeze', unable to load" not in seen.stdout, seen.stdout[-2000:]


def test_the_gc_freeze_callback_freezes_what_the_controller_holds_at_a_plays_start() -> None:
    import gc
    import importlib.util

    from toolkit.adapters import ansible as adapter

    path = adapter._CALLBACK_DIR / f"{adapter.GC_FREEZE_CALLBACK}.py"
    spec = importlib.util.spec_from_file_location("toolkit_gc_freeze_plugin", path)
    assert spec is not None and spec.loader is not None
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    assert plugin.CallbackModule.CALLBACK_NAME == adapter.GC_FREEZE_CALLBACK
    assert gc.get_freeze_count() == 0
    try:
        plugin.CallbackModule().v2_playbook_on_play_start(None)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_users_own_ansible_config_stays_in_force(local: tuple[Path, Path, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".ansible.cfg").write_text("[defaults]\ninternal_poll_interval = 0.05\n")
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(home))
    assert _config_seen(local, tmp_path).poll == "poll=0.05"


def test_without_a_config_of_the_users_modules_run_in_one_mitogen_interpreter_per_host(
        local: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if Path("/etc/ansible/ansible.cfg").is_file():
        pytest.skip("this machine has /etc/ansible/ansible.cfg, which the toolkit leaves in force")
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.delenv("ANSIBLE_STRATEGY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = _config_seen(local, tmp_path)
    assert seen.strategy == "mitogen_linear"
    assert seen.parents[0] == seen.parents[1], "two tasks' modules ran in two interpreters"


def test_a_host_asking_for_accept_new_keeps_ansible_cores_strategy_for_the_run(
        local: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Mitogen's SSH would put `StrictHostKeyChecking yes` before the host's own option and SSH takes the first:
    # a new container's key, which accept-new trusts, would be refused.
    if Path("/etc/ansible/ansible.cfg").is_file():
        pytest.skip("this machine has /etc/ansible/ansible.cfg, which the toolkit leaves in force")
    _, inv, _ = local
    inv.write_text(inv.read_text() + "      ansible_ssh_common_args: -o StrictHostKeyChecking=accept-new\n")
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.delenv("ANSIBLE_STRATEGY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = _config_seen(local, tmp_path)
    assert seen.strategy == "linear" and seen.parents[0] != seen.parents[1]
    # Told not to check the key at all, in Ansible's own words, the host is Mitogen's again.
    inv.write_text(inv.read_text().replace("accept-new", "no") + "      ansible_host_key_checking: false\n")
    assert _config_seen(local, tmp_path).strategy == "mitogen_linear"


def test_ansible_strategy_in_the_environment_puts_ansible_cores_own_back(
        local: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.setenv("ANSIBLE_STRATEGY", "linear")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = _config_seen(local, tmp_path)
    assert seen.strategy == "linear"
    assert seen.parents[0] != seen.parents[1], "ansible-core's linear strategy starts a Python per task"
