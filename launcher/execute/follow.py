"""The console's share of node output (execute/spliced.py): the node logs, read back at the
console's pace, never more. A node that writes faster than the console shows is
skipped ahead to its newest lines, and the console says by how much; the logs hold every line.
"""
from __future__ import annotations

import threading

from .console import Console
from .tail import FileTail

TICK_S = 0.05       # how often the logs are looked at
MIN_READ = 2**14    # bytes per node per look at least, however many nodes share the pace
# What the console shows at a run's end of what it had not read yet, in all: the last lines of
# a quiet run, the newest of a flood (a bound on what the run's end waits for: the console's)
FINAL_BYTES = 2**20


class _Followed(FileTail):
    """One node log and how far the console has read it."""

    def __init__(self, rank: int, host: str, path: str):
        super().__init__(path)
        self.rank, self.host = rank, host


class LogFollower:
    """Reads each followed node log from a thread of its own and offers its new whole lines to
    the console, at most the console's pace; stops when the console is abandoned (teardown)."""

    def __init__(self, console: Console):
        self.console = console
        self._logs: dict[int, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, rank: int, host: str, path: str) -> None:
        """Show node rank's log (another thread writes it) from its start."""
        with self._lock:
            self._logs[rank] = _Followed(rank, host, path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True)
                self._thread.start()

    def finish(self) -> None:
        """Stop following: what is left goes to the console (its newest FINAL_BYTES in all)
        unless the console was abandoned; the rest is tallied as not shown."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        logs = list(self._logs.values())
        for f in logs:
            if not self.console.abandoned:
                self._step(f, max(MIN_READ, FINAL_BYTES // max(1, len(logs))), final=True)
            left = f.size() - f.pos
            if left > 0:
                self.console.unshown(f.rank, left)
            f.close()

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S) and not self.console.abandoned:
            with self._lock:
                logs = list(self._logs.values())
            budget = max(MIN_READ, int(self.console.rate * TICK_S) // max(1, len(logs)))
            for f in logs:
                self._step(f, budget)

    def _step(self, f: _Followed, budget: int, final: bool = False) -> None:
        size = f.size()
        if size - f.pos > (budget if final else self.console.bound):   # on to the newest lines
            self.console.skipped(f.rank, size - budget - f.pos)
            f.skip(size - budget)
        if text := f.read(budget):
            self.console.offer(f.rank, f.host, text)
