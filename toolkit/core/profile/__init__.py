"""Profiles: the declarative source of truth (pure: data in, data out).

Public API (others import these names):
    Profile, ResolvedProfile, resolve, validate, spec_hash,
    split_results_block, join_results_block, dump_results_block,
    render_launch_argv, render_env, render_systemd_unit, render_sglang_config_yaml, render_bench_argv
    (the render functions are in toolkit.core.profile.render; import them from there to keep
    jinja2 out of commands that only validate).
"""

from __future__ import annotations

from toolkit.core.profile.hashing import spec_hash
from toolkit.core.profile.model import API_KEY_ENV, RESULTS_MARKER, SCHEMA_VERSION, Profile, ResultsBlock
from toolkit.core.profile.resolve import Origin, ResolvedProfile, resolve
from toolkit.core.profile.results_block import dump_results_block, join_results_block, split_results_block
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
    "ResultsBlock",
    "dump_results_block",
    "join_results_block",
    "parse_profile_text",
    "resolve",
    "spec_hash",
    "split_results_block",
    "validate",
]
