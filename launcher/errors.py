"""User-facing errors: each carries one line per problem and maps to exit code 2."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input: where, what was given, how to fix it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class UserError(Exception):
    """Bad input or an unmet precondition. The CLI prints the lines and exits 2."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | str, *, header: str | None = None):
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems = list(problems)
        self.header = header
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        out = [self.header] if self.header else []
        return out + [str(p) for p in self.problems]


class SpecError(UserError):
    """The job spec does not validate."""
