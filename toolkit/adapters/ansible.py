"""The toolkit's one door to Ansible: the only module that imports ansible_runner.

ansible-runner's interface is untyped `**kwargs` and raw event dicts; this wraps it once in a typed
function (`run_playbook`) whose result is `toolkit.core.ansible_summary.PlaybookResult`.

Secrets. ansible-runner writes `artifacts/<ident>/command` with the child's whole environment and
its command line (runner.py `Runner.run`), and `env/extravars` when extra vars come as a file. So:
- secrets passed in `secrets=` go to a 0600 vars file in a private temp dir outside the runner's
  directory, named on the command line as `-e @file` (only the path is recorded) and deleted after;
- environment variables named `TOOLKIT_SECRET_<VAR>` become the extra var `<var>` the same way, and
  are taken out of the environment for the run so that the `command` file never sees them;
- after the run every artifact file is scanned and any secret value still found is masked
  (a task without `no_log` that echoes one is a bug, but the artifacts stay clean regardless).
Tasks that use a secret carry `no_log: true`, so their results are censored in the events too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toolkit.adapters.files import write_atomic
from toolkit.core.ansible_summary import (
    HostStats,
    PlaybookEvent,
    PlaybookResult,
    TaskFailure,
    event_from_runner,
    redact,
    summarize,
)
from toolkit.core.errors import ToolkitError

__all__ = [
    "DEFAULT_INVENTORY",
    "HostStats",
    "InventoryHost",
    "PlaybookEvent",
    "PlaybookInterrupted",
    "PlaybookResult",
    "PlaybookTimedOut",
    "TaskFailure",
    "find_inventory",
    "read_inventory",
    "resolve_inventory",
    "run_playbook",
    "secrets_from_environment",
    "share_dir",
    "target_hosts",
]

SECRET_ENV_PREFIX = "TOOLKIT_SECRET_"
VAULT_PASSWORD_FILE_ENV = "TOOLKIT_VAULT_PASSWORD_FILE"
_SHARE_PARTS = ("roles", "playbooks")
# Runs of this process, numbered into their ident: one process runs many (a sweep's point applies, in process),
# and two in one second would otherwise share an artifacts directory.
_RUN_NUMBERS = itertools.count(1)


def share_dir() -> Path:
    """Where roles/, playbooks/, inventory/ and profiles/ are: the wheel's toolkit/_share, else the repository root."""
    package_dir = Path(__file__).resolve().parents[1]
    candidates = [package_dir / "_share", package_dir.parent]
    override = os.environ.get("TOOLKIT_SHARE_DIR")
    if override:
        candidates.insert(0, Path(override))
    for candidate in candidates:
        if all((candidate / part).is_dir() for part in _SHARE_PARTS):
            return candidate
    raise ToolkitError.of(
        f"cannot find the toolkit's roles and playbooks (looked in {', '.join(str(c) for c in candidates)})",
        fix="reinstall the toolkit (`pip install gpu-serving-toolkit`) or set TOOLKIT_SHARE_DIR to a checkout",
    )


def default_runs_dir() -> Path:
    state = os.environ.get("TOOLKIT_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "toolkit"
    )
    return Path(state) / "ansible"


def secrets_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`TOOLKIT_SECRET_LXC_GPU_CONTAINER_ROOT_PASSWORD=...` -> {"lxc_gpu_container_root_password": "..."}."""
    env = os.environ if environ is None else environ
    return {k[len(SECRET_ENV_PREFIX) :].lower(): v for k, v in env.items() if k.startswith(SECRET_ENV_PREFIX) and v}


def _resolve_playbook(playbook: str) -> Path:
    path = Path(playbook)
    if not path.is_absolute() and not path.exists():
        name = playbook if playbook.endswith((".yml", ".yaml")) else f"{playbook}.yml"
        path = share_dir() / "playbooks" / name
    if not path.is_file():
        raise ToolkitError.of(
            f"playbook not found: {playbook}",
            file=str(path),
            fix=f"name one of {sorted(p.stem for p in (share_dir() / 'playbooks').glob('*.yml'))} or a playbook's path",
        )
    return path.resolve()


def resolve_inventory(inventory: Path | str, fix: str | None = None) -> Path:
    path = Path(inventory).expanduser()
    if not path.exists():
        raise ToolkitError.of(
            f"inventory not found: {inventory}",
            file=str(path),
            field="--inventory",
            fix=fix or "pass an inventory file (shape: inventory/real-host.example.yml); `toolkit lab up` writes "
            "inventory/lab.yml",
        )
    return path.resolve()


@contextlib.contextmanager
def _without_secret_environment() -> Iterator[None]:
    """Take TOOLKIT_SECRET_* out of os.environ while the runner copies it into its `command` artifact."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(SECRET_ENV_PREFIX)}
    try:
        yield
    finally:
        os.environ.update(saved)


