"""`toolkit probe run --fleet` for real: the toolkit's own sampler started on each host (local processes here, pve1
over SSH in the lab), each host's clock measured, the benchmark run on the controller, the runs brought back,
merged on the controller's clock and judged. The GPUs are a committed synthetic recording replayed by each host's
sampler (`--gpu-source replay:`), so the merge and the verdict have figures to work on without a GPU."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_json_contract import _run, _validated
from toolkit.app import fleet_probe
from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/probe/seed-synthetic-8gpu/trace.csv"


def _inventory(path: Path, hosts: dict[str, dict[str, Any]], group_vars: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_containers": {"vars": group_vars, "hosts": hosts}}}}))
    return str(path)


def _local_vars(tmp_path: Path) -> dict[str, Any]:
    return {"ansible_connection": "local", "toolkit_probe_sampler_command": [sys.executable, "-m", "toolkit"],
            "toolkit_probe_sampler_args": ["--gpu-source", f"replay:{FIXTURE}", "--host-hz", "4"]}


def _check_merged(out: Path, hosts: list[str]) -> dict[str, Any]:
    """What every fleet run must hold, read from its files."""
    run = json.loads((out / "run.json").read_text())
    verdict = json.loads((out / "fleet_verdict.json").read_text())
    assert run["kind"] == "fleet" and sorted(run["clocks"]) == sorted(hosts)
    for host in hosts:
        clock = run["clocks"][host]
        assert clock["start"]["exchanges"] == fleet_probe.CLOCK_EXCHANGES and clock["start"]["consistent"]
        assert 0 < clock["bound_s"] < 0.05  # half a round trip: well under a sampling tick here
        sampler = json.loads((out / "hosts" / host / "run.json").read_text())
        assert sampler["role"] == "fleet-sampler" and sampler["status"] == "finished"
        for name in ("trace.csv", "host_trace.csv", "net_trace.csv"):
            assert (out / "hosts" / host / name).exists(), name
        assert "net_gb_s_p95" in verdict["per_host"][host]
        assert verdict["per_host"][host]["gpu_count"] == 8
        # The node judged alone by the single-host code, over the fleet's window: the replayed GPUs are busy.
        assert verdict["per_host"][host]["verdict"]["class"] not in ("no-load", "benchmark-failed")
        assert verdict["evidence"]["clocks"][host]["bound_ms"] == pytest.approx(clock["bound_s"] * 1000, abs=1e-3)
    lines = (out / "fleet_trace.csv").read_text().splitlines()
    assert lines[0].startswith("# toolkit-probe-fleet-trace schema_version=1 clock=controller")
    rows = [line.split(",") for line in lines[2:]]
    assert {r[0] for r in rows} == set(hosts)
    # Every host's samples sit inside the controller's run, from the first sample to the last.
    t = [float(r[1]) for r in rows]
    assert min(t) >= run["idle_start_s"] - 5.0 and max(t) <= run["bench_end_s"] + 5.0
    # The host's own time of one sample, moved by the origins' difference, is its merged time within the bound.
    host = hosts[0]
    sampler = json.loads((out / "hosts" / host / "run.json").read_text())
    first_own = float((out / "hosts" / host / "trace.csv").read_text().splitlines()[2].split(",")[0])
    first_merged = next(float(r[1]) for r in rows if r[0] == host)
    moved = first_own + (sampler["clock_origin_epoch_ns"] - run["clock_origin_epoch_ns"]) / 1e9
    offset_s = run["clocks"][host]["start"]["offset_s"]
    assert abs(first_merged - (moved - offset_s)) <= run["clocks"][host]["bound_s"] + 0.002
    assert verdict["fleet"]["gpu_count"] == 8 * len(hosts) and verdict["fleet"]["energy_j"] > 0
    return verdict


# The router's exposition as smg writes it (docs/reference/metrics.md of smg: a gauge per worker URL).
ROUTER_EXPOSITION = """# HELP smg_worker_requests_active Currently running requests per worker
# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://10.0.0.1:30000"} 9
smg_worker_requests_active{worker="http://10.0.0.2:30000"} 3
# HELP smg_worker_health Worker health status (1=healthy, 0=unhealthy)
# TYPE smg_worker_health gauge
smg_worker_health{worker="http://10.0.0.1:30000"} 1
smg_worker_health{worker="http://10.0.0.2:30000"} 1
"""


@pytest.fixture
def router_metrics() -> Iterator[str]:
    """A metrics endpoint serving ROUTER_EXPOSITION: what the router's Prometheus port answers."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = ROUTER_EXPOSITION.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def test_two_hosts_are_sampled_merged_on_the_controllers_clock_and_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], router_metrics: str) -> None:
    inv = _inventory(tmp_path / "inv.yml", {"nodea": {"bench_probe_runs_dir": str(tmp_path / "a")},
                                            "nodeb": {"bench_probe_runs_dir": str(tmp_path / "b")}},
                     _local_vars(tmp_path))
    out = tmp_path / "fleet"
    outcome = fleet_probe.run(fleet_probe.FleetProbeRequest(command=["sleep", "1.5"], inventory=inv, idle_s=0.5,
                                                            sample_hz=10, out=out, network_gb_s=10.0,
                                                            router_metrics_url=router_metrics))
    assert outcome.exit_code == 0
    verdict = _check_merged(out, ["nodea", "nodeb"])
    assert verdict["evidence"]["network_measured_gb_s"] == 10.0
    # The router's view: 9 against 3 requests in flight, scraped here over the benchmark.
    assert verdict["class"] == "replicas-imbalanced"
    assert verdict["evidence"]["backend_load"] == {"http://10.0.0.1:30000": 9.0, "http://10.0.0.2:30000": 3.0}
    assert verdict["evidence"]["backend_load_is"] == "mean requests in flight at the router"
    run = json.loads((out / "run.json").read_text())
    assert run["router"]["scrapes"] > 0 and run["router"]["gaps"] == 0
    # Replayed from the directory alone: the same verdict, printed as its --json kind says.
    assert fleet_probe.judge_fleet_dir(out, write=False) == verdict
    data = _validated(_run(capsys, ["probe", "replay", str(out), "--json"]), "probe.fleet")
    assert data["replay"] and data["verdict"] == verdict
    shown = _run(capsys, ["probe", "replay", str(out)])
    assert "fleet probe" in shown and "nodea" in shown and "nodeb" in shown
    assert "verdict: replicas-imbalanced" in shown


