"""Upgrade a profile's SGLang with a gate: the new release installed beside the old, both measured in alternation,
kept only on a significant result, the old one restored otherwise.

1. The profile moved to the release (as `profile migrate --as PROFILE-VERSION`; an existing such profile that
   extends PROFILE and pins the release is used as it is), it and every profile extending it checked;
2. the host side: each target container's Proxmox host's loaded driver against the CUDA the release's wheels are
   built for (toolkit.core.upgrade.driver_refusal, from the compatibility data), refused before anything changes;
3. old, new, old, new ...: each run an apply with a probe (toolkit.app.apply, in this process). The first apply
   of the new profile installs its venv beside the old one (the sglang_venv role: one venv per lock, the
   engine's venv_path switched atomically), so every later switch, either way, is a symlink and a restart;
4. after each pair the gate (toolkit.core.upgrade.gate) decides or asks for another pair, up to --repeats pairs;
   a new run that fails (health, a crash, NaN, no benchmark result) rolls back at once;
5. promoted: the new unit is left serving (the last run was the new one). Otherwise the old profile is applied
   again: the unit on the old venv, health waited for, the smoke generation checked, timed;
6. every run is recorded into its profile's results with the gate's decision and interval (so no entry of a
   refused release claims it better), and a report is written beside the runs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolkit.adapters.ansible import PlaybookEvent, read_inventory
from toolkit.adapters.compat_store import read_matrix
from toolkit.adapters.files import write_atomic
from toolkit.app.apply import ApplyRequest, apply, target
from toolkit.app.measure import measurement_from_probe_dir
from toolkit.app.profiles import open_store, resolve_checked
from toolkit.core import stats
from toolkit.core.errors import EXIT_FAILED, Problem, ToolkitError
from toolkit.core.results.model import Gate, GateChange
from toolkit.core.sweep.slo import SLO_DEFINITIONS, check_slo, parse_slo, slo_definition
from toolkit.core.sweep.state import Measurement
from toolkit.core.upgrade import (
    DEFAULT_EFFECT,
    DEFAULT_MAX_PAIRS,
    OBJECTIVES,
    PROMOTED,
    REFUSED,
    ROLLED_BACK,
    GateVerdict,
    Run,
    driver_refusal,
    gate,
    report_markdown,
    slo_rates,
)

PROXMOX_HOST_VAR = "lxc_gpu_container_proxmox_host"


@dataclass
class UpgradeRequest:
    profile: str
    sglang_version: str
    inventory: str | None = None
    limit: str | None = None
    objective: str = "throughput"
    slo: str | None = None
    repeats: int = DEFAULT_MAX_PAIRS  # the budget: at most this many (old, new) pairs
    accept_equal: bool = False
    effect_pct: float = DEFAULT_EFFECT * 100
    profiles_dir: str | None = None
    runs_dir: str = "runs"
    num_prompts: int | None = None


@dataclass
class UpgradeOutcome:
    decision: str  # promoted, refused, rolled-back
    profile: str
    new_profile: str
    from_version: str
    to_version: str
    text: str
    runs: list[Run] = field(default_factory=list)
    verdict: GateVerdict | None = None
    rollback_s: float | None = None
    wall_s: float = 0.0
    report: str | None = None
    recorded: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 0 if self.decision == PROMOTED else EXIT_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {**self.data, "runs": [r.to_dict() for r in self.runs], "report": self.report,
                "recorded": self.recorded, "wall_s": round(self.wall_s, 1)}


def _new_profile(req: UpgradeRequest, on_message: Callable[[str], None]) -> str:
    """The profile of the new release: PROFILE-VERSION, migrated now unless it exists (then it must extend
    PROFILE and pin the release). It and every profile extending it are checked; an error raises."""
    from toolkit.app.profile_migrate import migrate_profile

    store = open_store(req.profiles_dir)
    name = f"{req.profile}-{req.sglang_version}"
    if store.path(name).exists():
        extends, got = store.source(name).data.get("extends"), store.resolve(name).spec.engine.sglang_version
        if extends != req.profile or got != req.sglang_version:
            raise ToolkitError.of(f"{name} exists but does not extend {req.profile} on SGLang {req.sglang_version} "
                                  f"(it extends {extends}, pins {got})", file=str(store.path(name)),
                                  field="--sglang-version", fix=f"move {name} aside, or upgrade from what it extends")
        on_message(f"{name}: the release's profile exists (extends {req.profile}, pins {got}): used as it is")
    else:
        result = migrate_profile(store, req.profile, req.sglang_version, new_name=name, write=True)
        if not result.written:
            problems = list(result.migration.refusals)
            problems += [p for ps in result.problems.values() for p in ps if p.severity == "error"]
            problems += [Problem(f"SGLang {req.sglang_version} cannot be locked: {r.path}", field="--sglang-version",
                                 fix="pick a release the container's Python can install") for r in result.lock_refusals]
            raise ToolkitError(problems or [Problem(f"{req.profile} could not be migrated to SGLang "
                                                    f"{req.sglang_version}", field="--sglang-version",
                                                    fix=f"toolkit profile migrate {req.profile} --sglang-version "
                                                    f"{req.sglang_version} --as {name} shows why")])
        on_message(f"{name}: {req.profile} migrated to SGLang {req.sglang_version} (profile migrate --as)")
    store = open_store(req.profiles_dir)
    resolve_checked(name, store=store)
    for child in store.names():
        if child != name and name in store.resolve(child).chain:
            resolve_checked(child, store=store)
    return name


def _driver_check(req: UpgradeRequest, on_event: Callable[[PlaybookEvent], None] | None) -> list[str]:
    """Each target container's Proxmox host read (facts) and its driver held against the release; refused with
    the fix before anything is installed. Returns what was checked, one line per host."""
    from toolkit.app.host import gather_facts, host_plan

    inventory, containers = target(ApplyRequest(req.profile, inventory=req.inventory, limit=req.limit))
    every = read_inventory(inventory)
    pve = sorted(h for h, v in every.items() if "proxmox_hosts" in v.groups)
    hosts = sorted({str(c.vars.get(PROXMOX_HOST_VAR) or (pve[0] if len(pve) == 1 else "")) for c in containers.values()}
                   - {""})
    matrix = read_matrix()
    lines, refusals = [], []
    for host in hosts:
        facts = gather_facts(host_plan(host, inventory), on_event=on_event)
        loaded = facts.driver.loaded_version
        refusal = driver_refusal(matrix, req.sglang_version, loaded, host)
        if refusal is not None:
            refusals.append(refusal)
        lines.append(f"{host}: driver {loaded or 'none'} " + ("cannot run" if refusal else "runs")
                     + f" SGLang {req.sglang_version}")
    if refusals:
        raise ToolkitError(refusals)
    return lines


def _value(m: Measurement, objective: str) -> float:
    got = {"throughput": m.steady_output_tok_per_s, "tokens-per-joule": m.tokens_per_j,
           "j-per-token": m.energy_per_output_token_j}[objective]
    return math.nan if got is None else float(got)


def upgrade(req: UpgradeRequest, *, on_event: Callable[[PlaybookEvent], None], on_message: Callable[[str], None],
            clock: Callable[[], float] = time.monotonic) -> UpgradeOutcome:
    if req.objective not in OBJECTIVES:
        raise ToolkitError.of(f"unknown objective {req.objective!r}", field="--objective",
                              fix=f"use one of {', '.join(OBJECTIVES)}")
    if req.repeats < 3:
        raise ToolkitError.of(f"--repeats {req.repeats}: fewer than {stats.MIN_PAIRS} pairs decide nothing",
                              field="--repeats", fix="e.g. --repeats 6")
    slo = parse_slo(req.slo) if req.slo else None
    t0 = clock()
    old = resolve_checked(req.profile, req.profiles_dir)
    from_version = old.resolved.spec.engine.sglang_version or "?"
    if from_version == req.sglang_version:
        raise ToolkitError.of(f"{req.profile} already pins SGLang {req.sglang_version}", field="--sglang-version",
                              fix="name the release to move to")
    new_name = _new_profile(req, on_message)
    for line in _driver_check(req, on_event):
        on_message(line)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    effect = req.effect_pct / 100
    runs: list[Run] = []

    def measure(side: str) -> Run:
        profile = req.profile if side == "old" else new_name
        on_message(f"measuring {side} ({profile}), run {sum(r.side == side for r in runs) + 1}")
        start = clock()
        out = apply(ApplyRequest(profile, inventory=req.inventory, limit=req.limit, probe=True,
                                 profiles_dir=req.profiles_dir, runs_dir=req.runs_dir, num_prompts=req.num_prompts),
                    on_event=on_event, on_message=on_message)
        wall = clock() - start
        probes = list((out.probes or {}).values())
        if out.exit_code != 0 or not probes or any(p.verdict is None or p.verdict.failed for p in probes):
            why = "; ".join(f"{f.host}: {f.task}: {f.message}" for f in out.playbook.failures)
            said = [p.verdict.cls if p.verdict else "none written" for p in probes]
            return Run(side, math.nan, None, None, wall, why or f"no result (verdict {said})")
        measured = [measurement_from_probe_dir(p.run_dir) for p in probes]
        values = [_value(m, req.objective) for m in measured]
        met = all(check_slo(slo, m.latency_ms).met for m in measured) if slo is not None else None
        value = sum(values) / len(values)
        return Run(side, value, str(probes[0].run_dir), met, wall,
                   None if math.isfinite(value) else f"no {OBJECTIVES[req.objective][0]} in the run",
                   provenance=measured[0].provenance)

    verdict: GateVerdict | None = None
    failed: Run | None = None
    while True:
        runs.append(measure("old"))
        if runs[-1].failure:
            raise ToolkitError.of(f"the old release's run failed before anything was decided: {runs[-1].failure}",
                                  field=req.profile, fix=f"toolkit apply {req.profile} --probe: the old unit must "
                                  "serve before it can be compared", exit_code=EXIT_FAILED)
        runs.append(measure("new"))
        if runs[-1].failure:
            failed = runs[-1]
            break
        olds = [r.value for r in runs if r.side == "old"]
        news = [r.value for r in runs if r.side == "new"]
        verdict = gate(olds, news, objective=req.objective, effect=effect, accept_equal=req.accept_equal,
                       max_pairs=req.repeats)
        on_message(f"pair {verdict.pairs}: {verdict.decision.text}")
        if verdict.done:
            break
    rates = slo_rates(runs)
    slo_text = None
    if rates is not None:
        slo_old, slo_new = rates
        guard = stats.pass_rate_gain(slo_old, slo_new)
        slo_text = f"old {slo_old.text()}, new {slo_new.text()}"
        if verdict is not None and verdict.decision.promote and guard.promote:
            # The old release kept the SLO significantly more often: a faster release that misses it is no gain.
            verdict = GateVerdict(stats.Decision(stats.LOSS, False, f"{verdict.decision.text}, but the old release "
                                                 f"{guard.text}"), verdict.change, verdict.promote_change,
                                  verdict.pairs, True)
    if failed is not None:
        decision, text = ROLLED_BACK, f"the new release failed: {failed.failure}; rolled back at once"
    elif verdict is not None and verdict.decision.promote:
        decision, text = PROMOTED, verdict.decision.text
    else:
        decision, text = REFUSED, (verdict.decision.text if verdict else "nothing measured")
    rollback_s = None
    if decision != PROMOTED:
        on_message(f"{decision}: restoring {req.profile} (SGLang {from_version}): its venv is still there")
        start = clock()
        back = apply(ApplyRequest(req.profile, inventory=req.inventory, limit=req.limit,
                                  profiles_dir=req.profiles_dir, runs_dir=req.runs_dir), on_event=on_event,
                     on_message=on_message)
        rollback_s = clock() - start
        if back.exit_code != 0:
            why = "; ".join(f"{f.host}: {f.message}" for f in back.playbook.failures)
            raise ToolkitError.of(f"the rollback to {req.profile} failed: {why}", field=req.profile,
                                  fix=f"toolkit apply {req.profile} (its venv is still installed)",
                                  exit_code=EXIT_FAILED)
        if decision == REFUSED:
            text += f"; rolled back to SGLang {from_version} in {rollback_s:.1f} s"
    change = verdict.change if verdict else None
    gate_note = {
        "decision": decision, "from_version": from_version, "to_version": req.sglang_version,
        "objective": req.objective, "pairs": verdict.pairs if verdict else 0,
        "change": GateChange(value=change.value, low=change.low, high=change.high, method=change.method)
        if change else None,
        "outcome": "failed" if failed else (verdict.outcome if verdict else None),
        "slo_definition": slo_definition(slo) if slo else None,
    }
    recorded: dict[str, str] = {}
    for r in runs:
        if r.run_dir is None:
            continue
        from toolkit.app.record import record_run

        profile = req.profile if r.side == "old" else new_name
        out = record_run(Path(r.run_dir), profile, old.store.dir, gate=Gate(side=r.side, **gate_note))
        recorded[Path(r.run_dir).name] = f"{out.action} in {profile}"
    data: dict[str, Any] = {
        "decision": decision, "profile": req.profile, "new_profile": new_name, "from_version": from_version,
        "to_version": req.sglang_version, "objective": req.objective, "effect_pct": req.effect_pct,
        "accept_equal": req.accept_equal, "text": text, "pairs": verdict.pairs if verdict else 0,
        "change": change.to_dict() if change else None,
        "change_99": verdict.promote_change.to_dict() if verdict and verdict.promote_change else None,
        "outcome": gate_note["outcome"], "rollback_s": None if rollback_s is None else round(rollback_s, 1),
        "slo": req.slo, "slo_definition": SLO_DEFINITIONS[slo_definition(slo)] if slo else None,
        "slo_text": slo_text,
    }
    report = Path(req.runs_dir) / f"upgrade-{req.profile}-{req.sglang_version}-{stamp}" / "report.md"
    write_atomic(report, report_markdown(data, runs))
    write_atomic(report.with_name("upgrade.json"), json.dumps({**data, "runs": [r.to_dict() for r in runs]},
                                                               indent=2, sort_keys=True) + "\n")
    return UpgradeOutcome(decision, req.profile, new_name, from_version, req.sglang_version, text, runs, verdict,
                          rollback_s, clock() - t0, str(report), recorded, data)
