"""The sampler boundary: what the probe's loop calls, whether the GPUs are real or recorded.

`toolkit.adapters.nvml.NvmlSampler` reads real GPUs; `RecordedSampler` plays a recorded trace through the
same four calls, for CPU tests and for the lab (which has no GPU). Every row a RecordedSampler yields is
recorded data, and the run it feeds says so in each artifact.
"""

from __future__ import annotations

import bisect
from typing import Any, Protocol

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.trace import NUMERIC_COLUMNS, Trace

Row = dict[str, float | int | str | None]


class GpuSampler(Protocol):
    source: str  # "nvml", or "recorded:<file>" for replayed data

    def open(self, gpus: list[int] | None) -> list[int]:
        """Start; select GPUs (None = all). Raises ToolkitError (exit 2) when there is no driver or GPU."""
        ...

    def topology(self) -> dict[str, Any]:
        """Driver, GPU names and the pairwise topology / P2P matrix, once per run."""
        ...

    def sample(self, t_s: float) -> list[Row]:
        """One row per selected GPU; a GPU that errors gives a row with `error` set, not an exception."""
        ...

    def close(self) -> None: ...


class RecordedSampler:
    """Plays `trace` back on the run's clock: the row at recorded t0 + t_s (the last one held at the end)."""

    def __init__(self, trace: Trace, file: str, topology: dict[str, Any] | None = None) -> None:
        self.trace = trace
        self.file = file
        self.source = f"recorded:{file}"
        self._topology = topology
        self._gpus: list[int] = []
        starts = [s.t_s[0] for s in trace.gpus.values() if s.t_s]
        self._t0 = min(starts) if starts else 0.0

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
        for g in self._gpus:
            s = self.trace.gpus[g]
            i = max(0, min(len(s) - 1, bisect.bisect_right(s.t_s, self._t0 + t_s) - 1))
            row: Row = {"t_s": t_s, "gpu": g, "error": s.errors[i]}
            for c in NUMERIC_COLUMNS:
                row[c] = s.values[c][i]
            rows.append(row)
        return rows

    def close(self) -> None:
        return None
