"""Live rich progress for a playbook run, and the per-host summary table: the CLI side of
toolkit.adapters.ansible (commands pass `progress.on_event` as run_playbook's on_event)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.table import Table

from toolkit.core.ansible_summary import PlaybookEvent, PlaybookResult


class PlaybookProgress:
    """A spinner naming the current play and task; a line for each change, failure and unreachable host."""

    def __init__(self, console: Console, title: str, *, show_changes: bool = True) -> None:
        self.console = console
        self.title = title
        self.show_changes = show_changes
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
        if event.kind == "play_start":
            self._play = event.message or event.play
            self.console.print(f"[bold]{self._play}[/]")
        elif event.kind == "task_start":
            self.tasks_done += 1
            if self._status is not None:
                self._status.update(f"{self.title}: [cyan]{event.task}[/] (task {self.tasks_done})")
        elif event.kind == "changed" and self.show_changes:
            self.console.print(f"  [yellow]changed[/] {event.host}: {event.task}")
        elif event.kind == "failed" and not event.ignore_errors:
            self.console.print(f"  [red]failed[/] {event.host}: {event.task}\n    {event.message}")
        elif event.kind == "unreachable":
            self.console.print(f"  [red]unreachable[/] {event.host}: {event.message}")


def summary_table(result: PlaybookResult, title: str) -> Table:
    table = Table(title=title)
    for column in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for host in sorted(result.hosts):
        s = result.hosts[host]
        style = "red" if s.failed or s.unreachable else ("yellow" if s.changed else "green")
        table.add_row(host, str(s.ok), str(s.changed), str(s.failed), str(s.unreachable), str(s.skipped), style=style)
    return table


def result_json(result: PlaybookResult) -> dict[str, Any]:
    return {
        "rc": result.rc,
        "status": result.status,
        "hosts": {h: vars(s) for h, s in sorted(result.hosts.items())},
        "failures": [vars(f) for f in result.failures],
        "artifacts_dir": str(result.artifacts_dir) if result.artifacts_dir else None,
    }