def _scrub_artifacts(root: Path, current: Path, secret_values: list[str]) -> None:
    """Mask any secret value left in the runner's files of this run (atomic rewrite of each file that holds one):
    its artifacts (`current`) and the runner's files outside `artifacts/`. Other runs' artifacts were scrubbed by
    their own runs; several processes share the directory, and one's rotation removed a run while another walked
    all of them (FileNotFoundError from rglob, that apply lost: seen in a CI run). What vanishes is skipped."""
    if not secret_values:
        return
    needles = [v.encode() for v in secret_values if v]
    for dirpath, dirnames, filenames in os.walk(root):  # a directory gone meanwhile is skipped (onerror=None)
        here = Path(dirpath)
        if here == root / "artifacts":
            dirnames[:] = [d for d in dirnames if here / d == current]
        for name in filenames:
            path = here / name
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                write_atomic(path, redact(data.decode("utf-8", errors="replace"), secret_values), mode=0o600)


def run_playbook(
    playbook: str,
    *,
    inventory: Path | str,
    extravars: dict[str, Any] | None = None,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    tags: list[str] | None = None,
    on_event: Callable[[PlaybookEvent], None] | None = None,
    private_data_dir: Path | None = None,
    secrets: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> PlaybookResult:
    """Run one playbook through ansible-runner and return what happened on each host.

    `playbook` is a path or the name of one of the toolkit's playbooks ("host", "site.yml").
    Secrets come from `secrets` and from `TOOLKIT_SECRET_*` environment variables; they never reach the
    runner's artifacts (see the module docstring). Raises ToolkitError (exit 2) for bad input, before
    anything runs; a run that fails returns a result with `failures` and a non-zero `rc`. Ctrl-C stops the
    playbook and raises PlaybookInterrupted; a run past `timeout_s` is stopped the same way and raises
    PlaybookTimedOut.
    """
    import ansible_runner  # heavy; imported only when a playbook actually runs

    book = _resolve_playbook(playbook)
    inv = resolve_inventory(inventory)
    share = share_dir()

    all_secrets = {**secrets_from_environment(), **(secrets or {})}
    overlap = sorted(set(all_secrets) & set(extravars or {}))
    if overlap:
        raise ToolkitError.of(
            f"{', '.join(overlap)} given both as a secret and as a plain extra var",
            field="extravars",
            fix="pass secrets only through the environment (TOOLKIT_SECRET_<NAME>) or Ansible Vault, never as -e",
        )

    # The pid stays last: _still_running reads it.
    ident = time.strftime("%Y%m%dT%H%M%S") + f"-{book.stem}-{next(_RUN_NUMBERS)}-{os.getpid()}"
    if private_data_dir is None:
        private_data_dir = default_runs_dir()
    private_data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    cmdline: list[str] = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    vault_file = os.environ.get(VAULT_PASSWORD_FILE_ENV)
    if vault_file:
        if not Path(vault_file).is_file():
            raise ToolkitError.of(
                f"{VAULT_PASSWORD_FILE_ENV} names a file that does not exist: {vault_file}",
                field=VAULT_PASSWORD_FILE_ENV,
                fix="point it at the file holding your Ansible Vault password, or unset it",
            )
        cmdline += ["--vault-password-file", str(Path(vault_file).resolve())]

    secret_dir = Path(tempfile.mkdtemp(prefix="toolkit-secrets-"))  # mode 0700
    raw_events: list[dict[str, Any]] = []
    _runner_settings(private_data_dir)
    inventory_hosts = _LazyInventory(inv)
    config_env = _ansible_config(private_data_dir, inventory_hosts)
    interrupt = _Interrupt(timeout_s)
    addresses: dict[str, str] = {}

    def handle(raw: dict[str, Any]) -> bool:
        raw_events.append(raw)
        if raw.get("event") == "runner_on_unreachable" and not addresses:
            # Mitogen's refusal of a host key names no address.
            addresses.update({n: str(h.vars.get("ansible_host") or n) for n, h in inventory_hosts().items()})
        if on_event is not None:
            on_event(event_from_runner(raw, addresses))
        return True  # keep the event on disk: artifacts are the run's record

    try:
        if all_secrets:
            secret_file = secret_dir / "secrets.yml"
            fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                yaml.safe_dump(all_secrets, fh)
            cmdline += ["-e", f"@{secret_file}"]
        envvars = {
            # ansible-playbook sits next to this interpreter in a venv that is not activated.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
            "ANSIBLE_ROLES_PATH": str(share / "roles"),
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_PIPELINING": "True",
            # A stuck host must not hang a command for ever (SSH's own default waits minutes).
            "ANSIBLE_TIMEOUT": os.environ.get("ANSIBLE_TIMEOUT", "20"),
            # ansible-runner turns host-key checking off unless told: a real host's key is checked against
            # known_hosts (an unknown one fails with the fix, TaskFailure's hint); an inventory that must not
            # check (a container remade with new keys) says so per host (ansible_ssh_common_args).
            "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"),
            **config_env,
        }
        with _without_secret_environment(), interrupt.installed():
            runner = ansible_runner.run(
                private_data_dir=str(private_data_dir),
                ident=ident,
                project_dir=str(book.parent),
                playbook=book.name,
                inventory=str(inv),
                extravars=dict(extravars or {}),
                limit=limit,
                tags=",".join(tags) if tags else None,
                cmdline=" ".join(_quote(a) for a in cmdline) or None,
                envvars=envvars,
                event_handler=handle,
                quiet=True,
                rotate_artifacts=0,  # rotated below: ansible-runner's own fails a run another rotates beside
                suppress_env_files=True,
                cancel_callback=interrupt.requested,
            )
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)

    artifacts = Path(runner.config.artifact_dir)
    _scrub_artifacts(private_data_dir, artifacts, list(all_secrets.values()))
    _rotate_artifacts(private_data_dir, keep=20, current=artifacts)
    if interrupt.seen:
        raise PlaybookInterrupted(artifacts)
    if interrupt.timed_out:
        raise PlaybookTimedOut(artifacts, timeout_s or 0.0)
    result = summarize(raw_events, rc=int(runner.rc or 0), status=str(runner.status), artifacts_dir=artifacts,
                       addresses=addresses)
    if result.rc != 0 and not result.failures and not result.hosts:
        # ansible-playbook died before any host ran: a syntax error, an unparsable inventory.
        stdout = (artifacts / "stdout").read_text(errors="replace") if (artifacts / "stdout").exists() else ""
        tail = "\n".join(line for line in stdout.strip().splitlines()[-5:])
        why = redact(tail, list(all_secrets.values())) or runner.status
        raise ToolkitError.of(
            f"ansible-playbook could not start {book.name}: {why}",
            file=str(book),
            fix=f"see {artifacts / 'stdout'}",
        )
    if result.rc != 0 and not result.failures:
        # Failed outside any host's task (a role file that does not parse, an undefined play variable):
        # the reason is only in ansible-playbook's own output.
        result.failures.append(TaskFailure(host="", task="ansible-playbook", message=_error_lines(artifacts)))
    return result


class PlaybookInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during a playbook: ansible-playbook and its workers were stopped before this is raised."""

    def __init__(self, artifacts_dir: Path) -> None:
        super().__init__(f"interrupted; ansible-playbook stopped (artifacts: {artifacts_dir})")
        self.artifacts_dir = artifacts_dir


class PlaybookTimedOut(Exception):
    """The playbook ran past its `timeout_s`: ansible-playbook and its workers were stopped as on Ctrl-C."""

    def __init__(self, artifacts_dir: Path, timeout_s: float) -> None:
        super().__init__(f"ansible-playbook did not finish in {timeout_s:.0f} s and was stopped "
                         f"(artifacts: {artifacts_dir})")
        self.artifacts_dir = artifacts_dir
        self.timeout_s = timeout_s


class _Interrupt:
    """SIGINT while ansible-runner drives ansible-playbook. The child runs in its own session (pexpect's pty), so
    a terminal's Ctrl-C never reaches it, and ansible-core's workers each call setsid(): the runner's own cancel
    (SIGKILL to ansible-playbook's process group) leaves every worker and its task running, orphaned (seen
    here: a `sleep` task outlived the cancel). So the handler only records the request; when the runner next
    polls `requested` (cancel_callback), the whole process tree under ansible-playbook is stopped by pid:
    SIGINT to ansible-playbook first (it stops its workers and prints where it was), SIGKILL to whatever is
    left after a grace period. Then the runner returns and run_playbook raises PlaybookInterrupted. A deadline
    (`timeout_s`) passed is a request too, the same stop, and PlaybookTimedOut."""

    GRACE_S = 5.0

    def __init__(self, timeout_s: float | None = None) -> None:
        self.seen = False
        self.timed_out = False
        self.stopped = False
        self.started_ticks = _ticks_now()
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def requested(self) -> bool:
        if not self.seen and self.deadline is not None and time.monotonic() > self.deadline:
            self.timed_out = True
        if (self.seen or self.timed_out) and not self.stopped:
            self.stopped = True
            _stop_tree(self.started_ticks, self.GRACE_S)
        return self.seen or self.timed_out

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.seen:
            print("interrupted: stopping ansible-playbook ...", file=sys.stderr, flush=True)
        self.seen = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; its caller handles them
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in clock ticks) of a process, from /proc (None once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def _ticks_now() -> int:
    """Now, in the clock ticks of /proc/PID/stat's start time (since boot)."""
    try:
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return 0
    return int(uptime_s * os.sysconf("SC_CLK_TCK"))


def _playbook_tree(since_ticks: int) -> tuple[list[int], list[int]]:
    """(ansible-playbook processes this process started since `since_ticks`, them and all their descendants)."""
    children: dict[int, list[int]] = {}
    roots = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is None:
            continue
        children.setdefault(st[0], []).append(int(entry.name))
        if st[0] == me and st[2] >= since_ticks:
            try:
                if b"ansible-playbook" in (entry / "cmdline").read_bytes():
                    roots.append(int(entry.name))
            except OSError:
                continue
    tree, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return roots, tree


def _stop_tree(since_ticks: int, grace_s: float) -> None:
    """SIGINT to ansible-playbook (it stops its workers and says where it was); after ORDERLY_S, SIGTERM to what
    is left under it; SIGKILL to anything left after `grace_s`. The SIGTERM is for Mitogen's strategy: its
    multiplexer ignores SIGINT and, at ansible-playbook's exit, waits up to 3 s for each host's interpreter (one
    running a task included) to say goodbye; on a loaded machine that ran past the grace (5.5 s to stop, against
    0.6 s with ansible-core's own strategy, in 2 of 5 runs beside six busy loops on 2 cores)."""
    import signal

    roots, tree = _playbook_tree(since_ticks)
    for pid in roots:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    start = time.monotonic()
    alive, termed = tree, False
    while alive and time.monotonic() < start + grace_s:
        time.sleep(0.1)
        alive = [p for p in tree if (st := _stat(p)) is not None and st[1] != "Z"]
        if not termed and time.monotonic() >= start + ORDERLY_S:
            termed = True
            for pid in alive:
                if pid not in roots:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGTERM)
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


