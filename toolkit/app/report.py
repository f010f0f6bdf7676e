"""Report a profile's results: what ran, its verdict and next steps, the plots of the run it came from (when that
run is on this machine), its figures and evidence, the knob changes against its parent and its history, as
Markdown and a standalone HTML page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from toolkit.adapters.files import write_atomic
from toolkit.app.record import load_results
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.diff import diff_profiles
from toolkit.core.results.compare import is_stale, latest
from toolkit.core.results.report import ReportData, page_context, plot_data, render_markdown
from toolkit.core.text import redact


@dataclass
class ReportRequest:
    profile: str
    html: Path | None = None
    markdown: Path | None = None  # with its plots as PNG files beside it
    run: Path | None = None  # the plots from this run directory (default: the latest entry's artifacts)
    profiles_dir: str | None = None
    # A document asked for on standard output (`--html -`, `--markdown -`): made, returned, not written. Markdown
    # there has no plots (no files beside it to hold them); HTML has them embedded.
    stdout: Literal["html", "markdown"] | None = None


@dataclass
class ReportOutcome:
    data: ReportData
    text: str | None  # the document asked for on standard output
    written: list[Path]


def _shown(path: Path, repo: Path) -> str:
    """A path as the report may show it: relative to the repository, else its last two parts; never a path of the
    machine that made the report."""
    try:
        return str(path.resolve().relative_to(repo.resolve()))
    except ValueError:
        return str(Path(*path.parts[-2:])) if len(path.parts) >= 2 else path.name


def _run_dir(req: ReportRequest, artifacts: str | None, repo: Path) -> Path | None:
    if req.run is not None:
        if not req.run.is_dir():
            raise ToolkitError.of("not a directory", file=str(req.run), field="--run",
                                  fix="give the --out directory of `toolkit probe run`")
        return req.run
    if not artifacts:
        return None
    p = Path(artifacts)
    return p if p.is_absolute() else repo / p


def report(req: ReportRequest) -> ReportOutcome:
    """The report's data and documents; files written atomically where asked, the stdout document returned."""
    for out in (req.html, req.markdown):
        if out is not None and not out.parent.is_dir():
            raise ToolkitError.of("its directory does not exist", file=str(out), field="--html/--markdown",
                                  fix="create the directory first, or write elsewhere")
    pr = load_results(req.profile, req.profiles_dir)
    repo = pr.file.parent.resolve().parent
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
        profile=req.profile, file=_shown(pr.file, repo), parent=parent, knob_changes=changes, entry=entry,
        stale=bool(entry and is_stale(entry, pr.spec_hash)),
        history=[(e, is_stale(e, pr.spec_hash)) for e in pr.block.entries],
    )
    run_dir = _run_dir(req, entry.artifacts if entry else None, repo)
    shown_run = _shown(run_dir, repo) if run_dir is not None else None
    if req.run is not None and (entry is None or entry.run_id != req.run.resolve().name):
        data.notes.append(f"the plots are from `{shown_run}`, which is not recorded in this profile; the figures "
                          f"are from {entry.run_id if entry else 'no entry'}")
    want_plots = req.html is not None or req.markdown is not None or req.stdout == "html"
    if run_dir is not None and run_dir.is_dir():
        from toolkit.adapters.probe_store import load_run

        run = load_run(run_dir)
        if run.verdict:
            data.next_steps = list(run.verdict.next_steps)
        if run.summary is None:
            data.notes.append(f"`{shown_run}` has no summary.json: no plots (`toolkit probe replay DIR --write`)")
        else:
            data.run_facts = {"duration_s": run.summary.benchmark.duration_s,
                              "bench_start_s": run.manifest.bench_start_s,
                              "bench_end_s": run.manifest.bench_end_s,
                              "request_per_s": run.summary.full.throughput.request_per_s}
            data.watermark = run.summary.provenance.watermark
            if want_plots:
                from toolkit.adapters.plots import report_plots

                pd = plot_data(run.trace, run.summary, run.manifest, run.bench_raw, server=run.server,
                               host=run.host, topology=run.topology)
                data.plots = report_plots(pd)
                if pd.latencies is None:
                    data.notes.append(f"no TTFT/ITL distribution: {pd.latency_note}")
    elif entry is not None and entry.source == "manual":
        data.notes.append("the latest entry is imported from notes: there is no trace to plot")
    elif run_dir is not None:
        data.notes.append(f"the entry's artifacts `{shown_run}` are not on this machine: no plots")
    written: list[Path] = []
    if req.markdown is not None:
        paths = {}
        for p in data.plots:
            png = req.markdown.with_name(f"{req.markdown.stem}-{p.key}.png")
            write_atomic(png, p.png)
            written.append(png)
            paths[p.key] = png.name
        write_atomic(req.markdown, redact(render_markdown(data, paths)))
        written.append(req.markdown)
    html = None
    if req.html is not None or req.stdout == "html":
        from toolkit.adapters.documents import render_page

        html = redact(render_page("report.html.j2", page_context(data)))
        if req.html is not None:
            write_atomic(req.html, html)
            written.append(req.html)
    # A report quotes the profile (its knobs, its changes, its command): no credential of a URL, no secret value.
    text = html if req.stdout == "html" else redact(render_markdown(data)) if req.stdout == "markdown" else None
    return ReportOutcome(data, text, written)
