"""The toolkit's own errors: every failure a user can fix names where it is and what to do.

Adapters translate their library's exceptions into these; only the CLI edge turns them into
text and exit codes, so nothing below it prints or exits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Exit codes the commands promise (documented in the README).
EXIT_OK = 0
EXIT_FAILED = 1  # the work ran and failed (a task failed, a benchmark failed)
EXIT_BAD_INPUT = 2  # nothing was changed: the input was wrong or a precondition is missing


@dataclass
class Problem:
    """One thing wrong with an input, located as precisely as we can."""

    message: str
    file: str | None = None
    line: int | None = None
    field: str | None = None
    fix: str | None = None
    severity: str = "error"  # "error" or "warning"
    rule_id: str | None = None

    def render(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        what = f"{self.field}: " if self.field else ""
        rule = f" [{self.rule_id}]" if self.rule_id else ""
        text = f"{self.severity}: {where}{what}{self.message}{rule}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


@dataclass
class ToolkitError(Exception):
    """A failure the user can act on. Rendered without a traceback by the CLI."""

    problems: list[Problem] = field(default_factory=list)
    exit_code: int = EXIT_BAD_INPUT

    @classmethod
    def of(
        cls,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        fix: str | None = None,
        exit_code: int = EXIT_BAD_INPUT,
    ) -> ToolkitError:
        return cls([Problem(message, file=file, line=line, field=field, fix=fix)], exit_code=exit_code)

    def __str__(self) -> str:
        return "\n".join(p.render() for p in self.problems)
