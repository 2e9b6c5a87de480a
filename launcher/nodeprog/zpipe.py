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
import sys
import zlib

from .wrapped import end_as, send, spawn

MAGIC = b"\x1bmlaunch-zlib-1\n"
READ = 1 << 18


def main():
    child = spawn(sys.argv[1:])
    fd, z = child.fd, zlib.compressobj(1)
    send(1, MAGIC)
    while True:
        data = os.read(fd, READ)
        if not data:
            break
        send(1, z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH))
    send(1, z.flush())
    end_as(child)


if __name__ == "__main__":
    main()
