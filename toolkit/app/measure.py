"""Measure variants, for a sweep and a tune alike: the point runners, the host locks a measuring run holds, the
measuring loop with its progress, and the checks a promoted profile passes before it is written.

Runners, by name (`--runner`):
- `apply`: each point is the apply use case (toolkit.app.apply) with the probe, in this process: what
  `toolkit apply profile VARIANT --probe` runs, so a sweep measures exactly what apply deploys;
- `recorded:FILE`: a table of recorded results replayed in-process (no host is touched), announced as such;
- any other name: a plug-in of the group toolkit.runners (toolkit.app.plugins), e.g. the lab's `engine-model`.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from toolkit.adapters.ansible import PlaybookTimedOut, find_inventory, target_hosts
from toolkit.adapters.files import write_atomic
from toolkit.adapters.host_lock import host_locks
from toolkit.adapters.profile_store import ProfileStore
from toolkit.adapters.sweep_store import SweepStore, load_table
from toolkit.app import plugins
from toolkit.app.apply import ApplyOutcome, ApplyRequest, apply
from toolkit.app.profiles import check
from toolkit.core.ansible_summary import PlaybookEvent
from toolkit.core.errors import ToolkitError
from toolkit.core.probe.records import Summary
from toolkit.core.probe.verdict import Verdict
from toolkit.core.profile.resolve import ResolvedProfile
from toolkit.core.sweep.measurement import measurement_from_entry
from toolkit.core.sweep.promote import variant_profile_name, variant_profile_text
from toolkit.core.sweep.recorded import TableRunner
from toolkit.core.sweep.run import PointFailed, PointRequest, Progress, VariantFailed, run_sweep
from toolkit.core.sweep.state import Measurement, SweepState
from toolkit.core.text import safe

# The bench_probe role's task after a failed `toolkit probe run` (roles/bench_probe/tasks/run.yml).
PROBE_FAILED_TASK = "Fail when the probe failed"
INTERVAL_S = 2.0  # slices of the steady window for its own spread: the server's counter is scraped at ~2 Hz


@dataclass(frozen=True)
class RunnerContext:
    """What a point runner is built from; a plug-in runner (toolkit.runners) receives it whole."""

    kind: str  # "sweep" or "tune": names the run in messages and in the variant profiles
    store: SweepStore
    run_id: str
    base: ResolvedProfile
    profiles: ProfileStore
    chain_files: list[Path]  # the profile files the apply runner copies beside its variants
    inventory: str | None
    num_prompts: int | None  # prompts per measurement instead of the profile's (apply's --num-prompts)
    timeout_s: float
    # Some variant of the run sets gpu.power_limit_w: every variant then says its limit (the board's default when it
    # sets none), so one measured after a capped one does not run under the cap the host still holds.
    power_limits: bool = False


def make_runner(name: str, ctx: RunnerContext) -> Any:
    """The point runner `name` (see the module's docstring); an unknown name is exit 2 naming the installed ones."""
    if name == "apply":
        return ApplyProbeRunner(ctx)
    if name.startswith("recorded:"):
        path = name.split(":", 1)[1]
        here = Path(path).resolve().parent
        return TableRunner(load_table(path), source=path, sleep=time.sleep,
                           load_probe_run=lambda run: measurement_from_probe_dir(here / run))
    factory = plugins.load("runners", name, field="--runner",
                           fix="use apply, recorded:FILE, or a runner an installed package provides")
    return factory(ctx)


def point_locks(runner: str, inventory: str | None, *, wait: bool, on_message: Callable[[str], None],
                purpose: str) -> contextlib.AbstractContextManager[Any]:
    """The apply runner deploys to the inventory's GPU containers: the run holds their host locks for its whole
    length (no other apply slips in between two variants); each point's apply, in this thread, re-enters them
    (toolkit.adapters.host_lock). Other runners touch no host and lock nothing."""
    if runner != "apply":
        return contextlib.nullcontext()
    return host_locks(target_hosts(find_inventory(inventory)), purpose=purpose, wait=wait, on_message=on_message)


def measure(state: SweepState, spec: dict[str, Any], point_runner: Any, store: SweepStore, *, runner: str,
            inventory: str | None, wait: bool, purpose: str, on_progress: Callable[[Progress], None],
            on_message: Callable[[str], None],
            loop: Callable[[Callable[[Progress], None]], None] | None = None) -> bool:
    """Measure the pending points under the host locks (the sweep's loop, or `loop(on_progress)`: a tune's, which
    measures through the sweep's), the state saved after every point. True when interrupted: Ctrl-C ends the
    measuring, not the command, so the report is still written and the run can be resumed."""
    try:
        with point_locks(runner, inventory, wait=wait, on_message=on_message, purpose=purpose):
            if loop is not None:
                loop(on_progress)
            else:
                run_sweep(state, spec, point_runner, save=store.save, clock=time.monotonic, on_progress=on_progress)
    except KeyboardInterrupt:
        return True
    return False


def measurement_from_probe_dir(run_dir: Path) -> Measurement:
    """A probe run directory through the probe's own summary and the results entry builder."""
    from toolkit.adapters.probe_store import load_run
    from toolkit.core.probe.judge import judge_run
    from toolkit.core.results.build import build_entry

    run = load_run(run_dir)
    summary, verdict = run.summary, run.verdict
    if summary is None or verdict is None:  # cut before it judged: judge it now, with the probe's own code
        summary, verdict = judge_run(run)
    exit_code = summary.benchmark.exit_code
    if exit_code not in (0, None) or verdict.failed:
        tail = summary.benchmark.stderr_tail.strip()[-300:]
        raise PointFailed(f"benchmark failed (exit {exit_code}): {tail}", artifacts=str(run_dir))
    entry = build_entry(summary, verdict, run.manifest, run_id=run_dir.name, spec_hash=None, artifacts=str(run_dir),
                        topology=run.topology, bench_raw=run.bench_raw)
    m = measurement_from_entry(entry)
    # What `toolkit tune` reads next: the verdict's machine-readable next steps (docs/probe.md, "Next steps").
    m.knob_steps = [s.to_dict() for s in verdict.knob_steps]
    m.verdict_headline = verdict.headline or None
    add_run_details(m, summary, verdict, run.bench_raw, run.server)
    return m


def add_run_details(m: Measurement, summary: Summary, verdict: Verdict, bench_raw: Any, server: Any) -> None:
    """What a capacity search and the noise rules read of a probe run, beside the results entry's figures: the
    offered rate, latency percentiles from bench_serving's per-request results (--output-details; its own reported
    p99s otherwise), the steady window's throughput per interval from the server's counter, the power limit and the
    server's state where the verdict held."""
    from toolkit.core.probe.bench import latency_percentiles, normalize_bench_result, request_latencies
    from toolkit.core.probe.server_trace import counter_intervals

    raw = bench_raw or {}
    rate = raw.get("request_rate")
    m.request_rate = float(rate) if isinstance(rate, int | float) and rate != float("inf") else None
    norm = normalize_bench_result(raw)
    m.request_per_s = norm.get("request_per_s")
    lat = request_latencies(raw)
    if lat is not None and len(lat):
        m.latency_ms = latency_percentiles(lat)
        m.latency_source = f"bench_serving --output-details: {len(lat)} requests ({lat.failed} failed, left out)"
    else:
        m.latency_ms = {k.removesuffix("_ms").replace("e2e_latency", "e2e"): {q: v for q, v in stats.items()
                        if q.startswith("p") or q == "median"} for k, stats in (norm.get("latency_ms") or {}).items()}
        m.latency_source = "bench_serving's reported percentiles (no per-request details)" if m.latency_ms else None
    window = summary.steady
    if server is not None and window.start_s is not None and window.end_s is not None:
        m.interval_tok_per_s = [round(x, 2) for x in counter_intervals(
            server, "realtime_decode_tokens_total", float(window.start_s), float(window.end_s), INTERVAL_S)]
        m.interval_s = INTERVAL_S if m.interval_tok_per_s else None
    limits = [lim for g in window.gpus.values() if (lim := g["power_limit_w"])]
    m.power_limit_w = max(limits) if limits else None
    srv = verdict.evidence.get("server")
    steps_srv = next((s.evidence["server"] for s in verdict.knob_steps
                      if isinstance(s.evidence.get("server"), dict)), None)
    m.server = dict(steps_srv or (srv if isinstance(srv, dict) else {}))


class ApplyProbeRunner:
    """`run_variant` through the real deploy: the apply use case with the probe, per point, in this process.

    The variant is written as a profile (extends: the base, its knobs, bench.max_concurrency set to the
    point's level) into the run's own profiles directory next to copies of the base's chain, so the
    user's profiles/ is never touched by a sweep. Apply restarts the service only when the unit changed, and
    the unit carries the server's spec alone (not bench.*, probe.* or the power limit:
    toolkit.core.profile.hashing.server_hash), so the levels and rates of one variant reuse one server.

    What a child `toolkit apply` process gave each point, kept on purpose:
    - Ctrl-C: apply's playbook runner takes SIGINT while a playbook runs (it stops ansible-playbook's whole tree,
      then apply stops this run's probe on the hosts) and raises KeyboardInterrupt, which this runner lets
      through: the sweep's loop has saved the point as pending with its attempt counted, the command releases
      the host locks on its way out and exits 130, and a resume measures the point again;
    - the host locks: the run holds them (point_locks), and apply's own, in this thread, re-enters them;
    - a bound: `timeout_s` stops the deploy playbook (and the probe in it) as Ctrl-C does, and fails the variant;
    - a failure of one point (apply's refusal, or a bug) fails that variant, never the sweep: the error and its
      traceback go to the point's apply.log, the artifacts the failure names;
    - the output: apply's plays, changes, failures and messages go to that apply.log, as the child's stderr did,
      while the terminal shows the sweep's own progress;
    - a fresh state: each point builds its own ApplyRequest and plan (a new run id, fetch directory, playbook
      run and artifacts directory); what stays from point to point is read-only (the SGLang flag catalogue, the
      compatibility matrix, the plug-ins), and the environment is the sweep's own, as the child inherited it.
    """

    def __init__(self, ctx: RunnerContext, apply_use_case: Callable[..., ApplyOutcome] = apply) -> None:
        self.ctx = ctx
        self._apply = apply_use_case
        self._inventory: str | None = None

    def describe(self) -> str:
        where = self.ctx.inventory or "the default inventory"
        return f"toolkit apply profile VARIANT --probe against {where} (in process)"

    def _profiles_dir(self) -> Path:
        """The run's own profiles directory: the chain's files, and the files profiles name (patches, locks),
        which live in the profiles' tree (a profile names them relative to it), copied with their paths."""
        d = self.ctx.store.run_dir(self.ctx.run_id) / "profiles"
        d.mkdir(parents=True, exist_ok=True)
        for f in self.ctx.chain_files:
            shutil.copyfile(f, d / f.name)
        for sub_dir in (p for p in self.ctx.profiles.dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            shutil.copytree(sub_dir, d / sub_dir.name, dirs_exist_ok=True)
        return d

    def _variant(self, request: PointRequest, profiles: Path) -> str:
        """The point's variant profile, written into the run's profiles directory; its name."""
        ctx = self.ctx
        name = variant_profile_name(ctx.run_id, request.variant.id)
        extra: dict[str, Any] = {"bench.max_concurrency": request.concurrency}
        if request.request_rate is not None:
            extra["bench.request_rate"] = request.request_rate  # a capacity search's Poisson rate
        limit = (request.spec.get("gpu") or {}).get("power_limit_w")
        default = (request.spec.get("target") or {}).get("gpu_power_limit_w")
        if ctx.power_limits and limit is None and default is not None:
            extra["gpu.power_limit_w"] = default
        text = variant_profile_text(
            base=ctx.base.name,
            name=name,
            knobs=request.variant.knob_dict(),
            description=f"{ctx.kind} {ctx.run_id} variant {request.variant.id} ({request.variant.label})",
            extra=extra,
            header=[f"Written by `toolkit {ctx.kind}` for run {ctx.run_id}; deployed by `toolkit apply`."],
        )
        write_atomic(profiles / f"{name}.yaml", text)
        return name

    def __call__(self, request: PointRequest) -> Measurement:
        ctx = self.ctx
        profiles = self._profiles_dir()
        name = self._variant(request, profiles)
        runs = ctx.store.run_dir(ctx.run_id) / request.artifacts
        runs.mkdir(parents=True, exist_ok=True)
        if self._inventory is None:
            # Found once, as the locks found it: a default inventory is named on stderr once, not per point.
            self._inventory = str(find_inventory(ctx.inventory))
        req = ApplyRequest(profile=name, inventory=self._inventory, probe=True, profiles_dir=str(profiles),
                           runs_dir=str(runs), num_prompts=ctx.num_prompts, timeout_s=ctx.timeout_s)
        log_path = runs / "apply.log"
        with log_path.open("w", encoding="utf-8") as handle:
            log = _PointLog(handle)
            try:
                outcome = self._apply(req, on_event=log.event, on_message=log.say, on_status=log.say)
            except PlaybookTimedOut:
                log.say(f"stopped: the deploy did not finish in {ctx.timeout_s:.0f} s")
                raise VariantFailed(f"apply did not finish in {ctx.timeout_s:.0f} s",
                                    artifacts=str(log_path)) from None
            except ToolkitError as err:  # refused: what `toolkit apply` would print and exit 2 for
                log.say(str(err))
                raise VariantFailed(f"apply refused: {_oneline(str(err))}", artifacts=str(log_path)) from None
            except Exception as err:  # a bug in one point's apply fails that variant, not the whole run
                log.say(traceback.format_exc())
                raise VariantFailed(f"apply failed: {type(err).__name__}: {_oneline(str(err))}",
                                    artifacts=str(log_path)) from err
        return self._measurement(outcome, runs, log_path)

    def _measurement(self, outcome: ApplyOutcome, runs: Path, log_path: Path) -> Measurement:
        """The point's measurement from apply's outcome, or the failure it records."""
        run_dirs = [p.run_dir for p in (outcome.probes or {}).values()]
        # Apply names the fetched run; fall back to any probe run under the artifacts (run.json).
        run_dirs = run_dirs or sorted(p.parent for p in runs.glob("**/run.json"))
        if not outcome.deployed:
            failures = outcome.playbook.failures
            if failures and failures[0].task == PROBE_FAILED_TASK and run_dirs:
                # The server came up and the benchmark ran but failed (lost requests, exit code): that point
                # failed with the probe's reason, and the variant's other points are still measured.
                return measurement_from_probe_dir(run_dirs[0])
            what = f"{failures[0].task}: {failures[0].message[-300:]}" if failures else _tail(log_path)
            raise VariantFailed(f"deploy failed: {what}", artifacts=str(log_path))
        if not run_dirs:
            raise PointFailed(f"apply ran but fetched no probe run: {_tail(log_path)}", artifacts=str(log_path))
        return measurement_from_probe_dir(run_dirs[0])


class _PointLog:
    """One point's apply.log: the plays, changes, failures and messages of its apply, a line each with the UTC
    time, written as they come (a person can follow a long deploy with tail -f) and redacted as every output is."""

    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle

    def say(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        self.handle.write(f"{stamp} {safe(str(text), keep_newlines=True).rstrip()}\n")
        self.handle.flush()

    def event(self, event: PlaybookEvent) -> None:
        if event.kind == "play_start":
            self.say(f"PLAY {event.message or event.play}")
        elif event.kind == "changed":
            self.say(f"  changed {event.host}: {event.task}")
        elif event.kind == "failed" and not event.ignore_errors:
            self.say(f"  failed {event.host}: {event.task}\n    {event.message}")
        elif event.kind == "unreachable":
            self.say(f"  unreachable {event.host}: {event.message}")


def _oneline(text: str, chars: int = 300) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())[:chars]


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class Promoted:
    path: Path
    launch_args: int  # the rendered launch command's length: it renders


def write_promoted(profiles: ProfileStore, name: str, text: str) -> Promoted:
    """A promoted profile (sweep or tune) into the profiles directory, validated and rendered first: a promotion
    that would not deploy is refused, and an existing different file is never overwritten."""
    from toolkit.core.profile import parse_profile_text, resolve
    from toolkit.core.profile.render import render_launch_argv

    path = profiles.path(name)
    if path.exists() and path.read_text(encoding="utf-8") != text:
        raise ToolkitError.of(f"{path} exists and differs", file=str(path), field="--promote-name",
                              fix="give another --promote-name")
    source = parse_profile_text(name, str(path), text)
    resolved = resolve(name, lambda n: source if n == name else profiles.source(n))
    errors = [p for p in check(resolved) if p.severity == "error"]
    if errors:
        raise ToolkitError(errors)
    argv = render_launch_argv(resolved)
    write_atomic(path, text)
    return Promoted(path, len(argv))
