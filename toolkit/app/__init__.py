"""Use cases: what a user does with the toolkit, one module each (probe a run, apply a profile, measure variants
for a sweep or a tune, record a result, report, provision a host). Each takes plain inputs and returns a result;
the commands in toolkit.cli parse, call one, and render. docs/architecture.md has the map.
"""
