"""The Ray actor that stands for one node of a run on its bundle: it starts the node's
session (the node relay, launcher/nodeprog/relay.py, on Ray's own interpreter) as a
subprocess of its own and relays its stdin, stdout and stderr to mlaunch by method calls,
as an SSH connection carries a host's session. It also runs short scripts (staging,
teardown, preflight, output_dir helpers) on its node.

Ray ships this module to the nodes by value (the nodes need not have mlaunch installed), so
it imports the standard library only. When the actor dies (stop, a lost driver, a node
taken away) its end of the session's stdin closes with it, and the node's hang-up guard ends
the node's processes, as when an SSH session drops.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

READ = 2**16          # bytes per read of a session's pipes
TAKE_MAX = 2**22      # bytes returned by one take() at most


class _Session:
    """One started command: its pipes drained by threads into buffers take() empties."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.out, self.err = bytearray(), bytearray()
        self.cond = threading.Condition()
        self.open = 2   # pipes not yet at their end
        for pipe, buf in ((proc.stdout, self.out), (proc.stderr, self.err)):
            threading.Thread(target=self._drain, args=(pipe, buf), daemon=True).start()

    def _drain(self, pipe, buf: bytearray) -> None:
        while True:
            try:
                data = os.read(pipe.fileno(), READ)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.open -= 1
                    self.cond.notify_all()
                    return
                buf.extend(data)
                self.cond.notify_all()

    def take(self, wait_s: float):
        """(stdout bytes, stderr bytes, exit code or None): what came, waiting up to wait_s
        for something; the code only once both pipes ended and all they held was taken."""
        end = time.monotonic() + wait_s
        with self.cond:
            while not self.out and not self.err and self.open:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            out, err = bytes(self.out[:TAKE_MAX]), bytes(self.err[:TAKE_MAX])
            del self.out[:len(out)]
            del self.err[:len(err)]
            done = not self.open and not self.out and not self.err
        code = None
        if done:
            code = self.proc.wait()
            code = 128 - code if code < 0 else code
            self.hang_up()
        return out, err, code

    def hang_up(self) -> None:
        """Close the session's stdin, as sshd does once the command ended: the node's
        hang-up guard then ends what is left of it now, not when this actor is killed."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass


class NodeAgent:
    """One node of a run (one bundle of its placement group)."""

    def __init__(self):
        self._sessions: dict[str, _Session] = {}

    def where(self) -> tuple[str, str]:
        """(this node's IP as Ray knows it, its hostname)."""
        import ray   # present wherever this actor runs
        return ray.util.get_node_ip_address(), socket.gethostname()

    def start(self, key: str, argv: list[str], data: bytes, env: dict) -> int:
        """Start argv (in a session of its own, in the home directory as an SSH login is)
        with data first on its stdin; its pid."""
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                env=_env(env), cwd=os.path.expanduser("~"))
        self._sessions[key] = _Session(proc)
        self.write(key, data)
        return proc.pid

    def take(self, key: str, wait_s: float = 1.0):
        return self._sessions[key].take(wait_s)

    def write(self, key: str, data: bytes) -> bool:
        """data onto the session's stdin (a heartbeat, the script); False once it is closed."""
        proc = self._sessions[key].proc
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def hang_up(self, key: str) -> None:
        """Close the session's stdin: its hang-up guard ends what is left of the node."""
        self._sessions[key].hang_up()

    def run(self, argv: list[str], data: bytes, timeout: float, env: dict) -> tuple[int, str]:
        """A short command with data on its stdin: (exit code, its output)."""
        try:
            done = subprocess.run(argv, input=data, capture_output=True, timeout=timeout,
                                  env=_env(env), cwd=os.path.expanduser("~"))
        except subprocess.TimeoutExpired as e:
            return 124, (e.stdout or b"").decode("utf-8", "replace")
        return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")

    def python(self) -> str:
        """The interpreter this actor runs on (the relay runs on it)."""
        return sys.executable


def _env(extra: dict) -> dict:
    """The node's environment: the Ray worker's, without Ray's own settings for its workers
    (RAY_*), which mean nothing to the node's processes, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(extra)
    return env


def run_on_node(argv: list[str], data: bytes, timeout: float) -> tuple[str, int, str]:
    """A task's body for `stop`: (this node's IP, exit code, output) of a short script."""
    import ray
    try:
        done = subprocess.run(argv, input=data, capture_output=True, timeout=timeout, env=_env({}))
        code, out = done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        code, out = 124, "timed out"
    return ray.util.get_node_ip_address(), code, out


