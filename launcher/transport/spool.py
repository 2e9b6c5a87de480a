"""A node session's output as its `ssh` client (or local process) writes it: into a regular
file, not a pipe, so that the writer never meets a full pipe nor waits for the launcher
(bench/results/logpath-*). The file is unlinked at once (nothing is left behind whatever ends
the launcher), and what was taken is punched out of it as it goes: it holds about the
launcher's backlog, in TMPDIR. Readers poll it, at most every POLL_MAX_S."""
from __future__ import annotations

import errno
import functools
import os
import subprocess
import tempfile
import time

from ..errors import UserError

READ = 2**20          # bytes per read or move at most
# Between polls of an idle spool: doubled while it stays idle, POLL_MIN_S to POLL_MAX_S. After
# bytes came, GATHER_S: a flood gathers meanwhile and moves in a few large pieces.
POLL_MIN_S, POLL_MAX_S, GATHER_S = 0.001, 0.05, 0.02
PUNCH_EVERY = 2**23   # punch out what was taken once this much has gathered


class Spool:
    """One session's output file: what was taken so far (at), and the next bytes."""

    def __init__(self, directory: str):
        try:
            fd, path = tempfile.mkstemp(dir=directory, prefix="out-")
        except OSError as e:   # a full or read-only TMPDIR: one line, nothing started
            raise UserError(f"cannot make a node's output spool in {directory}: {e.strerror}; "
                            "free space there or set TMPDIR to a directory with room") from None
        os.unlink(path)
        self.fd, self.at = fd, 0
        self._punched, self._can_punch, self._sendfile, self._idle = 0, True, True, POLL_MIN_S

    def take(self, size: int = READ) -> bytes:
        """The next bytes written (up to size; b"" where none are there yet)."""
        data = os.pread(self.fd, size, self.at)
        self.at += len(data)
        self._trim()
        return data

    def give_back(self, size: int) -> None:
        """The last size bytes taken are taken again next time (read past a line looked for)."""
        self.at -= size

    def move_to(self, fd: int) -> int:
        """Copy the next bytes into fd (in the kernel: no copy through Python, where the file
        systems allow sendfile(2)); how many."""
        if self._sendfile:
            try:
                moved = os.sendfile(fd, self.fd, self.at, READ)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                self._sendfile = False
                return self.move_to(fd)
        else:
            moved = os.write(fd, os.pread(self.fd, READ, self.at))
        self.at += moved
        self._trim()
        return moved

    def pause(self, got: bool, most: float = POLL_MAX_S) -> None:
        """Sleep before the next poll: GATHER_S after bytes came, else twice as long as the
        last idle poll (at most `most`)."""
        if got:
            self._idle = POLL_MIN_S
            time.sleep(GATHER_S)
            return
        time.sleep(self._idle)
        self._idle = min(most, self._idle * 2)

    def read(self, proc: subprocess.Popen, deadline: float | None = None, most: float = POLL_MAX_S) -> bytes:
        """The next bytes, waiting for them (polled at most `most` apart) while proc runs and
        until deadline (time.monotonic()); b"" once proc has ended and all it wrote was
        taken, or at the deadline."""
        while True:
            ended = proc.poll() is not None   # before the read: what it wrote is there
            data = self.take()
            if data or ended or (deadline is not None and time.monotonic() >= deadline):
                self._idle = POLL_MIN_S
                return data
            self.pause(False, most)

    def _trim(self) -> None:
        if not self._can_punch or self.at - self._punched < PUNCH_EVERY:
            return
        end = self.at & ~4095
        try:
            _punch(self.fd, self._punched, end - self._punched)
            self._punched = end
        except OSError as e:   # a file system without holes: the spool keeps what was taken
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            self._can_punch = False

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


def _punch(fd: int, offset: int, length: int) -> None:
    """fallocate(2) PUNCH_HOLE|KEEP_SIZE: the range's blocks are freed, the size stays."""
    import ctypes
    if _fallocate()(fd, 0x02 | 0x01, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@functools.cache
def _fallocate():
    import ctypes
    call = ctypes.CDLL(None, use_errno=True).fallocate
    call.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
    return call
