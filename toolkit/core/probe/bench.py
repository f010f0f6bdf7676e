"""SGLang bench_serving results, read by presence of keys (they differ between versions)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.core.probe.numbers import percentile

# bench_serving's progress bar (tqdm, on stderr): "100%|##########| 160/160 [00:09<00:00, 16.2it/s]".
_TQDM_COUNT = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")

LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e_latency")
LATENCY_STATS = ("mean", "median", "std", "p90", "p95", "p99")


def _num(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def normalize_bench_result(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The numbers the summary needs, None where the benchmark did not report them."""
    raw = raw or {}
    out_tps = _num(raw, "output_throughput")
    in_tps = _num(raw, "input_throughput")
    total_tps = _num(raw, "total_throughput")
    total_source = "reported" if total_tps is not None else None
    if total_tps is None and out_tps is not None and in_tps is not None:
        # Older bench_serving versions lack total_throughput: it is input + output there.
        total_tps = out_tps + in_tps
        total_source = "input_throughput + output_throughput"
    latency: dict[str, dict[str, float]] = {}
    for metric in LATENCY_METRICS:
        stats = {s: v for s in LATENCY_STATS if (v := _num(raw, f"{s}_{metric}_ms")) is not None}
        if stats:
            latency[f"{metric}_ms"] = stats
    timeline = raw.get("timeline")
    return {
        "duration_s": _num(raw, "duration"),
        "completed": _num(raw, "completed"),
        "total_input_tokens": _num(raw, "total_input_tokens"),
        "total_output_tokens": _num(raw, "total_output_tokens"),
        "request_per_s": _num(raw, "request_throughput"),
        "input_tok_per_s": in_tps,
        "output_tok_per_s": out_tps,
        "total_tok_per_s": total_tps,
        "total_tok_per_s_source": total_source,
        "peak_output_tok_per_s": _num(raw, "max_output_tokens_per_s"),
        "max_concurrent_requests": _num(raw, "max_concurrent_requests") or _num(raw, "concurrency"),
        "latency_ms": latency,
        # Optional, not SGLang's: [[t_s since the benchmark's start, output tokens so far], ...]; the load script
        # loads/gpu_phases.py writes it so steady-state throughput can be computed over the steady window.
        "timeline": timeline if isinstance(timeline, list) else None,
        # "probe_run": timeline t_s is on the probe's clock already; else seconds since the benchmark's start.
        "timeline_origin": raw.get("timeline_origin", "benchmark_start"),
        "keys_present": sorted(raw),
    }


def requests_sent(argv: list[str], stderr_text: str) -> int | None:
    """How many requests the benchmark sent: its progress bar's total (the dataset may hold fewer prompts than
    --num-prompts asks for), else --num-prompts; None when neither is known."""
    counts = _TQDM_COUNT.findall(stderr_text or "")
    if counts:
        return int(counts[-1][1])
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--num-prompts=") else (
            argv[i + 1] if arg == "--num-prompts" and i + 1 < len(argv) else None)
        if value is not None and value.isdigit():
            return int(value)
    return None


def failed_requests(completed: float | None, sent: int | None) -> int | None:
    """Requests that did not complete. bench_serving exits 0 when requests fail (a killed server, a refused
    prompt): it reports only the successes ("completed"), so the difference is the one sign of them."""
    if completed is None or sent is None:
        return None
    return max(sent - int(completed), 0)


# -- per-request latencies (bench_serving --output-details) -------------------------------------------------------
# With --output-details, SGLang's bench_serving (0.5.9: sglang/bench_serving.py, `result_details`) adds to its JSON
# line one entry per request, in the order sent: `ttfts` (seconds; 0.0 for a request that failed), `itls` (the gaps
# between the streamed chunks after the first, seconds), `output_lens` (0 for a failure), `errors` ("" when it
# succeeded), `input_lens` and `generated_texts`. Its own p99_ttft_ms / p99_itl_ms / p99_e2e_latency_ms are
# np.percentile over the same lists (successful requests only; the ITL list is every gap of every request).
LATENCY_QUANTILES = (50.0, 90.0, 95.0, 99.0)


@dataclass(frozen=True)
class RequestLatencies:
    """Each successful request's latencies, in seconds, in the order sent."""

    ttft_s: list[float]
    itl_s: list[list[float]]  # per request: its gaps
    failed: int

    @property
    def e2e_s(self) -> list[float]:
        """Each request's last token: its first token plus every gap after it. bench_serving's own `latency` ends at
        the stream's [DONE] chunk, which follows the last token by one network read."""
        return [t + sum(g) for t, g in zip(self.ttft_s, self.itl_s, strict=True)]

    @property
    def all_itl_s(self) -> list[float]:
        return [g for gaps in self.itl_s for g in gaps]

    def __len__(self) -> int:
        return len(self.ttft_s)


def request_latencies(raw: Mapping[str, Any] | None) -> RequestLatencies | None:
    """The per-request lists of a bench_serving result written with --output-details; None when it has none.

    A request counts as failed when its error is non-empty or it produced no output (bench_serving's
    `success=False` writes both); failed requests are left out, as bench_serving leaves them out of its own
    percentiles."""
    raw = raw or {}
    ttfts, itls = raw.get("ttfts"), raw.get("itls")
    if not isinstance(ttfts, list) or not isinstance(itls, list) or len(ttfts) != len(itls):
        return None
    errors: list[Any] = raw["errors"] if isinstance(raw.get("errors"), list) else [""] * len(ttfts)
    outs: list[Any] = raw["output_lens"] if isinstance(raw.get("output_lens"), list) else [1] * len(ttfts)
    ok_t: list[float] = []
    ok_i: list[list[float]] = []
    failed = 0
    for i, (t, gaps) in enumerate(zip(ttfts, itls, strict=True)):
        err = errors[i] if i < len(errors) else ""
        out = outs[i] if i < len(outs) else 1
        good_t = isinstance(t, int | float) and not isinstance(t, bool) and t > 0
        good_g = isinstance(gaps, list) and all(isinstance(g, int | float) and not isinstance(g, bool) for g in gaps)
        if err or not out or not good_t or not good_g:
            failed += 1
            continue
        ok_t.append(float(t))
        ok_i.append([float(g) for g in gaps])
    return RequestLatencies(ok_t, ok_i, failed)


def latency_percentiles(lat: RequestLatencies, quantiles: Sequence[float] = LATENCY_QUANTILES
                        ) -> dict[str, dict[str, float]]:
    """{"ttft": {"p50": ms, ...}, "itl": {...}, "e2e": {...}} from the per-request lists (numpy's interpolation,
    as bench_serving's own); a metric with no values is left out."""
    out: dict[str, dict[str, float]] = {}
    # tpot: each request's own mean gap, as SGLang's bench_serving computes it for --goodput ((latency - ttft) /
    # (output_len - 1)); a request of one token has none.
    tpot = [sum(g) / len(g) for g in lat.itl_s if g]
    for name, values in (("ttft", lat.ttft_s), ("itl", lat.all_itl_s), ("e2e", lat.e2e_s), ("tpot", tpot)):
        if values:
            ordered = sorted(values)
            out[name] = {f"p{q:g}": round(percentile(ordered, q) * 1000.0, 3) for q in quantiles}
    return out
