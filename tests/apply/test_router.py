"""The router's pins per SGLang release and its command line (pure: toolkit/core/router.py over the shipped pins)."""

from __future__ import annotations

import copy
import json

import pytest

from toolkit.adapters.sglang_catalogue import available_versions
from toolkit.adapters.sglang_router import PINS_PATH, load_pins
from toolkit.core.errors import ToolkitError
from toolkit.core.router import pins_from_json, router_argv, router_pin

URLS = ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]


def test_every_release_with_a_flag_catalogue_has_a_router_pin() -> None:
    # The toolkit supports a release when it has its flag catalogue; a profile pinned to it may ask for replicas.
    pins = load_pins()
    assert pins.releases() == available_versions()
    for release in pins.releases():
        pin = router_pin(pins, release)
        assert pin.package == "smg"
        assert pin.basis in ("tested", "carried")
        assert pin.evidence


def test_the_pins_follow_smg_s_own_pairings() -> None:
    pins = load_pins()
    assert router_pin(pins, "0.5.9").requirement == "smg==1.4.0"
    assert router_pin(pins, "0.5.10").requirement == "smg==1.4.1"
    assert router_pin(pins, "0.5.12.post1").requirement == "smg==1.8.0"
    assert router_pin(pins, "0.5.16").requirement == "smg==1.9.0"
    # An unpaired release takes the pin of the nearest earlier paired one, and says so.
    carried = router_pin(pins, "0.5.13")
    assert (carried.version, carried.basis) == ("1.8.0", "carried")
    assert "0.5.12.post1" in carried.evidence


def test_argv_is_smg_launch_with_the_router_s_own_flags() -> None:
    argv = router_argv("0.5.23", URLS, "round_robin", "0.0.0.0", 8000, pins=load_pins(), prometheus_port=29001)
    assert argv == ["smg", "launch", "--worker-urls", *URLS, "--policy", "round_robin", "--host", "0.0.0.0",
                    "--port", "8000", "--prometheus-port", "29001"]
    assert "--prometheus-port" not in router_argv("0.5.23", URLS[:1], "cache_aware", "127.0.0.1", 8000,
                                                  pins=load_pins())


def test_a_policy_the_pinned_router_lacks_is_refused() -> None:
    # least_load came into smg after 1.4.x: SGLang 0.5.9's router refuses it as its argparse would.
    argv = router_argv("0.5.16", URLS, "least_load", "h", 1, pins=load_pins())
    assert argv[argv.index("--policy") + 1] == "least_load"
    with pytest.raises(ToolkitError) as err:
        router_argv("0.5.9", URLS, "least_load", "h", 1, pins=load_pins())
    text = str(err.value)
    assert "smg 1.4.0" in text and "cache_aware" in text and "policy" in text


@pytest.mark.parametrize(("urls", "port", "prom", "field"), [
    ([], 8000, None, "worker_urls"),
    (["10.0.0.1:30000"], 8000, None, "worker_urls"),
    ([URLS[0], URLS[0]], 8000, None, "worker_urls"),
    (URLS, 0, None, "port"),
    (URLS, 8000, 70000, "prometheus_port"),
    (URLS, 8000, 8000, "prometheus_port"),
])
def test_bad_input_names_the_field(urls: list[str], port: int, prom: int | None, field: str) -> None:
    with pytest.raises(ToolkitError) as err:
        router_argv("0.5.23", urls, "round_robin", "h", port, pins=load_pins(), prometheus_port=prom)
    assert err.value.problems[0].field == field
    assert err.value.problems[0].fix


def test_an_unpinned_release_names_the_pinned_ones() -> None:
    with pytest.raises(ToolkitError) as err:
        router_argv("0.4.0", URLS, "round_robin", "h", 1, pins=load_pins())
    assert "0.5.9 ... 0.5.23" in str(err.value)


def test_a_damaged_pins_file_is_refused_with_its_field() -> None:
    good = json.loads(PINS_PATH.read_text())
    assert pins_from_json(good).pins
    bad = copy.deepcopy(good)
    bad["releases"]["0.5.9"]["router"] = "9.9.9"
    with pytest.raises(ToolkitError) as err:
        pins_from_json(bad)
    assert err.value.problems[0].field == "releases.0.5.9.router"
    bad = copy.deepcopy(good)
    bad["releases"]["0.5.9"]["basis"] = "guessed"
    with pytest.raises(ToolkitError):
        pins_from_json(bad)
    with pytest.raises(ToolkitError):
        pins_from_json({**good, "schema_version": 2})
