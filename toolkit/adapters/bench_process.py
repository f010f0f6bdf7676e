"""The benchmark subprocess and the sampling loop around it, on one monotonic clock.

Timeline of a run (seconds since the run's start, `time.monotonic()` of this process):
  [0, idle_s)            idle baseline: sampling, no benchmark
  bench_start_s          the benchmark subprocess is started (just before Popen)
  bench_end_s            its exit is seen (poll after each tick; at most one tick late)
The trace is streamed to `trace.csv.partial` as it is sampled, so Ctrl-C or a crash keeps what was seen;
the caller renames it when the run is over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from toolkit.adapters.timeline_thread import TimelineThread
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.sampler import GpuSampler, Row
from toolkit.core.probe.series import COLUMNS
from toolkit.core.probe.trace import format_row, header_line

STDERR_TAIL_CHARS = 4000
def read_bench_jsonl(path: Path) -> dict[str, Any] | None:
    """The last JSON object line of bench_serving's --output-file (it appends one line per run)."""
    if not path.exists():
        return None
    last: dict[str, Any] | None = None
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut off by an interrupted benchmark: keep the previous complete one
        if isinstance(obj, dict):
            last = obj
    return last


def tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - chars))
        return f.read().decode(errors="replace")


@dataclass
class SamplerCost:
    ticks: int = 0
    late_ticks: int = 0  # ticks that started more than one period late
    gpu_samples: int = 0
    sample_wall_s: float = 0.0  # time inside sampler.sample()
    sample_cpu_s: float = 0.0  # this thread's CPU time inside sampler.sample()
    loop_wall_s: float = 0.0
    process_cpu_s: float = 0.0  # the whole probe process (every thread: loop, trace writer, sampler thread)
    sampler_thread: dict[str, Any] = field(default_factory=dict)  # the sampler's own thread, where it has one

    def to_dict(self) -> dict[str, Any]:
        per = self.sample_wall_s / self.gpu_samples if self.gpu_samples else None
        thread_cpu = float(self.sampler_thread.get("thread_cpu_s", 0.0))
        return {
            **self.sampler_thread,
            "process_cpu_s": round(self.process_cpu_s, 4),
            "process_cpu_share_of_one_core": round(self.process_cpu_s / self.loop_wall_s, 5)
            if self.loop_wall_s else None,
            "ticks": self.ticks,
            "late_ticks": self.late_ticks,
            "gpu_samples": self.gpu_samples,
            "sample_wall_s": round(self.sample_wall_s, 4),
            "sample_cpu_s": round(self.sample_cpu_s, 4),
            "loop_wall_s": round(self.loop_wall_s, 3),
            "ms_per_gpu_sample": round(per * 1000, 4) if per is not None else None,
            # the sampling itself: calls into the sampler on the loop's thread plus its own thread, if any
            "cpu_share_of_one_core": round((self.sample_cpu_s + thread_cpu) / self.loop_wall_s, 5)
            if self.loop_wall_s else None,
        }


@dataclass
class RunResult:
    idle_start_s: float = 0.0
    idle_end_s: float = 0.0
    bench_start_s: float = 0.0
    bench_end_s: float = 0.0
    t0_epoch_ns: int = 0  # the wall clock at the run's start: a fleet's controller moves these times onto its own
    exit_code: int | None = None
    interrupted: bool = False
    stderr_tail: str = ""
    cost: SamplerCost = field(default_factory=SamplerCost)
    gpus: list[int] = field(default_factory=list)


