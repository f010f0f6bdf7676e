"""A probe run's directory: its records written (`write_run_record`, `write_judged`, `write_topology`, atomically)
and read back (`load_run(dir)`, `read_judged`, `read_run_record` ...) here and nowhere else, as their types
(toolkit.core.probe.records: `RunRecord`, `Summary`; toolkit.core.probe.verdict.Verdict); the traces are written
by the probe's sampling loop.

Files (docs/probe.md has every field): run.json (manifest), trace.csv (per-GPU samples), bench.jsonl (the
benchmark's raw result, when it wrote one), topology.json, summary.json, verdict.json. Each JSON file has a
schema_version; a newer one than this toolkit knows is refused, an older one is migrated on read.

Schema history of run.json: 1: where the GPU figures came from as a sentence (`data_source`); 2: also as the
typed provenance (`provenance: {kind, detail}`, toolkit.core.provenance). summary.json and verdict.json gained the
same field (their keys are only ever added). A record without it is given it on read, from its sentence (the
types' `from_dict`: the one migration).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from toolkit.adapters.files import write_json
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.clock import HostClock
from toolkit.core.probe.fleet_verdict import FLEET_VERDICT_SCHEMA_VERSION
from toolkit.core.probe.host_trace import read_host_trace
from toolkit.core.probe.judge import ProbeRun
from toolkit.core.probe.net_trace import NetSeries, read_net_trace
from toolkit.core.probe.records import RunRecord, Summary
from toolkit.core.probe.series import Trace
from toolkit.core.probe.server_trace import read_server_trace
from toolkit.core.probe.summary import SUMMARY_SCHEMA_VERSION
from toolkit.core.probe.trace import parse_trace
from toolkit.core.probe.verdict import VERDICT_SCHEMA_VERSION, Verdict

RUN_SCHEMA_VERSION = 2
TOPOLOGY_SCHEMA_VERSION = 1
R = TypeVar("R")
KNOWN_VERSIONS = {"run.json": RUN_SCHEMA_VERSION, "topology.json": TOPOLOGY_SCHEMA_VERSION,
                  "summary.json": SUMMARY_SCHEMA_VERSION, "verdict.json": VERDICT_SCHEMA_VERSION,
                  "fleet_verdict.json": FLEET_VERDICT_SCHEMA_VERSION}


def _read_json(path: Path, *, required: bool = True) -> dict[str, Any] | None:
    if not path.exists():
        if required:
            raise ToolkitError.of("missing", file=str(path), fix="give a directory written by `toolkit probe run`")
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ToolkitError.of(f"not valid JSON: {err.msg}", file=str(path), line=err.lineno,
                              fix="re-run the probe, or restore the file") from None
    if not isinstance(data, dict):
        raise ToolkitError.of("expected a JSON object", file=str(path), line=1, fix="restore the file")
    known = KNOWN_VERSIONS.get(path.name)
    version = data.get("schema_version")
    if known is not None and isinstance(version, int) and version > known:
        raise ToolkitError.of(f"schema_version {version} is newer than this toolkit reads ({known})",
                              file=str(path), field="schema_version", fix="upgrade the toolkit")
    return data


def _typed(path: Path, make: Callable[[dict[str, Any]], R]) -> R:
    """A record's type from its file (the migration on read is the type's `from_dict`); a bad value names the
    file."""
    data = _read_json(path)
    assert data is not None
    try:
        return make(data)
    except ToolkitError as err:  # a hand-edited provenance kind
        for problem in err.problems:
            problem.file = str(path)
        raise


def read_run_record(run_dir: Path) -> RunRecord:
    return _typed(run_dir / "run.json", RunRecord.from_dict)


def read_summary(run_dir: Path) -> Summary | None:
    """summary.json; None when the run was cut before it was written."""
    return _typed(run_dir / "summary.json", Summary.from_dict) if (run_dir / "summary.json").exists() else None


def read_verdict(run_dir: Path) -> Verdict | None:
    """verdict.json; None when the run was cut before it was written."""
    return _typed(run_dir / "verdict.json", Verdict.from_dict) if (run_dir / "verdict.json").exists() else None


def read_topology(run_dir: Path) -> dict[str, Any]:
    return _read_json(run_dir / "topology.json", required=False) or {}


def write_run_record(run_dir: Path, record: RunRecord) -> None:
    _write(run_dir, "run.json", record.to_dict())


def write_judged(run_dir: Path, summary: Summary, verdict: Verdict) -> None:
    """summary.json and verdict.json of a judged run."""
    _write(run_dir, "summary.json", summary.to_dict())
    _write(run_dir, "verdict.json", verdict.to_dict())


def write_topology(run_dir: Path, topology: dict[str, Any]) -> None:
    _write(run_dir, "topology.json", topology)


def _write(run_dir: Path, name: str, data: dict[str, Any]) -> None:
    """One of a run's JSON records, atomically, stamped with the schema version this toolkit writes (a record it
    rewrites was migrated on read)."""
    write_json(run_dir / name, {**data, "schema_version": KNOWN_VERSIONS[name]})


def read_trace(path: Path) -> Trace:
    if not path.exists():
        raise ToolkitError.of("trace missing", file=str(path), fix="give a trace.csv written by `toolkit probe run`")
    return parse_trace(path.read_text(errors="replace"), file=str(path))


def _side(d: Path, name: str) -> str | None:
    """A side timeline's text: the final file, or the .partial an interrupted run left; None when absent."""
    for p in (d / name, d / (name + ".partial")):
        if p.exists():
            return p.read_text(errors="replace")
    return None


