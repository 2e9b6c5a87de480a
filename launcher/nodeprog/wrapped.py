# mlaunch node program part (relay): the command a stream program wraps, and its end.
# The command runs as a child in a session of its own (as it would under sshd: its pid is its
# process group, which teardown signals), stdin inherited, stdout and stderr into one pipe;
# the wrapping program, outside that group and without the run's environment, is never a
# teardown's target. Standard library only.
import os
import sys

try:   # the C module: `signal` imports enum, CPU on every node session
    import _signal as signal
except ImportError:
    import signal


class Child:
    """The spawned command: its output's read end (fd) and its end (wait())."""

    def __init__(self, pid, fd):
        self.pid, self.fd, self.code = pid, fd, None

    def poll(self):
        """Its exit code once it has ended (then reaped), else None."""
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self):
        """Its exit code, or minus the signal that ended it (as subprocess says it)."""
        if self.code is None:
            self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.code


def spawn(argv):
    """The command, started with its stdout and stderr into one pipe (read it from .fd).
    posix_spawn: a node starts one per session, and importing subprocess there would cost
    more CPU than the spawn. Signals Python ignores (SIGPIPE) are the command's default again."""
    if not hasattr(os, "waitstatus_to_exitcode"):   # Python < 3.9
        return _spawn_subprocess(argv)
    r, w = os.pipe()   # both close on exec: the command has only its 1 and 2 made of w
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ, setsid=True,
                              file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)],
                              setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except NotImplementedError:   # a Python built on a C library without POSIX_SPAWN_SETSID (< 2.26)
        os.close(r)
        return _spawn_subprocess(argv)
    finally:
        os.close(w)
    return Child(pid, r)


def _spawn_subprocess(argv):
    import subprocess
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    child = Child(proc.pid, proc.stdout.fileno())
    child.wait, child.poll = proc.wait, proc.poll
    return child


def send(fd, data):
    """Write all of data to fd; on a closed session, leave at once: the command then meets
    the closed pipe on its next write, as it would without the wrapping program."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            os._exit(141)


def end_as(child):
    """Wait for the command and end as it did: its code, or its signal (for sshd to report
    it as such)."""
    code = child.wait()
    if code < 0:
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):   # SIGKILL and SIGSTOP have no handler to reset
            pass
        os.kill(os.getpid(), -code)
    sys.exit(code)
