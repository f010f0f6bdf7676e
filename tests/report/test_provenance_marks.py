"""One word list for where figures came from: a lab run, a replayed run and an imported entry, each through every
surface that shows it (the apply summary, the profile report in Markdown, HTML and on the terminal, the sweep's and
the tune's reports, `results compare`), and each surface shows the same mark (toolkit.core.provenance.MARK).

The lab run and the replayed run are one recorded probe run whose run.json declares the provenance its GPU source
gives (the lab's simulated GPUs, a recorded trace), judged by the probe's own code (`probe replay --write`) and
recorded into a profile; the imported entry is the shipped glm5-baseline's, typed in from notes."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.results.conftest import REPO
from toolkit.adapters.probe_store import read_verdict
from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.apply import ApplyOutcome, HostProbe
from toolkit.app.measure import measurement_from_probe_dir
from toolkit.app.profiles import check
from toolkit.app.record import load_results
from toolkit.cli.main import main
from toolkit.cli.render import print_apply_summary
from toolkit.core.ansible_summary import PlaybookResult
from toolkit.core.probe.sampler import RecordedSampler
from toolkit.core.probe.series import Trace
from toolkit.core.provenance import MARK, Provenance
from toolkit.core.sweep import report as sweep_report
from toolkit.core.sweep.measurement import measurement_from_entry
from toolkit.core.sweep.promote import base_spec, profile_validator
from toolkit.core.sweep.run import PointRequest
from toolkit.core.sweep.state import Measurement, new_state
from toolkit.core.tune import report as tune_report
from toolkit.core.tune.loop import new_tune_log, run_tune
from toolkit.lab.simulated_gpus import SimulatedSampler

RUN = REPO / "tests" / "results" / "fixtures" / "run-synthetic-tp8"
LAB = SimulatedSampler.provenance
REPLAYED = RecordedSampler(Trace({}, {}), "recorded.csv").provenance


def _run_dir(tmp_path: Path, name: str, provenance: Provenance) -> Path:
    """The recorded run, as a probe with this GPU source writes it, judged again by the probe's own code."""
    run = tmp_path / "runs" / name
    shutil.copytree(RUN, run)
    manifest = json.loads((run / "run.json").read_text())
    manifest.pop("data_source")
    (run / "run.json").write_text(json.dumps({**manifest, "provenance": provenance.to_dict()}))
    assert main(["probe", "replay", str(run), "--write", "--json"]) == 0
    return run


def _apply_summary(run: Path) -> str:
    console = Console(record=True, width=200)
    outcome = ApplyOutcome("glm5-tp8", False, PlaybookResult(0, "successful", {}, [], None), [], run.parent,
                           probes={"gpu-host": HostProbe(run, read_verdict(run))})
    print_apply_summary(console, outcome, as_json=False)
    return console.export_text()


def _tune_and_sweep_reports(profiles: ProfileStore, measure: object) -> tuple[str, str]:
    """A tune of glm5-baseline whose every point is the given measurement: the sweep's and the tune's report."""
    spec = base_spec(profiles.resolve("glm5-baseline"))
    state = new_state(run_id="t", profile="glm5-baseline", base_spec=spec, axes=[], planned=[], concurrency=[1024],
                      created="", runner="test")
    state.tune = new_tune_log(objective="throughput", repeats=2, min_gain_pct=1.0, budget_points=None)

    def runner(_request: PointRequest) -> Measurement:
        return measure()  # type: ignore[operator,no-any-return]

    run_tune(state, spec, runner, validate=profile_validator("glm5-baseline", "t", profiles.source, check),
             save=lambda _s: None, clock=time.monotonic)
    return sweep_report.markdown(state), tune_report.markdown(state)


def _report(profiles: Path, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The report's Markdown, its HTML and its terminal summary."""
    capsys.readouterr()
    html, md = tmp_path / f"{name}.html", tmp_path / f"{name}.md"
    assert main(["report", name, "--profiles-dir", str(profiles), "--html", str(html), "--markdown", str(md)]) == 0
    return [md.read_text(), html.read_text(), capsys.readouterr().err]


@pytest.mark.slow
def test_every_surface_shows_the_same_mark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    store = ProfileStore(profiles)
    cases = {"glm5-tp8": LAB, "glm5-ep8": REPLAYED}
    surfaces: dict[str, dict[str, str]] = {}
    for profile, prov in cases.items():
        run = _run_dir(tmp_path, f"run-{prov.kind}", prov)
        assert main(["results", "record", str(run), "--profile", profile, "--profiles-dir", str(profiles)]) == 0
        sweep_md, tune_md = _tune_and_sweep_reports(store, lambda run=run: measurement_from_probe_dir(run))
        md, html, terminal = _report(profiles, profile, tmp_path, capsys)
        surfaces[prov.kind] = {"apply summary": _apply_summary(run), "report (Markdown)": md, "report (HTML)": html,
                               "report (terminal)": terminal, "sweep report": sweep_md, "tune report": tune_md}
    entry = next(e for e in load_results("glm5-baseline", profiles).block.entries if e.source == "manual")
    sweep_md, tune_md = _tune_and_sweep_reports(store, lambda: measurement_from_entry(entry))
    md, html, terminal = _report(profiles, "glm5-baseline", tmp_path, capsys)
    surfaces["imported"] = {"report (Markdown)": md, "report (HTML)": html, "report (terminal)": terminal,
                            "sweep report": sweep_md, "tune report": tune_md}
    capsys.readouterr()
    assert main(["results", "compare", "glm5-tp8", "glm5-ep8", "glm5-baseline", "--profiles-dir", str(profiles)]) == 0
    compare = capsys.readouterr().out

    for kind, shown in surfaces.items():
        mark = MARK[kind]  # type: ignore[index]
        # The shipped profiles' history rows say "imported" too: the capital marks are the ones never to mix.
        others = [m for k, m in MARK.items() if k not in (kind, "measured", "imported")]
        for surface, text in {**shown, "results compare": compare}.items():
            assert mark in text, f"{surface} does not mark {kind} figures {mark!r}"
        for surface, text in shown.items():
            assert not [m for m in others if m in text], f"{surface} of {kind} figures shows another mark"
    # The old words are gone from every surface: one word list.
    for shown in surfaces.values():
        for text in shown.values():
            assert "SIMULATED" not in text and "lab data" not in text