def test_a_host_without_the_sampler_is_named_and_no_sampler_is_left_running(tmp_path: Path,
                                                                            reliability: Any) -> None:
    group = _local_vars(tmp_path)
    hosts = {"nodea": {"bench_probe_runs_dir": str(tmp_path / "a")},
             "nodeb": {"bench_probe_runs_dir": str(tmp_path / "b"),
                       # as a host without the venv answers over SSH: the shell's 127 and its words
                       "toolkit_probe_sampler_command": [sys.executable, "-c", "import sys; print("
                                                         "'bash: /opt/toolkit/venv/bin/toolkit: No such file or "
                                                         "directory', file=sys.stderr); sys.exit(127)"]}}
    inv = _inventory(tmp_path / "inv.yml", hosts, group)
    with pytest.raises(ToolkitError) as err:
        fleet_probe.run(fleet_probe.FleetProbeRequest(command=["true"], inventory=inv, idle_s=0.2,
                                                      out=tmp_path / "fleet"))
    assert "the sampler on nodeb ended before sampling: bash: /opt/toolkit/venv/bin/toolkit: No such file" in str(
        err.value)
    failed = json.loads((tmp_path / "fleet" / "run.json").read_text())
    assert failed["status"] == "failed" and "the sampler on nodeb ended before sampling" in failed["error"]
    # nodea's sampler was stopped with the run: its directory is whole (it finished, it was not killed).
    assert json.loads((tmp_path / "a" / "fleet" / "run.json").read_text())["status"] == "finished"
    left = subprocess.run(["pgrep", "-f", f"--out {tmp_path}/a/fleet"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    reliability(
        fault="a fleet probe's host without the sampler (its shell answers 127: no toolkit venv there)",
        user_saw=f"exit {err.value.exit_code}: {str(err.value).splitlines()[0]}",
        recorded=f"the fleet's run.json status {failed['status']} with the error; the other host's run finished "
        "and stays on it",
        next_run="no sampler left running on any host (pgrep finds none)",
        area="probe",
    )


def test_a_host_whose_run_cannot_be_fetched_is_left_out_and_said(tmp_path: Path, reliability: Any) -> None:
    """nodeb samples, but has no tar (through the generic exec prefix: every other command runs): the fleet is
    judged on nodea, and the verdict says what it did not see."""
    no_tar = ("import os, sys; a = sys.argv[1:]; "
              "sys.exit('bash: tar: command not found') if a[0] == 'tar' else os.execvp(a[0], a)")
    hosts = {"nodea": {"bench_probe_runs_dir": str(tmp_path / "a")},
             "nodeb": {"bench_probe_runs_dir": str(tmp_path / "b"),
                       "toolkit_probe_exec_prefix": [sys.executable, "-c", no_tar]}}
    inv = _inventory(tmp_path / "inv.yml", hosts, _local_vars(tmp_path))
    out = tmp_path / "fleet"
    outcome = fleet_probe.run(fleet_probe.FleetProbeRequest(command=["sleep", "1"], inventory=inv, idle_s=0.3,
                                                            out=out))
    run = json.loads((out / "run.json").read_text())
    assert sorted(run["host_runs"]) == ["nodea"] and sorted(run["clocks"]) == ["nodea", "nodeb"]
    assert any("nodeb: its run was not fetched" in n and "tar: command not found" in n for n in run["notes"])
    assert list(outcome.verdict["per_host"]) == ["nodea"]
    assert "not seen: nodeb: its run was not fetched" in outcome.verdict["headline"]
    # nodeb's sampler finished on its host all the same: its run is there to fetch by hand.
    assert json.loads((tmp_path / "b" / "fleet" / "run.json").read_text())["status"] == "finished"
    reliability(
        fault="a fleet probe's host whose run cannot be brought back (no tar on it)",
        user_saw=f"exit {outcome.exit_code}; verdict: {outcome.verdict['headline']}",
        recorded=f"run.json notes {run['notes']}; fleet_verdict.json per_host {sorted(outcome.verdict['per_host'])}",
        next_run="the host's own run stays whole on it (status finished), to fetch by hand",
        area="probe",
    )


def copy_toolkit_to(lab: Any, host: str, remote: str) -> dict[str, Any]:
    """The checkout's toolkit and the synthetic recording copied to a lab host; the inventory variables that reach
    it as Ansible would and run its sampler from there (a real host has the venv bench_probe installs)."""
    ssh = lab.ssh_args(host)
    pack = subprocess.run(["tar", "-C", str(REPO), "-cf", "-", "--exclude=__pycache__", "toolkit",
                           "tests/fixtures/probe/seed-synthetic-8gpu"], capture_output=True, check=True)
    subprocess.run([*ssh, f"rm -rf {remote} && mkdir -p {remote} && tar -C {remote} -xf -"], input=pack.stdout,
                   check=True, timeout=60)
    # The probe's import chain reaches core/sweep/state.py, whose TypedDicts come from typing_extensions (pydantic
    # needs them on Python < 3.12): a host's python3 needs that one module beside the toolkit.
    import typing_extensions

    subprocess.run([*ssh, f"cat > {remote}/typing_extensions.py"], input=Path(typing_extensions.__file__).read_bytes(),
                   check=True, timeout=60)
    return {"ansible_host": lab.config.lab_host(host).address, "ansible_user": "root",
            "ansible_ssh_private_key_file": lab.ssh_key_path,
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab.known_hosts_path} -o StrictHostKeyChecking=yes",
            "bench_probe_runs_dir": f"{remote}/runs",
            "toolkit_probe_sampler_command": ["env", f"PYTHONPATH={remote}", "python3", "-m", "toolkit"],
            "toolkit_probe_sampler_args": ["--gpu-source",
                                           f"replay:{remote}/tests/fixtures/probe/seed-synthetic-8gpu/trace.csv",
                                           "--host-hz", "4"]}


def probe_lab_hosts(lab: Any, hosts: list[str], tmp_path: Path, skew_ms: dict[str, int] | None = None,
                    hz: float = 20.0) -> dict[str, Any]:
    """A fleet probe over lab hosts reached over SSH; each host's clock found at its skew, and the moment each saw
    its run end, merged, just after the controller ended it (unmerged, a skewed host's is its skew late). The run's
    run.json."""
    from toolkit.core.probe.clock import HostClock
    from toolkit.core.probe.fleet import to_controller_s

    remote = "/tmp/toolkit-fleet-test"
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {h: copy_toolkit_to(lab, h, remote) for h in hosts}}}))
    out = tmp_path / "fleet"
    outcome = fleet_probe.run(fleet_probe.FleetProbeRequest(command=["sleep", "2"], inventory=str(inv),
                                                            pattern="all", idle_s=0.5, sample_hz=hz, out=out))
    assert outcome.exit_code == 0
    verdict = _check_merged(out, sorted(hosts))
    run = json.loads((out / "run.json").read_text())
    for host in hosts:
        clock = HostClock.from_record(run["clocks"][host])
        bound_s = clock.bound_ns / 1e9
        expected_s = (skew_ms or {}).get(host, 0) / 1000
        assert abs(clock.start.offset_ns / 1e9 - expected_s) <= bound_s + 0.002, (host, run["clocks"][host])
        own = json.loads((out / "hosts" / host / "run.json").read_text())
        merged = to_controller_s(clock, own["clock_origin_epoch_ns"], run["clock_origin_epoch_ns"],
                                 [own["bench_end_s"]])[0]
        unmerged = own["bench_end_s"] + (own["clock_origin_epoch_ns"] - run["clock_origin_epoch_ns"]) / 1e9
        stopped = run["sampler_stopped_s"][host]
        assert -bound_s <= merged - stopped <= 1 / hz + 0.25 + bound_s, (host, merged, stopped)
        assert unmerged - merged == pytest.approx(expected_s, abs=0.005)
        assert "eth0" in run["net_counters"][host]["end"]["bytes"]
        left = subprocess.run([*lab.ssh_args(host), f"pgrep -f 'ou[t] {remote}/runs' || true"], capture_output=True,
                              text=True, timeout=30)  # [t]: not the shell that runs pgrep, which holds the pattern
        assert left.stdout.strip() == ""
        subprocess.run([*lab.ssh_args(host), f"rm -rf {remote}"], check=False, timeout=30)
    assert "within +/-" in verdict["headline"]
    return run


