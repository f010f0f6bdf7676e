"""A probe run's recorded data (`ProbeRun`) judged by the probe's own summary and verdict code (`judge_run`).

Pure: the data is read from the run's directory by toolkit.adapters.probe_store.load_run; `toolkit probe run`
judges its fresh run, `probe replay` and the sweep's runners judge a recorded one, all with this function.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.core.probe.bench import normalize_bench_result
from toolkit.core.probe.host_trace import HostTrace
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.series import Trace
from toolkit.core.probe.server_trace import ServerTrace
from toolkit.core.probe.summary import summarize
from toolkit.core.probe.verdict import Verdict, judge


@dataclass
class ProbeRun:
    dir: Path
    manifest: RunRecord
    trace: Trace
    bench_raw: dict[str, Any] | None
    topology: dict[str, Any]
    summary: Summary | None
    verdict: Verdict | None
    server: ServerTrace | None = None  # server_trace.csv; None for runs without one (old, or no server)
    host: HostTrace | None = None  # host_trace.csv


def judge_run(run: ProbeRun) -> tuple[Summary, Verdict]:
    """The same summary and verdict code `probe run` uses, over a recorded directory."""
    summary = summarize(run.trace, run.manifest, normalize_bench_result(run.bench_raw), server=run.server,
                        host=run.host)
    return summary, judge(summary, run.topology, run.manifest.target, trace=run.trace, server=run.server,
                          host=run.host)
