"""Build one results entry from a probe run's artifacts (pure: its typed records in, an entry out).

Inputs are the probe's summary.json, verdict.json and run.json as the probe store reads them (`Summary`,
`Verdict`, `RunRecord`; layouts in docs/probe.md). Every figure is rounded once, here, so the rendered block is
byte-stable: recording the same run twice is a no-op.

What is copied is an allow-list: the bench settings are taken field by field, never the benchmark's
command line or the server's arguments (an `--api-key` would otherwise land in a versioned file).
"""

from __future__ import annotations

import math
import shlex
from typing import Any, Literal

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.clock import HostClock
from toolkit.core.probe.records import RunRecord, Summary, Window
from toolkit.core.probe.verdict import Verdict
from toolkit.core.results.model import (
    BenchSettings,
    Energy,
    FleetNode,
    FleetResult,
    GpuPower,
    GpuStamp,
    LabNote,
    Latency,
    Percentiles,
    Power,
    Rates,
    ResultsEntry,
    SteadyRates,
    Throughput,
    VerdictExcerpt,
)
from toolkit.core.text import redact_argv

# Rounding, by unit: enough digits to see a real change, few enough that float noise never shows.
TOK_PER_S_DIGITS = 1
MS_DIGITS = 2
W_DIGITS = 1
PCT_DIGITS = 1
S_DIGITS = 2
ENERGY_SIG_DIGITS = 4


def rnd(v: Any, digits: int) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or math.isinf(v):
        return None
    out = round(float(v), digits)
    return 0.0 if out == 0 else out  # no "-0.0" in a file


def sig(v: Any, digits: int = ENERGY_SIG_DIGITS) -> float | None:
    """Round to significant digits: J per token is 0.5 on 8 GPUs and 0.005 on a small model."""
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or math.isinf(v) or v == 0:
        return rnd(v, 0) if v == 0 else None
    return rnd(v, digits - 1 - math.floor(math.log10(abs(float(v)))))


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        return None
    return int(v)


def _str(v: Any) -> str | None:
    return str(v) if isinstance(v, str | int | float) and not isinstance(v, bool) and str(v) else None


def _percentiles(stats: Any) -> Percentiles | None:
    if not isinstance(stats, dict):
        return None
    p = Percentiles(**{k: rnd(stats.get(k), MS_DIGITS) for k in ("mean", "median", "p90", "p95", "p99")})
    return p if any(v is not None for v in p.model_dump().values()) else None


def _latency(raw: Any) -> Latency | None:
    if not isinstance(raw, dict):
        return None
    lat = Latency(
        ttft=_percentiles(raw.get("ttft_ms")),
        itl=_percentiles(raw.get("itl_ms")),
        tpot=_percentiles(raw.get("tpot_ms")),
        e2e=_percentiles(raw.get("e2e_latency_ms")),
    )
    return lat if any(v is not None for v in (lat.ttft, lat.itl, lat.tpot, lat.e2e)) else None


def _power(window: Window, name: str, idle: dict[str, float | None]) -> Power | None:
    gpus = window.gpus
    if not gpus:
        return None
    per_gpu: list[GpuPower] = []
    for key in sorted(gpus, key=lambda k: int(k)):
        g = gpus[key]
        mean_w = rnd(_get(g, "power_w", "mean"), W_DIGITS)
        limit_w = rnd(g.get("power_limit_w"), W_DIGITS)
        per_gpu.append(GpuPower(
            gpu=int(key),
            mean_w=mean_w,
            p95_w=rnd(_get(g, "power_w", "p95"), W_DIGITS),
            limit_w=limit_w,
            mean_of_limit_pct=rnd(100.0 * mean_w / limit_w, PCT_DIGITS) if mean_w is not None and limit_w else None,
        ))
    means = [g.mean_w for g in per_gpu if g.mean_w is not None]
    idles = [v for v in idle.values() if isinstance(v, int | float)]
    return Power(
        window="steady" if name == "steady" else "full",
        per_gpu=per_gpu,
        mean_w=rnd(sum(means) / len(means), W_DIGITS) if means else None,
        idle_w=rnd(sum(idles) / len(idles), W_DIGITS) if idles else None,
    )


