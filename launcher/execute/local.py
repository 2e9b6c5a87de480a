"""Local executor: every host is this machine, so node commands are plain subprocesses."""
from __future__ import annotations

import os
import subprocess

from .. import render
from ..record import fsmode
from ..errors import Problem
from ..plan.launch_plan import LaunchPlan, NodePlan
from .base import Exit, make_run_dirs


class LocalRunning:
    """A node command running as a local process group of its own."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    def read(self) -> bytes:
        return os.read(self._proc.stdout.fileno(), 65536)

    def wait(self) -> Exit:
        code = self._proc.wait()
        self._proc.stdout.close()
        self._hang_up()
        # A signal death shows as -N; report it the way a shell would (128 + N).
        return Exit(128 - code if code < 0 else code)

    def heartbeat(self) -> None:
        try:
            self._proc.stdin.write(b"x")
            self._proc.stdin.flush()
        except (OSError, ValueError):  # already exited or hung up
            pass

    def close(self) -> None:
        self._hang_up()

    def _hang_up(self) -> None:
        # Closing the node's stdin is what a lost launcher looks like: its hang-up guard
        # then ends whatever of the node is still running.
        if self._proc.stdin and not self._proc.stdin.closed:
            self._proc.stdin.close()


class LocalExecutor:
    """Runs node scripts with /bin/sh on this machine; no SSH involved."""

    def connect(self) -> list[Problem]:
        return []

    def stage(self, plan: LaunchPlan) -> None:
        # This machine's shell, also in a subclass whose run() reaches other nodes (srun).
        make_run_dirs(lambda host, script, t: LocalExecutor.run(self, host, script, t), "localhost", plan)
        for f in plan.files:
            fsmode.write_private(f.path, f.content)

    def start(self, node: NodePlan) -> LocalRunning:
        # The script goes over stdin, never argv (render.bootstrap): it holds the secrets.
        proc = subprocess.Popen(["/bin/sh", "-c", render.bootstrap()], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.stdin.write(render.framed(node.script))
            proc.stdin.flush()
        except OSError:  # the shell died at once; wait() reports how
            pass
        return LocalRunning(proc)

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        try:
            done = subprocess.run(["/bin/sh", "-c", render.bootstrap()], capture_output=True,
                                  timeout=timeout, input=render.framed(script))
        except subprocess.TimeoutExpired as e:
            return 124, (e.stdout or b"").decode("utf-8", "replace")
        return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")

    def close(self) -> None:
        pass
