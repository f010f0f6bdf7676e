"""What several commands show alike: live progress of a playbook run (`PlaybookProgress.on_event` is
run_playbook's on_event) and of a sweep's or tune's points (`MeasureProgress.on_progress`), the per-host tables
of a playbook and of an apply, and the line for a promoted profile."""

from __future__ import annotations

import textwrap
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolkit.cli.envelope import emit
from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult, diff_text
from toolkit.core.provenance import mark
from toolkit.core.text import safe

if TYPE_CHECKING:
    from toolkit.app.apply import ApplyOutcome
    from toolkit.core.probe.verdict import Verdict


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """Input-derived text for rich output: redacted, terminal controls escaped, and rich markup escaped (a name
    holding "[red]" is shown as written, not as markup)."""
    return escape(safe(text, keep_newlines=keep_newlines))


class PlaybookProgress:
    """A spinner naming the current play and task; a line for each change, failure and unreachable host."""

    def __init__(self, console: Console, title: str, *, show_changes: bool = True, show_diffs: bool = False) -> None:
        self.console = console
        self.title = title
        self.show_changes = show_changes
        self.show_diffs = show_diffs  # --diff: each changed task's diff under its line
        self.tasks_done = 0
        self._play = ""
        self._status: Any = None

    def __enter__(self) -> PlaybookProgress:
        self._status = self.console.status(f"{self.title}: starting ansible-playbook")
        self._status.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.__exit__(exc_type, exc, tb)

    def on_event(self, event: PlaybookEvent) -> None:
        # Names and messages are printed as text, never as markup (log lines hold brackets: "[lab stand-in] ..."),
        # and never as terminal control or a secret (shown).
        if event.kind == "play_start":
            self._play = event.message or event.play
            self.console.print(f"[bold]{shown(self._play)}[/]")
        elif event.kind == "task_start":
            self.tasks_done += 1
            if self._status is not None:
                self._status.update(f"{self.title}: [cyan]{shown(event.task)}[/] (task {self.tasks_done})")
        elif event.kind == "changed" and self.show_changes:
            self.console.print(f"  [yellow]changed[/] {shown(event.host)}: {shown(event.task)}")
            diff = diff_text(event.result) if self.show_diffs else ""
            if diff:
                # A diff shows file contents: redacted and with terminal controls escaped like any input.
                self.console.print(textwrap.indent(safe(diff, keep_newlines=True), "    "), highlight=False,
                                   markup=False)
        elif event.kind == "failed" and not event.ignore_errors:
            self.console.print(f"  [red]failed[/] {shown(event.host)}: {shown(event.task)}\n"
                               f"    {shown(event.message, keep_newlines=True)}")
        elif event.kind == "unreachable":
            self.console.print(f"  [red]unreachable[/] {shown(event.host)}: {shown(event.message, keep_newlines=True)}")


def summary_table(result: PlaybookResult, title: str) -> Table:
    table = Table(title=title)
    for column in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for host in sorted(result.hosts):
        s = result.hosts[host]
        style = "red" if s.failed or s.unreachable else ("yellow" if s.changed else "green")
        table.add_row(host, str(s.ok), str(s.changed), str(s.failed), str(s.unreachable), str(s.skipped), style=style)
    return table


