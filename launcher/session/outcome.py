"""What a run of a plan came to: each node's outcome and the job's one exit status."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..transport.base import Exit

SIGINT_EXIT = 130    # the job's status after Ctrl-C (128 + SIGINT)
TIMEOUT_EXIT = 124   # ... after its time limit, as timeout(1) exits


@dataclass
class NodeOutcome:
    """What became of one node."""

    rank: int
    host: str
    exit: Exit | None = None
    terminated: bool = False     # it was still running when mlaunch tore the job down
    tail: list[str] = field(default_factory=list)
    ended_by: str = "mlaunch"    # who ended a terminated node (a scheduler's own kill: srun's)

    @property
    def result(self) -> str:
        if self.exit is None:
            return "not started"
        # mlaunch decided this node's end: a session that closed before its exit status came
        # through (a loaded host, a cut session) does not make it a failure of its own.
        if self.terminated and self.exit.lost:
            return f"terminated by {self.ended_by} ({self.exit.detail or 'connection lost'} before its exit status)"
        if self.exit.lost:
            return self.exit.detail or "connection lost"
        if self.terminated:
            return f"terminated by {self.ended_by} (exit {self.exit.code})"
        return f"exit {self.exit.code}"


@dataclass
class JobResult:
    """The job's single exit status and every node's outcome."""

    code: int
    nodes: list[NodeOutcome]
    interrupted: bool = False
    timed_out: bool = False
    first_failure: int | None = None
    teardown: dict[str, str] = field(default_factory=dict)
    failed_at: float | None = None      # monotonic time the first failure was seen
    torn_down_at: float | None = None   # monotonic time teardown finished on every host
    health: object | None = None        # the health verdict that stopped the job, if any
    never_starts: str | None = None     # the scheduler's reason the job can never start
    hardware: dict = field(default_factory=dict)   # node -> (hwcause line, device?): watch.py
    last_step: int | None = None        # the last training step the nodes' lines told of

    @property
    def restartable(self) -> bool:
        """A restart may help: not a NaN or a wrong world, which would only happen again."""
        if self.never_starts:
            return False
        return self.health is None or bool(getattr(self.health, "restartable", False))
