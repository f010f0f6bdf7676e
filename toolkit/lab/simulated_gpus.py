"""The lab's GPUs: SIMULATED, read from the stand-in server's lab-only GET /lab/gpus.

The lab has no GPU. Its stand-in server runs the engine model (toolkit/lab/standin_server/engine_model.py),
which knows at each instant what the GPUs would be doing (a prefill, a decode step, idle) and what that costs in
power; this sampler reads that state through the same four calls as NVML, so the probe's loop, summary and
verdict run unchanged on GPU figures that follow the profile (tp, max_running_requests, memory) instead of one
replayed recording. Every row, the trace header (source=simulated:...), topology.json and run.json say so.
Standard library only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.sampler import Row
from toolkit.core.probe.series import NUMERIC_COLUMNS
from toolkit.core.provenance import Provenance

PROVENANCE = Provenance("stand-in", "simulated GPUs: the lab's engine model, not measured on a GPU")


class SimulatedSampler:
    """The lab's GPU source for `toolkit probe run --gpu-source simulated:URL` (a plug-in: toolkit.app.plugins)."""

    provenance = PROVENANCE

    def __init__(self, base_url: str, timeout_s: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.source = f"simulated:{self.base_url}/lab/gpus"
        self.timeout_s = timeout_s
        self._gpus: list[int] = []
        self._topology: dict[str, Any] = {}
        self.note = ""

    def _get(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base_url + "/lab/gpus", timeout=self.timeout_s) as r:
            data = json.loads(r.read())
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            raise ValueError("not a /lab/gpus answer")
        return data

    def open(self, gpus: list[int] | None) -> list[int]:
        try:
            data = self._get()
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ToolkitError.of(f"the lab stand-in at {self.base_url} does not answer /lab/gpus ({err})",
                                  field="--simulated-gpus",
                                  fix="start the lab's stand-in server (toolkit apply in the lab) or give its URL") \
                from None
        have = [int(g["gpu"]) for g in data["gpus"]]
        chosen = have if gpus is None else gpus
        missing = [g for g in chosen if g not in have]
        if missing:
            raise ToolkitError.of(f"GPUs {missing} are not simulated (the stand-in has {have})", field="--gpus",
                                  fix=f"choose from {have} or use --gpus all")
        self._gpus = chosen
        self._topology = data.get("topology") or {}
        self.note = str(data.get("simulated") or "simulated")
        return chosen

    def topology(self) -> dict[str, Any]:
        topo = dict(self._topology)
        topo["gpus"] = [g for g in topo.get("gpus", []) if g.get("index") in self._gpus]
        topo["links"] = [lk for lk in topo.get("links", []) if lk.get("a") in self._gpus and lk.get("b") in self._gpus]
        return {**topo, "data_source": self.source, "simulated": self.note}

    def bench_started(self, t_s: float) -> None:
        return None

    def sample(self, t_s: float) -> list[Row]:
        try:
            data = self._get()
        except (urllib.error.URLError, OSError, ValueError) as err:
            text = str(err).replace(",", ";").replace("\n", " ")[:200]
            return [{"t_s": t_s, "gpu": g, "error": f"stand-in: {text}"} for g in self._gpus]
        by_gpu = {int(g["gpu"]): g for g in data["gpus"]}
        rows: list[Row] = []
        for g in self._gpus:
            src = by_gpu.get(g, {})
            row: Row = {"t_s": t_s, "gpu": g, "error": "" if src else "not simulated this tick"}
            for c in NUMERIC_COLUMNS:
                v = src.get(c)
                row[c] = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
            rows.append(row)
        return rows

    def close(self) -> None:
        return None
