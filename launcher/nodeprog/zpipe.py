"""Compresses a node's output for the trip to the launcher (python3 -c, argv: the command).

The command runs as a child in a session of its own (as it would under sshd: its pid is
its process group, which teardown signals), stdin inherited (the hang-up guard's heartbeat),
stdout and stderr into one pipe. This process, outside that group and without the run's
environment, is never a teardown's target: it forwards what the command wrote until every
writer has closed the pipe. Each read is compressed and sync-flushed at once, so a line
is never held back; the launcher (execute/inflow.py) inflates behind the MAGIC header,
and reads output without it as it is. The exit is the command's: its code, or its signal.
"""
import os
import signal
import subprocess
import sys
import zlib

MAGIC = b"\x1bmlaunch-zlib-1\n"
READ = 1 << 18


def send(data):
    """Write all of data to stdout; on a closed session, leave at once: the command then
    meets the closed pipe on its next write, as it would without this program."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(1, view):]
        except OSError:
            os._exit(141)


def main():
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    fd, z = child.stdout.fileno(), zlib.compressobj(1)
    send(MAGIC)
    while True:
        data = os.read(fd, READ)
        if not data:
            break
        send(z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH))
    send(z.flush())
    code = child.wait()
    if code < 0:   # killed by a signal: end the same way, for sshd to report it as such
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
