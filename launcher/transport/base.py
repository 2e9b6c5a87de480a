"""The executor seam: the only code with side effects on nodes sits behind this interface."""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Callable, Protocol

from .. import render
from ..errors import Problem, UserError
from ..plan.launch_plan import LaunchPlan, NodePlan, uses_default_base
from .spool import Spool

LOST = 255            # exit code reported for a node whose connection dropped
HEARTBEAT_S = 5.0     # longest launcher -> node heartbeat period (see heartbeat_period)
TEARDOWN_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
STAGE_TIMEOUT_S = 60  # a host's run directories and files
DROP_LOGS_S = 15   # a host's torchrun log folders removed after an attempt that ended well


def heartbeat_period(hangup_after_s: float) -> float:
    """Seconds between heartbeats: at most a quarter of the node's hang-up wait.

    A guard that waited exactly one period would end a healthy node on the first late
    beat (a loaded launcher, a slow link); with four beats per wait, three can be late.
    """
    return min(HEARTBEAT_S, hangup_after_s / 4)


Run = Callable[[str, str, float], tuple[int, str]]   # an executor's run(host, script, timeout)


def make_run_dirs(run: Run, host: str, plan: LaunchPlan) -> None:
    """The run dir and its parent on host, 0700 and this user's (templates/private_dirs.sh.j2);
    UserError with the node's one line when another user owns one of them."""
    _setup(run, host, render.private_dirs_script(plan.run_dir, uses_default_base(plan.job)), 30)


def stage_files(run: Run, host: str, plan: LaunchPlan) -> None:
    """make_run_dirs, then the plan's files written 0600 into the run dir, in one script on
    host; UserError with the node's one line when a directory or a file cannot be made."""
    _setup(run, host, stage_text(plan), STAGE_TIMEOUT_S)


def stage_text(plan: LaunchPlan) -> str:
    """The script that makes the run's directories and writes the plan's files on a node."""
    files = [(posixpath.join(plan.run_dir, posixpath.basename(f.path)), f.content) for f in plan.files]
    return render.stage_script(plan.run_dir, uses_default_base(plan.job), files)


def setup_failed(host: str, words: str) -> Problem:
    """The one line for a host whose setup script failed, from its last words."""
    return Problem(host, f"{words.removeprefix('mlaunch: ')}; nothing was started")


def _setup(run: Run, host: str, script: str, timeout: float) -> None:
    code, out = run(host, script, timeout)
    if code != 0:
        lines = [ln for ln in out.splitlines() if ln.strip()] or [f"exit {code}"]
        raise UserError([setup_failed(host, lines[-1])])


@dataclass
class Exit:
    """How one node's command ended."""

    code: int
    lost: bool = False    # the connection dropped: the code is unknown
    detail: str = ""


class Running(Protocol):
    """One started node command, under nodeprog/relay.py: its masked output goes into its
    spool (transport/spool.py), moved from there into the node log unread; its stderr holds
    the relay's lines (session/nodeoutput.py)."""

    spool: Spool

    def ended(self) -> bool:
        """Whether the session has ended (all it wrote is then in the spool)."""

    def read_err(self) -> bytes:
        """Next chunk of the session's stderr; b"" at its end. Blocks."""

    def wait(self, said: str | None = None) -> Exit:
        """Block until the command has ended (call after read_err() returned b""); said: what
        the session's stderr held besides the relay's lines."""

    def heartbeat(self) -> None:
        """Tell the node's hang-up guard that the launcher is still there."""

    def close(self) -> None:
        """Drop the session: the node's hang-up guard then ends the node."""


class Executor(Protocol):
    """Connect to every host, place files, start node commands, tear a run down."""

    def connect(self) -> list[Problem]:
        """Open every host in parallel; the problems of all hosts that failed."""

    def stage(self, plan: LaunchPlan) -> None:
        """Write the plan's files where every node reads them."""

    def start(self, node: NodePlan) -> Running:
        """Start one node's script."""

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        """Run a short shell script on host; (exit code, output)."""

    def drop_logs(self, dirs: dict[str, list[str]]) -> None:
        """Remove these torchrun log folders ({host: folders}) after an attempt that ended well,
        as far as the hosts can still be reached; nothing is said where one could not."""

    def close(self) -> None:
        """Release every connection."""


def drop_logs_by_run(run: Run, dirs: dict[str, list[str]]) -> None:
    """drop_logs() through run(): every host at once, none waited for longer than a few seconds."""
    from concurrent.futures import ThreadPoolExecutor
    if not dirs:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(dirs))) as pool:
        list(pool.map(lambda h: run(h, render.drop_logs_script(dirs[h]), DROP_LOGS_S), dirs))


Starter = Callable[[NodePlan], Running]
