"""The sampler boundary: what the probe's loop calls, whether the GPUs are real or recorded.

`toolkit.adapters.nvml.NvmlSampler` reads real GPUs; `RecordedSampler` plays a recorded trace through the
same four calls, for CPU tests and for the lab (which has no GPU). Every row a RecordedSampler yields is
recorded data, and the run it feeds says so in each artifact.
"""

from __future__ import annotations

import bisect
from pathlib import PurePath
from typing import Any, Protocol

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.records import RunRecord
from toolkit.core.probe.series import NUMERIC_COLUMNS, Trace
from toolkit.core.provenance import Provenance

Row = dict[str, float | int | str | None]


class GpuSampler(Protocol):
    source: str  # "nvml", or "recorded:<file>" for replayed data
    provenance: Provenance  # what kind of figures it gives, declared here where they are made

    def open(self, gpus: list[int] | None) -> list[int]:
        """Start; select GPUs (None = all). Raises ToolkitError (exit 2) when there is no driver or GPU."""
        ...

    def topology(self) -> dict[str, Any]:
        """Driver, GPU names and the pairwise topology / P2P matrix, once per run."""
        ...

    def sample(self, t_s: float) -> list[Row]:
        """One row per selected GPU; a GPU that errors gives a row with `error` set, not an exception."""
        ...

    def bench_started(self, t_s: float) -> None:
        """The benchmark started at t_s (the probe's clock). NVML ignores it; a recorded trace aligns to it."""
        ...

    def close(self) -> None: ...


class RecordedSampler:
    """Plays `trace` back on the run's clock.

    Without the recording's run manifest (`run`), the row at recorded t0 + t_s (the last one held at the end).
    With it, playback follows the live run's phases, so the replay does not depend on how long this machine's
    benchmark takes: the live idle phase plays the recorded idle (looped if longer), and from the live
    benchmark's start the recorded benchmark plays from its own start through its ramp-up, then loops over the
    recording's steady window until the live benchmark ends. A slow benchmark (a loaded CI machine) would
    otherwise run past the recording's end and be judged on a held idle row."""

    def __init__(self, trace: Trace, file: str, topology: dict[str, Any] | None = None,
                 run: RunRecord | None = None) -> None:
        self.trace = trace
        self.file = file
        self.source = f"recorded:{file}"
        self.provenance = Provenance("replayed", f"recorded GPU trace {PurePath(file).name}, not measured in this run")
        self._topology = topology
        self._gpus: list[int] = []
        starts = [s.t_s[0] for s in trace.gpus.values() if s.t_s]
        self._t0 = min(starts) if starts else 0.0
        self._live_bench_start_s: float | None = None
        self._phases = _recorded_phases(trace, run, self._t0) if run is not None else None

    def bench_started(self, t_s: float) -> None:
        self._live_bench_start_s = t_s

    def _recorded_t(self, t_s: float) -> float:
        if self._phases is None:
            return self._t0 + t_s
        bench_start, loop_start, loop_end = self._phases
        if self._live_bench_start_s is None:
            idle_len = bench_start - self._t0
            return self._t0 + (t_s % idle_len if idle_len > 0 else 0.0)
        x = bench_start + max(0.0, t_s - self._live_bench_start_s)
        if x > loop_end and loop_end > loop_start:
            x = loop_start + (x - loop_start) % (loop_end - loop_start)
        return x

    def open(self, gpus: list[int] | None) -> list[int]:
        have = sorted(g for g, s in self.trace.gpus.items() if len(s))
        if not have:
            raise ToolkitError.of("the recorded trace has no samples", file=self.file,
                                  fix="record one with `toolkit probe run` on a GPU machine")
        if gpus is None:
            self._gpus = have
        else:
            missing = [g for g in gpus if g not in have]
            if missing:
                raise ToolkitError.of(f"GPUs {missing} are not in the recorded trace (it has {have})",
                                      file=self.file, field="--gpus", fix=f"choose from {have} or use --gpus all")
            self._gpus = list(gpus)
        return self._gpus

    def topology(self) -> dict[str, Any]:
        if self._topology is not None:
            return {**self._topology, "data_source": self.source}
        return {
            "driver_version": None,
            "gpus": [{"index": g, "name": "recorded GPU", "gpm_supported": None} for g in self._gpus],
            "links": [],
            "data_source": self.source,
        }

    def sample(self, t_s: float) -> list[Row]:
        rows: list[Row] = []
        t_rec = self._recorded_t(t_s)
        for g in self._gpus:
            s = self.trace.gpus[g]
            i = max(0, min(len(s) - 1, bisect.bisect_right(s.t_s, t_rec) - 1))
            row: Row = {"t_s": t_s, "gpu": g, "error": s.errors[i]}
            for c in NUMERIC_COLUMNS:
                row[c] = s.values[c][i]
            rows.append(row)
        return rows

    def close(self) -> None:
        return None


def _recorded_phases(trace: Trace, run: RunRecord, t0: float) -> tuple[float, float, float] | None:
    """(bench start, loop start, loop end) on the recording's clock: the loop is its steady window, or its
    whole benchmark window when it had none (an idle or failed recording). None without a benchmark window."""
    from toolkit.core.probe.steady import SteadyParams, find_steady_window
    from toolkit.core.probe.summary import idle_power

    if run.bench_start_s is None or run.bench_end_s is None:
        return None
    b0, b1 = float(run.bench_start_s), float(run.bench_end_s)
    if b1 <= b0:
        return None
    idle = idle_power(trace, float(run.idle_start_s), float(b0 if run.idle_end_s is None else run.idle_end_s))
    steady = find_steady_window(trace, b0, b1, idle, SteadyParams.of_record(run.steady_state))
    return (b0, steady.start_s, steady.end_s) if steady.found else (b0, b0, b1)
