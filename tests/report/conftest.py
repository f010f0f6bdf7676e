"""The report tests use the results tests' scratch repository (a copy of profiles/ and the run fixture)."""

from tests.results.conftest import scratch

__all__ = ["scratch"]
