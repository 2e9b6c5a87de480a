"""Reading a registered run's log files: printing them and following them to the run's end.

The console log is printed as it is (it already holds the live stream's prefixes); a node's
log gets the live stream's `[node<k> <host> local<r>]` prefixes added.
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque

from ..errors import UserError
from ..logs.stream import Printer, lines_of
from ..logs.tail import FileTail, log_iter
from ..record.registry import console_path, locate

FOLLOW_POLL_S = 0.1   # how often a follower looks for new bytes
STATE_POLL_S = 0.5    # ... and asks the registry whether the run has ended
LOST_EXIT = 255       # what `logs -f` exits with when the run's supervisor was lost
READ_CHUNK = 4 << 20  # the most one read takes of a file shown whole: a flooded log is never held at once
SEEK_CHUNK = 64 << 10  # the step back from a file's end when looking for its last lines


def refresh(reg, run):
    """The run as its backend describes it now (ssh: a lost supervisor; a scheduler: the
    job's state), recorded on the way; a compare-and-set, so a concurrent writer wins."""
    if not run.active:
        return run
    from ..backends import backend_for
    status = backend_for(run.backend).describe(run)
    if status.state == run.state:
        return run
    reg.set_state(run.id, status.state, only_from=(run.state,), exit_code=status.exit_code)
    return reg.get(run.id)


class _Tail(FileTail):
    """One of the run's files, its whole lines handed to emit."""

    def __init__(self, path: str, emit, what: str = "log"):
        super().__init__(path, reopen=True)   # `logs -f` may read another host's files (NFS)
        self.emit, self.what = emit, what

    def show(self, tail: int | None = None) -> None:
        """Hand on what the file holds now that was not yet (its last `tail` lines). Read in
        bounded chunks, and with `tail` only from where its last lines begin: a log of many GB
        is never held at once. Goes on from the end seen, where a follower takes over."""
        if tail is not None:
            self._skip_to_last(tail)
        last = None if tail is None else deque(maxlen=tail)
        for text in self._chunks(self.size()):
            if last is not None:
                last.extend(lines_of(text))
            elif text:
                self.emit(lines_of(text))
        if last:
            self.emit(list(last))

    def _chunks(self, end: int):
        """The texts of whole lines up to byte `end` (the size when asked: a file that keeps
        growing does not keep a plain `logs` from ending), READ_CHUNK bytes at a time."""
        while self.pos < end:
            before = self.pos
            text = self.read(min(READ_CHUNK, end - self.pos))
            if self.pos <= before:   # unreadable, or made again: the follower goes on from here
                return
            yield text

    def _skip_to_last(self, n: int) -> None:
        """Go on from the start of the file's last n whole lines: the (n+1)th line break from
        its end, looked for SEEK_CHUNK bytes at a time (not before what was read already)."""
        at = self._break_back(n + 1)
        if at is not None:
            self.skip(at)   # the bytes up to and with that break go with the skipped

    def _break_back(self, k: int) -> int | None:
        """The offset of the k-th line break from the file's end; None where it has fewer."""
        end = self.size()
        try:
            lo = end
            while lo > self.pos and self.fd >= 0:
                step = min(SEEK_CHUNK, lo - self.pos)
                lo -= step
                data = os.pread(self.fd, step, lo)
                i = len(data)
                while (i := data.rfind(b"\n", 0, i)) >= 0:
                    k -= 1
                    if not k:
                        return lo + i
            return None
        except OSError:
            return None
        finally:
            if self.reopen:
                self.close()


class View:
    """What `mlaunch logs` / `attach` show of one run: its console, one node, or one attempt."""

    def __init__(self, reg, run, node: int | None, attempt: int | None, wait: bool = False):
        """wait: the caller follows, so files an active run has yet to write are no error."""
        self.reg, self.run, self.node, self.attempt = reg, run, node, attempt
        self.printer = Printer(lambda s: s, sys.stdout)
        self.seen_attempts = -1
        self.tails: list[_Tail] = self._tails()
        if not (wait and run.active):
            self._require()

    def _require(self) -> None:
        """Every file this view reads exists: a missing log is said, never shown as empty."""
        if not self.tails:
            raise UserError(f"run {self.run.id} ({self.run.state}) has started no node"
                        + (" yet; `mlaunch logs -f` waits for it" if self.run.active else ""))
        for t in self.tails:
            try:
                t.path = locate(t.path, t.what)
            except LookupError as e:
                raise UserError(f"run {self.run.id}: {e}") from None

    def _tails(self) -> list[_Tail]:
        if self.node is None and self.attempt is None:
            return [_Tail(console_path(self.run.id), self.printer.raw_lines, "console log")]
        attempts = self.reg.attempts(self.run.id)
        if not attempts:
            return []
        pick = attempts[-1] if self.attempt is None else next(
            (a for a in attempts if a.n == self.attempt), None)
        if pick is None:
            raise UserError(f"--attempt {self.attempt}: run {self.run.id} has attempts "
                        f"0..{attempts[-1].n}")
        self.seen_attempts = pick.n
        ranks = range(len(pick.log_paths)) if self.node is None else [self.node]
        if self.node is not None and not 0 <= self.node < len(pick.log_paths):
            raise UserError(f"--node {self.node}: run {self.run.id} has nodes 0..{len(pick.log_paths) - 1}")
        return [_Tail(pick.log_paths[k], self._node_emit(k), f"node {k}'s log (attempt {pick.n})")
                for k in ranks]

    def live(self) -> None:
        """Keep the run's per-node status lines (its live.json) under the stream, on a terminal."""
        from ..view.nodeview import read_snapshot, status_lines
        def lines(width: int) -> list[str]:
            snap = read_snapshot(self.run.log_dir)
            return [] if snap is None else status_lines(snap, width, max(0.0, time.time() - snap["time"]))
        self.printer.set_status(lines)

    def _node_emit(self, rank: int):
        host = self.run.hosts[rank] if rank < len(self.run.hosts) else "?"
        return lambda lines: self.printer.node_lines(rank, host, lines) if lines else None

    def show(self, tail: int | None) -> None:
        """Print what the files hold now (the last `tail` lines of each)."""
        for t in self.tails:
            t.show(tail)

    def follow(self) -> int:
        """Print new lines as they arrive until the run ends; the run's exit code."""
        self._next_check = 0.0
        for t, text in log_iter(lambda: self.tails, self._ended, FOLLOW_POLL_S):
            t.emit(lines_of(text))
        self.printer.set_status(None)
        return LOST_EXIT if self.run.exit_code is None else self.run.exit_code

    def _ended(self) -> bool:
        # The registry is asked every STATE_POLL_S; a node followed through restarts moves on
        # to each attempt's own log file.
        if time.monotonic() < self._next_check:
            return False
        self._next_check = time.monotonic() + STATE_POLL_S
        self.printer.redraw()
        self.run = refresh(self.reg, self.reg.get(self.run.id))
        if self.node is not None or self.attempt is not None:
            self._next_attempt()
        return not self.run.active

    def _next_attempt(self) -> None:
        # Following a node through restarts: each attempt writes its own log file.
        if self.attempt is None and self.run.attempts - 1 > self.seen_attempts:
            for t in self.tails:
                if text := t.flush():
                    t.emit(lines_of(text))
            self.tails = self._tails()
