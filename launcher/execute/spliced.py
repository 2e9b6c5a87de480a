"""The log path that never copies node output through the launcher's Python (issue 28).

Where a node's session runs under nodeprog/relay.py (the OpenSSH client's sessions on a node
with python3), the relay masks the node's output and copies the lines that matter (a health
mark, torchrun's root cause, a sample) to the session's stderr behind 0x1f. Here what each
node's `ssh` client wrote to its spool (execute/spool.py) is moved into its node log with
sendfile(2), by a thread of its own, never read into Python; the pump reads only the stderr
lines; the console follows the node logs at its pace (LogFollower). bench/splice_ceiling.py measured the design before it was built.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time
from typing import Callable

from ..plan.launch_plan import MASK, LaunchPlan
from ..record import fsmode
from ..record.events import said_removed
from ..spec.secret_rules import mask_rules
from ..view.nodeview import MARK as SAMPLE_MARK
from .base import Exit, RelayedRunning
from .spool import Spool
from .health import MARKS as HEALTH_MARKS
from .stream import LineSplitter, lines_of, text_of, _last_frame
from .torchrun_out import ROOT_CAUSE, ROOT_CAUSE_LINES

# A move of less than this waits (Spool.pause) before the next: the spool fills meanwhile, so
# a flood moves in fewer, larger pieces (a wake-up, a removal check and a sendfile each) and a
# trickle of lines costs few wake-ups a second. The node never waits: its client writes a file.
GATHER_BYTES = 2**18
ACTIVE_EVERY_S = 0.5    # the live view's "output seen" at most this often per node
TAIL_BYTES = 2**16      # read back from the node log's end for the summary's last lines
OURS = "\x1f"           # leads every line the relay writes to stderr


def wanted() -> bool:
    """Whether OpenSSH sessions run under the relay (MLAUNCH_LOG_RELAY=0: today's reader)."""
    return os.environ.get("MLAUNCH_LOG_RELAY", "1") != "0" and hasattr(os, "splice")


def relay_config(plan: LaunchPlan) -> dict:
    """What nodeprog/relay.py masks and copies to the launcher, from the modules that read
    those lines (the same secrets as plan.mask, the health watch's and torchrun's marks)."""
    return {**mask_rules(plan.secrets, MASK), "marks": list(HEALTH_MARKS),
            "after": [[ROOT_CAUSE, ROOT_CAUSE_LINES]], "sample": SAMPLE_MARK}


class SplicedPump:
    """One relayed node: stdout spliced into its log by a thread, stderr's lines to `seen`.

    seen(text): a text of whole relay lines (masked on the node); active(): the node wrote
    output; unlogged(text): output the node log could not take (it goes to the console)."""

    def __init__(self, running: RelayedRunning, path: str, seen: Callable[[str], None],
                 active: Callable[[], None], unlogged: Callable[[str], None]):
        self.running, self.path = running, path
        self.seen, self.active, self.unlogged = seen, active, unlogged
        self._fd = -1
        self._failed = False
        self._unlogged = LineSplitter()

    def run(self) -> Exit:
        """Move the node's output until its session ends; its exit."""
        mover = threading.Thread(target=self._move, daemon=True)
        mover.start()
        said = self._read_lines()
        mover.join()
        return self.running.wait(said)

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
            self.seen(text[1:].replace("\n" + OURS, "\n"))   # the common case: every line ours
            return
        ours = []
        for line in lines_of(text):
            if line.startswith(OURS):
                ours.append(line[1:])
            else:
                said.append(line)
        if ours:
            self.seen(text_of(ours))

    def _move(self) -> None:
        spool, last = self.running.spool, 0.0
        self._fd = self._open()
        try:
            while True:
                ended = self.running.ended()   # before the move: all the client wrote is there
                moved = self._to_log(spool) if self._fd >= 0 else self._to_console(spool)
                if not moved and ended:
                    self._to_console(spool, end=True)
                    return
                if moved and (now := time.monotonic()) - last > ACTIVE_EVERY_S:
                    last = now
                    self.active()
                if moved < GATHER_BYTES:
                    spool.pause(moved > 0)
        finally:
            if self._fd >= 0:
                os.close(self._fd)

    def _to_log(self, spool: Spool) -> int:
        try:
            if os.fstat(self._fd).st_nlink == 0:   # removed with its directory: made again
                self._reopen()
                if self._fd < 0:
                    return 1
            return spool.move_to(self._fd)
        except OSError as e:   # a full disk: the node's output goes on, to the console only
            self._fail(e)
            return 1

    def _to_console(self, spool: Spool, end: bool = False) -> int:
        data = spool.take()
        text = self._unlogged.feed_text(data) if data else self._unlogged.flush_text() if end else ""
        if text:
            self.unlogged(text)
        return len(data)

    def _open(self) -> int:
        # sendfile(2) into a file opened O_APPEND is refused: this thread is the log's only writer.
        try:
            fd = fsmode.private_fd(self.path, os.O_WRONLY)
            os.lseek(fd, 0, os.SEEK_END)
            return fd
        except OSError as e:
            self._fail(e)
            return -1

    def _reopen(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        said_removed(os.path.dirname(self.path) or ".")
        os.close(self._fd)
        self._fd = -1
        self._fd = self._open()

    def _fail(self, e: OSError) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if not self._failed:
            self._failed = True
            print(f"mlaunch: cannot write {self.path} ({e.strerror or e}); the run goes on, "
                  "that node's output from here on is only on the console", flush=True,
                  file=sys.stderr)
