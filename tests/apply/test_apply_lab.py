"""`toolkit apply profile glm5-tp8` against the lab, for real: Ansible over SSH into a real LXC container
running systemd, the pinned SGLang installed from PyPI wheels, the real patch applied, the lab stand-in
server behind the rendered unit (its engine model: SIMULATED GPUs), SGLang's own bench_serving, the probe
scraping the stand-in's /metrics and sampling the simulated GPUs.

The container is provisioned first with the provision playbooks (#6). Tests share one provisioned lab
and run in file order: scratch deploy, no-change deploy, then the failure cases, each of which
restores a healthy service before the next.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolkit.lab.deploy_overlay import LAB_NUM_PROMPTS

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PATCH_TARGET = "sglang/srt/model_executor/model_runner.py"
PATCH_SHA = "be071c1567de4b63e82d070623f95aa4bb5f537698659526c68b1c7d05074640"


def toolkit(*args: str, cwd: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "toolkit", *args, "--json"], capture_output=True, text=True,
                          cwd=cwd, timeout=1200)
    try:
        summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        summary = {}
    return proc.returncode, summary, proc.stderr


class Target:
    """The lab's GPU container the tests deploy to: `ct` of the lab's inventory (CI), or, with
    TOOLKIT_TEST_APPLY_INVENTORY, another container of the same lab (so a developer's run does not
    redeploy a container another engineer is testing)."""

    def __init__(self, lab: Any, inventory: Path) -> None:
        self.lab = lab
        self.inventory_path = inventory
        hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_containers"]["hosts"]
        self.name = next(iter(hosts))
        self.address = hosts[self.name]["ansible_host"]

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        argv = [*self.lab.ssh_args("ct")[:-1], f"root@{self.address}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def provisioned(lab: Any) -> Target:
    """The container created and its NVIDIA userspace installed (`toolkit host provision`, #6)."""
    inventory = Path(os.environ.get("TOOLKIT_TEST_APPLY_INVENTORY") or lab.inventory_path)
    proc = subprocess.run([sys.executable, "-m", "toolkit", "host", "provision", "pve1", "--containers", "-i",
                           str(inventory)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Target(lab, inventory)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the profiles, so that --record writes there and not into the checkout."""
    root = tmp_path_factory.mktemp("apply")
    shutil.copytree(REPO / "profiles", root / "profiles")
    return root


def ct(target: Target, command: str) -> subprocess.CompletedProcess[str]:
    return target.ssh(command)


def installed_of(target: Target, dist: str) -> str:
    """The version of `dist` in the engine's venv on the container."""
    return ct(target, "/opt/sglang/venv/bin/python -c 'import importlib.metadata as m, sys; "
                      f"print(m.version(sys.argv[1]))' {dist}").stdout.strip()


def _entries(profiles: Path, name: str = "glm5-tp8") -> int:
    text = (profiles / f"{name}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    return len(((data.get("results") or {}).get("entries")) or [])


def apply(lab: Target, work: Path, *extra: str, inventory: Path | None = None,
          profile: str = "glm5-tp8") -> tuple[int, dict[str, Any], str]:
    return toolkit("apply", "profile", profile, "-i", str(inventory or lab.inventory_path),
                   "--profiles-dir", str(work / "profiles"), "--runs-dir", str(work / "runs"), *extra, cwd=REPO)


def with_host_vars(target: Target, tmp: Path, **host_vars: Any) -> Path:
    """The lab's inventory with variables added to the target container, as a user sets them: the lab
    overlay's test switches (toolkit_lab_standin_fail_health, toolkit_lab_standin_nan_log) travel this way."""
    inv = yaml.safe_load(Path(target.inventory_path).read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"][target.name].update(host_vars)
    path = tmp / "switched.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_apply_from_scratch_probe_and_record(provisioned: Target, work: Path) -> None:
    # From scratch even on a developer's reused container: no venv, no unit, no toolkit there.
    ct(provisioned, "systemctl disable --now sglang 2>/dev/null; rm -rf /opt/sglang /opt/toolkit /etc/sglang "
                    "/etc/systemd/system/sglang.service /etc/systemd/system/sglang.service.d; systemctl daemon-reload")
    before = _entries(work / "profiles")
    rc, summary, err = apply(provisioned, work, "--probe", "--record")
    assert rc == 0, err[-4000:]
    assert summary["hosts"][provisioned.name]["changed"] > 0 and not summary["failures"]

    # What runs is what `toolkit profile render` prints.
    rendered = subprocess.run([sys.executable, "-m", "toolkit", "profile", "render", "glm5-tp8", "--only", "unit"],
                              capture_output=True, text=True, cwd=REPO)
    unit = ct(provisioned, "cat /etc/systemd/system/sglang.service").stdout
    if rendered.returncode == 0:
        assert rendered.stdout.strip() == unit.strip()
    assert "-m sglang.launch_server" in unit
    assert ct(provisioned, "systemctl is-active sglang").stdout.strip() == "active"
    # The lab's overlay: a drop-in runs the stand-in from the toolkit's wheel in the engine's venv, same flags.
    dropin = ct(provisioned, "cat /etc/systemd/system/sglang.service.d/*.conf").stdout
    assert "LAB STAND-IN" in dropin and "-m toolkit.lab.standin_server.server" in dropin
    assert "--nsa-decode-backend trtllm" in dropin.split("ExecStart=/")[1]

    # The real pinned SGLang from PyPI, patched for real.
    py = "/opt/sglang/venv/bin/python -c"
    version = ct(provisioned, f"{py} 'import importlib.metadata as m; print(m.version(\"sglang\"))'")
    assert version.stdout.strip() == "0.5.9"
    site = ct(provisioned, f"{py} 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'")
    target = f"{site.stdout.strip()}/{PATCH_TARGET}"
    assert ct(provisioned, f"sha256sum {target}").stdout.split()[0] != PATCH_SHA
    reverse = ct(provisioned, f"patch --dry-run -R -f -s {target} /opt/sglang/patches/sm120-cutlass-moe-autotune.patch")
    assert reverse.returncode == 0

    # Artifacts on the controller: server info from the stand-in, environment, smoke text, the probe run.
    run_dir = Path(summary["artifacts_dir"]) / provisioned.name
    info = json.loads((run_dir / "server_info.json").read_text())
    assert info["lab_standin"] is True and info["version"] == "0.5.9" and info["tp_size"] == 8
    env = json.loads((run_dir / "environment.json").read_text())
    assert env.get("SGLANG_STANDIN") == "1"
    # One Hugging Face cache for the server, the download and the probe: on the model-cache mount (mp0 at /models,
    # a volume on the root filesystem's storage), not the rootfs (roles review finding 7; review 2, finding 2).
    assert env.get("HF_HOME") == "/models/huggingface"
    vmid = yaml.safe_load(provisioned.inventory_path.read_text())["all"]["children"]["gpu_containers"]["hosts"][
        provisioned.name]["lxc_gpu_container_vmid"]
    config = provisioned.lab.ssh("pve1", f"pct config {vmid}").stdout
    assert re.search(r"^mp0: local-lvm:vm-\d+-disk-\d+,mp=/models,backup=0,size=\d+G$", config, re.M), config
    mount = provisioned.lab.ssh("pve1", f"pct exec {vmid} -- findmnt -no TARGET -T /models/huggingface").stdout
    assert mount.strip() == "/models"
    assert json.loads((run_dir / "smoke.json").read_text())["text"].strip()
    probe = summary["probe"][provisioned.name]
    bench = (Path(probe["run_dir"]) / "bench.jsonl").read_text()
    assert json.loads(bench.splitlines()[-1])["completed"] == LAB_NUM_PROMPTS  # SGLang's own bench_serving wrote it
    # The simulated GPUs (100 % util, well under 600 W, no P2P: the engine model's tp8 over PCIe) must come out
    # as the story's diagnosis.
    assert probe["verdict"]["class"] == "busy-but-waiting", probe["verdict"]
    # Over time too: the engine model's server never queues at 1024 slots, so not scheduler-capped;
    # the next step halves the tensor-parallel group, naming the existing profile.
    verdict = probe["verdict"]
    assert verdict["signals"] == ["gpu", "server", "host"], verdict["signals"]
    assert "scheduler-capped" not in {m["state"] for m in verdict["mix"]}
    tp = next(k for k in verdict["knob_steps"] if k["knob"] == "server.tp_size")
    assert (tp["current"], tp["proposed"], tp["together"]) == (8, [4], {"server.pp_size": 2})
    assert tp["profiles"] == ["glm5-tp4-pp2"]

    record = summary.get("record") or {}
    if "skipped" not in record:
        assert _entries(work / "profiles") == before + 1
    server = _check_timelines_and_entry(Path(probe["run_dir"]), work / "profiles" / "glm5-tp8.yaml")
    # tp8 with 1024 slots takes all 160 prompts at once: nothing waits in the steady window.
    assert server["steady"]["num_queue_reqs"]["max"] == 0, server["steady"]
    assert server["steady"]["max_running_requests"] == 1024


def _check_timelines_and_entry(run_dir: Path, profile: Path) -> dict[str, Any]:
    """What every lab probe run must carry: the server and host timelines, and a truthful results entry."""
    from toolkit.core.probe.host_trace import read_host_trace
    from toolkit.core.probe.server_trace import read_server_trace

    tr = read_server_trace((run_dir / "server_trace.csv").read_text())
    assert len(tr) > 10 and tr.gaps == 0 and tr.meta["source"].startswith("http://127.0.0.1:")
    assert any(v is not None for v in tr.column("num_running_reqs"))
    assert any(v is not None for v in tr.column("num_queue_reqs"))
    host = read_host_trace((run_dir / "host_trace.csv").read_text())
    assert {"bench", "server"} <= set(host.role)  # the unit's MainPID tree, found through systemd
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["provenance"]["kind"] == "stand-in" and "simulated GPUs" in summary["provenance"]["detail"]
    assert summary["steady"]["throughput"]["source"].startswith("server counter")
    entry = yaml.safe_load(profile.read_text())["results"]["entries"][-1]
    completed = json.loads((run_dir / "bench.jsonl").read_text().splitlines()[-1])["completed"]
    assert entry["bench"]["num_prompts"] == completed == LAB_NUM_PROMPTS
    assert entry["bench"]["failed"] == 0 and entry["bench"]["profile_asked"] == {"num_prompts": 1024}
    assert "--num-prompts 160" in entry["bench"]["command"] and "--tokenizer /opt/sglang" in entry["bench"]["command"]
    if summary["steady_state"]["found"]:
        assert entry["throughput"]["steady_state"]["output_tok_per_s"] > 0
    else:  # too short for one: said so, and no steady rate to be ranked against steady ones
        assert "steady_state" not in entry["throughput"] and entry["throughput"]["no_steady_state"]
    _steady_window_holds_no_drain(run_dir)
    assert "simulated" in entry["lab"]["note"]
    return dict(summary["server"])


def _steady_window_holds_no_drain(run_dir: Path) -> dict[str, Any]:
    """The steady window, checked against the server's own token counter: found from it, its ends at or above the
    plateau bar, no fall below the bar inside it longer than the smoothing width (a drain or a ramp), and the
    drain (the rate below the bar to the benchmark's end) after it; or no steady state, with the reason."""
    from toolkit.core.probe.server_trace import counter_series, read_server_trace

    summary = json.loads((run_dir / "summary.json").read_text())
    state = summary["steady_state"]
    assert state["signal"] == "server token counter", state
    if not state["found"]:
        assert "too short for a steady state" in state["reason"], state
        return state
    start, end, bar = summary["steady"]["start_s"], summary["steady"]["end_s"], state["threshold"]
    ts, rates = counter_series(read_server_trace((run_dir / "server_trace.csv").read_text()),
                               "realtime_decode_tokens_total")
    # summary.json rounds the window's ends to the millisecond, and a scrape pair's midpoint may be half of one off.
    inside = [(t, r) for t, r in zip(ts, rates, strict=True) if start - 5e-4 <= t <= end + 5e-4]
    assert inside[0][1] >= bar and inside[-1][1] >= bar, (inside[:2], inside[-2:], bar)
    below_since = None
    for t, r in inside:
        if r < bar and below_since is None:
            below_since = t
        elif r >= bar:
            below_since = None
        assert below_since is None or t - below_since <= state["rule"]["smooth_s"], f"a fall inside at {t} s"
    run = json.loads((run_dir / "run.json").read_text())
    tail = [r for t, r in zip(ts, rates, strict=True) if end < t <= run["bench_end_s"]]
    assert tail and min(tail) < bar, "the drain is after the window"
    return state


def test_the_demos_benchmark_has_a_steady_window_without_its_drain(provisioned: Target, work: Path) -> None:
    """scripts/demo's benchmark (640 prompts, 128 in flight) holds a steady load: the window is found from the
    server's token counter and ends before the drain, which GPU utilisation (100 % to the end) cannot see."""
    rc, summary, err = apply(provisioned, work, "--probe", "--num-prompts", "640", "--max-concurrency", "128")
    assert rc == 0, err[-4000:]
    run_dir = Path(summary["probe"][provisioned.name]["run_dir"])
    state = _steady_window_holds_no_drain(run_dir)
    assert state["found"], state
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["steady"]["duration_s"] >= 10, s["steady"]
    assert s["steady"]["end_s"] < state["gpu_rule"]["end_s"]  # the GPU rule's window runs into the drain
    bench = json.loads((run_dir / "bench.jsonl").read_text().splitlines()[-1])
    assert bench["completed"] == 640 and bench["max_concurrency"] == 128
    assert len(bench["ttfts"]) == 640 and len(bench["itls"]) == 640  # per-request results (--output-details)


def test_second_apply_changes_nothing(provisioned: Target, work: Path) -> None:
    rc, summary, err = apply(provisioned, work)
    assert rc == 0, err[-4000:]
    assert summary["hosts"][provisioned.name]["changed"] == 0, summary


def test_a_package_removed_from_the_venv_fails_the_next_deploy_and_the_standin_refuses_to_start(
        provisioned: Target, work: Path) -> None:
    from toolkit.core.engine_lock import parse_lock

    # The engine path links to the venv of the lab lock (the real 0.5.9 lock, its GPU-only lines lab stand-ins).
    venv = ct(provisioned, "readlink /opt/sglang/venv").stdout.strip()
    assert venv.startswith("/opt/sglang/venvs/"), venv
    assert ct(provisioned, f"head -1 {venv}/toolkit-engine.lock").stdout.startswith("# LAB LOCK (toolkit lab)")
    lock = parse_lock((REPO / "profiles/requirements/sglang-0.5.9-cp311.lock").read_text(), "lock")
    assert installed_of(provisioned, "torch") == lock.get("torch").version  # type: ignore[union-attr]
    assert installed_of(provisioned, "transformers") == lock.get("transformers").version  # type: ignore[union-attr]
    said = ct(provisioned, "/opt/sglang/venv/bin/python -c 'import torch' 2>&1").stdout
    assert "[lab] torch is a lab stand-in for torch" in said
    tqdm = lock.get("tqdm")
    assert tqdm is not None
    unit_before = ct(provisioned, "systemctl show -p ActiveEnterTimestampMonotonic sglang").stdout
    try:
        assert ct(provisioned, "/opt/sglang/venv/bin/python -m pip uninstall -q -y tqdm").returncode == 0
        rc, summary, _ = apply(provisioned, work)
        assert rc != 0
        failures = summary["failures"]
        assert [f["task"] for f in failures] == ["Fail the deploy when the venv cannot start SGLang"], failures
        assert f"missing {tqdm.requirement()}" in failures[0]["message"]
        assert f"remove {venv} and deploy again" in failures[0]["message"]
        assert ct(provisioned, "systemctl show -p ActiveEnterTimestampMonotonic sglang").stdout == unit_before
        # Started by anything else, the stand-in runs the same check from the same files and refuses to start.
        ct(provisioned, "systemctl restart sglang; sleep 3")
        journal = ct(provisioned, "journalctl -u sglang --no-pager -n 40 -o cat").stdout
        assert "the engine check failed" in journal and f"missing {tqdm.requirement()}" in journal, journal[-2000:]
        assert ct(provisioned, "systemctl is-active sglang").stdout.strip() != "active"
    finally:
        ct(provisioned, f"rm -rf {venv}")  # the fix the message names: the venv made again from its lock
    rc, summary, err = apply(provisioned, work)
    assert rc == 0, err[-4000:]
    assert installed_of(provisioned, "tqdm") == tqdm.version
    assert ct(provisioned, "systemctl is-active sglang").stdout.strip() == "active"


def test_baseline_is_capped_at_64_running_with_a_queue(provisioned: Target, work: Path) -> None:
    """glm5-baseline's 64 slots bind: the server shows 64 running and the rest queued, as in the story."""
    rc, summary, err = apply(provisioned, work, "--probe", "--record", profile="glm5-baseline")
    assert rc == 0, err[-4000:]
    probe = summary["probe"][provisioned.name]
    server = _check_timelines_and_entry(Path(probe["run_dir"]), work / "profiles" / "glm5-baseline.yaml")
    steady = server["steady"]
    # At the cap: SGLang writes the gauge at each prefill batch with the running batch before the freed slots are
    # refilled (62-63 of 64 here) and at decode logs with the full batch.
    assert steady["max_running_requests"] == 64 and 61 <= steady["num_running_reqs"]["max"] <= 64, steady
    assert steady["num_queue_reqs"]["max"] > 0 and steady["queue_nonzero_share"] > 0.3, steady
    assert steady["token_usage"]["max"] < 0.5  # the slots bind, not the KV pool
    # The verdict over time names the knob that binds, with its value from the profile.
    verdict = probe["verdict"]
    assert verdict["class"] == "scheduler-capped", verdict["headline"]
    step = verdict["knob_steps"][0]
    assert (step["knob"], step["current"], step["current_source"]) == ("server.max_running_requests", 64, "profile")
    assert min(step["proposed"]) > 64 and step["sweep_args"][0] == "--vary"
    assert "server.max_running_requests: 64 -> " in " ".join(verdict["next_steps"])
    over = verdict["evidence"]["over_time"]["server"]
    assert over["max_running_requests"] == 64 and over["queue"] > 1 and over["token_usage"] < 0.8


def test_failing_health_fails_naming_the_service_with_its_log(provisioned: Target, work: Path,
                                                              tmp_path: Path) -> None:
    before = (work / "profiles" / "glm5-tp8.yaml").read_bytes()
    failing = with_host_vars(provisioned, tmp_path, toolkit_lab_standin_fail_health=True)
    rc, summary, err = apply(provisioned, work, "--probe", "--record", inventory=failing)
    assert rc != 0
    message = "\n".join(f["message"] for f in summary["failures"])
    assert "service sglang did not answer" in message
    assert "told to fail its health check" in message  # the log tail, from the journal
    # The probe never started (the deploy stopped at the health check): no run fetched, nothing recorded.
    assert summary["probe"] == {} and "record" not in summary
    assert (work / "profiles" / "glm5-tp8.yaml").read_bytes() == before
    rc, summary, err = apply(provisioned, work)  # healthy again: the drop-in changed back, so it restarts
    assert rc == 0, err[-4000:]


def test_nan_in_the_log_fails_the_deploy_with_that_line(provisioned: Target, work: Path, tmp_path: Path) -> None:
    rc, summary, _ = apply(provisioned, work, inventory=with_host_vars(provisioned, tmp_path,
                                                                      toolkit_lab_standin_nan_log=True))
    assert rc != 0
    assert "NaN in the logits" in "\n".join(f["message"] for f in summary["failures"])
    rc, _, err = apply(provisioned, work)
    assert rc == 0, err[-4000:]


def _task_end_times(artifacts: Path) -> dict[str, datetime]:
    """When each task of an ansible-runner run ended, from its job events (the last time, for a repeated name)."""
    out: dict[str, datetime] = {}
    for path in sorted(artifacts.glob("job_events/*.json"), key=lambda p: int(p.name.split("-")[0])):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        if event.get("event", "").startswith("runner_on_") and data.get("end"):
            out[data.get("task", "")] = datetime.fromisoformat(data["end"])
    return out


def test_a_server_that_exits_at_once_fails_the_deploy_within_seconds_with_its_log(provisioned: Target,
                                                                                   work: Path, tmp_path: Path) -> None:
    # A server that dies while starting (on a real host: a module missing from the venv) under Restart=on-failure.
    # With a health timeout of 600 s the deploy must still fail within a minute, from the unit's state.
    rc, _, err = apply(provisioned, work)  # the venv in place, so the time below is the deploy's, not pip's
    assert rc == 0, err[-4000:]
    exiting = with_host_vars(provisioned, tmp_path, toolkit_lab_standin_exit_at_start=True,
                             sglang_service_health_timeout_s=600)
    started = time.monotonic()
    rc, summary, _ = apply(provisioned, work, inventory=exiting)
    elapsed_s = time.monotonic() - started
    assert rc != 0
    failures = summary["failures"]
    assert [f["task"] for f in failures] == ["Fail at once when the server's process exited while starting, "
                                             "showing its log tail"], failures
    message = failures[0]["message"]
    assert "service sglang exited before answering" in message and "exit status 1" in message
    assert "told to exit at start (SGLANG_STANDIN_EXIT_AT_START=1)" in message  # the journal's lines
    assert "Fix: " in message
    # From the (re)start of the unit to the failed deploy, by the run's own event times (the apply before the
    # start, the wheelhouse and venv checks, is the same for a healthy server).
    ended = _task_end_times(Path(summary["ansible_artifacts_dir"]))
    started_at = max(ended[t] for t in ("Enable and start the service", "Restart the SGLang service") if t in ended)
    waited_s = (ended["Fail at once when the server's process exited while starting, showing its log tail"]
                - started_at).total_seconds()
    assert waited_s < 60, f"{waited_s:.1f} s from the unit's start to the failure"
    print(f"a server exiting at once: the deploy failed {waited_s:.1f} s after the unit started (health timeout "
          f"600 s); the whole apply took {elapsed_s:.1f} s")
    rc, _, err = apply(provisioned, work)
    assert rc == 0, err[-4000:]


def test_no_c_compiler_fails_the_deploy_at_its_jit_check_not_the_first_request(provisioned: Target,
                                                                               work: Path) -> None:
    # Roles review finding 18: without a compiler Triton's launcher build (and FlashInfer's JIT) fails at the
    # first request of a server that looked healthy. gcc made unrunnable (as on a container nobody gave
    # build-essential): the deploy fails in sglang_venv's verify step, before the service is touched.
    gcc = ct(provisioned, "readlink -f \"$(command -v gcc)\"").stdout.strip()
    assert gcc.startswith("/usr/bin/"), gcc
    unit_before = ct(provisioned, "systemctl show -p ActiveEnterTimestampMonotonic sglang").stdout
    try:
        assert ct(provisioned, f"chmod a-x {gcc}").returncode == 0
        rc, summary, _ = apply(provisioned, work)
        assert rc != 0
        failures = summary["failures"]
        assert [f["task"] for f in failures] == ["Fail the deploy when the JIT toolchain is missing"], failures
        assert "Failed to find C compiler. Please specify via CC environment variable." in failures[0]["message"]
        assert "install build-essential" in failures[0]["message"]
        assert ct(provisioned, "systemctl show -p ActiveEnterTimestampMonotonic sglang").stdout == unit_before
    finally:
        ct(provisioned, f"chmod 0755 {gcc}")
    rc, _, err = apply(provisioned, work)
    assert rc == 0, err[-4000:]


def test_patch_for_another_file_is_refused_before_the_venv_changes(provisioned: Target, work: Path,
                                                                    tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(work / "profiles", profiles)
    tp8 = profiles / "glm5-tp8.yaml"
    tp8.write_text(tp8.read_text().replace(PATCH_SHA, "ab" * 32))  # letters: YAML would read 64 digits as an int
    digest = ("find /opt/sglang/venv -type f -not -path '*__pycache__*' -print0 | sort -z "
              "| xargs -0 sha256sum | sha256sum")
    venv_before = ct(provisioned, digest).stdout
    proc = subprocess.run([sys.executable, "-m", "toolkit", "apply", "profile", "glm5-tp8", "-i",
                           str(provisioned.inventory_path), "--profiles-dir", str(profiles), "--runs-dir",
                           str(tmp_path / "runs"), "--json"], capture_output=True, text=True, cwd=REPO, timeout=1200)
    assert proc.returncode != 0
    message = "\n".join(f["message"] for f in json.loads(proc.stdout)["failures"])
    assert "patch sm120-cutlass-moe-autotune refused" in message and "ab" * 32 in message
    assert ct(provisioned, digest).stdout == venv_before


def test_unreachable_host_among_several(provisioned: Target, work: Path, tmp_path: Path) -> None:
    inv = yaml.safe_load(Path(provisioned.inventory_path).read_text())
    hosts = inv["all"]["children"]["gpu_containers"]["hosts"]
    ghost = dict(hosts[provisioned.name])
    # An address inside the lab's own container subnet that nothing answers (traffic stays in the lab).
    ghost["ansible_host"] = ".".join([*ghost["ansible_host"].split(".")[:3], "250"])
    hosts["ct-ghost"] = ghost
    path = tmp_path / "two.yml"
    path.write_text(yaml.safe_dump(inv))
    rc, summary, _ = apply(provisioned, work, inventory=path)
    assert rc != 0
    assert summary["unreachable"] == ["ct-ghost"]
    me = summary["hosts"][provisioned.name]
    assert me["failed"] == 0 and me["unreachable"] == 0


def test_api_key_from_a_secret_reaches_only_the_env_file(provisioned: Target, work: Path, tmp_path: Path) -> None:
    key = hashlib.sha256(b"toolkit-apply-test-key").hexdigest()
    profiles = tmp_path / "profiles"
    shutil.copytree(work / "profiles", profiles)
    tp8 = profiles / "glm5-tp8.yaml"
    keyed = tp8.read_text().replace("\nserver:\n", "\nserver:\n  api_key_secret: env:TOOLKIT_TEST_SGLANG_KEY\n", 1)
    tp8.write_text(keyed)
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "toolkit", "apply", "profile", "glm5-tp8", "-i",
                           str(provisioned.inventory_path), "--profiles-dir", str(profiles), "--runs-dir", str(runs),
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=1200,
                          env={**os.environ, "TOOLKIT_TEST_SGLANG_KEY": key})
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert key not in proc.stdout + proc.stderr
    for root in (runs, Path(summary["ansible_artifacts_dir"])):
        for f in root.rglob("*"):
            if f.is_file():
                assert key not in f.read_text(errors="replace"), f
    assert "${SGLANG_API_KEY}" in ct(provisioned, "cat /etc/systemd/system/sglang.service").stdout
    assert ct(provisioned, "stat -c %a /etc/sglang/glm5-tp8.env").stdout.strip() == "600"
    info = json.loads((Path(summary["artifacts_dir"]) / provisioned.name / "server_info.json").read_text())
    assert info["api_key_set"] is True
    rc, _, err = apply(provisioned, work)  # back to the profile without a key
    assert rc == 0, err[-4000:]


# ---- Faults mid-run. They reuse the deployed service the tests above leave, and share deploys where
# they do not interfere: the kill and the second apply in one probe run; the stopped container and the converging
# apply; Ctrl-C in one more probe run. Each writes its row of docs/reliability.md.


def _wait_for(check: Any, timeout_s: float, what: str, step_s: float = 0.3,
              running: subprocess.Popen[str] | None = None) -> None:
    """Poll `check` until it holds; fail with `running`'s output if that process ends first."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if running is not None and running.poll() is not None:
            out, err = running.communicate()
            raise AssertionError(f"exit {running.returncode} before {what}: {err[-3000:]}\n{out[-2000:]}")
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _start_apply(target: Target, work: Path, runs: Path, *extra: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "toolkit", "apply", "profile", "glm5-tp8", "-i", str(target.inventory_path),
            "--profiles-dir", str(work / "profiles"), "--runs-dir", str(runs), "--json", *extra]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def _main_pid(target: Target) -> str:
    return ct(target, "systemctl show -p MainPID --value sglang").stdout.strip()


def test_fault_server_killed_mid_benchmark_while_a_second_apply_is_refused(provisioned: Target, work: Path,
                                                                           reliability) -> None:
    profile = work / "profiles" / "glm5-tp8.yaml"
    before = profile.read_bytes()
    from toolkit.adapters.host_lock import lock_path, read_holder

    first = _start_apply(provisioned, work, work / "runs-kill", "--probe", "--record")
    lock = lock_path(f"{provisioned.address}:22")
    _wait_for(lambda: (h := read_holder(lock)) is not None and h.pid == first.pid, 300, "the apply's host lock",
              running=first)

    # The same host, at once: refused with --no-wait, naming the apply that holds it.
    rc2, _, err2 = apply(provisioned, work, "--no-wait")
    assert rc2 == 2 and f"host {provisioned.name} is in use by pid {first.pid}" in err2, err2[-2000:]

    # bench_serving takes seconds to load before it sends anything, then finishes its 160 requests in ~7 s: wait in
    # the container itself for its first finished requests (its progress bar counts them, "5/160", where "0/160 ...
    # ?it/s" is only the start) and kill at once, so the kill lands with requests in flight whatever an SSH round
    # trip costs on a loaded host.
    _wait_for(lambda: ct(provisioned, "pgrep -f '[s]glang.bench_serving' >/dev/null").returncode == 0, 300,
              "the benchmark", running=first)
    kill = ct(provisioned,
              "d=$(ls -td /var/lib/toolkit/runs/*/ | head -1); for i in $(seq 600); do "
              f"grep -qsE '[|] *[1-9][0-9]?/{LAB_NUM_PROMPTS} ' $d/bench.stderr.log && break; sleep 0.05; done; "
              "pid=$(systemctl show -p MainPID --value sglang); kill -9 $pid && echo $pid")
    assert kill.returncode == 0, kill.stderr
    killed = kill.stdout.strip()
    out, err = first.communicate(timeout=600)
    assert first.returncode == 1, err[-3000:]
    summary = json.loads(out)
    verdict = summary["probe"][provisioned.name]["verdict"]
    assert verdict["class"] == "benchmark-failed"
    server_log = verdict["evidence"]["server_log_tail"]
    assert "status=9/KILL" in server_log, server_log  # systemd's own line about the kill, from the journal
    assert "record" not in summary and profile.read_bytes() == before  # nothing recorded as a result
    assert "the server's log tail is in evidence.server_log_tail" in verdict["headline"]

    rc, _, err = apply(provisioned, work)
    assert rc == 0, err[-3000:]
    now = _main_pid(provisioned)
    assert now not in ("0", killed) and ct(provisioned, "systemctl is-active sglang").stdout.strip() == "active"
    reliability(
        fault="the SGLang server (lab stand-in) killed with SIGKILL mid-benchmark",
        user_saw=f"exit {first.returncode}; verdict: {verdict['headline']}; then the server's log: "
        + next(line for line in server_log.splitlines() if "status=9/KILL" in line).split(": ", 1)[-1],
        recorded="the failed run's artifacts (verdict benchmark-failed, evidence.server_log_tail); the profile byte "
        "for byte unchanged (no results entry)",
        next_run=f"apply exit {rc}: the service active again under a new main PID ({killed} -> {now}), "
        "health and smoke passed",
        area="apply",
    )
    reliability(
        fault="a second `toolkit apply --no-wait` on the same host while an apply runs",
        user_saw=f"exit {rc2}: " + next(line for line in err2.splitlines() if "is in use by" in line).strip(),
        recorded="nothing: refused before any playbook ran",
        next_run="the first apply went on undisturbed (its own outcome above)",
        area="apply",
    )


def test_fault_container_stopped_mid_apply_then_the_next_apply_converges(provisioned: Target, work: Path,
                                                                         tmp_path: Path, reliability) -> None:
    state = tmp_path / "state"  # this apply's own ansible-runner directory: its events say when a task runs
    first = _start_apply(provisioned, work, tmp_path / "runs", env={"TOOLKIT_STATE_DIR": str(state)})

    def tasks_started() -> int:
        return sum(1 for f in state.glob("ansible/artifacts/*/job_events/*.json")
                   if '"runner_on_start"' in f.read_text(errors="replace"))

    _wait_for(lambda: tasks_started() >= 3, 300, "the deploy's third task on the host", running=first)
    stop = provisioned.lab.ssh("pve1", "pct stop 100")
    assert stop.returncode == 0, stop.stderr
    out, err = first.communicate(timeout=600)
    summary = json.loads(out)
    assert first.returncode == 1
    (failure,) = [f for f in summary["failures"] if f["host"] == provisioned.name]
    assert failure["task"] and provisioned.name in summary["unreachable"] + summary["failed_hosts"]

    assert provisioned.lab.ssh("pve1", "pct start 100").returncode == 0
    _wait_for(lambda: ct(provisioned, "systemctl is-active sglang").stdout.strip() == "active", 120,
              "the container and its service")
    rc, again, err = apply(provisioned, work)
    assert rc == 0, err[-3000:]
    assert not again["failures"] and again["hosts"][provisioned.name]["failed"] == 0
    reliability(
        fault="the container stopped (`pct stop`) mid-apply",
        user_saw=f"exit {first.returncode}; {failure['host']}: {failure['task']} "
        f"({'unreachable' if provisioned.name in summary['unreachable'] else 'failed'})",
        recorded="the summary's failures name the host and the task; nothing else changed on the controller",
        next_run=f"after `pct start 100`: apply exit {rc}, changed={again['hosts'][provisioned.name]['changed']}, "
        "the service active",
        area="apply",
    )


def test_fault_ctrl_c_during_the_probe_leaves_nothing_running(provisioned: Target, work: Path, tmp_path: Path,
                                                               reliability) -> None:
    import signal

    from toolkit.adapters.host_lock import host_locks

    runs = tmp_path / "runs-ctrl-c"
    first = _start_apply(provisioned, work, runs, "--probe")
    _wait_for(lambda: ct(provisioned, "pgrep -f '[s]glang.bench_serving'").returncode == 0, 300, "the benchmark",
              running=first)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "stopping this run's probe" in err
    # Nothing of this apply left: no ansible-playbook on the controller, no probe or benchmark on the host.
    ours = subprocess.run(["pgrep", "-f", str(runs)], capture_output=True, text=True)
    assert ours.stdout.strip() == "", ours.stdout
    assert ct(provisioned, "pgrep -f '[t]oolkit probe run|[s]glang.bench_serving'").stdout.strip() == ""
    with host_locks({provisioned.name: f"{provisioned.address}:22"}, purpose="test", wait=False) as held:
        assert held.taken == [provisioned.name]  # released
    reliability(
        fault="Ctrl-C (SIGINT) to `toolkit apply --probe` during the benchmark",
        user_saw=f"exit {first.returncode}; " + "; ".join(line for line in err.strip().splitlines()
                                                         if "interrupt" in line or "stopping" in line),
        recorded="no ansible-playbook left on the controller, no probe or bench_serving on the host; the probe, "
        "interrupted by this run's stop playbook, wrote what it had on the host",
        next_run="the host lock was free at once (taken with --no-wait)",
        area="apply",
    )


# Issue 16: the verdict over time on the stand-in's engine model (GPU, server and host timelines together); the
# glm5-tp8 and glm5-baseline applies above carry its assertions. This one runs last: it leaves a test variant
# deployed. One apply with --probe (no record).
SMALL_KV = """schema_version: 1
name: glm5-tp8-small-kv
extends: glm5-tp8
description: Lab test variant of glm5-tp8 with a small KV pool, to check the verdict names the knob that binds.
server:
  mem_fraction_static: 0.54
bench:
  random_range_ratio: 1.0
why:
  server.mem_fraction_static:
    reason: a small static fraction leaves the KV pool too small for 160 requests of 256 + 128 tokens.
  bench.random_range_ratio:
    reason: fixed lengths, so every request needs its full 384 tokens of KV.
"""


def test_small_mem_fraction_static_is_kv_bound_naming_it(provisioned: Target, work: Path) -> None:
    (work / "profiles" / "glm5-tp8-small-kv.yaml").write_text(SMALL_KV)
    rc, summary, err = apply(provisioned, work, "--probe", profile="glm5-tp8-small-kv")
    assert rc == 0, err[-4000:]
    verdict = summary["probe"][provisioned.name]["verdict"]
    assert verdict["class"] == "kv-bound", verdict["headline"]
    step = next(k for k in verdict["knob_steps"] if k["knob"] == "server.mem_fraction_static")
    assert step["current"] == 0.54 and step["proposed"][0] > 0.54
    assert verdict["evidence"]["over_time"]["server"]["token_usage"] >= 0.7


@pytest.mark.skipif(
    not os.environ.get("TOOLKIT_TEST_NEWEST_RELEASE_LAB"),
    reason="a second SGLang release in the container (a 296 MB wheelhouse, a fresh venv: 90 to 185 s on a 2-core "
    "machine) is over CI's share for it; run with TOOLKIT_TEST_NEWEST_RELEASE_LAB=1. CI covers the same refusal "
    "without the lab (test_standin_server.py::test_the_unmigrated_render_is_refused_and_the_migrated_one_parses)",
)
def test_the_newest_release_deploys_from_its_wheelhouse_and_its_stand_in_refuses_the_old_render(
        provisioned: Target, work: Path) -> None:
    """glm5-tp8-0.5.23 (glm5-tp8 migrated: --dsa-decode-backend, the CUDA graph backend flags, no patch) deploys
    SGLang 0.5.23 from its wheelhouse and probes; the stand-in beside it parses as 0.5.23 does, so glm5-tp8's 0.5.9
    render is refused there with argparse's line, as the real 0.5.23 server would refuse it."""
    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.core.profile.render import render_launch_argv
    from toolkit.lab.deploy_overlay import standin_argv

    rc, summary, err = apply(provisioned, work, "--probe", profile="glm5-tp8-0.5.23")
    assert rc == 0, err[-4000:]
    unit = ct(provisioned, "cat /etc/systemd/system/sglang.service").stdout
    assert "--dsa-decode-backend trtllm" in unit and "--cuda-graph-backend-decode disabled" in unit
    assert "--nsa-decode-backend" not in unit and "--disable-cuda-graph" not in unit
    assert installed_of(provisioned, "sglang") == "0.5.23"
    journal = ct(provisioned, "journalctl -u sglang --no-pager -o cat -n 200").stdout
    assert "parsing the flags as SGLang 0.5.23's parser does (the installed SGLang 0.5.23)" in journal
    # The probe ran the bench through the lab's bench client (SGLang 0.5.9's bench_serving, beside 0.5.23).
    assert installed_of(provisioned, "toolkit_lab_bench_client") == "0.5.9"
    assert summary["probe"][provisioned.name]["verdict"]["class"], summary["probe"]
    # 0.5.23's own bench_serving imports torch, which the lab has not: 0.5.9's client runs the same flags, announced.
    assert "lab: the benchmark client is SGLang 0.5.9's bench_serving" in " ".join(err.split())

    old = standin_argv(render_launch_argv(ProfileStore(work / "profiles").resolve("glm5-tp8")))
    old[old.index("--port") + 1] = "18000"  # beside the running service (the parse fails before any bind)
    refused = ct(provisioned, shlex.join(old))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "sglang serve: error: unrecognized arguments: --nsa-decode-backend trtllm"
    )


@pytest.mark.skipif(os.environ.get("TOOLKIT_TEST_REAL_ENGINE") != "1",
                    reason="opt-in (TOOLKIT_TEST_REAL_ENGINE=1): downloads and installs the real engine, several GB")
def test_the_real_engine_from_its_lock_passes_the_check_and_a_removed_package_fails_the_deploy_naming_it(
        provisioned: Target, work: Path, tmp_path: Path) -> None:
    """The real torch and SGLang from the real 0.5.9 lock (no stand-ins) installed into the lab's container: the
    engine check imports torch, sglang.srt.server_args and the profile's backends (CUDA absent allowed); then a
    package removed from that venv fails the next deploy at the check, in seconds, naming it."""
    import time

    from toolkit.core.engine_lock import parse_lock

    inventory = with_host_vars(provisioned, tmp_path, toolkit_lab_real_engine=True)
    started = time.monotonic()
    rc, summary, err = apply(provisioned, work, inventory=inventory)
    installed_s = time.monotonic() - started
    assert rc == 0, err[-4000:]
    venv = ct(provisioned, "readlink /opt/sglang/venv").stdout.strip()
    size = ct(provisioned, f"du -sm {venv} | cut -f1").stdout.strip()
    check = json.loads(ct(provisioned, f"{venv}/bin/python {venv}/toolkit-engine-check.py "
                                       f"{venv}/toolkit-engine-check.json").stdout.strip().splitlines()[-1])
    assert check["ok"], check
    statuses = {i["module"]: i["status"] for i in check["imports"]}
    assert {"torch", "sglang.srt.server_args", "flashinfer", "sgl_kernel"} <= set(statuses), statuses
    assert set(statuses.values()) <= {"ok", "no-cuda"}, check["imports"]
    lock = parse_lock((REPO / "profiles/requirements/sglang-0.5.9-cp311.lock").read_text(), "lock")
    kernel = lock.get("sgl-kernel")
    assert kernel is not None
    try:
        ct(provisioned, f"{venv}/bin/python -m pip uninstall -q -y sgl-kernel")
        started = time.monotonic()
        rc, summary, _ = apply(provisioned, work, inventory=inventory)
        failed_s = time.monotonic() - started
        assert rc != 0
        (failure,) = summary["failures"]
        assert failure["task"] == "Fail the deploy when the venv cannot start SGLang"
        assert f"missing {kernel.requirement()}" in failure["message"]
        assert "import sgl_kernel failed (ModuleNotFoundError" in failure["message"]
    finally:
        ct(provisioned, f"rm -rf {venv}")
    print(f"real engine: installed in {installed_s:.0f} s (apply), venv {size} MiB; the deploy with sgl-kernel "
          f"removed failed in {failed_s:.0f} s (apply)")
    rc, _, err = apply(provisioned, work)  # back to the lab lock's venv: a switch
    assert rc == 0, err[-4000:]
