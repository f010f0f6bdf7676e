"""`toolkit probe run|replay` end to end: real subprocesses, real files; NVML faked only at the adapter."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from unittest import mock

import pynvml
import pytest

import toolkit.adapters.nvml as nvml_adapter
from toolkit.cli.main import main
from toolkit.core.probe.trace import dump_trace, trace_from_rows

from . import fake_pynvml as fp

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "probe"


def _short_recorded_trace(path: Path) -> Path:
    """1 s idle then a spin-like plateau, as a recorded trace file (synthetic, labelled so)."""
    rows = []
    for i in range(120):
        t = i / 10
        busy = t >= 1.0
        rows.append({"t_s": t, "gpu": 0, "power_w": 120.0 if busy else 80.0, "power_limit_w": 700.0,
                     "util_gpu_pct": 100.0 if busy else 0.0, "gpm_sm_util_pct": 0.8 if busy else 0.0,
                     "gpm_tensor_util_pct": 0.0, "gpm_dram_bw_util_pct": 0.0, "energy_j": 1000 + t * 100})
    path.write_text(dump_trace(trace_from_rows(rows, {"sample_hz": "10", "source": "synthetic:cli-test"})))
    return path


def test_no_driver_is_exit_2_before_the_benchmark_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "started"
    fake = fp.make_fake([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with mock.patch.object(nvml_adapter, "pynvml", fake):
        rc = main(["probe", "run", "--out", str(tmp_path / "r"), "--", sys.executable, "-c",
                   f"open({str(marker)!r}, 'w')"])
    assert rc == 2
    assert not marker.exists() and not (tmp_path / "r").exists()
    assert "no NVIDIA driver" in capsys.readouterr().err


def test_no_gpu_is_exit_2(tmp_path: Path) -> None:
    with mock.patch.object(nvml_adapter, "pynvml", fp.make_fake([])):
        assert main(["probe", "run", "--out", str(tmp_path / "r"), "--", "true"]) == 2


def test_replayed_run_writes_every_artifact_labelled_lab_data(tmp_path: Path) -> None:
    trace = _short_recorded_trace(tmp_path / "recorded.csv")
    out = tmp_path / "run"
    rc = main(["probe", "run", "--replay-gpu-trace", str(trace), "--idle-s", "1", "--out", str(out), "--json", "--",
               sys.executable, "-c", "import time; time.sleep(7)"])
    assert rc == 0
    for name in ("run.json", "trace.csv", "topology.json", "summary.json", "verdict.json"):
        data = (out / name).read_text()
        assert "lab data" in data or "recorded" in data, name
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["class"] == "busy-but-waiting" and verdict["schema_version"] == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steady_state"]["found"]
    run = json.loads((out / "run.json").read_text())
    assert run["bench_end_s"] - run["bench_start_s"] >= 7
    assert main(["probe", "replay", str(out), "--json"]) == 0  # same code, same answer


def test_failing_benchmark_keeps_artifacts_and_exits_1(tmp_path: Path) -> None:
    trace = _short_recorded_trace(tmp_path / "recorded.csv")
    out = tmp_path / "run"
    rc = main(["probe", "run", "--replay-gpu-trace", str(trace), "--idle-s", "0.5", "--out", str(out), "--json", "--",
               sys.executable, "-c", "import sys; sys.stderr.write('connect refused\\n'); sys.exit(4)",
               "--api-key", "sk-secret-123"])
    assert rc == 1
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["class"] == "benchmark-failed"
    assert "connect refused" in verdict["evidence"]["stderr_tail"]
    everything = "".join(p.read_text() for p in out.iterdir())
    assert "sk-secret-123" not in everything  # the command is stored redacted
    assert '"***"' in (out / "run.json").read_text()


def test_bad_input_exit_2(tmp_path: Path) -> None:
    assert main(["probe", "run", "--replay-gpu-trace", str(FIX / "h200-spin" / "trace.csv")]) == 2  # no command
    assert main(["probe", "run", "--gpus", "zero", "--", "true"]) == 2
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("run.json", "topology.json", "bench.jsonl"):
        (bad / name).write_text((FIX / "h200-spin" / name).read_text())
    text = (FIX / "h200-spin" / "trace.csv").read_text()
    (bad / "trace.csv").write_text(text[: len(text) // 2])  # truncated mid-row
    assert main(["probe", "replay", str(bad)]) == 2


def test_truncated_replay_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (FIX / "h200-spin" / "trace.csv").read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: len(text) // 2])
    assert main(["probe", "run", "--replay-gpu-trace", str(cut), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert f"{cut}:{text[: len(text) // 2].count(chr(10)) + 1}" in err


def test_gpu_lost_mid_run_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    gpus = [fp.FakeGpu(util_gpu=100, power_mw=400_000), fp.FakeGpu(util_gpu=100, power_mw=400_000)]
    fake = fp.make_fake(gpus)
    # GPU 1 falls off the bus 1.5 s into the benchmark; GPU 0 keeps being sampled.
    script = "import time; time.sleep(3)"
    with mock.patch.object(nvml_adapter, "pynvml", fake):
        import threading

        timer = threading.Timer(2.0, lambda: setattr(gpus[1], "fail_with", pynvml.NVML_ERROR_GPU_IS_LOST))
        timer.start()
        rc = main(["probe", "run", "--idle-s", "0.5", "--out", str(tmp_path / "r"), "--json", "--",
                   sys.executable, "-c", script])
        timer.cancel()
    assert rc == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["gpu_error_count"] > 5
    assert {e["gpu"] for e in summary["gpu_errors"]} == {1}
    assert "GPU is lost" in summary["gpu_errors"][0]["error"]
    assert summary["full"]["gpus"]["0"]["error_samples"] == 0
    assert summary["full"]["gpus"]["0"]["samples"] > 25


@pytest.mark.slow  # replays the seed trace in real time: 10 s idle + 20 s benchmark
def test_profile_gives_the_bench_command_target_and_variants(tmp_path: Path) -> None:
    seed = FIX / "seed-synthetic-8gpu" / "trace.csv"
    out = tmp_path / "run"
    # An explicit command wins over the profile's bench; the profile still gives target and probe settings.
    rc = main(["probe", "run", "--profile", "glm5-tp8", "--replay-gpu-trace", str(seed), "--idle-s", "10",
               "--out", str(out), "--json", "--", sys.executable, "-c", "import time; time.sleep(20)"])
    assert rc == 0
    run = json.loads((out / "run.json").read_text())
    assert run["profile"] == "glm5-tp8" and run["target"]["profile"] == "glm5-tp8"
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["class"] == "busy-but-waiting"
    assert "glm5-tp4-pp2" in verdict["next_steps"][0] and "glm5-ep8" in verdict["next_steps"][0]
    assert verdict["provenance"]["kind"] == "replayed" and "REPLAYED" in verdict["data_source"]


def test_profile_bench_is_rendered_bench_serving(tmp_path: Path) -> None:
    seed = FIX / "seed-synthetic-8gpu" / "trace.csv"
    out = tmp_path / "run"
    rc = main(["probe", "run", "--profile", "glm5-tp8", "--replay-gpu-trace", str(seed), "--idle-s", "0.2",
               "--out", str(out), "--json"])
    run = json.loads((out / "run.json").read_text())
    assert run["command"][1:3] == ["-m", "sglang.bench_serving"]
    assert run["command"][run["command"].index("--output-file") + 1] == str((out / "bench.jsonl").resolve())
    # No SGLang here: the benchmark fails, and the run says so rather than judging the GPUs.
    assert rc == 1 and json.loads((out / "verdict.json").read_text())["class"] == "benchmark-failed"


def test_missing_benchmark_program_is_exit_2_with_nothing_written(tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert main(["probe", "run", "--replay-gpu-trace", str(FIX / "h200-spin" / "trace.csv"), "--out", str(out),
                 "--", "no-such-benchmark-xyz"]) == 2
    assert not out.exists()


def test_ctrl_c_writes_what_it_has(tmp_path: Path) -> None:
    import signal
    import subprocess

    out = tmp_path / "r"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit", "probe", "run", "--replay-gpu-trace", str(FIX / "h200-spin" / "trace.csv"),
         "--idle-s", "1", "--out", str(out), "--live", "off", "--",
         sys.executable, "-c", "import time; time.sleep(60)"],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out / "bench.stdout.log").exists():
        time.sleep(0.1)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and run["interrupted"] is True
    assert json.loads((out / "verdict.json").read_text())["class"] == "benchmark-failed"
    assert (out / "trace.csv").read_text().count("\n") > 20
