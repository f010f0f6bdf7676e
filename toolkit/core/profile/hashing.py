"""spec_hash: which spec a measurement observed (like Kubernetes' observedGeneration).

Results entries record it; when the hash of the current spec differs, the entry is stale.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from toolkit.core.profile.resolve import ResolvedProfile

# Prose and the toolkit's own block do not change what runs; renaming a profile does not either.
# Acknowledged rules are what validation reports, not what runs.
HASH_EXCLUDED = ("description", "why", "acknowledge", "results", "name", "extends", "schema_version")
# Knobs that only tell validation what the author means and render nothing: they do not change what runs,
# and recorded results must not go stale when they are added.
# probe.server_scrape_hz is how often the probe looks at the server, not what the server runs; model.size_gib is
# how much room the weights need, not which weights (model.config: facts of those weights, checked
# against the layout); bench.slo is what a tune holds the measurements to, not what
# runs; the target's power-limit range only bounds validation; which inventory hosts run it (target.hosts,
# replicas.hosts) and how a change rolls over them change where it runs, not what. A patch's `upstream` names the
# release that carries the change itself: what the pinned release runs is the same.
HASH_EXCLUDED_KNOBS: dict[str, Any] = {
    "server": {"allow_unauthenticated"},
    "probe": {"server_scrape_hz"},
    "model": {"size_gib", "config"},
    "bench": {"slo"},
    "target": {"gpu_power_limit_min_w", "gpu_power_limit_max_w", "hosts"},
    "replicas": {"hosts": True, "rolling": True},
    "engine": {"patches": {"__all__": {"upstream"}}},
}


def canonical_spec(resolved: ResolvedProfile) -> dict[str, object]:
    """The resolved spec as plain data, defaults filled in, without HASH_EXCLUDED."""
    exclude: dict[str, Any] = {key: True for key in HASH_EXCLUDED}
    exclude.update(HASH_EXCLUDED_KNOBS)
    spec = resolved.spec.model_dump(mode="json", exclude=exclude)
    if not any(v is not None for v in (spec.get("gpu") or {}).values()):
        # The gpu section came later: a profile that sets nothing in it keeps the hash its results recorded.
        spec.pop("gpu", None)
    # Replicas came later too: a profile without them keeps the hash its results recorded.
    if spec.get("replicas") is None:
        spec.pop("replicas", None)
    return spec


def spec_hash(resolved: ResolvedProfile) -> str:
    """sha256 (hex) of the canonical JSON (sorted keys, no spaces) of the resolved spec."""
    return _digest(canonical_spec(resolved))


def _digest(spec: dict[str, object]) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# What the server does not run: how it is measured (bench, probe) and the host's power limit (gpu, applied by the
# host role). A capacity search changes bench.request_rate on every point and a sweep bench.max_concurrency on
# every level: the unit must stay byte for byte the same then, or each point restarts a server that takes minutes
# to load its weights.
SERVER_HASH_EXCLUDED = ("bench", "probe", "gpu")


def server_hash(resolved: ResolvedProfile) -> str:
    """sha256 (hex) of the canonical spec without SERVER_HASH_EXCLUDED: which server a unit runs."""
    return _digest({k: v for k, v in canonical_spec(resolved).items() if k not in SERVER_HASH_EXCLUDED})

