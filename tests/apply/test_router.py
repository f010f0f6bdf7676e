"""The router's pins per SGLang release and its command line (pure: toolkit/core/router.py over the shipped pins)."""

from __future__ import annotations

import copy
import json

import pytest

from toolkit.adapters.sglang_catalogue import available_versions
from toolkit.adapters.sglang_router import PINS_PATH, load_pins
from toolkit.core.errors import ToolkitError
from toolkit.core.router import backend_loads, pins_from_json, router_argv, router_backends, router_pin

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


# Recorded from smg 1.9.0's GET /get_loads in front of two stand-ins (tests/apply/test_router_standins.py's setup).
GET_LOADS = {"workers": [
    {"worker": "http://127.0.0.1:31002", "load": 1, "details": {"timestamp": "2026-12-06T09:13:17Z", "dp_rank_count": 1,
     "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 2, "num_total_reqs": 5,
                "token_usage": 0.25, "max_running_requests": 4096}]}},
    {"worker": "http://127.0.0.1:31001", "load": 0},
]}


def test_backend_loads_reads_the_router_s_view_per_backend() -> None:
    first, second = backend_loads(GET_LOADS)
    assert first.url == "http://127.0.0.1:31001"
    assert (first.routed_in_flight, first.running_reqs, first.token_usage) == (0, None, None)
    assert (second.routed_in_flight, second.running_reqs, second.waiting_reqs) == (1, 3, 2)
    assert (second.token_usage, second.max_running_requests) == (0.25, 4096)
    with pytest.raises(ToolkitError):
        backend_loads({"loads": []})


def test_router_backends_reads_each_backend_s_series() -> None:
    a, b = "http://127.0.0.1:31001", "http://127.0.0.1:31002"
    samples = [
        ("smg_worker_cb_outcomes_total", {"worker": a, "outcome": "success"}, 3.0),
        ("smg_worker_cb_outcomes_total", {"worker": b, "outcome": "success"}, 4.0),
        ("smg_worker_cb_outcomes_total", {"worker": b, "outcome": "failure"}, 1.0),
        ("smg_worker_requests_active", {"worker": b}, 2.0),
        ("smg_worker_health", {"worker": a}, 1.0),
        ("smg_worker_health", {"worker": b}, 0.0),
        ("smg_router_requests_total", {"model": "m"}, 8.0),  # router-wide: no backend
    ]
    view = router_backends(samples)
    assert list(view) == [a, b]
    assert (view[a].finished, view[a].failed, view[a].requests_active, view[a].healthy) == (3.0, 0.0, None, True)
    assert (view[b].finished, view[b].failed, view[b].requests_active, view[b].healthy) == (5.0, 1.0, 2.0, False)
