"""The lab's per-release knobs (toolkit.lab.deploy_overlay): a release made faster, slower or broken on purpose
through the inventory, never through production code. Pure: milliseconds."""

from __future__ import annotations

import pytest

from toolkit.core.errors import ToolkitError
from toolkit.lab.deploy_overlay import (
    DIST_TIMEOUT_VAR,
    RELEASE_HEALTH_VAR,
    RELEASE_SPEED_VAR,
    dist_timeout,
    dropin,
    release_switches,
)

HV = {RELEASE_SPEED_VAR: {"0.5.23": 0.85}, RELEASE_HEALTH_VAR: {"0.5.24": "fail"}}


def test_the_applied_release_takes_its_own_speed_and_health_and_others_are_untouched() -> None:
    assert release_switches(HV, "0.5.23", "ct1") == (0.85, False)
    assert release_switches(HV, "0.5.24", "ct1") == (None, True)
    assert release_switches(HV, "0.5.9", "ct1") == (None, False)
    assert release_switches({}, "0.5.9", "ct1") == (None, False)
    argv = ["/opt/sglang/venvs/x/bin/python", "-m", "sglang.launch_server", "--port", "30000"]
    slow = dropin(argv, {}, fail_health=False, nan_log=False, speed=0.85)
    assert "Environment=SGLANG_STANDIN_SPEED=0.85" in slow.splitlines()
    assert "SGLANG_STANDIN_SPEED" not in dropin(argv, {}, fail_health=False, nan_log=False)


@pytest.mark.parametrize(("hv", "said"), [
    ({RELEASE_SPEED_VAR: [0.85]}, "not a mapping of release to value"),
    ({RELEASE_SPEED_VAR: {"0.5.23": 0}}, "not a positive factor"),
    ({RELEASE_SPEED_VAR: {"0.5.23": "fast"}}, "not a positive factor"),
    ({RELEASE_HEALTH_VAR: {"0.5.23": "slow"}}, "the one state is fail"),
])
def test_a_bad_value_names_the_variable_the_host_and_the_fix(hv: dict[str, object], said: str) -> None:
    with pytest.raises(ToolkitError) as e:
        release_switches(hv, "0.5.23", "ct1")
    text = str(e.value)
    assert said in text and "ct1" in text and ("toolkit_lab_release_" in text)


def test_the_multi_node_timeout_knob_reaches_the_stand_in_and_a_bad_one_is_refused() -> None:
    argv = ["/opt/sglang/venvs/x/bin/python", "-m", "sglang.launch_server", "--nnodes", "2"]
    assert dist_timeout({DIST_TIMEOUT_VAR: 20}, "ct1") == 20.0
    assert dist_timeout({}, "ct1") is None
    unit = dropin(argv, {}, fail_health=False, nan_log=False, dist_timeout_s=20.0)
    assert "Environment=SGLANG_STANDIN_DIST_TIMEOUT_S=20" in unit.splitlines()
    assert "DIST_TIMEOUT" not in dropin(argv, {}, fail_health=False, nan_log=False)
    with pytest.raises(ToolkitError) as e:
        dist_timeout({DIST_TIMEOUT_VAR: "soon"}, "ct1")
    assert DIST_TIMEOUT_VAR in str(e.value) and "ct1" in str(e.value)
