"""Sweeps on disk: one directory per sweep run, its state file written atomically after every point.

    runs/sweeps/<run id>/
        state.json          the resumable state (toolkit.core.sweep.state), schema-versioned
        variants/vNN/cC/    the probe artifacts of variant NN at concurrency C (apply runner)
        profiles/           the variant profiles the apply runner deployed (extends: the base)
        report.md, *.png    the ranking and the plots, rewritten at the end of each invocation

Also the apply + probe runner: each point is `toolkit apply profile VARIANT --probe` in a child process,
the same command a person runs, so a sweep measures exactly what apply deploys.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from toolkit.adapters.files import write_atomic
from toolkit.core.errors import ToolkitError
from toolkit.core.sweep.promote import variant_profile_name, variant_profile_text
from toolkit.core.sweep.run import PointFailed, PointRequest, VariantFailed
from toolkit.core.sweep.state import Measurement, SweepState, state_from_dict

SWEEPS_ENV = "TOOLKIT_SWEEPS_DIR"
DEFAULT_SWEEPS_DIR = "runs/sweeps"
STATE_FILE = "state.json"
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
PROBE_FAILED_TASK = "Fail when the probe failed"  # roles/bench_probe/tasks/run.yml, after a failed `toolkit probe run`


def sweeps_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(SWEEPS_ENV) or DEFAULT_SWEEPS_DIR).expanduser().resolve()


class SweepStore:
    """`kind` and `dir_flag` name the runs in messages: a tune keeps its runs in the same layout (runs/tunes/)."""

    def __init__(self, root: str | Path, *, kind: str = "sweep", dir_flag: str = "--sweeps-dir") -> None:
        self.root = Path(root)
        self.kind = kind
        self.dir_flag = dir_flag

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id):
            raise ToolkitError.of(
                f"{run_id!r} is not a {self.kind} run id", field="--resume", fix=f"see `ls {self.root}`"
            )
        return self.root / run_id

    def state_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / STATE_FILE

    def runs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / STATE_FILE).is_file())

    def new_run_id(self, profile: str, now: float | None = None) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
        run_id = f"{profile}-{stamp}"
        n = 2
        while self.run_dir(run_id).exists():
            run_id = f"{profile}-{stamp}-{n}"
            n += 1
        return run_id

    def create(self, state: SweepState) -> Path:
        d = self.run_dir(state.run_id)
        d.mkdir(parents=True, exist_ok=False)
        self.save(state)
        return d

    def save(self, state: SweepState) -> None:
        """Atomic (temp file, fsync, os.replace): a kill at any moment leaves the previous state or this one."""
        text = json.dumps(state.to_dict(), indent=1, ensure_ascii=False) + "\n"
        write_atomic(self.state_path(state.run_id), text)

    def load(self, run_id: str) -> SweepState:
        path = self.state_path(run_id)
        if not path.is_file():
            known = ", ".join(self.runs()[-5:]) or "none"
            raise ToolkitError.of(
                f"no {self.kind} {run_id!r} in {self.root}",
                file=str(path),
                field="--resume",
                fix=f"give one of: {known} (or {self.dir_flag} DIR)",
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ToolkitError.of(
                f"not valid JSON: {err.msg}", file=str(path), line=err.lineno, fix="restore it or start a new sweep"
            ) from None
        return state_from_dict(data, file=str(path))

    def write_text(self, run_id: str, name: str, text: str) -> Path:
        path = self.run_dir(run_id) / name
        write_atomic(path, text)
        return path


def load_table(path: str | Path) -> dict[str, Any]:
    """A recorded results table (JSON or YAML) for the in-process runner."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        msg = f"cannot read: {err.strerror}"
        raise ToolkitError.of(msg, file=str(p), field="--runner", fix="give a table file") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as err:  # json.JSONDecodeError and yaml.YAMLError are both ValueErrors or close to it
        raise ToolkitError.of(f"not a valid table: {err}", file=str(p), fix="check the file") from None
    if not isinstance(data, dict):
        raise ToolkitError.of("a recorded table must be a mapping", file=str(p), fix="{about: ..., points: [...]}")
    return data