ORDERLY_S = 1.0  # how long ansible-playbook alone stops its run after SIGINT before the rest is told to stop


# ansible-runner checks cancel_callback each time pexpect's wait returns, at the latest every `pexpect_timeout`
# seconds (default 5); 1 s makes Ctrl-C stop the playbook within a second. It reads this only from env/settings.
# How long ansible-runner waits on the playbook's output per poll: also how late it notices the end of a run.
_RUNNER_SETTINGS = "pexpect_timeout: 0.2\n"


def _rotate_artifacts(private_data_dir: Path, keep: int, current: Path) -> None:
    """The newest `keep` runs' artifacts stay. Several toolkit processes share the runs directory (two commands
    at once, the test shards, a sweep's applies beside them), and ansible-runner's own rotation dies on a file
    another process removed first (FileNotFoundError in its rmtree, the run lost); this one skips what is already
    gone, and never removes a run still going in another process: a sweep's apply + probe runs for minutes, while
    other commands start and rotate dozens of runs, and a run whose directory goes loses its events."""
    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    try:
        runs = [p for p in (private_data_dir / "artifacts").iterdir()
                if p.is_dir() and p != current and not _still_running(p)]
    except OSError:
        return
    for old in sorted(runs, key=mtime)[:max(len(runs) + 1 - keep, 0)]:
        shutil.rmtree(old, ignore_errors=True)