def _hms(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class MeasureProgress:
    """A sweep's or tune's points: a bar with elapsed time and ETA, and one line per finished point."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                                 console=console, transient=False)
        self.task: Any = None

    def __enter__(self) -> MeasureProgress:
        self.progress.__enter__()
        self.task = self.progress.add_task("sweep", total=None, eta="?")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def on_progress(self, p: Any) -> None:
        self.progress.update(self.task, total=p.total_points, completed=p.finished_points, eta=_hms(p.eta_s))
        if p.kind == "point":
            self.progress.update(self.task, description=f"variant {p.position} of {p.planned}: {p.variant.id} "
                                 f"{p.variant.label} @ c={p.point.concurrency}")
        elif p.kind in ("done", "failed"):
            m = p.point.measurement
            what = (
                f"{m.steady_output_tok_per_s:,.1f} tok/s steady, "
                + (f"{m.tokens_per_j:.3f} tok/J" if m.tokens_per_j is not None else "no energy")
                + f" ({escape(mark(m.provenance))})"
                if p.kind == "done" and m is not None
                else f"[red]failed[/]: {escape(str(p.point.reason))}"
            )
            self.progress.console.print(
                f"variant {p.position} of {p.planned} {p.variant.id} {escape(p.variant.label)} "
                f"c={p.point.concurrency}: {what}  [{p.finished_points}/{p.total_points}, elapsed "
                f"{_hms(p.elapsed_s)}, ETA {_hms(p.eta_s)}]", markup=True, highlight=False)


def stderr_console() -> Console:
    """The console long-running commands report on; in a log or a CI job (no terminal) 200 wide, so table rows
    stay on one line."""
    con = Console(stderr=True)
    return con if con.is_terminal else Console(stderr=True, width=200)


def say(con: Console) -> Any:
    """A message callback (a host lock's holder named, ...) printing in yellow."""
    return lambda m: con.print(f"[yellow]{escape(m)}[/]", highlight=False)


def print_promoted(con: Console, promoted: Any, best: Any, base: str) -> None:
    """One line for a profile a sweep or a tune promoted."""
    con.print(f"[green]promoted[/] {best.variant_id} ({escape(best.label)}) as {promoted.path}; it validates and "
              f"renders ({promoted.launch_args} launch arguments). Review with "
              f"`toolkit profile diff {base} {promoted.path.stem}`.")


def _verdict_line(verdict: Verdict | None) -> str:
    if verdict is None:
        return "no verdict (the probe wrote none)"
    return (f"{verdict.headline or verdict.cls or '?'} (confidence {verdict.confidence_label}) "
            f"({mark(verdict.provenance)})")


def print_apply_summary(console: Any, outcome: ApplyOutcome, *, as_json: bool) -> None:
    if as_json:
        emit("apply", outcome.summary)
        return
    result = outcome.playbook
    table = Table(title=f"toolkit apply profile {outcome.profile}" + (" (check mode)" if outcome.check else ""))
    for col in ("host", "ok", "changed", "failed", "unreachable"):
        table.add_column(col)
    for host, s in sorted(result.hosts.items()):
        table.add_row(host, str(s.ok), str(s.changed), str(s.failed), str(s.unreachable))
    console.print(table)
    for f in result.failures:
        # Log lines hold brackets ("[lab stand-in] ..."): print them as text, never as rich markup.
        console.print(f"[red]{shown(f.host)}: {shown(f.task)}[/]\n{shown(f.message, keep_newlines=True)}")
    if outcome.unreachable:
        console.print(f"[red]unreachable: {', '.join(outcome.unreachable)}[/] (the other hosts were deployed)")
    for host, probe in (outcome.probes or {}).items():
        console.print(f"[bold]{escape(host)}[/]: verdict {escape(_verdict_line(probe.verdict))}; run {probe.run_dir}")
        server_log = probe.verdict.evidence.get("server_log_tail") if probe.verdict else None
        if server_log:
            tail = "\n".join(str(server_log).strip().splitlines()[-12:])
            console.print(f"the server's log ({escape(host)}, last lines):\n{escape(tail)}")
    if outcome.fleet_probe is not None:
        print_fleet_verdict(console, outcome.fleet_probe.verdict,
                            f"fleet probe {outcome.fleet_probe.out} (on this machine's clock)")
    rec = outcome.record
    if rec:
        console.print(rec.get("skipped") or "recorded: " + "; ".join(
            f"{host}: {what}" for host, what in sorted((rec.get("recorded") or {}).items())), highlight=False)
    console.print(f"artifacts: {outcome.artifacts_dir}")


def _fig(v: Any, nd: int = 0) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, int | float) else str(v)


def print_fleet_verdict(con: Console, verdict: dict[str, Any], title: str) -> None:
    """A fleet run's verdict (fleet_verdict.json): each node's figures, its clock offset and bound, how it is judged
    alone, the fleet's beside them; the headline, the clock problems, the next steps."""
    clocks = verdict["evidence"].get("clocks") or {}
    tb = Table(title=title)
    for col in ("host", "GPUs", "W", "util %", "SM MHz", "energy J", "tok/J", "net GB/s p95", "clock ms",
                "alone"):
        tb.add_column(col, justify="right")
    for host, fig in verdict["per_host"].items():
        c = clocks.get(host, {})
        clock = (f"{c['offset_ms']:+.1f} +/-{c['bound_ms']:.2f} (drift {c['drift_ms']:+.2f})" if c else "-")
        net = fig.get("net_gb_s_p95") if fig.get("net_gb_s_p95") is not None else fig.get("net_gb_s")
        tb.add_row(host, str(fig["gpu_count"]), _fig(fig["power_w"]), _fig(fig["util_gpu_pct"]),
                   _fig(fig["sm_clock_mhz"]), _fig(fig["energy_j"]), _fig(fig["tokens_per_j"], 3), _fig(net, 3),
                   clock, (fig.get("verdict") or {}).get("class", "-"))
    fl = verdict["fleet"]
    tb.add_row("fleet", str(fl["gpu_count"]), _fig(fl["power_w"]), _fig(fl["util_gpu_pct"]), "-",
               _fig(fl["energy_j"]), _fig(fl["tokens_per_j"], 3), "-", "-", verdict["class"])
    con.print(tb)
    con.print(f"[bold]verdict: {escape(str(verdict['headline']))}[/bold]  (confidence {verdict['confidence']})")
    for problem in verdict["evidence"].get("clock_problems") or []:
        con.print(f"  clock: {problem}", markup=False)
    for step in verdict["next_steps"]:
        con.print(f"  next: {step}", markup=False)


def figure_column(table: Table, name: str, cells: list[str]) -> None:
    """A column of figures: right-aligned, never wrapped or cut (it keeps the width of its widest figure; the text
    columns fold instead)."""
    width = max([len(c) for c in cells] + [1])
    table.add_column(name, justify="right", no_wrap=True, min_width=width)


def text_column(table: Table, name: str) -> None:
    """A column of words: folds onto more lines in a narrow terminal, so the figures beside it keep their width."""
    table.add_column(name, overflow="fold")


def print_wide(renderables: list[Any], *, stderr: bool = False) -> None:
    """Print tables and lines on the terminal at its width (text columns fold, figures keep theirs); piped or in a
    log, at the width the widest table needs, so no row is cut or folded in a file."""
    con = Console(stderr=stderr)
    if not con.is_terminal:
        wide = con.options.update_width(10_000)
        need = max([con.measure(r, options=wide).maximum for r in renderables if not isinstance(r, str)] + [80])
        con = Console(stderr=stderr, width=need)
    for r in renderables:
        con.print(r, highlight=False) if isinstance(r, str) else con.print(r)


def print_host_plan(con: Console, plan: Any) -> None:
    """A host plan (toolkit.core.hostplan.plan.Plan): the stack with each choice's reason, the changes in order,
    then warnings and refusals with their fixes."""
    table = Table(title=f"plan for {plan.host}" + (f" with {plan.profile}" if plan.profile else ""), show_lines=False)
    table.add_column("stack")
    table.add_column("value")
    table.add_column("why", overflow="fold")
    for c in plan.choices:
        value = ", ".join(map(str, c.value)) if isinstance(c.value, list) else str(c.value)
        table.add_row(escape(c.what), escape(value), escape(c.reason + (f" [{c.source}]" if c.source else "")))
    con.print(table)
    if plan.changes:
        con.print("[bold]changes, in order[/]")
        for n, ch in enumerate(plan.changes, 1):
            con.print(f"  {n}. {escape(ch.what)}\n     [dim]{escape(ch.why)}[/]")
    for w in plan.warnings:
        con.print(f"[yellow]warning[/] {escape(w.finding)}: {escape(w.reason)}\n  fix: {escape(w.fix)}")
    for r in plan.refusals:
        con.print(f"[red]refused[/] {escape(r.finding)}: {escape(r.reason)}\n  fix: {escape(r.fix)}"
                  + (f"\n  source: {escape(r.source)}" if r.source else ""))
    if plan.unknown:
        con.print(f"[dim]not read on this host: {', '.join(plan.unknown)}[/]")
    con.print("[green]resolved[/]: nothing changed yet" if plan.resolved else
              "[red]not resolved[/]: nothing changed; fix the above and run again")


def print_host_facts(con: Console, facts: Any) -> None:
    """Host facts (toolkit.core.hostplan.facts.HostFacts) for people."""
    k = facts.kernels
    lines = [
        ("Proxmox VE", f"{facts.pve_version or 'unknown'} (Debian {facts.debian_suite or 'unknown'})"),
        ("kernels", f"running {k.running or 'unknown'}, next boot {k.default or 'unknown'}"
         + (" (pinned)" if k.pinned else "") + ", installed "
         + (", ".join(f"{x.release}{'' if x.headers else ' (no headers)'}" for x in k.installed) or "unknown")
         + (f", proxmox-default-kernel -> {k.pending_series}" if k.pending_series else "")),
        ("Secure Boot", "unknown" if facts.secure_boot is None else "on" if facts.secure_boot else "off"),
        ("driver", f"{facts.driver.loaded_version or 'none loaded'}"
         + (f"; apt: {', '.join(facts.driver.apt_installed)}" if facts.driver.apt_installed else "")
         + ("; alternate-install marker" if facts.driver.alternate_install_marker else "")
         + ("; .run install" if facts.driver.runfile else "")),
        ("root", f"{facts.root_source or 'unknown'} ({facts.root_fstype or '?'})"),
        ("HA resources", ", ".join(f"{sid} {state}" for sid, state in facts.ha_resources) or "none"),
        ("cluster nodes", ", ".join(facts.cluster_nodes) or "unknown"),
        ("proxies", ", ".join(f"{k_}={v}" for k_, v in facts.proxies) or "none"),
    ]
    for name, text in lines:
        con.print(f"[bold]{name}[/]: {escape(text)}")
    gpus = Table(title="GPUs (identity: PCI bus id)")
    for col in ("bus id", "device", "driver", "minor", "VMs"):
        gpus.add_column(col)
    for g in facts.gpus:
        gpus.add_row(g.bus_id, escape(f"{g.name} [{g.pci_id}]"), g.driver or "-",
                     "-" if g.minor is None else str(g.minor), ", ".join(map(str, g.vms)) or "-")
    con.print(gpus)
    st = Table(title="storages")
    for col in ("name", "type", "active", "avail GiB", "content", "network", "shares the root's pool"):
        st.add_column(col)
    for s in facts.storages:
        st.add_row(s.name, s.type, "yes" if s.active else "no",
                   "-" if s.avail_gib is None else f"{s.avail_gib:.0f}", ",".join(s.content),
                   "yes" if s.shared else "no",
                   "unknown" if s.shares_root is None else "yes" if s.shares_root else "no")
    con.print(st)
    if facts.unknown:
        con.print(f"[dim]not read on this host: {', '.join(facts.unknown)}[/]")
