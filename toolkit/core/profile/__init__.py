"""Profiles: the declarative source of truth (pure: data in, data out).

Public API (others import these names):
    Profile, ResolvedProfile, resolve, validate, spec_hash,
    render_launch_argv, render_env, render_systemd_unit, render_sglang_config_yaml, render_bench_argv
    (the render functions are in toolkit.core.profile.render; import them from there to keep
    jinja2 out of commands that only validate).
"""

from __future__ import annotations

from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.model import API_KEY_ENV, RESULTS_MARKER, SCHEMA_VERSION, Profile, ResultsEnvelope
from toolkit.core.profile.resolve import Origin, ResolvedProfile, resolve
from toolkit.core.profile.source import ProfileSource, parse_profile_text
from toolkit.core.profile.validate import validate

__all__ = [
    "API_KEY_ENV",
    "RESULTS_MARKER",
    "SCHEMA_VERSION",
    "Origin",
    "Profile",
    "ProfileSource",
    "ResolvedProfile",
    "ResultsEnvelope",
    "parse_profile_text",
    "resolve",
    "spec_hash",
    "validate",
]