def _still_running(run_dir: Path) -> bool:
    """A run of another live process: its ident ends in the pid of the process that runs it (run_playbook's ident)
    and ansible-runner has not written its `rc` yet (it does when the playbook ends). A run whose process died
    without an `rc` is rotated like any other."""
    pid = run_dir.name.rsplit("-", 1)[-1]
    if not pid.isdigit() or int(pid) <= 0 or (run_dir / "rc").exists():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, another user's
        return True
    return True


# ansible-playbook's main process waits on its workers in a loop that sleeps `internal_poll_interval` between
# checks of the result queue: 0.001 s by default, which kept it at 2-4 % of a core for the whole of every long
# task (a pip install, the health wait, a probe): measured, a 15 s task cost the controller 1.32 s of CPU at
# 0.001 and 1.00 s at 0.01 (medians of 5). 0.01 s adds at most 10 ms to a task's result. ansible-core reads this
# setting from an ini file only (no environment variable), so the toolkit's file is named only where the user
# has no Ansible config of their own (ANSIBLE_CONFIG, ~/.ansible.cfg, /etc/ansible/ansible.cfg): theirs stays
# in force as before.
_POLL_CFG = "internal_poll_interval = 0.01"
# Mitogen's strategy (a dependency): ansible-core starts a new Python on the target for every task (about 0.19 s
# of the target's CPU each, ~7,400 module runs in a CI run: the largest single cost of the test suite) and forks
# a worker that opens SSH for it; Mitogen keeps one interpreter per host over one connection and runs each
# module inside it. The same tasks, modules and results: the sglang_venv role's five tests took 141 s of CPU
# and 140 s of wall with ansible-core's linear strategy, 63 s and 65 s with mitogen_linear (one run each, quiet
# machine). Only in the toolkit's own file, as the poll interval: a user's config keeps its strategy, and
# ANSIBLE_STRATEGY=linear in the environment puts ansible-core's own back for one command.
MITOGEN_STRATEGY = "mitogen_linear"


def _mitogen_strategy_dir() -> Path | None:
    """Where the installed ansible_mitogen keeps its strategy plugins, found without importing it (it imports
    ansible at once); None where it is not installed."""
    spec = importlib.util.find_spec("ansible_mitogen")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(loc) / "plugins" / "strategy" for loc in locations]
    return next((d for d in found if (d / f"{MITOGEN_STRATEGY}.py").is_file()), None)


# The toolkit's callback plugin (ansible_callbacks/toolkit_gc_freeze.py): gc.freeze() at each play's start, so a
# worker's garbage collection does not walk, and copy, the controller's heap. Enabled in the toolkit's own file;
# its directory goes in ANSIBLE_CALLBACK_PLUGINS, where ansible-runner adds its own beside it.
GC_FREEZE_CALLBACK = "toolkit_gc_freeze"
_CALLBACK_DIR = Path(__file__).parent / "ansible_callbacks"


def toolkit_ansible_cfg() -> str:
    """The text of the toolkit's own ansible.cfg, named where the user has none (benchmarks/bench_apply.py runs a
    variant of it)."""
    lines = ["[defaults]", _POLL_CFG, f"callbacks_enabled = {GC_FREEZE_CALLBACK}"]
    strategy_dir = _mitogen_strategy_dir()
    if strategy_dir is not None:
        lines += [f"strategy_plugins = {strategy_dir}", f"strategy = {MITOGEN_STRATEGY}"]
    return "\n".join(lines) + "\n"


class _LazyInventory:
    """The run's inventory as read_inventory reads it, read at the first call and only then; empty where it does
    not parse (ansible-playbook then says why)."""

    def __init__(self, inventory: Path) -> None:
        self.inventory = inventory
        self.hosts: dict[str, InventoryHost] | None = None

    def __call__(self) -> dict[str, InventoryHost]:
        if self.hosts is None:
            try:
                self.hosts = read_inventory(self.inventory)
            except ToolkitError:
                self.hosts = {}
        return self.hosts


