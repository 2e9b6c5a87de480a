"""One node's output on its one path, never read into the launcher's Python: every node's
session runs under nodeprog/relay.py, which masks it and copies the lines that matter (a
health mark, torchrun's root cause, a sample) to the session's stderr behind 0x1f. A thread
moves the session's spool (transport/spool.py) into the node log with sendfile(2); only the
relay's lines are read; the console follows the node logs at its pace (logs/console.py)."""
from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable

from ..plan.launch_plan import LaunchPlan, NodePlan
from ..view import nodeview
from ..transport.base import LOST, Exit, Running
from ..transport.spool import Spool
from ..logs.stream import LineSplitter, NodeLog, lines_of, text_of, _last_frame
from ..logs.torchrun_out import TorchrunRootCause

# A move of less than this waits (Spool.pause) before the next: a flood moves in fewer, larger
# pieces, a trickle of lines costs few wake-ups a second.
GATHER_BYTES = 2**18
ACTIVE_EVERY_S = 0.5    # the live view's "output seen" at most this often per node
TAIL_BYTES = 2**16      # read back from the node log's end for the summary's last lines
OURS = "\x1f"           # leads every line the relay writes to stderr


class NodeOutput:
    """One node's output (session/attempt.py owns one per node): the spool moved into the node
    log, the relay's lines to the live view (samples), the root cause and the health watch
    (watched(rank, host, text)); unlogged(text): what the node log could not take."""

    def __init__(self, node: NodePlan, running: Running, plan: LaunchPlan, view: nodeview.LiveView,
                 unlogged: Callable[[str], None], watched: Callable[[int, str, str], None]):
        self.node, self.running, self.path = node, running, node.log_path
        self.plan, self.view, self.unlogged, self.watched = plan, view, unlogged, watched
        self.cause = TorchrunRootCause()
        self._unlogged = LineSplitter()

    def run(self) -> Exit:
        """Move the node's output until its session ends; its exit (never raises: a failure
        to read is a lost node, never the launcher's end)."""
        try:
            mover = threading.Thread(target=self._move, daemon=True)
            mover.start()
            said = self._read_lines()
            mover.join()
            return with_cause(self.running.wait(said), self.cause)
        except Exception as e:
            return Exit(LOST, lost=True, detail=f"stream error: {e}")

    def _seen(self, text: str) -> None:
        """The relay's lines (masked on the node): samples, the root cause, the health watch."""
        text, samples = nodeview.split_text(self.plan.mask(text))
        if samples:
            self.view.output(self.node.rank, samples)
        if text:
            self.cause.see_text(text)
            self.watched(self.node.rank, self.node.host, text)

    def tail(self, keep: int = 12) -> list[str]:
        """The node log's last lines (the summary's), as the console would show them."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - TAIL_BYTES))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [_last_frame(line) for line in text.splitlines()[-keep:]]

    def _read_lines(self) -> str:
        # The relay's lines; the rest of stderr is the OpenSSH client's own (wait() reads it).
        splitter, said = LineSplitter(), collections.deque(maxlen=4)
        while chunk := self.running.read_err():
            self._take(splitter.feed_text(chunk), said)
        self._take(splitter.flush_text(), said)
        return "\n".join(said)

    def _take(self, text: str, said: collections.deque) -> None:
        if not text:
            return
        if text.startswith(OURS) and text.count("\n") == text.count("\n" + OURS) + 1:
            self._seen(text[1:].replace("\n" + OURS, "\n"))   # the common case: every line ours
            return
        ours = []
        for line in lines_of(text):
            if line.startswith(OURS):
                ours.append(line[1:])
            else:
                said.append(line)
        if ours:
            self._seen(text_of(ours))

    def _move(self) -> None:
        spool, last, log = self.running.spool, 0.0, NodeLog(self.path)
        try:
            while True:
                ended = self.running.ended()   # before the move: all the client wrote is there
                moved = log.move(spool) if log.fd >= 0 else self._to_console(spool)
                if not moved and ended:
                    self._to_console(spool, end=True)
                    return
                if moved and (now := time.monotonic()) - last > ACTIVE_EVERY_S:
                    last = now
                    self.view.lines_seen(self.node.rank)
                if moved < GATHER_BYTES:
                    spool.pause(moved > 0)
        finally:
            log.close()

    def _to_console(self, spool: Spool, end: bool = False) -> int:
        data = spool.take()
        text = self._unlogged.feed_text(data) if data else self._unlogged.flush_text() if end else ""
        if text:
            self.unlogged(text)
        return len(data)


def with_cause(outcome: Exit, cause: TorchrunRootCause) -> Exit:
    """torchrun exits 1 whatever its worker returned: the worker's code from its report."""
    if outcome.code == 1 and cause.code not in (None, 0, 1):
        return Exit(cause.code, detail=f"torchrun: a worker exited {cause.code}")
    return outcome
