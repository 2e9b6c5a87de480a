"""The backend seam, after torchx's scheduler interface.

    dryrun(plan)      -> Request   what `submit --dry-run` prints; touches nothing
    submit(request)   -> handle    start the run detached: the handle goes into the registry
    run(request)      -> exit code start it in the foreground and stream until it ends
    describe(run)     -> Status    the run's state now (may find it lost)
    logs(run, node)   -> path      one node's log file of one attempt
    cancel(run)       -> Cancel    end every process of the run, wherever it is

Today's backend is `ssh` (with `local` when every host is this machine): mlaunch itself,
or its detached supervisor, drives the nodes. A scheduler backend (Slurm: sbatch, squeue,
scancel) implements the same five calls with the scheduler's job id as its handle.
This module is standard library only: `mlaunch ps` imports it. It names no backend: the
factory in launcher/launch/backends.py picks one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Request:
    """A run ready to submit: the plan and its printable form."""

    backend: str
    plan: Any          # launcher.plan.launch_plan.LaunchPlan
    text: str          # exactly what --dry-run prints


@dataclass(frozen=True)
class Status:
    """What describe() found."""

    state: str                 # one of registry.STATES
    exit_code: int | None = None
    detail: str = ""


@dataclass
class Cancel:
    """What cancel() did: processes left per host (all 0 is success) and any problems."""

    left: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    how: str = ""

    @property
    def clean(self) -> bool:
        return not self.problems and not any(self.left.values())


class Backend(Protocol):
    """One way of running a plan's nodes."""

    name: str

    def dryrun(self, plan: Any, full: bool = False) -> Request:
        """The request that submit would send; nothing is contacted."""

    def submit(self, request: Request, opts: Any, job: Any) -> int:
        """Start the run detached; return 0 once it is handed over (its handle is registered)."""

    def run(self, request: Request, opts: Any, job: Any) -> int:
        """Run in the foreground until the end; the run's exit code."""

    def describe(self, run: Any) -> Status:
        """The state of a registered run (registry.Run) now."""

    def logs(self, run: Any, node: int, attempt: int | None = None) -> str:
        """Path of node's log file for attempt (default: the latest)."""

    def cancel(self, run: Any, force: bool = False) -> Cancel:
        """Stop the run: the same scoped teardown as Ctrl-C; force kills at once."""
