"""spec_hash: which spec a measurement observed (like Kubernetes' observedGeneration).

Results entries record it; when the hash of the current spec differs, the entry is stale.
"""

from __future__ import annotations

import hashlib
import json

from toolkit.core.profile.resolve import ResolvedProfile

# Prose and the toolkit's own block do not change what runs; renaming a profile does not either.
HASH_EXCLUDED = ("description", "why", "results", "name", "extends", "schema_version")
# Fields added after entries were recorded, left out of the hash while at their default: adding a setting to the
# schema must not make every recorded entry stale. (section, field, default)
HASH_OMITTED_AT_DEFAULT: tuple[tuple[str, str, object], ...] = (("probe", "server_scrape_hz", 2.0),)


def canonical_spec(resolved: ResolvedProfile) -> dict[str, object]:
    """The resolved spec as plain data, defaults filled in, without HASH_EXCLUDED."""
    data = resolved.spec.model_dump(mode="json", exclude=set(HASH_EXCLUDED))
    for section, name, default in HASH_OMITTED_AT_DEFAULT:
        part = data.get(section)
        if isinstance(part, dict) and part.get(name) == default:
            del part[name]
    return data


def spec_hash(resolved: ResolvedProfile) -> str:
    """sha256 (hex) of the canonical JSON (sorted keys, no spaces) of the resolved spec."""
    text = json.dumps(canonical_spec(resolved), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