def run_sampled(
    sampler: GpuSampler,
    argv: Sequence[str],
    out_dir: Path,
    *,
    gpus: list[int],
    sample_hz: float,
    idle_s: float,
    trace_meta: dict[str, str],
    env: dict[str, str] | None = None,
    on_tick: Callable[[str, float, list[Row]], None] | None = None,
    side: Sequence[TimelineThread] = (),
    on_bench_pid: Callable[[int], None] | None = None,
) -> RunResult:
    """Sample idle_s of baseline, then run argv while sampling, until it exits (or Ctrl-C).

    `side` timelines (server scrape, host CPU) run in their own threads on the same clock from t0 to the end;
    `on_bench_pid` learns the benchmark's pid as soon as it is started (the host timeline's `bench` root)."""
    period = 1.0 / sample_hz
    result = RunResult(gpus=gpus)
    partial = out_dir / "trace.csv.partial"
    stdout_path, stderr_path = out_dir / "bench.stdout.log", out_dir / "bench.stderr.log"
    proc: subprocess.Popen[bytes] | None = None
    t0 = time.monotonic()
    result.t0_epoch_ns = time.time_ns()
    env = dict(env if env is not None else os.environ, TOOLKIT_PROBE_T0_MONOTONIC=repr(t0))
    cost = result.cost
    for tl in side:
        tl.start(t0)
    cpu0 = _process_cpu_s()
    with partial.open("w", buffering=1 << 16) as trace_f, stdout_path.open("wb") as so, stderr_path.open("wb") as se:
        trace_f.write(header_line(trace_meta))
        trace_f.write(",".join(COLUMNS) + "\n")
        try:
            k = 0
            phase = "idle"
            while True:
                now = time.monotonic() - t0
                if phase == "idle" and now >= idle_s:
                    result.idle_end_s = now
                    phase = "bench"
                    result.bench_start_s = time.monotonic() - t0
                    sampler.bench_started(result.bench_start_s)
                    try:
                        proc = subprocess.Popen(list(argv), stdout=so, stderr=se, env=env)
                    except OSError as err:
                        raise ToolkitError.of(f"cannot start the benchmark: {err}", field="command",
                                              fix="check the command after `--` (is it installed, on PATH?)") from None
                    if on_bench_pid is not None:
                        on_bench_pid(proc.pid)
                target = k * period
                if target > now:
                    time.sleep(target - now)
                elif now - target > period:
                    cost.late_ticks += 1
                    k = int(now / period)  # skip missed ticks rather than bursting to catch up
                t_s = time.monotonic() - t0
                c0, w0 = time.thread_time(), time.perf_counter()
                rows = sampler.sample(t_s)
                cost.sample_wall_s += time.perf_counter() - w0
                cost.sample_cpu_s += time.thread_time() - c0
                cost.ticks += 1
                cost.gpu_samples += len(rows)
                _write_rows(trace_f, rows)
                if on_tick is not None:
                    on_tick(phase, t_s, rows)
                k += 1
                if proc is not None and proc.poll() is not None:
                    result.bench_end_s = time.monotonic() - t0
                    result.exit_code = proc.returncode
                    break
        except KeyboardInterrupt:
            result.interrupted = True
            end = time.monotonic() - t0
            if phase == "idle":
                result.idle_end_s = result.bench_start_s = end
            result.bench_end_s = end
            if proc is not None:
                stop_process(proc)
            result.exit_code = proc.returncode if proc is not None else None
        except OSError:
            # The trace could not be written (the disk under the run directory is full): the benchmark must
            # not run on unrecorded, so it is stopped before the error goes up.
            if proc is not None:
                stop_process(proc)
            raise
        finally:
            # A threaded sampler (NVML) hands its last rows over here: power samples it had not drained yet.
            finish = getattr(sampler, "finish", None)
            if finish is not None:
                rows = finish(time.monotonic() - t0)
                cost.gpu_samples += len(rows)
                _write_rows(trace_f, rows)
            cost.loop_wall_s = time.monotonic() - t0
            cost.process_cpu_s = _process_cpu_s() - cpu0  # the side timelines' threads included
            sampler_cost = getattr(sampler, "cost", None)
            if sampler_cost is not None:
                cost.sampler_thread = sampler_cost()
            for tl in side:
                tl.stop()
    result.stderr_tail = tail(stderr_path)
    return result


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGINT (bench_serving writes what it has), then SIGKILL if it does not end within grace_s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_log_tail(unit: str, since_epoch_s: float, lines: int = 40) -> str:
    """The last `lines` of systemd unit `unit`'s journal since `since_epoch_s` (the server's side of a failed
    benchmark: a crash, an OOM kill, systemd saying it was killed). Empty where there is no journal."""
    try:
        proc = subprocess.run(
            ["journalctl", "--no-pager", "-o", "short-iso", "-u", unit, "--since", f"@{int(since_epoch_s)}",
             "-n", str(lines)],
            capture_output=True, text=True, timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout[-STDERR_TAIL_CHARS:] if proc.returncode == 0 else ""


def _process_cpu_s() -> float:
    # user + system of every thread, to the nanosecond (os.times counts 10 ms clock ticks: 0.07 % of a core over a
    # 15 s run, too coarse for a cost that should stay under 2 %)
    return time.process_time()


def _write_rows(f: IO[str], rows: list[Row]) -> None:
    for r in rows:
        f.write(format_row(r))
