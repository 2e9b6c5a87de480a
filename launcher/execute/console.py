"""The console's share of node output: a bounded queue that one thread prints from.

Node output is in the node logs first (execute/spliced.py; the Slurm follow's stream.NodeLog)
and only then offered here (execute/follow.py reads it back), so a slow terminal never holds
a node, hence never a teardown. When the queue is over its bound the oldest lines are skipped (the newest keep
flowing) and the console says how far behind it is; at teardown the queue is abandoned and
one line says what was not shown and where it is.
"""
from __future__ import annotations

import collections
import threading
import time

from .stream import Printer

BOUND_BYTES = 8 * 2**20  # node output held for the console; past it the oldest is skipped
BEHIND_EVERY_S = 2.0     # at most one "behind" line per this many seconds
# The console's pace at most: 40,000 lines of 100 bytes a second, more than a terminal shows or
# anyone reads. Under a flood it printed a third of 160 MB and took 45% of the launcher's time
# (bench/results/logpath-device-2026-12-03.txt), time the readers need: the node logs are the
# record. Past this pace the queue's bound skips the oldest, as for a slow terminal.
RATE_BYTES_S = 4 * 2**20
BURST_BYTES = 2**20


class Console:
    """Node lines to the Printer from a thread of its own; offer() never blocks on the terminal."""

    def __init__(self, printer: Printer, log_paths: dict[int, str], bound: int = BOUND_BYTES,
                 rate: float | None = None):
        self.printer, self.log_paths, self.bound = printer, log_paths, bound
        self.rate = rate or RATE_BYTES_S   # read at start: bench/logflood.py --unpaced sets it
        self._tokens, self._filled_at = float(BURST_BYTES), time.monotonic()
        self._queue: collections.deque[tuple[int, str, str, int]] = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._skipped = [0, 0]       # lines, bytes skipped since the last "behind" line
        self._skipped_ranks: set[int] = set()
        self._unshown = [0, 0]       # lines, bytes never shown once abandoned
        self._unshown_ranks: set[int] = set()
        self._abandoned = self._closed = False
        self._bytes_only = False     # a tally holds output whose lines were never counted
        self._said_at = 0.0
        self._thread = threading.Thread(target=self._print_loop, daemon=True)
        self._thread.start()

    def offer(self, rank: int, host: str, text: str) -> None:
        """Queue a masked text of whole lines (stream.LineSplitter.feed_text) for the console;
        the oldest queued texts go if the bound is passed."""
        size = len(text)
        with self._cond:
            if self._abandoned:
                self._count(self._unshown, self._unshown_ranks, rank, text.count("\n"), size)
                return
            was_empty = not self._queue
            self._queue.append((rank, host, text, size))
            self._bytes += size
            while self._bytes > self.bound and len(self._queue) > 1:
                r, _, old, n = self._queue.popleft()
                self._bytes -= n
                self._count(self._skipped, self._skipped_ranks, r, old.count("\n"), n)
            if was_empty:   # only an idle console waits for a text; a pacing one wakes by itself
                self._cond.notify()

    @property
    def abandoned(self) -> bool:
        """Teardown began: node output is no longer shown."""
        return self._abandoned

    def skipped(self, rank: int, size: int) -> None:
        """size bytes of node rank's log that the console skipped, unread (execute/follow.py)."""
        with self._cond:
            self._bytes_only = True
            self._count(self._skipped, self._skipped_ranks, rank, 1, size)

    def unshown(self, rank: int, size: int) -> None:
        """size bytes of node rank's log never shown, unread (execute/follow.py)."""
        with self._cond:
            self._bytes_only = True
            self._count(self._unshown, self._unshown_ranks, rank, 1, size)

    def abandon(self) -> None:
        """Stop showing node output (teardown): what is queued and what comes later is only
        in the node logs; close() says so in one line."""
        with self._cond:
            if self._abandoned:
                return
            self._abandoned = True
            for r, _, text, n in self._queue:
                self._count(self._unshown, self._unshown_ranks, r, text.count("\n"), n)
            self._count(self._unshown, self._unshown_ranks, None, *self._skipped)
            self._unshown_ranks |= self._skipped_ranks
            self._queue.clear()
            self._bytes = 0
            self._cond.notify()

    def close(self, wait_s: float = 5.0, more: str = "") -> None:
        """Print what is queued (not past wait_s), then the one 'not shown' line if any
        (more: said at its end, e.g. where output the nodes never sent is)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(wait_s)
        self.abandon()  # whatever the thread could not print in time is not shown
        lines, size = self._unshown
        if lines:
            paths = ", ".join(self.log_paths[r] for r in sorted(self._unshown_ranks))
            self.printer.say(f"console: {self._amount(lines, size)} of node output not shown "
                             f"here; every line is in {paths}{more}")

    def _count(self, tally: list[int], ranks: set[int], rank: int | None, lines: int, size: int) -> None:
        tally[0] += lines
        tally[1] += size
        if rank is not None and lines:
            ranks.add(rank)

    def _print_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed and not self._abandoned:
                    self._cond.wait()
                self._pace()
                if self._abandoned or not self._queue:
                    return
                rank, host, text, size = self._queue.popleft()
                self._tokens -= size
                self._bytes -= size
                behind = self._behind_line()
            if behind:
                self.printer.say(behind)
            self.printer.node_text(rank, host, text, masked=True)

    def _pace(self) -> None:
        # Called under the lock: waits (lock released, woken by close or abandon) until the
        # queue's first text is within the pace. Once closing, the rest goes out at once.
        while self._queue and not self._closed and not self._abandoned:
            now = time.monotonic()
            self._tokens = min(BURST_BYTES, self._tokens + (now - self._filled_at) * self.rate)
            self._filled_at = now
            need = min(self._queue[0][3], BURST_BYTES) - self._tokens
            if need <= 0:
                return
            self._cond.wait(need / self.rate)

    def _behind_line(self) -> str | None:
        # Called under the lock: one line now and then, never one per skipped batch.
        lines, size = self._skipped
        now = time.monotonic()
        if not lines or now - self._said_at < BEHIND_EVERY_S:
            return None
        self._said_at = now
        paths = ", ".join(self.log_paths[r] for r in sorted(self._skipped_ranks))
        self._skipped, self._skipped_ranks = [0, 0], set()
        return (f"console behind: skipped {self._amount(lines, size)} to keep up, showing the "
                f"newest; every line is in {paths}")

    def _amount(self, lines: int, size: int) -> str:
        # Output skipped unread (a followed log) has bytes but no line count.
        if self._bytes_only:
            return _mb(size)
        return f"{lines} line{'' if lines == 1 else 's'} ({_mb(size)})"


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MB"
