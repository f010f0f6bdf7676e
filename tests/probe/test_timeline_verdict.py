"""The verdict over time, on synthetic timelines in the layout of docs/probe.md (server_trace.csv and host_trace.csv
text parsed by the real readers), through the real summary, interval and verdict code."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit.core.probe.summary import summarize
from toolkit.core.probe.verdict import judge

from .synthetic import alternating, host_csv, parse_host, parse_server, server_csv, timeline_trace

SECONDS = 30.0


def _verdict(shape_at: Any, *, server: Any = None, host: Any = None, target: dict[str, Any] | None = None,
             seconds: float = SECONDS, gpus: int = 1, topology: dict[str, Any] | None = None) -> Any:
    trace, run = timeline_trace(shape_at, seconds, gpus=gpus)
    summary = summarize(trace, run, {})
    srv = parse_server(server_csv(server, seconds)) if server else None
    hst = parse_host(host_csv(host, seconds)) if host else None
    return judge(summary, topology or {}, target or {}, trace=trace, server=srv, host=hst)


@pytest.mark.parametrize("on_s", [0.5, 2.0, 5.0])
def test_alternating_saturated_and_idle_phases_are_intermittent_load_not_launch_bound(on_s: float) -> None:
    v = _verdict(alternating(on_s, on_s))
    assert v.cls == "intermittent-load", v.headline
    # the window's mean alone reads a half-busy GPU (the old verdict's mistake for the short phases)
    assert v.window_mean is not None and v.window_mean["class"] != "intermittent-load"
    lp = v.evidence["over_time"]["load_phases"]
    assert lp["busy_phase_median_s"] == pytest.approx(on_s, abs=0.25)
    assert lp["idle_phase_median_s"] == pytest.approx(on_s, abs=0.25)
    steps = " ".join(v.next_steps)
    assert "concurrency or request rate" in steps and "won't help" in steps
    assert "enable CUDA graphs" not in steps and not any(k.knob == "server.cuda_graph" for k in v.knob_steps)
    assert v.confidence >= 0.75


def test_short_phases_read_as_on_off_intervals_long_phases_as_phases_with_their_times() -> None:
    v = _verdict(alternating(0.5, 0.5))
    assert v.timeline is not None and v.timeline.mix[0]["state"] == "on-off"
    v5 = _verdict(alternating(5.0, 5.0))
    assert v5.timeline is not None
    states = [p["state"] for p in v5.timeline.phases]
    assert states[:4] == ["compute-bound (power-capped)", "idle", "compute-bound (power-capped)", "idle"]
    for p in v5.timeline.phases[1:-1]:
        assert p["duration_s"] == pytest.approx(5.0, abs=1.01)
    shares = {m["state"]: m["share"] for m in v5.timeline.mix}
    assert shares["compute-bound (power-capped)"] == pytest.approx(0.5, abs=0.1)


def test_fine_grained_gaps_stay_launch_bound() -> None:
    v = _verdict(lambda t: "launch")
    assert v.cls == "launch-bound"
    assert v.evidence["over_time"]["load_phases"]["gappy_share"] > 0.9


def test_one_long_idle_stretch_is_a_phase_and_a_mix_not_intermittent() -> None:
    v = _verdict(lambda t: "idle" if 10.0 <= t < 22.6 else "compute")
    assert v.cls == "mixed", v.headline
    assert v.headline.startswith("mixed: 5") and "compute-bound (power-capped)" in v.headline and "idle" in v.headline
    assert v.confidence <= 0.5
    assert v.timeline is not None and [p["state"] for p in v.timeline.phases] == [
        "compute-bound (power-capped)", "idle", "compute-bound (power-capped)"]


BENCH_HOT = [("bench", 4100, "python3", "python3", 99.0)]
BENCH_COOL = [("bench", 4100, "python3", "python3", 8.0)]


def test_a_benchmark_thread_at_a_full_core_beside_an_underused_gpu_is_host_bound_and_named() -> None:
    v = _verdict(lambda t: "launch", host=lambda t: BENCH_HOT)
    assert v.cls == "host-bound", v.headline
    t = v.evidence["over_time"]["busiest_thread"]
    assert (t["role"], t["pid"], t["process"], t["tid"]) == ("bench", 4100, "python3", 4101)
    assert t["cpu_pct"] == pytest.approx(99.0)
    assert "pid 4100" in v.headline and "99 % of a core" in v.headline
    # the same GPU with a cool thread: fine-grained gaps, launch-bound
    assert _verdict(lambda t: "launch", host=lambda t: BENCH_COOL).cls == "launch-bound"
    # and a CPU-burning benchmark in front of an idle GPU is host-bound, not no-load
    assert _verdict(lambda t: "idle", host=lambda t: BENCH_HOT).cls == "host-bound"


def test_a_saturated_gpu_with_a_spinning_sync_thread_is_not_host_bound() -> None:
    v = _verdict(lambda t: "compute", host=lambda t: BENCH_HOT)
    assert (v.cls, v.power_capped) == ("compute-bound", True)


def _capped(t: float) -> dict[str, Any]:  # the story's baseline: 1024 prompts at once, 64 slots
    return {"running": 64, "queue": max(0.0, 960 - 30 * t), "token_usage": 0.31, "cap": 64}


def test_running_at_the_cap_with_a_queue_and_kv_to_spare_is_scheduler_capped_with_the_knob() -> None:
    target = {"profile": "glm5-baseline", "knobs": {"server.max_running_requests": 64, "server.cuda_graph": True}}
    v = _verdict(lambda t: "spin", server=_capped, target=target)
    assert v.cls == "scheduler-capped", v.headline
    step = v.knob_steps[0]
    assert (step.knob, step.current, step.current_source) == ("server.max_running_requests", 64, "profile")
    assert step.proposed == (256, 512, 1024)
    assert step.sweep_args == ["--vary", "server.max_running_requests=256,512,1024"]
    assert "server.max_running_requests: 64 -> 256..1024" in " ".join(v.next_steps)
    d = step.to_dict()
    assert d["evidence"]["server"]["max_running_requests"] == 64 and d["evidence"]["held"]
    assert v.evidence["over_time"]["server"]["queue"] > 100
    # without a profile target the current value is what the server reported
    v2 = _verdict(lambda t: "spin", server=_capped)
    assert (v2.knob_steps[0].current, v2.knob_steps[0].current_source) == (64, "server")


def test_scheduler_cap_against_a_power_capped_gpu_lowers_the_confidence_and_says_why() -> None:
    calm = _verdict(lambda t: "spin", server=_capped)
    hot = _verdict(lambda t: "compute", server=_capped)
    assert hot.cls == "scheduler-capped"
    assert hot.confidence < calm.confidence
    assert any(d.startswith("gpu vs server") for d in hot.disagreements)
    assert not calm.disagreements


def test_kv_full_with_queue_and_retractions_is_kv_bound_naming_mem_fraction_static() -> None:
    def kv(t: float) -> dict[str, Any]:
        return {"running": 40, "queue": 200, "token_usage": 0.97, "cap": 256, "retracted_total": int(t * 3)}

    target = {"knobs": {"server.mem_fraction_static": 0.5, "server.kv_cache_dtype": None}}
    v = _verdict(lambda t: "memory", server=kv, target=target)
    assert v.cls == "kv-bound", v.headline
    mfs = next(k for k in v.knob_steps if k.knob == "server.mem_fraction_static")
    assert (mfs.current, mfs.proposed) == (0.5, (0.58,))
    assert any(k.knob == "server.kv_cache_dtype" and k.proposed == ("fp8_e4m3",) for k in v.knob_steps)
    assert v.evidence["over_time"]["server"]["retracted"] > 50


def test_no_queue_and_few_running_is_client_bound_even_with_the_scheduler_polling_at_a_full_core() -> None:
    def light(t: float) -> dict[str, Any]:
        return {"running": 4, "queue": 0, "token_usage": 0.02, "cap": 256}

    polling = [("server", 900, "python3", "sglang::scheduler", 100.0)]
    v = _verdict(lambda t: "launch", server=light, host=lambda t: polling,
                 target={"knobs": {"bench.max_concurrency": 4}})
    assert v.cls == "client-bound", v.headline
    assert v.knob_steps[0].knob == "bench.max_concurrency"
    assert v.knob_steps[0].sweep_args == ["--concurrency", "8,16"]


def test_a_server_thread_at_a_full_core_with_requests_waiting_is_host_bound() -> None:
    def queued(t: float) -> dict[str, Any]:
        return {"running": 30, "queue": 50, "token_usage": 0.2, "cap": 256}

    hot = [("server", 900, "python3", "sglang::scheduler", 99.0)]
    v = _verdict(lambda t: "launch", server=queued, host=lambda t: hot,
                 target={"knobs": {"server.cuda_graph": False}})
    assert v.cls == "host-bound", v.headline
    assert "sglang::scheduler" in v.headline
    assert [k.knob for k in v.knob_steps][:2] == ["server.cuda_graph", "server.num_continuous_decode_steps"]


def test_a_queue_that_grows_the_whole_run_is_overloaded_and_says_latency_is_not_comparable() -> None:
    def growing(t: float) -> dict[str, Any]:
        return {"running": 64, "queue": 10 * t, "token_usage": 0.4, "cap": 64}

    v = _verdict(lambda t: "compute", server=growing, target={"knobs": {"bench.request_rate": 20.0}})
    assert v.cls == "overloaded", v.headline
    assert "not comparable" in v.headline and "not comparable" in v.next_steps[0]
    assert v.knob_steps[0].knob == "bench.request_rate" and v.knob_steps[0].proposed == (10.0, 15.0)
    # a draining queue (requests all sent at t0) is not overload
    assert _verdict(lambda t: "compute", server=_capped).cls != "overloaded"


def test_machine_readable_steps_land_in_verdict_json() -> None:
    v = _verdict(lambda t: "spin", server=_capped, target={"knobs": {"server.max_running_requests": 64}})
    d = v.to_dict()
    step = d["knob_steps"][0]
    assert set(step) >= {"knob", "current", "proposed", "why", "evidence", "sweep_args"}
    assert d["mix"][0]["state"] == "scheduler-capped" and d["phases"][0]["state"] == "scheduler-capped"
    assert d["signals"] == ["gpu", "server"]
    assert d["timeline"]["intervals"][3]["server"]["running"] == 64
    assert d["window_mean"]["class"] == "busy-but-waiting"


def test_gpu_only_judgement_without_a_trace_is_the_window_mean() -> None:
    trace, run = timeline_trace(alternating(2.0, 2.0), SECONDS)
    v = judge(summarize(trace, run, {}))
    assert v.timeline is None and v.window_mean is None and v.cls != "intermittent-load"


def test_knob_steps_are_variants_the_sweep_takes_as_they_are() -> None:
    """Each step's sweep_args parse with the sweep's own --vary parser against the profile they name."""
    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.core.probe.knobs import run_target
    from toolkit.core.sweep.variants import expand, parse_vary

    store = ProfileStore()
    for name, shape, server in (("glm5-baseline", "spin", _capped), ("glm5-tp8", "spin", None)):
        spec = store.resolve(name).spec.model_dump(mode="json")
        target = run_target(name, spec, set(store.names()))
        v = _verdict(lambda t, s=shape: s, server=server, target=target, gpus=8,
                     topology={"links": [{"a": 0, "b": 1, "p2p_read_ok": False}]})
        assert v.knob_steps, (name, v.headline)
        for step in v.knob_steps:
            args = step.sweep_args
            axes = [parse_vary(args[i + 1], spec) for i in range(0, len(args), 2) if args[i] == "--vary"]
            assert axes and axes[0].path == step.knob and list(axes[0].values) == list(step.proposed)
            assert all(type(x) is type(step.current) for x in axes[0].values)  # typed like the profile's value
            assert len(expand(axes)) == len(step.proposed)
    assert target["knobs"]["server.max_running_requests"] == 1024 and "server.cuda_graph" in target["why"]


def test_the_seeds_synthetic_eight_gpus_stay_busy_but_waiting_over_time() -> None:
    from .synthetic import seed_run

    trace, run, bench, topology = seed_run()
    from toolkit.core.probe.bench import normalize_bench_result

    v = judge(summarize(trace, run, normalize_bench_result(bench)), topology, run.target, trace=trace)
    assert v.cls == "busy-but-waiting" and v.timeline is not None and v.timeline.mix[0]["share"] == 1.0
    assert "glm5-tp4-pp2" in v.next_steps[0] and "not more compute tuning" in v.next_steps[0]
    tp = v.knob_steps[0]
    assert (tp.knob, tp.current, tp.proposed, tp.together) == ("server.tp_size", 8, (4,), {"server.pp_size": 2})


def test_target_json_that_is_not_an_object_is_exit_2_before_anything_runs(tmp_path: Any,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from toolkit.cli.main import main

    marker = tmp_path / "started"
    for bad in ("{not json", "[1, 2]"):
        rc = main(["probe", "run", "--target-json", bad, "--out", str(tmp_path / "r"), "--", "touch", str(marker)])
        assert rc == 2 and not marker.exists() and not (tmp_path / "r").exists()
        assert "--target-json" in capsys.readouterr().err