class ApplyProbeRunner:
    """`run_variant` through the real deploy: `toolkit apply profile VARIANT --probe` per point.

    The variant is written as a profile (extends: the base, its knobs, bench.max_concurrency set to the
    point's level) into the run's own profiles directory next to copies of the base's chain, so the
    user's profiles/ is never touched by a sweep. Apply restarts the service only when the rendered
    command changed, so the levels of one variant reuse one server.
    """

    def __init__(
        self,
        *,
        store: SweepStore,
        run_id: str,
        base: str,
        chain_files: list[Path],
        inventory: str | None,
        lab: bool | None,
        timeout_s: float,
        lab_num_prompts: int | None = None,
        command: str = "sweep",
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.base = base
        self.chain_files = chain_files
        self.inventory = inventory
        self.lab = lab
        self.timeout_s = timeout_s
        # The lab's bench runs 160 prompts (apply's LAB_NUM_PROMPTS); a tune that must see demand above 512
        # running requests asks for more (`toolkit apply --lab-num-prompts`).
        self.lab_num_prompts = lab_num_prompts
        self.command = command

    def describe(self) -> str:
        where = self.inventory or "the lab inventory"
        return f"toolkit apply profile VARIANT --probe against {where}"

    def _profiles_dir(self) -> Path:
        d = self.store.run_dir(self.run_id) / "profiles"
        d.mkdir(parents=True, exist_ok=True)
        for f in self.chain_files:
            shutil.copyfile(f, d / f.name)
        return d

    def __call__(self, request: PointRequest) -> Measurement:
        profiles = self._profiles_dir()
        name = variant_profile_name(self.run_id, request.variant.id)
        text = variant_profile_text(
            base=self.base,
            name=name,
            knobs=request.variant.knob_dict(),
            description=f"{self.command} {self.run_id} variant {request.variant.id} ({request.variant.label})",
            extra={"bench.max_concurrency": request.concurrency},
            header=[f"Written by `toolkit {self.command}` for run {self.run_id}; deployed by `toolkit apply`."],
        )
        write_atomic(profiles / f"{name}.yaml", text)
        runs = self.store.run_dir(self.run_id) / request.artifacts
        runs.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "toolkit", "apply", "profile", name, "--probe", "--json"]
        argv += ["--profiles-dir", str(profiles), "--runs-dir", str(runs)]
        if self.inventory:
            argv += ["-i", self.inventory]
        if self.lab is not None:
            argv.append("--lab" if self.lab else "--no-lab")
        if self.lab_num_prompts is not None:
            argv += ["--lab-num-prompts", str(self.lab_num_prompts)]
        log = runs / "apply.log"
        with log.open("w") as handle:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=handle, text=True)
            try:
                stdout, _ = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _stop(proc)
                raise VariantFailed(f"apply did not finish in {self.timeout_s:.0f} s", artifacts=str(log)) from None
            except BaseException:
                # Ctrl-C (or SIGINT to this process alone): let apply stop its playbook cleanly before we go,
                # so no orphaned deploy keeps changing the host under the resumed sweep.
                _stop(proc)
                raise
        try:
            summary = json.loads(stdout)
        except json.JSONDecodeError:
            summary = None
        tail = _tail(log)
        if summary is None:
            raise VariantFailed(f"apply exited {proc.returncode} without a summary: {tail}", artifacts=str(log))
        probes = summary.get("probe") or {}
        run_dirs = [Path(p["run_dir"]) for p in probes.values() if p.get("run_dir")]
        # Apply's summary names the fetched run; fall back to any probe run under the artifacts (run.json).
        run_dirs = run_dirs or sorted(p.parent for p in runs.glob("**/run.json"))
        if summary.get("rc") != 0 or summary.get("failed_hosts") or summary.get("unreachable"):
            failures = summary.get("failures") or []
            if failures and failures[0].get("task") == PROBE_FAILED_TASK and run_dirs:
                # The server came up and the benchmark ran but failed (lost requests, exit code): that point
                # failed with the probe's reason, and the variant's other points are still measured.
                return measurement_from_probe_dir(run_dirs[0])
            what = failures[0]["task"] + ": " + failures[0]["message"][-300:] if failures else tail
            raise VariantFailed(f"deploy failed: {what}", artifacts=str(log))
        if not run_dirs:
            raise PointFailed(f"apply ran but fetched no probe run: {tail}", artifacts=str(log))
        return measurement_from_probe_dir(run_dirs[0])


