# mlaunch node program part (zpipe, relay): the command a stream program wraps, and its end.
# The command runs as a child in a session of its own (as it would under sshd: its pid is its
# process group, which teardown signals), stdin inherited, stdout and stderr into one pipe;
# the wrapping program, outside that group and without the run's environment, is never a
# teardown's target. Standard library only.
import os
import signal
import subprocess
import sys


def spawn(argv):
    """The command, started; read its output from .stdout."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


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
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)
