"""Reading a log file that another process is still writing: its new whole lines, from where
the reader left off. One object for every reader of node output: the console's follower
(logs/console.py), `mlaunch logs -f` and `attach` (cli/logview.py), and a scheduler job's
per-node files (its follow in launcher/backends). log_iter is modelled on torchx's: a generator of
lines from files that may still grow, until a predicate says to stop.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterator

from .stream import LineSplitter


class FileTail:
    """One file read as it grows. A file not there yet reads as empty; one removed and made
    again at its path (its writer's reopen) is read again from its start. reopen: opened for
    each read, so that a file on shared storage (NFS: close-to-open) shows its newest bytes."""

    def __init__(self, path: str, reopen: bool = False):
        self.path, self.fd, self.pos, self.reopen = path, -1, 0, reopen
        self.splitter = LineSplitter()
        self._cut = False   # skipped ahead: the first bytes read may be a part of a line

    def size(self) -> int:
        """The file's size now (pos while it cannot be opened)."""
        try:
            if self.fd >= 0 and os.fstat(self.fd).st_nlink == 0:   # removed; its writer makes it again
                self.close()
                self.pos, self._cut, self.splitter = 0, False, LineSplitter()
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_RDONLY)
            return os.fstat(self.fd).st_size
        except OSError:
            return self.pos

    def read(self, most: int | None = None) -> str:
        """The whole lines that the next bytes (at most `most`) complete, as one text."""
        size = self.size()
        if size <= self.pos or self.fd < 0:
            return ""
        try:
            data = os.pread(self.fd, size - self.pos if most is None else min(most, size - self.pos), self.pos)
        except OSError:
            return ""
        finally:
            if self.reopen:
                self.close()
        self.pos += len(data)
        if self._cut:   # the part of a line before the first whole one goes with the skipped
            start = data.find(b"\n") + 1
            if not start:
                return ""
            data, self._cut = data[start:], False
        return self.splitter.feed_text(data)

    def skip(self, to: int) -> None:
        """Go on from byte `to`, past what was not read."""
        self.pos, self._cut, self.splitter = to, True, LineSplitter()

    def flush(self) -> str:
        """The rest of the file, its last line whether or not it ends."""
        return self.read() + self.splitter.flush_text()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def log_iter(files: Callable[[], list[FileTail]], should_stop: Callable[[], bool],
             poll_s: float) -> Iterator[tuple[FileTail, str]]:
    """(file, text of its new whole lines) as the files grow, polled every poll_s, until
    should_stop() is true; then what is left of each, its last lines whole or not. files()
    is asked each round: a follower may move on to other files."""
    while True:
        stop = should_stop()   # before the reads: all written before it is read
        for tail in files():
            if text := tail.flush() if stop else tail.read():
                yield tail, text
        if stop:
            return
        time.sleep(poll_s)