def _ansible_config(private_data_dir: Path, inventory_hosts: Callable[[], dict[str, InventoryHost]]
                    ) -> dict[str, str]:
    """The environment that names the toolkit's ansible.cfg, where the user has no Ansible config of their own;
    with ANSIBLE_STRATEGY=linear beside it when a host's SSH options would be overridden by Mitogen's."""
    if os.environ.get("ANSIBLE_CONFIG") or any(
            path.is_file() for path in (Path.home() / ".ansible.cfg", Path("/etc/ansible/ansible.cfg"))):
        return {}
    path = private_data_dir / "env" / "ansible.cfg"
    text = toolkit_ansible_cfg()
    if not (path.is_file() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, text, mode=0o600)
    env = {"ANSIBLE_CONFIG": str(path), "ANSIBLE_CALLBACK_PLUGINS": ":".join(
        filter(None, (os.environ.get("ANSIBLE_CALLBACK_PLUGINS"), str(_CALLBACK_DIR))))}
    if MITOGEN_STRATEGY in text and not os.environ.get("ANSIBLE_STRATEGY") and _mitogen_overridden(inventory_hosts()):
        env["ANSIBLE_STRATEGY"] = "linear"
    return env


_STRICT_HOST_KEY = re.compile(r"StrictHostKeyChecking\s*[= ]\s*(\S+)", re.IGNORECASE)


def _mitogen_overridden(hosts: Mapping[str, InventoryHost]) -> list[str]:
    """The hosts whose own SSH options Mitogen's SSH would override: it puts `StrictHostKeyChecking yes` (host-key
    checking on) or `no` (off) before the inventory's options, and SSH takes an option's first value. A host that
    asks for another (`accept-new`, the example inventory's for the containers the toolkit creates) with checking
    on would be refused; for such an inventory the run keeps ansible-core's own strategy, which passes the
    host's options as they are. Checking on or off is read as Ansible reads it (its own boolean parser)."""
    from ansible.module_utils.parsing.convert_bool import boolean  # type: ignore[import-untyped]

    checking_default = boolean(os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"), strict=False)
    overridden = []
    for name, host in hosts.items():
        said = host.vars.get("ansible_ssh_host_key_checking", host.vars.get("ansible_host_key_checking"))
        checking = checking_default if said is None else boolean(said, strict=False)
        options = " ".join(str(host.vars.get(k) or "") for k in
                           ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args"))
        asked = [m.lower() for m in _STRICT_HOST_KEY.findall(options)]
        if asked and asked[0] != ("yes" if checking else "no"):
            overridden.append(name)
    return overridden


def _runner_settings(private_data_dir: Path) -> None:
    path = private_data_dir / "env" / "settings"
    if path.is_file() and path.read_text() == _RUNNER_SETTINGS:
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, _RUNNER_SETTINGS, mode=0o600)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _error_lines(artifacts: Path) -> str:
    stdout = artifacts / "stdout"
    text = _ANSI.sub("", stdout.read_text(errors="replace")) if stdout.exists() else ""
    lines = text.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if "[ERROR]" in line or line.startswith("ERROR!")), None)
    picked = lines[start : start + 6] if start is not None else lines[-6:]
    return "\n".join(line.rstrip() for line in picked if line.strip()) or f"exit status (see {stdout})"


def _quote(arg: str) -> str:
    # runner splits cmdline with shlex; quote only what needs it.
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else json.dumps(arg)


INVENTORY_ENV = "TOOLKIT_INVENTORY"
# What `toolkit lab up` writes: with no -i and no $TOOLKIT_INVENTORY, the commands work against the lab.
DEFAULT_INVENTORY = Path("inventory/lab.yml")


# An inventory whose hosts exist only while a path does (the lab's: its host's network namespace) names it here.
VALID_WHILE_VAR = "toolkit_inventory_valid_while"


