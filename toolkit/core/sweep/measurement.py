"""A results entry as the sweep's Measurement: the figures a ranking and a tune compare. Pure."""

from __future__ import annotations

from typing import Any

from toolkit.core.sweep.run import PointFailed
from toolkit.core.sweep.state import Measurement


def measurement_from_entry(entry: Any) -> Measurement:
    """Map a results entry (toolkit.core.results.model.ResultsEntry) onto the sweep's Measurement; NaN stays NaN
    (a failure)."""
    tput, which = entry.output_tok_per_s()
    if tput is None:
        raise PointFailed("the probe run has no output throughput (the benchmark produced no result)")
    power = entry.power
    count = len(power.per_gpu) if power and power.per_gpu else (entry.gpu.count or 1)
    energy = entry.energy
    return Measurement(
        steady_output_tok_per_s=float(tput),
        output_tok_per_s=entry.throughput.full_run.output_tok_per_s,
        steady_total_tok_per_s=entry.throughput.steady_state.total_tok_per_s if entry.throughput.steady_state else None,
        tokens_per_j=energy.output_tok_per_j if energy else None,
        energy_per_output_token_j=energy.j_per_output_tok if energy else None,
        power_w_total=round(power.mean_w * count, 1) if power and power.mean_w is not None else None,
        gpu_count=count if power and power.mean_w is not None else None,
        verdict=entry.verdict_class(),
        # The report and a promoted profile's whys quote it, so no one reads lab figures as a GPU's.
        provenance=entry.provenance(),
        throughput_window=which,
    )