@pytest.mark.lab
def test_pve1_sampled_over_ssh_beside_the_controller(lab: Any, tmp_path: Path) -> None:
    """pve1 is a real remote host: the checkout's toolkit copied there, started over SSH with the lab's key, its
    clock exchanged over SSH, its run fetched with tar."""
    run = probe_lab_hosts(lab, ["pve1"], tmp_path)
    assert run["clocks"]["pve1"]["bound_s"] > 0

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime is not installed (apt-get install libfaketime)")
def test_a_host_250_ms_ahead_is_merged_onto_the_controllers_clock_within_its_bound(tmp_path: Path) -> None:
    """`ahead` runs 250 ms ahead (libfaketime under its sampler and its clock, through toolkit_probe_exec_prefix).
    The controller knows when it ended each host's run (it closed the sampler's stdin); each host saw that end on
    its own clock (its bench_end_s, at its next tick). Merged, both ends land just after the controller's moment,
    as on the host without skew; left unmerged, the skewed one would be 250 ms late."""
    from toolkit.core.probe.clock import HostClock
    from toolkit.core.probe.fleet import to_controller_s

    hz = 20.0
    # Its monotonic clock moves with the wall clock: with FAKETIME_DONT_FAKE_MONOTONIC=1, libfaketime 0.9.10's
    # clock_nanosleep hands the kernel a negative time for Python 3.11's absolute monotonic sleeps, and time.sleep
    # raises EINVAL (wolfcw/libfaketime#426). The sampler's times are differences of its monotonic clock anyway.
    ahead = {"bench_probe_runs_dir": str(tmp_path / "ahead"),
             "toolkit_probe_exec_prefix": ["env", f"LD_PRELOAD={FAKETIME}", "FAKETIME=+0.25"]}
    inv = _inventory(tmp_path / "inv.yml", {"plain": {"bench_probe_runs_dir": str(tmp_path / "plain")},
                                            "ahead": ahead}, _local_vars(tmp_path))
    out = tmp_path / "fleet"
    outcome = fleet_probe.run(fleet_probe.FleetProbeRequest(command=["sleep", "1"], inventory=inv, idle_s=0.5,
                                                            sample_hz=hz, out=out))
    assert outcome.exit_code == 0
    _check_merged(out, ["ahead", "plain"])
    run = json.loads((out / "run.json").read_text())
    assert run["clocks"]["ahead"]["start"]["offset_s"] == pytest.approx(0.25, abs=0.005)
    assert run["clocks"]["plain"]["start"]["offset_s"] == pytest.approx(0.0, abs=0.005)
    late: dict[str, tuple[float, float]] = {}
    for host in ("plain", "ahead"):
        clock = HostClock.from_record(run["clocks"][host])
        own = json.loads((out / "hosts" / host / "run.json").read_text())
        origin = own["clock_origin_epoch_ns"]
        merged = to_controller_s(clock, origin, run["clock_origin_epoch_ns"], [own["bench_end_s"]])[0]
        naive = own["bench_end_s"] + (origin - run["clock_origin_epoch_ns"]) / 1e9
        stopped = run["sampler_stopped_s"][host]
        late[host] = (merged - stopped, naive - stopped)
        bound_s = clock.bound_ns / 1e9
        # At most a tick and the pipe's latency after the controller's moment, never before it (beyond the bound).
        # (A process under libfaketime ends its run 40-80 ms later than a plain one here: its calls are slower.)
        assert -bound_s <= merged - stopped <= 1 / hz + 0.25 + bound_s, (host, merged, stopped)
    assert late["ahead"][1] - late["ahead"][0] == pytest.approx(0.25, abs=0.005)  # what the merge took out
    assert abs(late["ahead"][0] - late["plain"][0]) < 0.2
    verdict = json.loads((out / "fleet_verdict.json").read_text())
    assert verdict["evidence"]["clocks"]["ahead"]["offset_ms"] == pytest.approx(250.0, abs=5.0)
    assert "within +/-" in verdict["headline"]
