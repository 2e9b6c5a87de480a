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


# A 10,000-line hostfile of bad lines would otherwise print 10,000 lines.
MAX_SHOWN = 20


class UserError(Exception):
    """Bad input or an unmet precondition. The CLI prints the lines and exits 2."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | str, *, header: str | None = None):
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems = list(problems)
        self.header = header
        super().__init__("\n".join(self.lines()))

    def lines(self, limit: int | None = MAX_SHOWN) -> list[str]:
        """The header and one line per problem: the first `limit`, then how many more."""
        out = [self.header] if self.header else []
        shown = self.problems if limit is None else self.problems[:limit]
        out += [str(p) for p in shown]
        if len(self.problems) > len(shown):
            out.append(f"… and {len(self.problems) - len(shown)} more problems "
                       f"({len(self.problems)} in all)")
        return out


class SpecError(UserError):
    """The job spec does not validate."""
