"""The console's share of node output: the node logs, read back at the console's pace, never
more, by one thread that prints what it read.

Node output is in the node logs first (session/nodeoutput.py), so a slow terminal never holds a
node, hence never a teardown: it only holds this thread, which then finds a log further ahead
and skips to its newest lines, saying by how much; the logs hold every line. At teardown the
console is abandoned, and one line at the end says what was not shown and where it is.
"""
from __future__ import annotations

import threading
import time

from .stream import Printer
from .tail import FileTail
from .torchrun_out import ExitBarrierNoise

BOUND_BYTES = 8 * 2**20  # a node log's unread bytes past which the console skips to its newest
BEHIND_EVERY_S = 2.0     # at most one "behind" line per this many seconds
# The console's pace at most: 40,000 lines of 100 bytes a second, more than a terminal shows or
# anyone reads; under a flood, printing more took the launcher's time from the rest
# (bench/results/logpath-device-*). Past this pace the console skips, as for a slow terminal.
RATE_BYTES_S = 4 * 2**20
TICK_S = 0.05       # how often the logs are looked at
MIN_READ = 2**14    # bytes per node per look at least, however many nodes share the pace
# What the console shows at a run's end of what it had not read yet, in all: the last lines of
# a quiet run, the newest of a flood (a bound on what the run's end waits for)
FINAL_BYTES = 2**20


class _Followed(FileTail):
    """One node log and how far the console has read it."""

    def __init__(self, rank: int, host: str, path: str):
        super().__init__(path)
        self.rank, self.host = rank, host
        self.noise = ExitBarrierNoise()   # torchrun's exit-barrier traceback: one line here


class Console:
    """Follows each node log (follow()) from a thread of its own and prints its new whole
    lines, at most `rate` bytes a second in all; stops when abandoned (teardown) or closed."""

    def __init__(self, printer: Printer, log_paths: dict[int, str], bound: int = BOUND_BYTES,
                 rate: float | None = None):
        self.printer, self.log_paths, self.bound = printer, log_paths, bound
        self.rate = rate or RATE_BYTES_S   # read at start: bench/logflood.py --unpaced sets it
        self._logs: dict[int, _Followed] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._skipped: dict[int, int] = {}   # bytes skipped by rank since the last "behind" line
        self._unshown: dict[int, int] = {}   # bytes never shown by rank
        self._abandoned = False
        self._said_at = 0.0

    def follow(self, rank: int, host: str, path: str) -> None:
        """Show node rank's log (another thread writes it) from its start."""
        with self._lock:
            self._logs[rank] = _Followed(rank, host, path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True)
                self._thread.start()

    def offer(self, rank: int, host: str, text: str) -> None:
        """Print a masked text of whole lines that is in no node log (one that could not be
        written); tallied as not shown once the console is abandoned."""
        if self._abandoned:
            self._tally(self._unshown, rank, len(text))
        else:
            self.printer.node_text(rank, host, text, masked=True)

    def abandon(self) -> None:
        """Stop showing node output (teardown): what comes later is only in the node logs;
        close() says so in one line."""
        with self._lock:
            self._abandoned = True
            for rank, size in self._skipped.items():
                self._tally(self._unshown, rank, size)
            self._skipped.clear()

    def close(self, wait_s: float = 5.0, more: str = "") -> None:
        """Stop following: the newest FINAL_BYTES in all of what is left goes to the console
        unless it was abandoned, then the one 'not shown' line if any (more: said at its end,
        e.g. where output the nodes never sent is)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive():   # a terminal that takes nothing: nothing more is shown
                self.abandon()
        logs = list(self._logs.values())
        for f in logs:
            if not self._abandoned:
                self._step(f, max(MIN_READ, FINAL_BYTES // max(1, len(logs))), final=True)
            self._tally(self._unshown, f.rank, f.size() - f.pos)
            f.close()
        self.abandon()
        if self._unshown:
            self.printer.say(f"console: {_mb(sum(self._unshown.values()))} of node output not shown "
                             f"here; every line is in {self._paths(self._unshown)}{more}")

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S) and not self._abandoned:
            with self._lock:
                logs = list(self._logs.values())
            budget = max(MIN_READ, int(self.rate * TICK_S) // max(1, len(logs)))
            for f in logs:
                self._step(f, budget)
            self._say_behind()

    def _step(self, f: _Followed, budget: int, final: bool = False) -> None:
        size = f.size()
        if size - f.pos > (budget if final else self.bound):   # on to the newest lines
            with self._lock:
                self._tally(self._skipped, f.rank, size - budget - f.pos)
            f.skip(size - budget)
            if final:   # said ahead of the newest lines it shows
                self._say_behind(force=True)
        if (text := f.read(budget)) and not self._abandoned and (text := f.noise.filter(text)):
            self.printer.node_text(f.rank, f.host, text, masked=True)

    def _say_behind(self, force: bool = False) -> None:
        # One line now and then, never one per skip.
        now = time.monotonic()
        if not self._skipped or (now - self._said_at < BEHIND_EVERY_S and not force):
            return
        self._said_at = now
        with self._lock:
            skipped, self._skipped = self._skipped, {}
        self.printer.say(f"console behind: skipped {_mb(sum(skipped.values()))} to keep up, showing "
                         f"the newest; every line is in {self._paths(skipped)}")

    def _tally(self, tally: dict[int, int], rank: int, size: int) -> None:
        if size > 0:
            tally[rank] = tally.get(rank, 0) + size

    def _paths(self, tally: dict[int, int]) -> str:
        return ", ".join(self.log_paths[r] for r in sorted(tally))


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MB"
