"""Build one results entry from a probe run's artifacts (pure: parsed JSON in, an entry out).

Inputs are the probe's summary.json, verdict.json and run.json (layouts in docs/probe.md), read by
presence of keys so that a newer probe adding keys changes nothing here. Every figure is rounded
once, here, so the rendered block is byte-stable: recording the same run twice is a no-op.

What is copied is an allow-list: the bench settings are taken field by field, never the benchmark's
command line or the server's arguments (an `--api-key` would otherwise land in a versioned file).
"""

from __future__ import annotations

import math
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.results.model import (
    BenchSettings,
    Energy,
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
    Verdict,
)

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


def _power(window: dict[str, Any], name: str, idle: Any) -> Power | None:
    gpus = window.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
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
    idles = [v for v in (idle or {}).values() if isinstance(v, int | float)] if isinstance(idle, dict) else []
    return Power(
        window="steady" if name == "steady" else "full",
        per_gpu=per_gpu,
        mean_w=rnd(sum(means) / len(means), W_DIGITS) if means else None,
        idle_w=rnd(sum(idles) / len(idles), W_DIGITS) if idles else None,
    )


def _energy(window: dict[str, Any], name: str) -> Energy | None:
    j_per_tok = window.get("j_per_output_token")
    tok_per_j = window.get("output_tokens_per_j")
    if j_per_tok is None and tok_per_j is None:
        return None
    sources = {g.get("energy_source") for g in (window.get("gpus") or {}).values() if isinstance(g, dict)}
    sources.discard(None)
    method = None
    if sources == {"counter"}:
        method = "counter"
    elif sources:
        method = "integrated"
    return Energy(window="steady" if name == "steady" else "full", j_per_output_tok=sig(j_per_tok),
                  output_tok_per_j=sig(tok_per_j), method=method)


def _lab(summary: dict[str, Any], run: dict[str, Any]) -> LabNote | None:
    """Stand-in or replayed data says so in the entry (the standard: every stand-in announces itself)."""
    source = str(summary.get("data_source") or run.get("data_source") or "measured")
    if source in ("measured", "nvml", ""):
        return None
    note = _str(run.get("data_source_note")) or _str(run.get("stand_in")) or source
    kind = "replay" if "replay" in source or "recorded" in source or "trace" in source else "stand-in"
    return LabNote(kind=kind, note=note)


def _bench(run: dict[str, Any], profile_bench: dict[str, Any] | None) -> BenchSettings:
    b = run.get("bench") if isinstance(run.get("bench"), dict) else None
    b = b or profile_bench or {}
    rate = b.get("request_rate")
    rate_v: float | str | None
    if isinstance(rate, str) and rate.lower() in ("inf", "infinity"):
        rate_v = "inf"
    elif isinstance(rate, int | float) and not isinstance(rate, bool):
        rate_v = "inf" if math.isinf(rate) else rnd(rate, 3)
    else:
        rate_v = None
    return BenchSettings(
        dataset=_str(b.get("dataset_name") or b.get("dataset")),
        num_prompts=_int(b.get("num_prompts")),
        input_len=_int(b.get("random_input_len") if "random_input_len" in b else b.get("input_len")),
        output_len=_int(b.get("random_output_len") if "random_output_len" in b else b.get("output_len")),
        range_ratio=rnd(b.get("random_range_ratio") if "random_range_ratio" in b else b.get("range_ratio"), 3),
        request_rate=rate_v,
        max_concurrency=_int(b.get("max_concurrency")),
        seed=_int(b.get("seed")),
    )


def _gpu_stamp(run: dict[str, Any], summary: dict[str, Any]) -> GpuStamp:
    gpus = run.get("gpus")
    models: list[str] = []
    drivers: list[str] = []
    if isinstance(gpus, list):
        for g in gpus:
            if isinstance(g, dict):
                m = _str(g.get("name") or g.get("model"))
                if m:
                    models.append(m)
                d = _str(g.get("driver") or g.get("driver_version"))
                if d:
                    drivers.append(d)
    count = len(gpus) if isinstance(gpus, list) and gpus else len(summary.get("gpus") or []) or None
    model = _str(run.get("gpu_model")) or (models[0] if models and len(set(models)) == 1 else
                                           "+".join(sorted(set(models))) if models else None)
    driver = _str(run.get("driver_version") or run.get("driver")) or (drivers[0] if drivers else None)
    return GpuStamp(model=model, count=_int(run.get("gpu_count")) or count, driver=driver)


