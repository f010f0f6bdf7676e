"""SGLang bench_serving results, read by presence of keys (they differ between versions)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# bench_serving's progress bar (tqdm, on stderr): "100%|##########| 160/160 [00:09<00:00, 16.2it/s]".
_TQDM_COUNT = re.compile(r"\|\s*(\d+)/(\d+)\s*\[")

LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e_latency")
# A flag is secret-looking when one of its words (split at - and _) is one of these: --api-key, --hf-token,
# --admin-api-key, --password. Whole words, so --tokenizer and --max-total-tokens stay readable.
SECRET_FLAG_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd"})


def _secret_flag(flag: str) -> bool:
    words = flag.lstrip("-").lower().replace("_", "-").split("-")
    return any(w in SECRET_FLAG_WORDS for w in words)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command as it may be stored: values of flags that look like secrets are replaced."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        if a.startswith("-") and _secret_flag(a.partition("=")[0]):
            flag, eq, _ = a.partition("=")
            if eq:
                out.append(flag + "=***")
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(a)
    return out


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
