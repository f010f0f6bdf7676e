"""Results block schema migrations, applied on read (pipx's habit: a versioned file, migrated forward).

A block newer than this toolkit is refused: guessing at a future shape could drop figures on the next
write. Each migration is a pure function of one version's raw data to the next version's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.results.model import RESULTS_SCHEMA_VERSION


def _v1_entry_to_v2(e: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 (the profiles' importer) kept a manual entry flat; schema 2 groups the figures.

    Known flat keys are moved into their groups; a key this migration does not know is left where it
    is, so validation names it instead of the migration silently dropping it.
    """
    e = dict(e)
    out: dict[str, Any] = {}
    for key in ("run_id", "source", "date", "spec_hash", "lab", "sglang_version", "host"):
        if key in e:
            out[key] = e.pop(key)
    if "id" in e and "run_id" not in out:
        out["run_id"] = e.pop("id")
    if "run_id" not in out:
        out["run_id"] = f"{out.get('source', 'manual')}-{out.get('date', 'undated')}"
    if "date" in out:
        out["date"] = str(out["date"])  # YAML may have read an unquoted date as a date
    gpu = e.pop("gpu", None)
    if isinstance(gpu, dict):
        out["gpu"] = gpu
    elif gpu is not None:
        out["gpu"] = {"model": str(gpu)}
    for flat, nested in (("gpu_model", "model"), ("gpu_count", "count"), ("driver", "driver")):
        if flat in e:
            out.setdefault("gpu", {})[nested] = e.pop(flat)
    if isinstance(e.get("bench"), dict):
        out["bench"] = e.pop("bench")
    full: dict[str, Any] = {}
    for flat, nested in (("output_tok_per_s", "output_tok_per_s"), ("total_tok_per_s", "total_tok_per_s")):
        if flat in e:
            full[nested] = e.pop(flat)
    throughput: dict[str, Any] = {"full_run": full}
    if "peak_output_tok_per_s" in e:
        throughput["peak_output_tok_per_s"] = e.pop("peak_output_tok_per_s")
    if isinstance(e.get("throughput"), dict):
        throughput.update(e.pop("throughput"))
    out["throughput"] = throughput
    if isinstance(e.get("latency_ms"), dict):
        out["latency_ms"] = e.pop("latency_ms")
    power: dict[str, Any] = {}
    for flat, nested in (("power_w_per_gpu", "mean_w"), ("power_per_gpu_w", "mean_w"), ("mean_power_w", "mean_w"),
                         ("idle_power_w", "idle_w"), ("idle_w", "idle_w")):
        if flat in e:
            power[nested] = e.pop(flat)
    if isinstance(e.get("power"), dict):
        power.update(e.pop("power"))
    if power:
        out["power"] = power
    if isinstance(e.get("energy"), dict):
        out["energy"] = e.pop("energy")
    verdict = e.pop("verdict", None)
    if isinstance(verdict, str):
        out["verdict"] = {"class": verdict}
    elif isinstance(verdict, dict):
        out["verdict"] = verdict
    for key in ("artifacts", "note"):
        if key in e:
            out[key] = e.pop(key)
    out.update(e)  # whatever is left: validation names it
    return out


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    entries = raw.get("entries") or []
    return {
        **raw,
        "schema_version": 2,
        "entries": [_v1_entry_to_v2(e) if isinstance(e, dict) else e for e in entries],
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
