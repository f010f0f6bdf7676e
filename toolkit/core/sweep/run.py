"""The sweep loop: every pending point of every planned variant through an injected `run_variant`.

No I/O here: measuring (`run_variant`), saving the state (`save`), the clock and the progress display are
all passed in. The CPU tests inject an in-process runner over recorded probe runs; the CLI injects apply +
probe against a host. The rules live here once:
- the state is saved before a point starts (its attempt counted) and after it ends, so a kill at any
  moment loses at most the point in flight, and a resume measures it again;
- a point whose runner raises PointFailed, or whose numbers hold NaN, is recorded as failed with the
  reason and the sweep goes on; VariantFailed (the server did not come up) fails the variant's
  remaining levels with the same reason without trying them;
- KeyboardInterrupt is not caught: the state on disk is already consistent.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.core.sweep.state import DONE, FAILED, PENDING, Measurement, Point, SweepState, VariantState
from toolkit.core.sweep.variants import Variant, variant_spec


class PointFailed(Exception):
    """This variant could not be measured at this concurrency level (the benchmark failed); go on."""

    def __init__(self, reason: str, *, artifacts: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.artifacts = artifacts


class VariantFailed(PointFailed):
    """Nothing of this variant can be measured (the server did not come up): skip its other levels."""


@dataclass(frozen=True)
class PointRequest:
    """What `run_variant` is asked to do: deploy this resolved spec and probe it at this concurrency."""

    run_id: str
    variant: Variant
    spec: dict[str, Any]
    concurrency: int
    artifacts: str  # a path relative to the sweep run directory, for the probe's artifacts
    attempt: int
    repeat: int = 0  # the n-th measurement of this variant at this level (a tune measures its base again)
    # The Poisson request rate (req/s) to offer, for a capacity search; None: the profile's own (closed loop).
    request_rate: float | None = None


RunVariant = Callable[[PointRequest], Measurement]


@dataclass(frozen=True)
class Progress:
    """One step of the sweep, for a progress display."""

    kind: str  # "start", "point", "done", "failed", "end"
    position: int  # this variant's place among the planned variants, from 1
    planned: int  # how many variants are planned
    variant: VariantState | None
    point: Point | None
    finished_points: int
    total_points: int
    elapsed_s: float
    eta_s: float | None
    message: str = ""


def eta_s(durations_s: list[float], remaining_points: int) -> float | None:
    """Time left: the median duration of the points measured so far times the points left.

    The median, not the mean, because a variant that fails fast (server never up) would otherwise make the
    estimate swing; None until one point has a duration.
    """
    if not durations_s:
        return None
    return statistics.median(durations_s) * remaining_points


def point_dir(variant: VariantState, concurrency: int, repeat: int = 0, request_rate: float | None = None) -> str:
    rate = "" if request_rate is None else f"-rate{request_rate:g}"
    return f"variants/{variant.id}/c{concurrency}{rate}" + (f"-r{repeat + 1}" if repeat else "")


def run_sweep(
    state: SweepState,
    base_spec: Mapping[str, Any],
    run_variant: RunVariant,
    *,
    save: Callable[[SweepState], None],
    clock: Callable[[], float],
    on_progress: Callable[[Progress], None] = lambda _p: None,
) -> SweepState:
    """Measure every pending point; returns the same (mutated) state, saved after each change."""
    planned = state.planned()
    total_points = sum(len(v.points) for v in planned)
    started = clock()
    durations = [p.duration_s for _v, p in state.finished_points() if p.duration_s is not None]

    def report(kind: str, pos: int, v: VariantState | None, p: Point | None, message: str = "") -> None:
        finished = len(state.finished_points())
        on_progress(
            Progress(
                kind=kind,
                position=pos,
                planned=len(planned),
                variant=v,
                point=p,
                finished_points=finished,
                total_points=total_points,
                elapsed_s=clock() - started,
                eta_s=eta_s(durations, total_points - finished),
                message=message,
            )
        )

    report("start", 0, None, None)
    for pos, v in enumerate(planned, start=1):
        spec = variant_spec(base_spec, v.variant)
        for point in v.points:
            if point.status != PENDING:
                continue
            if v.failure is not None:
                _finish(point, FAILED, reason=f"not tried: {v.failure}")
                save(state)
                report("failed", pos, v, point, point.reason or "")
                continue
            point.attempts += 1
            save(state)
            report("point", pos, v, point)
            request = PointRequest(
                run_id=state.run_id,
                variant=v.variant,
                spec=spec,
                concurrency=point.concurrency,
                artifacts=point_dir(v, point.concurrency, point.repeat, point.request_rate),
                attempt=point.attempts,
                repeat=point.repeat,
                request_rate=point.request_rate,
            )
            t0 = clock()
            try:
                measurement = run_variant(request)
            except VariantFailed as exc:
                v.failure = exc.reason
                _finish(point, FAILED, reason=exc.reason, artifacts=exc.artifacts, duration_s=clock() - t0)
            except PointFailed as exc:
                _finish(point, FAILED, reason=exc.reason, artifacts=exc.artifacts, duration_s=clock() - t0)
            else:
                bad = measurement.non_finite()
                if bad:
                    reason = "NaN in outputs: " + ", ".join(f"{n}={getattr(measurement, n)}" for n in bad)
                    _finish(point, FAILED, reason=reason, measurement=measurement, duration_s=clock() - t0)
                elif measurement.steady_output_tok_per_s <= 0:
                    reason = "no output tokens in the steady window"
                    _finish(point, FAILED, reason=reason, measurement=measurement, duration_s=clock() - t0)
                else:
                    _finish(point, DONE, measurement=measurement, artifacts=request.artifacts, duration_s=clock() - t0)
            if point.duration_s is not None:
                durations.append(point.duration_s)
            save(state)
            report("done" if point.status == DONE else "failed", pos, v, point, point.reason or "")
    report("end", len(planned), None, None)
    return state


def _finish(
    point: Point,
    status: str,
    *,
    reason: str | None = None,
    measurement: Measurement | None = None,
    artifacts: str | None = None,
    duration_s: float | None = None,
) -> None:
    point.status = status
    point.reason = reason
    point.measurement = measurement
    point.artifacts = artifacts
    point.duration_s = duration_s