def find_inventory(explicit: str | Path | None = None) -> Path:
    """`-i INVENTORY`, else $TOOLKIT_INVENTORY, else inventory/lab.yml here or beside the toolkit's roles. An
    inventory not given with -i is named on stderr, so no command targets one silently; the default one is
    refused while the hosts it names are gone (its `toolkit_inventory_valid_while` path is missing)."""
    if explicit:
        return resolve_inventory(explicit)
    from_env = os.environ.get(INVENTORY_ENV) or None
    if from_env is not None:
        path = resolve_inventory(from_env)
        print(f"inventory: {path} (from ${INVENTORY_ENV})", file=sys.stderr)
        return path
    for candidate in (DEFAULT_INVENTORY, share_dir() / DEFAULT_INVENTORY):
        if candidate.exists():
            path = candidate.resolve()
            _refuse_gone(path)
            print(f"inventory: {path} (no -i given: the lab's)", file=sys.stderr)
            return path
    # A second lab (TOOLKIT_LAB_INSTANCE, docs/lab.md) keeps its inventory in its state directory, which no
    # command reads by default: the fix names that file, not the checkout's.
    instance = os.environ.get("TOOLKIT_LAB_INSTANCE", "")
    lab_inventory = f"/var/lib/toolkit-lab-{instance}/lab.yml" if instance else str(DEFAULT_INVENTORY)
    then = f", then pass -i {lab_inventory}" if instance else ""
    raise ToolkitError.of("no inventory given, and no lab inventory here", field="--inventory",
                          fix=f"pass -i INVENTORY (shape: inventory/real-host.example.yml), set {INVENTORY_ENV}, or "
                          f"run `toolkit lab up` (it writes {lab_inventory}{then})")


def _refuse_gone(path: Path) -> None:
    hosts = read_inventory(path)
    needed = {str(h.vars[VALID_WHILE_VAR]) for h in hosts.values() if h.vars.get(VALID_WHILE_VAR)}
    gone = sorted(p for p in needed if not Path(p).exists())
    if gone:
        raise ToolkitError.of(f"no -i given, and the default inventory's hosts are gone ({gone[0]} is missing: "
                              "the lab is down)", file=str(path), field="--inventory",
                              fix="pass -i INVENTORY for your own hosts (`toolkit inventory add` writes one, "
                              "docs/start.md), or bring the lab up: `toolkit lab up`")


@dataclass(frozen=True)
class InventoryHost:
    """One host as Ansible itself reads the inventory: its groups, its variables (group variables merged by depth,
    then its own; vault-encrypted values stay encrypted), and the address and port it connects to."""

    name: str
    groups: tuple[str, ...]
    vars: dict[str, Any]

    @property
    def address(self) -> str:
        """`host:port` Ansible connects to: the host lock's key."""
        return f"{self.vars.get('ansible_host') or self.name}:{self.vars.get('ansible_port') or 22}"


def read_inventory(inventory: Path | str, pattern: str = "all", limit: str | None = None) -> dict[str, InventoryHost]:
    """The hosts a play on `pattern` with `--limit limit` runs on, in the inventory's order (a multi-node profile's
    node ranks follow it). The toolkit's one reader of inventories: Ansible's own parser, any inventory format."""
    from ansible.inventory.manager import InventoryManager  # type: ignore[import-untyped]
    from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]

    inv = resolve_inventory(inventory)
    try:
        manager = InventoryManager(loader=DataLoader(), sources=[str(inv)])
        if limit:
            manager.subset(limit)
        hosts = manager.get_hosts(pattern=pattern)
    except Exception as err:  # ansible raises its own AnsibleError family
        raise ToolkitError.of(f"cannot parse the inventory: {err}", file=str(inv), fix="fix its syntax") from err
    out: dict[str, InventoryHost] = {}
    for host in hosts:
        variables: dict[str, Any] = {}
        for group in sorted(host.get_groups(), key=lambda g: g.depth):
            variables.update(group.get_vars())
        variables.update(host.get_vars())
        groups = tuple(sorted(g.name for g in host.get_groups() if g.name not in ("all", "ungrouped")))
        out[host.name] = InventoryHost(host.name, groups, variables)
    return out


def target_hosts(inventory: Path | str, pattern: str = "gpu_containers", limit: str | None = None) -> dict[str, str]:
    """{inventory name: "address:port"} of the hosts a play on `pattern` runs on (the host locks' keys)."""
    return {name: host.address for name, host in read_inventory(inventory, pattern, limit).items()}