def _verdict(verdict: dict[str, Any] | None) -> Verdict | None:
    if not verdict:
        return None
    cls = verdict.get("class") or verdict.get("verdict") or verdict.get("kind")
    if not isinstance(cls, str):
        return None
    evidence: list[dict[str, Any]] = []
    for item in verdict.get("evidence") or []:
        if isinstance(item, dict):
            evidence.append({str(k): _evidence_value(v) for k, v in item.items()})
        elif isinstance(item, str):
            evidence.append({"note": item})
    summary = verdict.get("summary") or verdict.get("headline") or verdict.get("reason")
    return Verdict.model_validate({"class": cls, "summary": summary if isinstance(summary, str) else None,
                                   "evidence": evidence})


def _evidence_value(v: Any) -> str | int | float | bool | None:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return sig(v, 4)
    # Nested values are flattened to text: the block stays one level deep and readable in a diff.
    return str(v)


def build_entry(
    summary: dict[str, Any],
    verdict: dict[str, Any] | None,
    run: dict[str, Any],
    *,
    spec_hash: str | None,
    artifacts: str | None,
    profile_bench: dict[str, Any] | None = None,
    source_file: str = "summary.json",
) -> ResultsEntry:
    """The entry for one probe run. Raises ToolkitError when the summary lacks what every entry needs."""
    full = summary.get("full")
    if not isinstance(full, dict):
        raise ToolkitError.of("the summary has no `full` window: it was not written by `toolkit probe run`",
                              file=source_file, field="full", fix="give the run directory `toolkit probe run` wrote")
    steady = summary.get("steady") if isinstance(summary.get("steady"), dict) else None
    steady_found = bool(_get(summary, "steady_state", "found")) and steady is not None
    run_id = _str(run.get("run_id")) or _str(run.get("id"))
    date = _str(run.get("started_at")) or _str(run.get("date")) or _str(run.get("start_utc"))
    if not run_id or not date:
        raise ToolkitError.of("run.json lacks the run's id or start date", file="run.json",
                              field="run_id" if not run_id else "started_at",
                              fix="give the run directory `toolkit probe run` wrote")

    steady_rates: SteadyRates | None = None
    if steady_found and steady is not None:
        steady_rates = SteadyRates(
            output_tok_per_s=rnd(_get(steady, "throughput", "output_tok_per_s"), TOK_PER_S_DIGITS),
            total_tok_per_s=rnd(_get(steady, "throughput", "total_tok_per_s"), TOK_PER_S_DIGITS),
            window_s=[rnd(steady.get("start_s"), S_DIGITS) or 0.0, rnd(steady.get("end_s"), S_DIGITS) or 0.0],
        )
    throughput = Throughput(
        full_run=Rates(
            output_tok_per_s=rnd(_get(full, "throughput", "output_tok_per_s"), TOK_PER_S_DIGITS),
            total_tok_per_s=rnd(_get(full, "throughput", "total_tok_per_s"), TOK_PER_S_DIGITS),
        ),
        steady_state=steady_rates,
        peak_output_tok_per_s=rnd(_get(summary, "benchmark", "peak_output_tok_per_s"), TOK_PER_S_DIGITS),
    )
    # Power and energy come from the window the verdict judges: the steady plateau when one was found.
    window, name = (steady, "steady") if steady_found and steady is not None else (full, "full")
    idle = _get(summary, "idle", "power_w")
    energy = _energy(window, name) if name == "steady" else None
    if energy is None or energy.j_per_output_tok is None:
        # Steady-state tokens need the benchmark's timeline; without it the full run's energy is what exists.
        energy = _energy(full, "full")
    return ResultsEntry(
        run_id=run_id,
        source="toolkit",
        date=date,
        spec_hash=spec_hash,
        lab=_lab(summary, run),
        sglang_version=_str(run.get("sglang_version")),
        host=_str(run.get("host") or run.get("hostname")),
        gpu=_gpu_stamp(run, summary),
        bench=_bench(run, profile_bench),
        throughput=throughput,
        latency_ms=_latency(full.get("latency_ms")),
        power=_power(window, name, idle),
        energy=energy,
        verdict=_verdict(verdict),
        artifacts=artifacts,
    )
