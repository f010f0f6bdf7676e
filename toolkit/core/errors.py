"""The toolkit's own errors: every failure a user can fix names where it is and what to do.

Adapters translate their library's exceptions into these; only the CLI edge turns them into
text and exit codes, so nothing below it prints or exits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.core.text import printable, redact, safe, shorten

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

    def __post_init__(self) -> None:
        # Redacted where it is made, so no output of it (text, --json, a report, a log) carries a credential.
        # Shortened too: a message quotes input, which may be a file's worth.
        self.message = shorten(redact(self.message))
        if self.fix is not None:
            self.fix = shorten(redact(self.fix))

    def render(self) -> str:
        """One problem as lines of text. Everything in it may come from input (a file name, a value): it is
        redacted and escaped, and a line break of the message is indented, so no input draws a line of its own
        (a forged `ok` or `fix:` line) or drives the terminal."""
        where = ""
        if self.file:
            where = printable(redact(self.file)) + (f":{self.line}" if self.line else "") + ": "
        what = f"{printable(redact(self.field))}: " if self.field else ""
        rule = f" [{printable(self.rule_id)}]" if self.rule_id else ""
        message = safe(self.message, keep_newlines=True).replace("\n", "\n    ")
        text = f"{self.severity}: {where}{what}{message}{rule}"
        if self.fix:
            text += "\n  fix: " + safe(self.fix, keep_newlines=True).replace("\n", "\n    ")
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