def _energy(window: Window, name: str) -> Energy | None:
    j_per_tok = window.j_per_output_token
    tok_per_j = window.output_tokens_per_j
    if j_per_tok is None and tok_per_j is None:
        return None
    sources = {g.get("energy_source") for g in window.gpus.values() if isinstance(g, dict)}
    sources.discard(None)
    method = None
    if sources == {"counter"}:
        method = "counter"
    elif sources:
        method = "integrated"
    return Energy(window="steady" if name == "steady" else "full", j_per_output_tok=sig(j_per_tok),
                  output_tok_per_j=sig(tok_per_j), method=method)


def _lab(summary: Summary, bench_raw: dict[str, Any] | None) -> LabNote | None:
    """Stand-in or replayed data says so in the entry (the standard: every stand-in announces itself).

    A load that is not a served model (loads/gpu_phases.py on a real GPU) says so too: its "tokens" are
    whatever its `unit` names, so its tok/s and J per token must never be read as a model's.
    """
    prov = summary.provenance
    source = prov.detail or prov.label
    unit = (bench_raw or {}).get("unit")
    load_note = None
    if isinstance(unit, str) and unit and unit.strip().lower() != "token":
        backend = (bench_raw or {}).get("backend")
        load_note = f"the load is not a served model ({backend or 'unknown benchmark'}): its tokens are {unit}"
    if prov.kind == "measured":
        return LabNote(kind="load", note=f"GPU figures measured ({source}); {load_note}") if load_note else None
    kind = _LAB_KIND.get(prov.kind, "stand-in")
    return LabNote(kind=kind, note=source + (f"; {load_note}" if load_note else ""))


# The provenance kinds a run directory can have, as the results block's `lab` names them.
_LAB_KIND: dict[str, Literal["stand-in", "engine-model", "replay"]] = {
    "stand-in": "stand-in", "engine-model": "engine-model", "replayed": "replay"}


# bench_serving's flags and, where the command line leaves one out, its own default (sglang 0.5.9
# bench_serving.py's argparse): what ran, when neither the result nor the command says more.
BENCH_FLAGS: dict[str, tuple[str, str | int | float | None]] = {
    "backend": ("--backend", "sglang"),
    "dataset_name": ("--dataset-name", "sharegpt"),
    "num_prompts": ("--num-prompts", 1000),
    "random_input_len": ("--random-input-len", 1024),
    "random_output_len": ("--random-output-len", 1024),
    "random_range_ratio": ("--random-range-ratio", 0.0),
    "request_rate": ("--request-rate", "inf"),
    "max_concurrency": ("--max-concurrency", None),
    "seed": ("--seed", 1),
}


def _argv_settings(argv: list[str] | None) -> dict[str, Any]:
    """The settings a bench_serving command line ran with (defaults for flags it leaves out); {} for another
    benchmark (a load script), whose own result is then all there is."""
    argv = [a for a in (argv or []) if isinstance(a, str)]
    if not any(a in ("sglang.bench_serving", "sglang.benchmark.serving") or a.endswith("bench_serving.py")
               for a in argv):
        return {}
    out: dict[str, Any] = {}
    for key, (flag, default) in BENCH_FLAGS.items():
        value: Any = default
        for i, tok in enumerate(argv):
            if tok == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif tok.startswith(flag + "="):
                value = tok.split("=", 1)[1]
        out[key] = value
    return out


def _num_or_text(v: Any) -> Any:
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if f.is_integer() and "." not in v and "inf" not in v.lower() else f
    return v


def _rate(rate: Any) -> float | Literal["inf"] | None:
    if isinstance(rate, str) and rate.lower() in ("inf", "infinity"):
        return "inf"
    if isinstance(rate, int | float) and not isinstance(rate, bool):
        return "inf" if math.isinf(rate) else rnd(rate, 3)
    return None


