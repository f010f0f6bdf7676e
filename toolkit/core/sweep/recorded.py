"""An in-process sweep runner that answers from a table of recorded results instead of a host.

What it stands in for: apply + probe of each variant. It is how the sweep's loop, resume and failure
rules are exercised without a GPU, and how a sweep is replayed from results recorded elsewhere. Every
measurement it returns says so (its provenance: replayed), and the CLI prints the runner's description.

A table is a mapping: {"about": str, "points": [...]}; each point has `knobs` (dotted path -> value, the
knobs it was measured with; a point matches a variant when these equal the variant's own knobs) and
either `concurrency` with `steady_output_tok_per_s`, `power_w_total` (all GPUs, steady window) and
optionally `output_tok_per_s`, `verdict`, `duration_s`, `fail` ("point") with `reason`; or `fail`:
"variant" with `reason` (the server did not come up: no concurrency needed); or `concurrency` with
`probe_run`: a recorded `toolkit probe run` directory (relative to the table's file), read through the
probe's own summary and verdict code by the injected `load_probe_run`. For `toolkit tune`, a point may also carry
`repeat` (the n-th measurement of that variant at that level, from 0; a point without it answers every repeat),
`knob_steps` (the verdict's, as verdict.json writes them) and `verdict_headline`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

from toolkit.core.errors import ToolkitError
from toolkit.core.provenance import Provenance, mark
from toolkit.core.sweep.run import PointFailed, PointRequest, VariantFailed
from toolkit.core.sweep.state import KnobStepRecord, Measurement
from toolkit.core.sweep.variants import canonical

RECORDED_RUN = Provenance("replayed", "recorded run")


def _num(value: Any) -> float:
    # JSON has no NaN literal in strict parsers: recorded NaN arrives as the string "NaN".
    return float(value)


class TableRunner:
    """`run_variant` over a recorded table; `sleep(duration_s)` replays each point's recorded duration."""

    def __init__(
        self,
        table: Mapping[str, Any],
        *,
        source: str,
        provenance: Provenance = RECORDED_RUN,
        sleep: Callable[[float], None] | None = None,
        load_probe_run: Callable[[str], Measurement] | None = None,
    ) -> None:
        self.source = source
        self.load_probe_run = load_probe_run
        self.provenance = provenance
        self.sleep = sleep
        self.calls: list[tuple[str, int]] = []
        self._points: dict[tuple[str, int | None, int | None], Mapping[str, Any]] = {}
        points = table.get("points") if isinstance(table, Mapping) else None
        if not isinstance(points, list):
            raise ToolkitError.of("a recorded table needs a list of points", file=source, field="points")
        for i, p in enumerate(points):
            if not isinstance(p, Mapping) or not isinstance(p.get("knobs"), Mapping):
                raise ToolkitError.of(f"point {i} has no knobs mapping", file=source, field=f"points[{i}].knobs")
            conc = p.get("concurrency")
            repeat = None if p.get("repeat") is None else int(p["repeat"])
            key = (canonical(dict(p["knobs"])), None if p.get("fail") == "variant" else int(conc or 0), repeat)
            self._points[key] = p

    def describe(self) -> str:
        return f"recorded results from {self.source} (replayed in-process, not a live measurement)"

    def __call__(self, request: PointRequest) -> Measurement:
        knobs = canonical(request.variant.knob_dict())
        self.calls.append((request.variant.id, request.concurrency))
        whole = self._points.get((knobs, None, None))
        if whole is not None:
            raise VariantFailed(str(whole.get("reason", "failed")))
        p = self._points.get((knobs, request.concurrency, request.repeat)) or self._points.get(
            (knobs, request.concurrency, None)
        )
        if p is None:
            raise PointFailed(f"no recorded result for {request.variant.label} at concurrency {request.concurrency}")
        if self.sleep is not None and p.get("duration_s"):
            self.sleep(float(p["duration_s"]))
        if p.get("fail"):
            raise PointFailed(str(p.get("reason", "failed")))
        if p.get("probe_run"):
            if self.load_probe_run is None:
                raise PointFailed(f"{self.source}: a probe_run point needs a probe run loader")
            m = self.load_probe_run(str(p["probe_run"]))
            # The run was recorded elsewhere, not with this variant's knobs: say so with every figure.
            run_name = str(p["probe_run"]).rstrip("/").rsplit("/", 1)[-1]
            m.provenance = Provenance("replayed",
                                      f"probe run {run_name}, recorded as {mark(m.provenance, detail=True)}")
            return m
        tput = _num(p["steady_output_tok_per_s"])
        power = _num(p["power_w_total"]) if p.get("power_w_total") is not None else None
        tokens_per_j = energy = None
        if power is not None and math.isfinite(tput) and tput > 0 and power > 0:
            tokens_per_j = round(tput / power, 6)
            energy = round(power / tput, 6)
        return Measurement(
            steady_output_tok_per_s=tput,
            output_tok_per_s=_num(p["output_tok_per_s"]) if p.get("output_tok_per_s") is not None else None,
            tokens_per_j=tokens_per_j,
            energy_per_output_token_j=energy,
            power_w_total=power,
            verdict=p.get("verdict"),
            provenance=self.provenance,
            knob_steps=[cast(KnobStepRecord, dict(s)) for s in p.get("knob_steps") or []],
            verdict_headline=p.get("verdict_headline"),
        )