def load_run(run_dir: str | Path) -> ProbeRun:
    """Everything a probe run wrote. summary/verdict are None when the run was cut before they were written."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ToolkitError.of("not a directory", file=str(d), fix="give the --out directory of `toolkit probe run`")
    from toolkit.adapters.bench_process import read_bench_jsonl

    manifest = read_run_record(d)
    trace_path = d / "trace.csv"
    if not trace_path.exists() and (d / "trace.csv.partial").exists():
        trace_path = d / "trace.csv.partial"  # an interrupted run: judge what it has
    return ProbeRun(
        dir=d,
        manifest=manifest,
        trace=read_trace(trace_path),
        bench_raw=read_bench_jsonl(d / "bench.jsonl"),
        topology=read_topology(d),
        summary=read_summary(d),
        verdict=read_verdict(d),
        server=read_server_trace(t, str(d / "server_trace.csv")) if (t := _side(d, "server_trace.csv")) else None,
        host=read_host_trace(t, str(d / "host_trace.csv")) if (t := _side(d, "host_trace.csv")) else None,
    )


def read_judged(run_dir: Path) -> tuple[RunRecord, Summary, Verdict, dict[str, Any], dict[str, Any] | None]:
    """(run.json, summary.json, verdict.json, topology.json, bench result) of a judged run directory: what a results
    entry is built from (the traces are not read). A run without its summary or verdict is refused."""
    from toolkit.adapters.bench_process import read_bench_jsonl

    if not run_dir.is_dir():
        raise ToolkitError.of("not a directory", file=str(run_dir), field="DIR",
                              fix="give the --out directory of `toolkit probe run`")
    for name in ("run.json", "summary.json", "verdict.json"):
        if not (run_dir / name).is_file():
            raise ToolkitError.of(
                f"the run directory has no {name}", file=str(run_dir / name), field="DIR",
                fix=f"give a directory `toolkit probe run` finished; for one cut short, write it with "
                f"`toolkit probe replay {run_dir} --write`" if name != "run.json" else
                "give the --out directory of `toolkit probe run`")
    run = read_run_record(run_dir)
    summary, verdict = read_summary(run_dir), read_verdict(run_dir)
    topology = read_topology(run_dir)
    assert summary is not None and verdict is not None
    bench_raw = read_bench_jsonl(run_dir / "bench.jsonl")
    return run, summary, verdict, topology, bench_raw


def write_fleet_record(run_dir: Path, name: str, data: dict[str, Any]) -> None:
    """A fleet run's run.json (`kind: fleet`: the controller's manifest, each host's clock) or fleet_verdict.json."""
    if name not in ("run.json", "fleet_verdict.json"):
        raise ValueError(f"{name} is not a fleet run's record")
    _write(run_dir, name, data)


def read_fleet_run(run_dir: Path) -> dict[str, Any]:
    """A fleet run's run.json; refused when the directory holds a single-host run."""
    data = _read_json(run_dir / "run.json")
    assert data is not None
    if data.get("kind") != "fleet":
        raise ToolkitError.of("not a fleet run (run.json has no kind: fleet)", file=str(run_dir / "run.json"),
                              fix="give the --out directory of `toolkit probe run --fleet`")
    return data


def read_fleet_verdict(run_dir: Path) -> dict[str, Any]:
    """A fleet run's fleet_verdict.json; refused, with the command that writes it, where it is missing."""
    path = run_dir / "fleet_verdict.json"
    if not path.is_file():
        raise ToolkitError.of("the fleet run has no fleet_verdict.json", file=str(path), field="DIR",
                              fix=f"write it with `toolkit probe replay {run_dir} --write`")
    data = _read_json(path)
    assert data is not None
    return data


def clocks_record(clocks: list[HostClock]) -> dict[str, Any]:
    """A fleet run's run.json `clocks`: each host's offset to the controller at the start and the end, with the
    bound of each and of a merged time (host -> HostClock.to_record)."""
    return {c.host: c.to_record() for c in clocks}


def read_clocks(manifest: dict[str, Any]) -> list[HostClock]:
    """run.json's `clocks` back (empty for a single-host run)."""
    return [HostClock.from_record(r) for _, r in sorted((manifest.get("clocks") or {}).items())]


def read_net(run_dir: Path) -> NetSeries | None:
    """A fleet sampler's net_trace.csv (None where the run has none)."""
    text = _side(run_dir, "net_trace.csv")
    return read_net_trace(text, str(run_dir / "net_trace.csv")) if text is not None else None


def router_trace_text(run_dir: Path) -> str | None:
    """A fleet run's router_trace.csv (None where no router was scraped)."""
    return _side(run_dir, "router_trace.csv")
