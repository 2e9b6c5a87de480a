"""One node's command in an `ssh` child (transport/openssh.py starts it): where its output is,
its heartbeats sent, its end told apart from the connection's."""
from __future__ import annotations

import os
import signal
import subprocess

from .base import LOST, Exit
from .spool import Spool

ACCEPTED = "Warning: Permanently added"   # the client's words when it accepts a new key
ALIVE_S, ALIVE_COUNT = 2, 3   # a silent link ends the client within ~6 s, as paramiko's keepalive
# ssh's words (INFO lines: the client runs at LogLevel INFO, templates/ssh_client.j2) when the
# host stopped answering its keepalives, and when the host closed the connection itself
NOT_RESPONDING = "not responding"   # "Timeout, server H not responding."
CLOSED = ("closed by remote host", "Connection reset by", "Broken pipe", "Connection closed by")


def lost_detail(said: str) -> str:
    """Why the client lost its host, from its own words: a host that stopped answering its
    keepalives (frozen, or its link is down) is told apart from one that closed the
    connection (its sshd, or the machine, went down): spares.py replaces both, the user
    reads which. Anything else keeps the client's last line."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    if any(NOT_RESPONDING in ln for ln in lines):
        return (f"connection lost: not responding (no answer to ssh keepalives in "
                f"{ALIVE_S * ALIVE_COUNT} s: the machine is frozen, or its link is down)")
    if closed := next((ln for ln in lines if any(w in ln for w in CLOSED)), None):
        return f"connection lost: closed by the host (ssh: {closed})"
    return f"connection lost (ssh: {lines[-1]})" if lines else "connection lost"


class OpenSSHRunning:
    """One node command in an `ssh` child under the relay (base.Running): its spool holds the
    node's masked output, its stderr the relay's lines and the client's own words."""

    def __init__(self, proc: subprocess.Popen, spool: Spool):
        self._proc = proc
        self.spool = spool   # the client's stdout, past the ready and staged lines
        self._in = proc.stdin.fileno()
        os.set_blocking(self._in, False)   # a heartbeat never blocks on a stuck client
        self._cut = False
        self.silent = False   # the host stopped answering keepalives (wait() found): none is tried there

    def ended(self) -> bool:
        """Whether the client has exited (all it wrote is then in the spool)."""
        return self._proc.poll() is not None

    def read_err(self) -> bytes:
        """The client's stderr: under the relay, its lines and the client's own words."""
        try:
            return os.read(self._proc.stderr.fileno(), 2**16)
        except OSError:
            return b""

    def wait(self, said: str | None = None) -> Exit:
        """The node's exit; said: the client's own words where the caller read its stderr."""
        code = self._proc.wait()
        if said is None:
            said = self._proc.stderr.read().decode("utf-8", "replace")
        said = "\n".join(ln for ln in said.strip().splitlines() if not ln.startswith(ACCEPTED))
        if self._cut and code != 0:
            return Exit(LOST, lost=True, detail="session cut by mlaunch")
        # The node's stderr went into its stdout (bootstrap merge_stderr): what is here is the
        # client's own, and exit 255 with it means the client, not the node, ended.
        if code < 0 or (code == 255 and said):
            self.silent = NOT_RESPONDING in said
            return Exit(LOST, lost=True, detail=lost_detail(said))
        return Exit(code)

    def heartbeat(self) -> None:
        try:
            os.write(self._in, b"x")
        except OSError:   # a full pipe (the client is stuck) or a gone client: wait() tells
            pass

    def close(self) -> None:
        self._cut = True
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)   # the session closes; the node's guard ends it
