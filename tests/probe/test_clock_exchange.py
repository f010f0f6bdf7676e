"""The clock exchange against a real process: this machine answering for itself has offset 0 within its bound."""

from __future__ import annotations

import sys

import pytest

from toolkit.adapters.clock_exchange import exchange_burst
from toolkit.core.errors import ToolkitError


def test_a_local_host_is_found_at_offset_zero_within_a_tight_bound() -> None:
    # The prefix stands where `ssh root@pve2` would: the host side is the same script either way.
    offset = exchange_burst("localhost", ["env"], count=8)
    assert offset.exchanges == 8
    assert abs(offset.offset_ns) <= offset.bound_ns
    assert offset.bound_ns < 50_000_000  # a pipe's round trip, not an interpreter start


def test_a_host_whose_command_fails_is_named_with_its_error() -> None:
    with pytest.raises(ToolkitError, match="pve9 did not answer with its clock"):
        exchange_burst("pve9", [sys.executable, "-c", "import sys; sys.exit('no route to host')", "--"], count=2)