def _bench(bench_raw: dict[str, Any] | None, profile_bench: dict[str, Any] | None,
           argv: list[str] | None = None, duration_s: Any = None) -> BenchSettings:
    """What ran: bench_serving's own echo of its settings first, then its command line (with its defaults); the
    profile only in `profile_asked`, where it differs. num_prompts is what completed (failed counted apart)."""
    raw = {k: v for k, v in (bench_raw or {}).items() if v is not None}
    ran = {k: _num_or_text(v) for k, v in _argv_settings(argv).items()}
    b: dict[str, Any] = {**ran, **raw}

    def first(*keys: str) -> Any:
        return next((b[k] for k in keys if b.get(k) is not None), None)

    completed = _int(raw.get("completed"))
    asked = _int(ran.get("num_prompts"))
    failed = _int(raw.get("failed"))
    if failed is None and completed is not None and asked is not None and asked >= completed:
        failed = asked - completed
    differs: dict[str, str | int | float | None] = {}
    for key, want in sorted((profile_bench or {}).items()):
        if key not in BENCH_FLAGS or want is None:
            continue
        got = ran.get(key) if key == "num_prompts" else first(key)
        if key == "request_rate":
            want_n: Any = _rate(want)
            got = _rate(got)
        else:
            want_n = want
        if got is None or _num_or_text(str(got)) != _num_or_text(str(want_n)):
            differs[key] = want_n if isinstance(want_n, str | int | float) else str(want_n)
    return BenchSettings(
        backend=_str(b.get("backend")),
        dataset=_str(first("dataset_name", "dataset")),
        num_prompts=completed,
        failed=failed,
        input_len=_int(first("random_input_len", "input_len")),
        output_len=_int(first("random_output_len", "output_len")),
        range_ratio=rnd(first("random_range_ratio", "range_ratio"), 3),
        request_rate=_rate(b.get("request_rate")),
        max_concurrency=_int(first("max_concurrency")),
        seed=_int(first("seed")),
        # Redacted again: run.json's is, but it may have been edited by hand.
        command=shlex.join(redact_argv([str(a) for a in argv])) if argv else None,
        profile_asked=differs or None,
        duration_s=rnd(duration_s, S_DIGITS),
    )


def _gpu_stamp(topology: dict[str, Any], summary: Summary) -> GpuStamp:
    raw = topology.get("gpus")
    gpus: list[Any] = raw if isinstance(raw, list) else []
    models = sorted({m for g in gpus if isinstance(g, dict) and (m := _str(g.get("name")))})
    count = len(gpus) or len(summary.gpus) or None
    return GpuStamp(model="+".join(models) or None, count=count, driver=_str(topology.get("driver_version")))