def _stop(proc: subprocess.Popen[str], grace_s: float = 120.0) -> None:
    """SIGINT, then wait for apply to wind its playbook down (and stop the probe on the hosts); SIGKILL only if
    it will not."""
    from toolkit.adapters.bench_process import stop_process

    stop_process(proc, grace_s)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def measurement_from_probe_dir(run_dir: Path) -> Measurement:
    """A probe run directory through the probe's own summary and the results entry builder."""
    from toolkit.adapters.probe_store import load_run
    from toolkit.core.results.build import build_entry

    run = load_run(run_dir)
    summary, verdict = run.summary, run.verdict
    if summary is None or verdict is None:  # cut before it judged: judge it now, with the probe's own code
        from toolkit.adapters.probe_store import judge_run

        summary, judged = judge_run(run)
        verdict = judged.to_dict()
    exit_code = (summary.get("benchmark") or {}).get("exit_code")
    if exit_code not in (0, None) or verdict.get("class") == "benchmark-failed":
        tail = str((summary.get("benchmark") or {}).get("stderr_tail") or "").strip()[-300:]
        raise PointFailed(f"benchmark failed (exit {exit_code}): {tail}", artifacts=str(run_dir))
    entry = build_entry(
        summary,
        verdict,
        run.manifest,
        run_id=run_dir.name,
        spec_hash=None,
        artifacts=str(run_dir),
        topology=run.topology,
        bench_raw=run.bench_raw,
    )
    m = measurement_from_entry(entry, lab=entry.lab is not None)
    # What `toolkit tune` reads next: the verdict's machine-readable next steps (docs/probe.md, "Next steps").
    m.knob_steps = [dict(s) for s in verdict.get("knob_steps") or []]
    m.verdict_headline = verdict.get("headline")
    return m


def measurement_from_entry(entry: Any, *, lab: bool) -> Measurement:
    """Map a results entry (#4's ResultsEntry) onto the sweep's Measurement; NaN stays NaN (a failure)."""
    tput, which = entry.output_tok_per_s()
    if tput is None:
        raise PointFailed("the probe run has no output throughput (the benchmark produced no result)")
    power = entry.power
    count = len(power.per_gpu) if power and power.per_gpu else (entry.gpu.count or 1)
    energy = entry.energy
    return Measurement(
        steady_output_tok_per_s=float(tput),
        output_tok_per_s=entry.throughput.full_run.output_tok_per_s,
        steady_total_tok_per_s=entry.throughput.steady_state.total_tok_per_s if entry.throughput.steady_state else None,
        tokens_per_j=energy.output_tok_per_j if energy else None,
        energy_per_output_token_j=energy.j_per_output_tok if energy else None,
        power_w_total=round(power.mean_w * count, 1) if power and power.mean_w is not None else None,
        verdict=entry.verdict_class(),
        # The entry's own lab note (simulated GPUs, a replayed trace): the report and a promoted profile's whys
        # quote it, so no one reads lab figures as a GPU's.
        data_source=f"lab data ({entry.lab.kind}): {entry.lab.note}" if lab and entry.lab else "measured",
        throughput_window=which,
    )
