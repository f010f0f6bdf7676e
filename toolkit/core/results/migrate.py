"""Results block schema migrations, applied on read (pipx's habit: a versioned file, migrated forward).

A block newer than this toolkit is refused: guessing at a future shape could drop figures on the next
write. Each migration is a pure function of one version's raw data to the next version's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.results.model import RESULTS_SCHEMA_VERSION

_V1_BENCH_KEYS = {"backend": "backend", "dataset_name": "dataset", "num_prompts": "num_prompts",
                  "random_input_len": "input_len", "random_output_len": "output_len",
                  "random_range_ratio": "range_ratio", "request_rate": "request_rate",
                  "max_concurrency": "max_concurrency", "seed": "seed"}


def _v1_entry_to_v2(e: dict[str, Any], index: int) -> dict[str, Any]:
    """Schema 1 (the profiles' importer of the story's figures) kept an entry flat; schema 2 groups it.

    Known flat keys are moved into their groups. A key this migration does not know is left where it
    is, so validation names it instead of the migration silently dropping a figure.
    """
    e = dict(e)
    out: dict[str, Any] = {"run_id": e.pop("run_id", None) or f"{e.get('source', 'manual')}-{index + 1}"}
    out["source"] = e.pop("source", "manual")
    date = e.pop("date", None)
    if date is not None:
        out["date"] = str(date)  # YAML reads an unquoted 2026-01-02 as a date
    out["spec_hash"] = e.pop("spec_hash", None)
    if e.pop("approximate", None):
        out["approximate"] = True
    # measured_by_toolkit: false is what `source: manual` already says.
    e.pop("measured_by_toolkit", None)
    gpu: dict[str, Any] = {}
    if "gpu_model" in e:
        gpu["model"] = e.pop("gpu_model")
    if "gpu_count" in e:
        gpu["count"] = e.pop("gpu_count")
    if gpu:
        out["gpu"] = gpu
    bench = e.pop("bench", None)
    if isinstance(bench, dict):
        out["bench"] = {_V1_BENCH_KEYS.get(k, k): v for k, v in bench.items()}
    throughput: dict[str, Any] = {"full_run": {}}
    for key in ("output_tok_per_s", "total_tok_per_s"):
        if key in e:
            throughput["full_run"][key] = e.pop(key)
    if "peak_output_tok_per_s" in e:
        throughput["peak_output_tok_per_s"] = e.pop("peak_output_tok_per_s")
    out["throughput"] = throughput
    power: dict[str, Any] = {}
    limit = e.pop("gpu_power_limit_w", None)
    per_gpu = e.pop("gpu_power_w_per_gpu", None)
    if isinstance(per_gpu, list):
        power["per_gpu"] = [
            {"gpu": i, "mean_w": w, "limit_w": limit,
             "mean_of_limit_pct": round(100.0 * w / limit, 1) if isinstance(w, int | float) and limit else None}
            for i, w in enumerate(per_gpu)
        ]
    elif limit is not None:
        power["limit_w"] = limit
    if "gpu_power_w" in e:
        power["mean_w"] = e.pop("gpu_power_w")
    if "idle_power_w" in e:
        power["idle_w"] = e.pop("idle_power_w")
    if power:
        out["power"] = power
    util = e.pop("gpu_util_pct", None)
    verdict = e.pop("verdict", None)
    reason = e.pop("verdict_reason", None)
    if verdict is not None:
        evidence = {"util_gpu_pct": util} if util is not None else {}
        out["verdict"] = {"class": verdict, "summary": reason, "evidence": evidence}
    notes = [str(n) for n in (e.pop("imported_from", None), e.pop("note", None)) if n]
    if notes:
        out["note"] = "; ".join(notes)
    out.update(e)  # whatever is left: validation names it
    return out


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    entries = raw.get("entries") or []
    return {
        **raw,
        "schema_version": 2,
        "entries": [_v1_entry_to_v2(e, i) if isinstance(e, dict) else e for i, e in enumerate(entries)],
    }


# from-version -> migration to from-version + 1
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def migrate_block(raw: dict[str, Any], *, file: str, line: int | None) -> dict[str, Any]:
    """The raw `results:` mapping of any known schema, as the current schema's raw mapping."""
    version = raw.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ToolkitError.of("the results block has no integer schema_version", file=file, line=line,
                              field="results.schema_version",
                              fix=f"restore `schema_version: {RESULTS_SCHEMA_VERSION}` (the toolkit writes it)")
    if version > RESULTS_SCHEMA_VERSION:
        raise ToolkitError.of(
            f"the results block is schema_version {version}, newer than this toolkit reads "
            f"({RESULTS_SCHEMA_VERSION}); nothing was written",
            file=file, line=line, field="results.schema_version",
            fix="upgrade the toolkit (pip install -U gpu-serving-toolkit) before recording into this profile")
    if version < 1:
        raise ToolkitError.of(f"results schema_version {version} does not exist (they start at 1)", file=file,
                              line=line, field="results.schema_version",
                              fix=f"restore `schema_version: {RESULTS_SCHEMA_VERSION}`")
    while version < RESULTS_SCHEMA_VERSION:
        raw = MIGRATIONS[version](raw)
        version += 1
    return raw