def _sglang_version(bench_raw: dict[str, Any] | None) -> str | None:
    """bench_serving's result carries the server's /get_server_info, whose `version` is SGLang's."""
    info = (bench_raw or {}).get("server_info")
    return _str(info.get("version")) if isinstance(info, dict) else None


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k in sorted(value, key=str):
            _flatten(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    else:
        out[prefix] = _evidence_value(value)


def _verdict(verdict: Verdict | None) -> VerdictExcerpt | None:
    if verdict is None or not verdict.cls:
        return None
    evidence: dict[str, Any] = {}
    _flatten("", verdict.evidence, evidence)
    return VerdictExcerpt.model_validate({
        "class": verdict.cls,
        "summary": verdict.headline or None,
        "confidence": rnd(verdict.confidence, 2),
        "basis": verdict.basis or None,
        "evidence": dict(sorted(evidence.items())),
    })


def _evidence_value(v: Any) -> str | int | float | bool | None:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return sig(v, 4)
    # Lists become text: the block stays one level deep and readable in a diff.
    return ", ".join(str(x) for x in v) if isinstance(v, list) else str(v)


def build_entry(
    summary: Summary,
    verdict: Verdict | None,
    run: RunRecord,
    *,
    run_id: str,
    spec_hash: str | None,
    artifacts: str | None,
    topology: dict[str, Any] | None = None,
    bench_raw: dict[str, Any] | None = None,
    profile_bench: dict[str, Any] | None = None,
    source_file: str = "summary.json",
) -> ResultsEntry:
    """The entry for one probe run (run: run.json; run_id: the run directory's name).

    Raises ToolkitError when the records lack what every entry needs."""
    full, steady = summary.full, summary.steady
    if full.duration_s is None:
        raise ToolkitError.of("the summary has no `full` window: it was not written by `toolkit probe run`",
                              file=source_file, field="full", fix="give the run directory `toolkit probe run` wrote")
    steady_found = summary.steady_state.found
    date = _str(run.started_at_utc)
    if not date:
        raise ToolkitError.of("run.json has no start date", file="run.json", field="started_at_utc",
                              fix="give the run directory `toolkit probe run` wrote")

    steady_rates: SteadyRates | None = None
    # Only a steady window that was found gives a steady rate: a rate over the whole benchmark window (none found)
    # is a full-run rate by another name, and would be compared with steady ones.
    if steady_found:
        steady_rates = SteadyRates(
            output_tok_per_s=rnd(steady.throughput.output_tok_per_s, TOK_PER_S_DIGITS),
            total_tok_per_s=rnd(steady.throughput.total_tok_per_s, TOK_PER_S_DIGITS),
            window_s=[rnd(steady.start_s, S_DIGITS) or 0.0, rnd(steady.end_s, S_DIGITS) or 0.0],
            source=_str(steady.throughput.source),
        )
    no_steady = None if steady_found else (_str(summary.steady_state.reason) or "no steady window")
    throughput = Throughput(
        full_run=Rates(
            output_tok_per_s=rnd(full.throughput.output_tok_per_s, TOK_PER_S_DIGITS),
            total_tok_per_s=rnd(full.throughput.total_tok_per_s, TOK_PER_S_DIGITS),
            request_per_s=rnd(full.throughput.request_per_s, 3),
        ),
        steady_state=steady_rates,
        peak_output_tok_per_s=rnd(summary.benchmark.peak_output_tok_per_s, TOK_PER_S_DIGITS),
        no_steady_state=no_steady.removesuffix("; using the full benchmark window") if no_steady else None,
    )
    # Power and energy come from the window the verdict judges: the steady plateau when one was found.
    window, name = (steady, "steady") if steady_found else (full, "full")
    idle = summary.idle.power_w
    energy = _energy(window, name) if name == "steady" else None
    if energy is None or energy.j_per_output_tok is None:
        # Steady-state tokens need the benchmark's timeline; without it the full run's energy is what exists.
        energy = _energy(full, "full")
    return ResultsEntry(
        run_id=run_id,
        source="toolkit",
        date=date,
        spec_hash=spec_hash,
        lab=_lab(summary, bench_raw),
        sglang_version=_sglang_version(bench_raw),
        host=_str(run.hostname) or _str(run.host),  # "host" holds the host timeline when it ran
        gpu=_gpu_stamp(topology or {}, summary),
        bench=_bench(bench_raw, profile_bench, run.command or None, duration_s=summary.benchmark.duration_s),
        throughput=throughput,
        latency_ms=_latency(full.latency_ms),
        power=_power(window, name, idle),
        energy=energy,
        verdict=_verdict(verdict),
        artifacts=artifacts,
    )


def _fleet_lab(summaries: dict[str, Summary], bench_raw: dict[str, Any] | None) -> LabNote | None:
    """A fleet's figures are as real as its least real host's: one host on simulated GPUs makes the entry a
    stand-in's, and the note names the hosts."""
    notes = {h: note for h, s in sorted(summaries.items()) if (note := _lab(s, bench_raw)) is not None}
    if not notes:
        return None
    kinds = {n.kind for n in notes.values()}
    kind = next(k for k in ("stand-in", "engine-model", "replay", "load") if k in kinds)
    texts = sorted({n.note for n in notes.values()})
    return LabNote(kind=kind, note=f"{', '.join(notes)}: {'; '.join(texts)}")


def _ms(seconds: Any) -> float | None:
    return rnd(seconds * 1000, 3) if isinstance(seconds, int | float) else None


def build_fleet_entry(
    fleet_run: dict[str, Any],
    fleet_verdict: dict[str, Any],
    summaries: dict[str, Summary],
    *,
    layout: Literal["nodes", "replicas"],
    run_id: str,
    spec_hash: str | None,
    artifacts: str | None,
    clocks: list[HostClock],
    topologies: dict[str, dict[str, Any]] | None = None,
    bench: dict[str, Any] | None = None,
    bench_raw: dict[str, Any] | None = None,
    profile_bench: dict[str, Any] | None = None,
) -> ResultsEntry:
    """The entry for one fleet run (fleet_run: its run.json, `kind: fleet`; fleet_verdict: fleet_verdict.json;
    summaries: each host's own summary, for its provenance; bench: the benchmark's result as
    normalize_bench_result gives it). Throughput and latency are the benchmark's (one client of the whole
    deployment); energy and the verdict are the fleet's; each node's figures sit in `fleet`."""
    date = _str(fleet_run.get("started_at_utc"))
    if not date:
        raise ToolkitError.of("run.json has no start date", file="run.json", field="started_at_utc",
                              fix="give the directory `toolkit probe run --fleet` wrote")
    if fleet_verdict.get("class") == "benchmark-failed":
        raise ToolkitError.of("the fleet's benchmark failed: a failure is not a result", file="fleet_verdict.json",
                              field="class", fix="fix what the verdict names and probe again")
    b = bench or {}
    fleet = fleet_verdict.get("fleet") or {}
    per_host = fleet_verdict.get("per_host") or {}
    by_host = {c.host: c for c in clocks}
    nodes = []
    for host in sorted(per_host):
        fig, clock = per_host[host], by_host.get(host)
        nodes.append(FleetNode(
            host=host,
            gpu_count=_int(fig.get("gpu_count")),
            power_w=rnd(fig.get("power_w"), W_DIGITS),
            power_of_limit=rnd(fig.get("power_of_limit"), 3),
            util_gpu_pct=rnd(fig.get("util_gpu_pct"), PCT_DIGITS),
            sm_clock_mhz=rnd(fig.get("sm_clock_mhz"), 0),
            energy_j=sig(fig.get("energy_j")),
            generated_tokens=rnd(fig.get("generated_tokens"), 0),
            output_tok_per_j=sig(fig.get("tokens_per_j")),
            net_gb_s=sig(fig.get("net_gb_s")),
            clock_offset_ms=_ms(clock.start.offset_ns / 1e9) if clock else None,
            clock_bound_ms=_ms(clock.bound_ns / 1e9) if clock else None,
            verdict=_str((fig.get("verdict") or {}).get("class")),
        ))
    bounds = [n.clock_bound_ms for n in nodes if n.clock_bound_ms is not None]
    tok_per_j = fleet.get("tokens_per_j")
    energy = Energy(window="full", output_tok_per_j=sig(tok_per_j),
                    j_per_output_tok=sig(1 / tok_per_j) if isinstance(tok_per_j, int | float) and tok_per_j else None,
                    method="the hosts' GPUs over the benchmark's window, on the controller's clock")
    gpus = [n.gpu_count for n in nodes if n.gpu_count is not None]
    models: set[str] = set()
    drivers: set[str] = set()
    for topology in (topologies or {}).values():
        stamp = _gpu_stamp(topology, Summary())
        models.update(stamp.model.split("+") if stamp.model else [])
        drivers.update([stamp.driver] if stamp.driver else [])
    evidence: dict[str, Any] = {}
    _flatten("", fleet_verdict.get("evidence") or {}, evidence)
    excerpt = VerdictExcerpt.model_validate({
        "class": str(fleet_verdict.get("class") or "unknown"),
        "summary": _str(fleet_verdict.get("headline")),
        "confidence": rnd(fleet_verdict.get("confidence"), 2),
        "basis": "fleet",
        # What the block would drop on writing (None) or says nothing (an empty list) is left out, so the entry
        # reads back equal and a second record is a no-op.
        "evidence": {k: v for k, v in sorted(evidence.items()) if v not in (None, "")},
    })
    argv = fleet_run.get("command")
    return ResultsEntry(
        run_id=run_id,
        source="toolkit",
        date=date,
        spec_hash=spec_hash,
        lab=_fleet_lab(summaries, bench_raw),
        sglang_version=_sglang_version(bench_raw),
        host="+".join(sorted(per_host)) or None,
        gpu=GpuStamp(model="+".join(sorted(models)) or None, count=sum(gpus) if gpus else None,
                     driver="+".join(sorted(drivers)) or None),
        bench=_bench(bench_raw, profile_bench, [str(a) for a in argv] if isinstance(argv, list) else None,
                     duration_s=b.get("duration_s")),
        throughput=Throughput(
            full_run=Rates(output_tok_per_s=rnd(b.get("output_tok_per_s"), TOK_PER_S_DIGITS),
                           total_tok_per_s=rnd(b.get("total_tok_per_s"), TOK_PER_S_DIGITS),
                           request_per_s=rnd(b.get("request_per_s"), 3)),
            peak_output_tok_per_s=rnd(b.get("peak_output_tok_per_s"), TOK_PER_S_DIGITS),
            no_steady_state="a fleet run is recorded over the benchmark's whole window"),
        latency_ms=_latency(b.get("latency_ms")),
        energy=energy,
        verdict=excerpt,
        artifacts=artifacts,
        fleet=FleetResult(
            layout=layout,
            hosts=len(nodes),
            gpu_count=sum(gpus) if gpus else None,
            power_w=rnd(fleet.get("power_w"), W_DIGITS),
            energy_j=sig(fleet.get("energy_j")),
            output_tok_per_j=sig(tok_per_j),
            network_gb_s=sig(fleet_run.get("network_gb_s")),
            clock_bound_ms=max(bounds) if bounds else None,
            nodes=nodes,
        ),
    )
