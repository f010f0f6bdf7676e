"""Report a profile's results: its latest entry's figures, the knob changes against its parent, and the plots of
the run it came from (when that run is on this machine), as Markdown and a standalone HTML file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.adapters.files import write_atomic
from toolkit.app.record import load_results
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.diff import diff_profiles
from toolkit.core.results.compare import is_stale, latest
from toolkit.core.results.report import ReportData, plot_data, render_html, render_markdown


@dataclass
class ReportRequest:
    profile: str
    html: Path | None = None
    markdown: Path | None = None  # with its plots as PNG files beside it
    run: Path | None = None  # the plots from this run directory (default: the latest entry's artifacts)
    profiles_dir: str | None = None


def _run_dir(req: ReportRequest, artifacts: str | None, profiles_dir: Path) -> Path | None:
    if req.run is not None:
        if not req.run.is_dir():
            raise ToolkitError.of("not a directory", file=str(req.run), field="--run",
                                  fix="give the --out directory of `toolkit probe run`")
        return req.run
    if not artifacts:
        return None
    p = Path(artifacts)
    return p if p.is_absolute() else profiles_dir.resolve().parent / p


def report(req: ReportRequest) -> ReportData:
    """The report's data; with `html` / `markdown` also drawn and written (atomically)."""
    for out in (req.html, req.markdown):
        if out is not None and not out.parent.is_dir():
            raise ToolkitError.of("its directory does not exist", file=str(out), field="--html/--markdown",
                                  fix="create the directory first, or write elsewhere")
    pr = load_results(req.profile, req.profiles_dir)
    entry = latest(pr.block, pr.spec_hash)
    if req.run is not None:
        # The figures and the plots must describe the same run: prefer the entry recorded from --run.
        named = [e for e in pr.block.entries if e.run_id == req.run.resolve().name]
        entry = named[-1] if named else entry
    parent = pr.resolved.spec.extends
    from toolkit.app.profiles import open_store

    store = open_store(str(pr.file.parent))
    changes = [c.render() for c in diff_profiles(store.resolve(parent), pr.resolved).changes] if parent else []
    data = ReportData(
        profile=req.profile, file=str(pr.file), parent=parent, knob_changes=changes, entry=entry,
        stale=bool(entry and is_stale(entry, pr.spec_hash)),
        history=[(e, is_stale(e, pr.spec_hash)) for e in pr.block.entries],
    )
    run_dir = _run_dir(req, entry.artifacts if entry else None, pr.file.parent)
    if req.run is not None and (entry is None or entry.run_id != req.run.resolve().name):
        data.notes.append(f"the plots are from {req.run}, which is not recorded in this profile; the figures "
                          f"are from {entry.run_id if entry else 'no entry'}")
    want_plots = req.html is not None or req.markdown is not None
    if run_dir is not None and run_dir.is_dir():
        from toolkit.adapters.probe_store import load_run

        run = load_run(run_dir)
        if run.verdict:
            data.next_steps = [s for s in run.verdict.get("next_steps") or [] if isinstance(s, str)]
        if run.summary is None:
            data.notes.append(f"{run_dir} has no summary.json: no plots (toolkit probe replay {run_dir} --write)")
        elif want_plots:
            from toolkit.adapters.plots import report_plots

            data.plots = report_plots(plot_data(run.trace, run.summary, run.manifest, run.bench_raw,
                                                server=run.server, host=run.host))
    elif entry is not None and entry.source == "manual":
        data.notes.append("the latest entry is manual (imported figures): there is no trace to plot")
    elif run_dir is not None:
        data.notes.append(f"the entry's artifacts {run_dir} are not on this machine: no plots")
    if req.markdown is not None:
        paths = {}
        for p in data.plots:
            png = req.markdown.with_name(f"{req.markdown.stem}-{p.key}.png")
            write_atomic(png, p.png)
            paths[p.key] = png.name
        write_atomic(req.markdown, render_markdown(data, paths))
    if req.html is not None:
        write_atomic(req.html, render_html(data))
    return data
