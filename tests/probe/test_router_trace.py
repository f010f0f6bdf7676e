"""router_trace.csv read back: each backend's load over the window, and the span the router had work in flight
(pure, from rows as the fleet probe writes them)."""

from __future__ import annotations

from toolkit.core.probe.router_trace import backend_load, busy_span, router_header, router_rows

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def _trace(scrapes: list[tuple[float, dict[str, float] | None]]) -> str:
    text = router_header({"scrape_hz": "2.0", "source": "http://10.0.0.1:29000/metrics"})
    for t_s, loads in scrapes:
        samples = None if loads is None else [("smg_worker_requests_active", {"worker": w}, v)
                                             for w, v in loads.items()]
        text += "".join(router_rows(t_s, samples, "" if loads is not None else "connection refused"))
    return text


def test_the_busy_span_runs_from_the_first_to_the_last_scrape_with_a_request_in_flight() -> None:
    text = _trace([(1.0, {A: 0, B: 0}), (2.0, {A: 1, B: 0}), (3.0, None), (4.0, {A: 80, B: 80}),
                   (5.0, {A: 0, B: 4}), (6.0, {A: 0, B: 0})])
    assert busy_span(text, 0.0, 10.0) == (2.0, 5.0)
    assert busy_span(text, 3.0, 10.0) == (4.0, 5.0)  # only the window's scrapes
    assert backend_load(text, 4.0, 5.0) == {A: 40.0, B: 42.0}


def test_a_router_that_never_had_work_has_no_busy_span() -> None:
    assert busy_span(_trace([(1.0, {A: 0, B: 0}), (2.0, None)]), 0.0, 10.0) is None
