"""Local executor: every host is this machine, so node commands are plain subprocesses, each
under nodeprog/relay.py as an SSH node's session is (one log path: session/nodeoutput.py)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile

from .. import nodeprog, render
from ..record import fsmode
from ..errors import Problem
from ..plan.launch_plan import LaunchPlan, NodePlan
from .base import Exit, drop_logs_by_run, make_run_dirs
from .spool import Spool
from .relay import relay_config


class LocalRunning:
    """A node command under the relay, in a process group of its own (base.Running): the
    relay's output in a spool, its lines on stderr."""

    def __init__(self, proc: subprocess.Popen, spool: Spool):
        self._proc, self.spool = proc, spool

    def ended(self) -> bool:
        return self._proc.poll() is not None

    def read_err(self) -> bytes:
        try:
            return os.read(self._proc.stderr.fileno(), 65536)
        except OSError:
            return b""

    def wait(self, said: str | None = None) -> Exit:
        code = self._proc.wait()
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
        """The session cut (session/attempt.py's settle, fanout's end): stdin hung up, and the
        relay ended if it still runs. A process that outlived the teardown and still holds the
        command's output would otherwise keep the relay, and the attempt, waiting for ever
        (an ssh session's cut ends its client: OpenSSHRunning.close)."""
        self._hang_up()
        if self._proc.poll() is None:
            self._proc.terminate()

    def _hang_up(self) -> None:
        # Closing the node's stdin is what a lost launcher looks like: its hang-up guard
        # then ends whatever of the node is still running.
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except OSError:
                pass


def start_relayed(argv: list[str], head: bytes, data: bytes, env: dict | None = None) -> LocalRunning:
    """argv under the relay on this machine's interpreter: head (the relay's config frame),
    then data, go on its stdin ahead of the heartbeats. env: argv's environment (None: this one)."""
    spool = Spool(tempfile.gettempdir())
    proc = subprocess.Popen([sys.executable, "-S", "-c", _relay(), *argv], stdin=subprocess.PIPE,
                            stdout=spool.fd, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        proc.stdin.write(head + data)
        proc.stdin.flush()
    except OSError:  # the relay died at once; wait() reports how
        pass
    return LocalRunning(proc, spool)


@functools.cache
def _relay() -> str:
    return nodeprog.source("relay")


class LocalExecutor:
    """Runs node scripts with /bin/sh on this machine; no SSH involved."""

    _relay_head = b""   # the relay's config frame (stage())

    def connect(self) -> list[Problem]:
        return []

    def stage(self, plan: LaunchPlan) -> None:
        # This machine's shell, also in a subclass whose run() reaches other nodes (srun).
        make_run_dirs(lambda host, script, t: LocalExecutor.run(self, host, script, t), "localhost", plan)
        for f in plan.files:
            fsmode.write_private(f.path, f.content)
        self._relay_head = render.relay_frame(relay_config(plan))

    def start(self, node: NodePlan) -> LocalRunning:
        # The script goes over stdin, never argv (render.bootstrap): it holds the secrets.
        return start_relayed(["/bin/sh", "-c", render.bootstrap(merge_stderr=True)],
                             self.relay_head(), render.framed(node.script))

    def relay_head(self) -> bytes:
        """The relay's config frame: the staged plan's, else one that masks and copies nothing."""
        return self._relay_head or render.relay_frame({})

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        try:
            done = subprocess.run(["/bin/sh", "-c", render.bootstrap()], capture_output=True,
                                  timeout=timeout, input=render.framed(script))
        except subprocess.TimeoutExpired as e:
            return 124, (e.stdout or b"").decode("utf-8", "replace")
        return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")

    def drop_logs(self, dirs: dict[str, list[str]]) -> None:
        drop_logs_by_run(self.run, dirs)

    def close(self) -> None:
        pass
